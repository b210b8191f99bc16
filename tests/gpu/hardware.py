"""When a test needs a real GPU: skip without one, fail only where one is required.

tests/conftest.py's `require_tool` fails in CI (`CI=true`) when a tool is missing, because CI
installs every tool the tests need. A GPU cannot be installed, and CI has none, so here `CI=true`
alone skips; `TRITONSHARE_REQUIRE_GPU=1` (set where a GPU must be present, such as the
`tests/gpu/run_on_gpu.sh` run on a GPU machine) turns each skip into a failure.

Self-contained (no conftest) so the real-GPU tests run with `pytest --noconftest` on a machine
that has only the check's own dependencies.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import pytest

from agent.errors import NvmlUnavailableError
from agent.gpus.inventory import GpuSnapshot
from agent.gpus.nvml import PYNVML, GpuReader

REQUIRE_GPU = "TRITONSHARE_REQUIRE_GPU"


def gpu_required(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return environ.get(REQUIRE_GPU, "").lower() in ("1", "true", "yes")


def require(available: bool, reason: str, environ: Mapping[str, str] | None = None) -> None:
    """Skip when what a real-GPU test needs is missing; fail instead when a GPU is required."""
    if available:
        return
    if gpu_required(environ):
        pytest.fail(f"{reason} ({REQUIRE_GPU}=1: this machine must have it)")
    pytest.skip(reason)


def real_gpus() -> GpuSnapshot:
    """The machine's GPUs through the real pynvml, or skip/fail as `require` does."""
    reader = GpuReader(nvml=PYNVML)
    try:
        snapshot = reader.read()
    except NvmlUnavailableError as e:
        require(False, f"no usable NVIDIA driver here: {e}")
        raise
    finally:
        reader.close()
    require(bool(snapshot.gpus), "NVML works but lists no GPU")
    return snapshot
