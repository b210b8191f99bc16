"""`python -m sim.demo --real-gpu` with the mock NVML standing in for the machine's GPU: the whole
product (binder, agent, gateway, proxy, loader) serves each model pinned on the node, and the
figures it prints are the agent's measurement (a Python model's stub holds its CUDA context on the
mock H200 too), booked with the per-process allowance."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.demo.gpucheck import MODELS, STAND_IN_CONTEXT, run_gpu_check
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
