"""`python -m sim.demo --real-gpu` with the mock NVML standing in for the machine's GPU: the whole
product (binder, agent, gateway, proxy, loader) serves each model pinned on the node, and the
figures it prints are the agent's measurement (a Python model's stub holds its CUDA context on the
mock H200 too), booked with the per-process allowance."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from sim import cluster
from sim.cluster import REAL_GPUS, NodeSpec, SimCluster
from sim.demo.gpucheck import MODELS, STAND_IN_CONTEXT, machine_gpus, run_gpu_check
from sim.processes import ClusterError
from sim.triton import TritonInstall

pytestmark = pytest.mark.triton

MIB = 1024**2


def test_the_gpu_check_prints_the_measured_figures(
    tmp_path: Path, triton_install: TritonInstall
) -> None:
    lines: list[str] = []
    result = run_gpu_check(tmp_path / "cluster", lines.append, real=False)
    transcript = "\n".join(lines)
    assert [m.name for m in result.models] == [name for name, _ in MODELS]
    assert result.gpus == ["0: NVIDIA H200 (140.4Gi)"], result.gpus
    for model in result.models:
        # Measured by the agent from the mock GPU: the allocation and the stub's context.
        assert model.measured == model.allocated + STAND_IN_CONTEXT, transcript
        assert model.booked == model.request + 640 * MIB
        assert not model.over_booking
        assert model.answer == [2.0, 3.0, 4.0, 5.0]
        assert model.load_seconds > 0 and model.unload_seconds > 0
        assert model.used_after_unload == model.used_before
        assert f"measured {model.measured} bytes" in transcript
        assert "+600 MiB beyond its allocation; within its booking" in transcript


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
