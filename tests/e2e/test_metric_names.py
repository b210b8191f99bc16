"""Every metric the dashboard and the autoscaler query is one the parts really export: the names
are checked against the /metrics the demo scraped from the binder, the agent and the proxies."""

from __future__ import annotations

import pytest

from sim.report import DemoResult
from tests.deploy.test_dashboard import METRIC, queries


@pytest.mark.slow
@pytest.mark.triton
def test_every_queried_metric_is_exported(demo_run: tuple[DemoResult, str]) -> None:
    result, _ = demo_run
    exported = {name.partition("{")[0] for name in result.metrics}
    assert len(exported) > 20
    missing = set()
    for query in queries():
        for name in METRIC.findall(query):
            # Histogram buckets are not kept in the demo's summary; their _count is.
            wanted = name.removesuffix("_bucket") + "_count" if name.endswith("_bucket") else name
            if wanted not in exported:
                missing.add(name)
    assert not missing, f"queried but not exported by any part: {sorted(missing)}"
