"""The agent's metrics exposition: per-GPU figures read at scrape time, accepted by promtool;
the info series that joins Triton's per-model series to model ids."""

from __future__ import annotations

import subprocess
from pathlib import Path

from prometheus_client import generate_latest

from agent.gpus.inventory import GpuInfo, GpuSnapshot
from agent.metrics import AgentMetrics
from agent.pods.modelpods import PodInfo
from agent.pods.provenpods import Proven
from common.tritonname import private_triton_name
from tests.conftest import require_executable


def test_the_exposition_follows_prometheus_conventions() -> None:
    promtool = require_executable("promtool")
    metrics = AgentMetrics()
    snapshots = [
        GpuSnapshot((GpuInfo(0, "GPU-a", "Tesla T4", 16 << 30, 1 << 30, True),)),
    ]
    metrics.watch_gpus(lambda: snapshots[-1], lambda: {"GPU-a": 2, "": 1})
    metrics.load_seconds.observe(1.5)
    metrics.installs.labels("installed").inc()
    metrics.load_failures.labels("triton_rejected").inc()
    first = generate_latest(metrics.registry).decode()
    # Labelled as dcgm-exporter labels a GPU (`gpu` its index, `UUID`), so queries join them.
    labels = '{UUID="GPU-a",gpu="0",product="Tesla T4"}'
    assert f"tritonshare_agent_gpu_memory_free_bytes{labels} 1.610612736e+10" in first
    assert 'tritonshare_agent_models_loaded{UUID="GPU-a",gpu="0"} 2.0' in first
    assert 'tritonshare_agent_models_loaded{UUID="",gpu=""} 1.0' in first

    # The collector reads the latest snapshot at scrape time: a lost GPU shows at the next scrape.
    snapshots.append(
        GpuSnapshot((GpuInfo(0, "GPU-a", "Tesla T4", 16 << 30, 1 << 30, False, "lost"),))
    )
    second = generate_latest(metrics.registry).decode()
    assert f"tritonshare_agent_gpu_healthy{labels} 0.0" in second

    result = subprocess.run(
        [promtool, "check", "metrics"], input=second, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


JOIN = """sum by (model_namespace, model_pod, model_id) (
  rate(nv_inference_request_success[5m])
  * on(node, model) group_left(model_namespace, model_pod, model_id)
    tritonshare_agent_model_info
)"""
"""docs/agent.md's join, as written there."""


def test_the_info_series_joins_tritons_series_to_model_ids_as_documented(tmp_path: Path) -> None:
    """The agent's info series for two pods of one model id (and a legacy model on another node
    with the same public name as a private one's prefix) joins Triton's nv_* series, as scraped
    with the PodMonitor's labels, to each pod's namespace and model id; promtool evaluates the
    documented expression."""
    promtool = require_executable("promtool")
    a = private_triton_name("team-a", "resnet50", "uid-a")
    b = private_triton_name("team-b", "resnet50", "uid-b")
    pods = {
        name: Proven(PodInfo(ns, pod, uid, "n1", "tritonshare", "Running", "resnet50", ""), 1)
        for name, ns, pod, uid in ((a, "team-a", "a", "uid-a"), (b, "team-b", "b", "uid-b"))
    }
    metrics = AgentMetrics()
    metrics.watch_models(lambda: pods)
    exposed = generate_latest(metrics.registry).decode()
    info = [line for line in exposed.splitlines() if line.startswith("tritonshare_agent_model_")]
    assert len(info) == 2
    assert (
        f'tritonshare_agent_model_info{{model="{a}",model_id="resnet50",model_namespace="team-a",'
        'model_pod="a"} 1.0'
    ) in info

    def series(name: str, labels: str, values: str) -> str:
        return f"      - series: '{name}{{{labels}}}'\n        values: '{values}'\n"

    scrape = 'job="tritonshare-node",namespace="tritonshare-system",pod="tritonshare-node-x"'
    inputs = (
        series("nv_inference_request_success", f'{scrape},node="n1",model="{a}"', "0+60x10")
        + series("nv_inference_request_success", f'{scrape},node="n1",model="{b}"', "0+120x10")
        + series("nv_inference_request_success", f'{scrape},node="n2",model="resnet50"', "0+30x10")
    )
    for line in info:
        labels = line[line.index("{") + 1 : line.index("}")]
        inputs += series("tritonshare_agent_model_info", f'{scrape},node="n1",{labels}', "1x10")
    inputs += series(
        "tritonshare_agent_model_info",
        f'{scrape},node="n2",model="resnet50",model_id="resnet50",model_namespace="team-c",'
        'model_pod="legacy"',
        "1x10",
    )
    expr = " ".join(JOIN.split())
    test = tmp_path / "join.yaml"
    test.write_text(
        "rule_files: []\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n"
        + inputs
        + "    promql_expr_test:\n"
        + f"      - expr: '{expr}'\n        eval_time: 10m\n        exp_samples:\n"
        + "".join(
            f'          - labels: \'{{model_id="resnet50",model_namespace="{ns}",'
            f'model_pod="{pod}"}}\'\n            value: {value}\n'
            for ns, pod, value in (
                ("team-a", "a", 1),
                ("team-b", "b", 2),
                ("team-c", "legacy", 0.5),
            )
        )
    )
    result = subprocess.run(
        [promtool, "test", "rules", str(test)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    docs = (Path(__file__).resolve().parents[2] / "docs" / "agent.md").read_text()
    assert JOIN in docs
