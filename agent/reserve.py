"""The GPU memory reserve a node needs (the binder's --gpu-mem-reserve): what each GPU holds with
no model loaded, and the reserve that covers it.

What a GPU holds before any model, and no model is billed for: the driver's own reservation, the
CUDA context of every process on it (Triton's, about 300-500 MiB a process, more with eager
module loading), and Triton's CUDA memory pool (--cuda-memory-pool-byte-size, 64 MiB a GPU by
default; the pinned pool is host memory). The first model of a backend on a GPU adds the
backend's libraries to Triton's context (cuBLAS and cuDNN handles and workspaces for ONNX
Runtime, TensorRT's runtime), which stay after that model unloads: BACKEND_ALLOWANCE covers them.
The models' own arenas and engines are measured per model and are not part of the reserve.

Pure: figures in, figures out; `agent.gpucheck --reserve` reads them with NVML.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

MIB = 1024**2
STEP = 256 * MIB
"""The reserve is rounded up to this: NVML's figures move by a few MiB between readings."""
BACKEND_ALLOWANCE = 256 * MIB
"""Held once a GPU's first ONNX Runtime or TensorRT model has loaded, and billed to no model."""
DEFAULT_RESERVE = 1024 * MIB
"""The chart's and the manifests' default: a Triton context at the top of its usual range, its
64 MiB pool and the driver's share, plus BACKEND_ALLOWANCE, rounded up. Measure a node with
`python -m agent.gpucheck --reserve` and set the figure it gives."""


@dataclass(frozen=True)
class Baseline:
    """One GPU as NVML reads it with no model loaded."""

    index: int
    uuid: str
    total: int
    used: int
    """NVML's used memory: the driver's reservation and every process's context and pools."""
    held_by_processes: int | None
    """The sum NVML's process list gives (None when the driver does not say)."""


def suggested_reserve(baselines: Iterable[Baseline]) -> int:
    """The --gpu-mem-reserve that covers every GPU's idle use plus the backends' libraries,
    rounded up to STEP; 0 without a GPU."""
    most = max((b.used for b in baselines), default=None)
    if most is None:
        return 0
    wanted = most + BACKEND_ALLOWANCE
    return -(-wanted // STEP) * STEP
