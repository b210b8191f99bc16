"""`python -m sim.demo --real-gpu` with the mock NVML standing in for the machine's GPU: the whole
product (binder, agent, gateway, proxy, loader) serves each model pinned on the node, and the
figures it prints are the agent's measurement (a Python model's stub holds its CUDA context on the
mock H200 too), booked with the per-process allowance; then a burst of model pods created at once
loads side by side, each billed exactly."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from common.quantity import parse_quantity
from sim import cluster
from sim.cluster import REAL_GPUS, NodeSpec, SimCluster
from sim.demo.gpuburst import burst_of
from sim.demo.gpucheck import (
    MODELS,
    STAND_IN_CONTEXT,
    STAND_IN_DRIVER_SHARE,
    machine_gpus,
    run_gpu_check,
)
from sim.processes import ClusterError
from sim.triton import TritonInstall

pytestmark = pytest.mark.triton

MIB = 1024**2


def test_the_gpu_check_prints_the_measured_figures(
    tmp_path: Path, triton_install: TritonInstall
) -> None:
    lines: list[str] = []
    burst = burst_of(3)
    result = run_gpu_check(tmp_path / "cluster", lines.append, real=False, burst=burst)
    transcript = "\n".join(lines)
    assert [m.name for m in result.models] == [name for name, _ in MODELS]
    assert result.gpus == ["0: NVIDIA H200 (140.4Gi)"], result.gpus
    # Measured by the agent from the mock GPU: the allocation, the stub's context as NVML lists
    # it for the stub's process, and the driver's share the GPU shows beyond that.
    context = STAND_IN_CONTEXT + STAND_IN_DRIVER_SHARE
    for model in result.models:
        assert model.measured == model.allocated + context, transcript
        assert model.booked == model.request + 640 * MIB
        assert not model.over_booking
        assert model.answer == [2.0, 3.0, 4.0, 5.0]
        assert model.load_seconds > 0 and model.unload_seconds > 0
        assert model.ready_seconds > model.load_seconds
        assert model.used_after_unload == model.used_before
        assert f"measured {model.measured} bytes" in transcript
        assert "+606 MiB beyond its allocation; within its booking" in transcript
    # The burst: created at once, each billed exactly, none of the GPU unattributed.
    assert result.burst is not None
    assert [m.allocated for m in result.burst.models] == [parse_quantity(r) for r in burst]
    for one in result.burst.models:
        assert one.measured == one.allocated + context, transcript
        assert one.ready_seconds > 0
    assert result.burst.grown == result.burst.measured > 0, transcript
    assert result.burst.unattributed == 0
    assert result.burst.load_seconds > 0
    assert result.burst.used_after_unload == result.burst.used_before
    assert "0 bytes no model accounts for (the agent's own figure: 0)" in transcript


def without_gpus() -> None:
    """These tests are of a machine without an NVIDIA driver (where one is, the mode runs)."""
    with contextlib.suppress(ClusterError):
        pytest.skip(f"this machine has GPUs ({machine_gpus()}): make demo GPU=real checks them")


def test_the_real_gpu_mode_says_first_when_this_machine_has_no_gpu(tmp_path: Path) -> None:
    """No NVIDIA driver here: `--real-gpu` stops before starting anything, saying why."""
    without_gpus()
    with pytest.raises(ClusterError) as failed:
        run_gpu_check(tmp_path / "cluster", lambda _: None, real=True)
    assert "this machine's GPUs cannot be read: NVML is not usable" in str(failed.value)
    assert not (tmp_path / "cluster").exists()


@pytest.mark.slow
def test_a_real_gpu_node_runs_the_agent_on_this_machines_nvml(
    tmp_path: Path, triton_install: TritonInstall, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `REAL_GPUS` node's agent is `python -m agent` itself (no mock, no --cpu-only), so here,
    without a driver, it reads no GPU and the cluster does not come up, its log saying why."""
    without_gpus()
    # It never publishes GPUs here: a shorter wait for them than a cluster's.
    monkeypatch.setattr(cluster, "AGENT_GPUS_SECONDS", 20.0)
    node = NodeSpec("gpu-node-0", REAL_GPUS, real=True)
    with pytest.raises(ClusterError), SimCluster(tmp_path, [node], binders=0):
        pass
    log = (tmp_path / "logs" / "agent-gpu-node-0.log").read_text()
    assert "Reading the GPUs failed: NVML is not usable" in log, log[-2000:]
