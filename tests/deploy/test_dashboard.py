"""The Grafana dashboard is well-formed and every query in it (and the autoscaler's) is PromQL
that Prometheus accepts. That the metrics exist is checked against the parts' live /metrics in
tests/e2e/test_metric_names.py."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import require_executable
from tests.deploy.rendering import DEPLOY

DASHBOARD = DEPLOY / "monitoring" / "tritonshare-dashboard.json"
SCALED_OBJECT = DEPLOY / "overlays" / "example-keda" / "model-scaledobject.yaml"
METRIC = re.compile(r"\btritonshare_[a-z_]+\b")
TRITON_METRIC = re.compile(r"\bnv_[a-z_]+\b")


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def queries() -> list[str]:
    """Every PromQL expression of the dashboard and of the example's autoscaler."""
    found = [t["expr"] for p in dashboard()["panels"] for t in p["targets"]]
    scaled = yaml.safe_load(SCALED_OBJECT.read_text())
    found += [t["metadata"]["query"] for t in scaled["spec"]["triggers"]]
    return found


def test_the_dashboard_is_well_formed() -> None:
    board = dashboard()
    assert board["uid"] and board["title"]
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels), "panel ids must be unique"
    variables = {v["name"] for v in board["templating"]["list"]}
    for panel in panels:
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        assert panel["datasource"]["uid"].strip("${}") in variables
        refs = [t["refId"] for t in panel["targets"]]
        assert len(set(refs)) == len(refs)
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, f"{panel['title']} is off the grid"
    titles = " ".join(p["title"].lower() for p in panels)
    for topic in ("gpu memory", "models per gpu", "scheduling latency", "pending", "concurrency"):
        assert topic in titles, f"the dashboard has no panel on {topic}"


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    promtool = require_executable("promtool")
    rules = {
        "groups": [
            {
                "name": "tritonshare-dashboard",
                "rules": [{"record": f"check:q{i}", "expr": q} for i, q in enumerate(queries())],
            }
        ]
    }
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"promtool rejects a query:\n{result.stdout}{result.stderr}"
    # Each query reads the parts' series, or Triton's own per-model ones (nv_*).
    assert all(METRIC.search(q) or TRITON_METRIC.search(q) for q in queries())
