"""The agent's metrics exposition: per-GPU figures read at scrape time, accepted by promtool."""

from __future__ import annotations

import subprocess

from prometheus_client import generate_latest

from agent.inventory import GpuInfo, GpuSnapshot
from agent.metrics import AgentMetrics
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
