"""Every metric the dashboard and the autoscaler query is one the parts really export: the names
are checked against the /metrics the demo scraped from the binder, the agent, the proxies and the
real Triton (its per-model nv_* series)."""

from __future__ import annotations

import pytest

from sim.demo.report import DemoResult
from tests.deploy.test_dashboard import METRIC, TRITON_METRIC, queries


@pytest.mark.slow
@pytest.mark.triton
def test_every_queried_metric_is_exported(demo_run: tuple[DemoResult, str]) -> None:
    result, _ = demo_run
    exported = {name.partition("{")[0] for name in result.metrics}
    assert len(exported) > 20
    missing = set()
    for query in queries():
        for name in METRIC.findall(query) + TRITON_METRIC.findall(query):
            # Histogram buckets are not kept in the demo's summary; their _count is.
            wanted = name.removesuffix("_bucket") + "_count" if name.endswith("_bucket") else name
            # Triton's counters have no _total in their names; the parser reading them adds it.
            if wanted not in exported and f"{wanted}_total" not in exported:
                missing.add(name)
    assert not missing, f"queried but not exported by any part: {sorted(missing)}"
