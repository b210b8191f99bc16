"""The GPU memory a node needs beyond what models ask for: the reserve every GPU keeps (the
binder's --gpu-mem-reserve) and the allowance a model in its own process takes (the binder's
--gpu-mem-process-allowance), from what NVML reads.

What a GPU holds before any model, and no model is billed for: the driver's own reservation,
Triton's CUDA context and its CUDA memory pool (--cuda-memory-pool-byte-size, 64 MiB a GPU by
default), and, once a GPU's first ONNX Runtime or TensorRT model has loaded, the backend's libraries
in Triton's context (cuBLAS and cuDNN handles and workspaces), which stay after that model unloads:
BACKEND_ALLOWANCE covers them. A model of a stub backend (Python) runs in a process of its own with
a CUDA context of its own, which its request does not include: PROCESS_ALLOWANCE. The models' own
arenas and engines are measured per model and are part of neither.

Pure: figures in, figures out; `agent.gpucheck --reserve` and `--measure` read them with NVML.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

MIB = 1024**2
STEP = 256 * MIB
"""The reserve is rounded up to this: NVML's figures move by a few MiB between readings."""
DRIVER_SHARE = 615 * MIB
"""What an idle data-centre GPU holds with no process (an H200 on driver 580; docs/results.md)."""
TRITON_CONTEXT = 591 * MIB
"""What Triton's own CUDA context adds before any model (Triton 2.51, CUDA 13; docs/results.md)."""
BACKEND_ALLOWANCE = 256 * MIB
"""Held once a GPU's first ONNX Runtime or TensorRT model has loaded, and billed to no model."""
DEFAULT_RESERVE = -(-(DRIVER_SHARE + TRITON_CONTEXT + BACKEND_ALLOWANCE) // STEP) * STEP
"""1536Mi, the chart's and the manifests' default: 615 + 591 + 256 = 1462 MiB, rounded up.
Measure a node with `python -m agent.gpucheck --reserve` and set the figure it gives."""
PROCESS_STEP = 64 * MIB


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

    @property
    def without_triton(self) -> bool:
        """No process holds memory on the GPU: Triton's context is not in `used` yet (the
        check ran without Triton, or before Triton touched this GPU)."""
        return self.held_by_processes == 0

    @property
    def idle(self) -> int:
        """What the GPU holds idle with Triton running: `used`, plus TRITON_CONTEXT when Triton
        was not there to read."""
        return self.used + (TRITON_CONTEXT if self.without_triton else 0)


def suggested_reserve(baselines: Iterable[Baseline]) -> int:
    """The --gpu-mem-reserve that covers every GPU's idle use with Triton running plus the
    backends' libraries, rounded up to STEP; 0 without a GPU."""
    most = max((b.idle for b in baselines), default=None)
    if most is None:
        return 0
    return -(-(most + BACKEND_ALLOWANCE) // STEP) * STEP


def suggested_allowance(context: int) -> int:
    """The --gpu-mem-process-allowance that covers a stub process's measured CUDA context,
    rounded up to 64 MiB."""
    return max(-(-context // PROCESS_STEP) * PROCESS_STEP, PROCESS_STEP)
