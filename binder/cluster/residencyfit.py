"""Residency classes in GPU memory accounting: what a GPU offers an `always` pod and an
`on-demand` one, from the GPU's ledger.

An `always` model stays loaded while its pod lives; an `on-demand` one may be unloaded when idle
and is loaded again by its next request, after the node evicts idle on-demand models until it
fits. So on one GPU of usable size U (memory minus the reserve), with A the bytes held by
always pods, O by on-demand pods, M the largest single on-demand holding, and F = U times the
node's over-commit factor (rounded down):

- an `always` pod of r bytes fits when A + r + M <= U: the always-resident models and any one
  on-demand model, woken, fit together. On-demand pods cost it only M, never their sum, so no
  number of them keeps an always pod off a GPU where one model of their largest size would not.
- an `on-demand` pod fits when A + O + r <= F (the over-commit budget) and A + max(M, r) <= U
  (it, alone beside the always-resident models, can be woken).

NVML's free memory still caps both, so memory nothing charged explains is never handed out; the
measured memory of loaded on-demand models (L) is added back to it, since evicting them frees it.
With no on-demand pods and a factor of 1 both give the plain rule: min(U - A, NVML free).

Pure arithmetic, no I/O.
"""

from __future__ import annotations

from typing import NamedTuple


class GpuLedger(NamedTuple):
    """One healthy GPU's numbers, in bytes."""

    usable: int
    """Memory minus the reserve."""
    nvml_free: int
    """NVML's free memory minus the reserve as the agent published it (`usable` without one)."""
    held: int
    """Held by every charged pod (A + O)."""
    on_demand: int = 0
    """Of `held`, by on-demand pods (O)."""
    largest_on_demand: int = 0
    """The largest single on-demand holding (M)."""
    loaded_on_demand: int = 0
    """Measured memory of the on-demand models loaded now (L)."""
    overcommit: float = 1.0


def always_free(gpu: GpuLedger) -> int:
    """The largest `always` request the GPU takes now."""
    always = gpu.held - gpu.on_demand
    wake = gpu.largest_on_demand
    return max(0, min(gpu.usable - always - wake, gpu.nvml_free + gpu.loaded_on_demand - wake))


def on_demand_free(gpu: GpuLedger) -> int:
    """The largest `on-demand` request the GPU takes now. A GPU that holds anything offers one
    byte less than its size, so binpack sees it as used (not empty) and stacks on it first."""
    always = gpu.held - gpu.on_demand
    budget = int(gpu.usable * gpu.overcommit)
    free = max(
        0,
        min(budget - gpu.held, gpu.usable - always, gpu.nvml_free + gpu.loaded_on_demand),
    )
    if free >= gpu.usable and gpu.held > 0:
        return gpu.usable - 1
    return free


def wake_room(gpu: GpuLedger) -> int:
    """What the always-resident models (and unexplained memory) leave for one on-demand model
    to be woken in: an on-demand request above it fits nowhere on the GPU, whatever the
    factor."""
    always = gpu.held - gpu.on_demand
    return max(0, min(gpu.usable - always, gpu.nvml_free + gpu.loaded_on_demand))


def free_of_both(gpu: GpuLedger) -> tuple[int, int, int]:
    """(`always_free`, `on_demand_free`, `wake_room`) in one pass: the state refreshes all three
    on every charge to a node with on-demand pods."""
    usable, nvml_free, held, on_demand, largest, loaded, overcommit = gpu
    always = held - on_demand
    room = nvml_free + loaded
    wake = max(0, min(usable - always, room))
    for_always = max(0, min(usable - always - largest, room - largest))
    for_on_demand = max(0, min(int(usable * overcommit) - held, wake))
    if for_on_demand >= usable and held > 0:
        for_on_demand = usable - 1
    return for_always, for_on_demand, wake
