"""GPU memory per model: what each loaded model is measured to use, and the rules built on it.

A model's request (`tritonshare.io/gpu-mem`, proved by the binder's signature) is what the binder
booked. What it really uses is measured here: Triton's own per-model figure when the backend
reports one, else the growth of its GPU's NVML used memory across its load (loads on one GPU are
serialized by `agent.models`, so the growth is the model's). Between loads, each poll compares a
GPU's used memory with what is attributed to its models: when a GPU holds one model, the change
is that model's; when it holds several, the change stays unattributed (published as such, never
blamed on anyone). From these figures:

- admission: a load fits only if the GPU's booked memory (every proven placement on it, the new
  one included, each at the larger of request and measured) fits its capacity minus the reserve,
  and NVML shows at least the request free beyond the reserve;
- enforcement: a model measured above its request by more than the tolerance (5% or 256Mi,
  whichever is larger) is over; `agent.reconcile` warns about it or evicts it;
- publication: the `<prefix>gpu-usage` node annotation (per GPU: NVML used bytes; per model:
  measured bytes), rounded so that noise does not cause writes.

Pure: the ledger is fed numbers and returns numbers; NVML, Triton and the API are elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from agent.inventory import GpuInfo, GpuSnapshot

MIB = 1024**2
TOLERANCE_FRACTION = 0.05
TOLERANCE_MIN_BYTES = 256 * MIB
PUBLISH_GRANULE_BYTES = 64 * MIB
"""Published figures are rounded up to this: a model that wobbles by a few MiB writes nothing."""


def tolerance(request: int, fraction: float, minimum: int) -> int:
    return max(int(request * fraction), minimum)


@dataclass
class Measured:
    """One loaded model on one GPU."""

    model_id: str
    gpu_uuid: str
    request: int
    bytes: int
    source: str
    """`triton` (the backend's own statistics) or `nvml` (its GPU's used memory)."""


class MemoryLedger:
    """Measured memory of the node's loaded models, and the GPUs' unattributed rest."""

    def __init__(
        self,
        *,
        tolerance_fraction: float = TOLERANCE_FRACTION,
        tolerance_min: int = TOLERANCE_MIN_BYTES,
    ) -> None:
        self.tolerance_fraction = tolerance_fraction
        self.tolerance_min = tolerance_min
        self.models: dict[str, Measured] = {}
        self._baseline: dict[str, int] = {}
        """Per GPU: used bytes that belong to no model (CUDA contexts, Triton itself)."""
        self._used: dict[str, int] = {}
        self.loading: set[str] = set()
        """GPUs with a load in progress: their change belongs to that load, not to a poll."""

    def measured(self, model_id: str) -> int:
        entry = self.models.get(model_id)
        return entry.bytes if entry else 0

    def on_gpu(self, gpu_uuid: str) -> list[Measured]:
        return [m for m in self.models.values() if m.gpu_uuid == gpu_uuid]

    def attributed(self, gpu_uuid: str) -> int:
        return sum(m.bytes for m in self.on_gpu(gpu_uuid))

    def record_load(
        self,
        model_id: str,
        gpu_uuid: str,
        request: int,
        used_before: int,
        used_after: int,
        reported: int | None,
    ) -> Measured:
        """A load finished: the model's figure is Triton's when reported, else the growth."""
        if reported is not None:
            entry = Measured(model_id, gpu_uuid, request, reported, "triton")
        else:
            entry = Measured(model_id, gpu_uuid, request, max(used_after - used_before, 0), "nvml")
        self.models[model_id] = entry
        self._used[gpu_uuid] = used_after
        self._baseline[gpu_uuid] = max(used_after - self.attributed(gpu_uuid), 0)
        return entry

    def forget(self, model_id: str) -> None:
        entry = self.models.pop(model_id, None)
        if entry is not None:
            # Its memory is gone from the GPU once Triton has unloaded it.
            used = self._used.get(entry.gpu_uuid, 0)
            self._used[entry.gpu_uuid] = max(used - entry.bytes, 0)

    def observe(self, snapshot: GpuSnapshot) -> None:
        """A new NVML reading: a GPU's change is its sole model's; otherwise unattributed."""
        for gpu in snapshot.gpus:
            if not gpu.healthy or gpu.uuid in self.loading:
                continue
            self._used[gpu.uuid] = gpu.memory_used
            models = self.on_gpu(gpu.uuid)
            baseline = self._baseline.setdefault(gpu.uuid, gpu.memory_used if not models else 0)
            if len(models) == 1 and models[0].source == "nvml":
                models[0].bytes = max(gpu.memory_used - baseline, 0)

    def unattributed(self, gpu_uuid: str) -> int:
        """Used bytes on the GPU that no model and no baseline accounts for (may be < 0 while
        an unload is finishing)."""
        used = self._used.get(gpu_uuid, 0)
        return used - self._baseline.get(gpu_uuid, 0) - self.attributed(gpu_uuid)

    def over(self) -> list[Measured]:
        """Models measured above their request by more than the tolerance."""
        fraction, minimum = self.tolerance_fraction, self.tolerance_min
        return [
            m
            for m in self.models.values()
            if m.bytes > m.request + tolerance(m.request, fraction, minimum)
        ]

    def annotation(self, snapshot: GpuSnapshot | None) -> str:
        """The `<prefix>gpu-usage` annotation: per GPU its used bytes and its models' figures,
        rounded up to the granule; byte-stable for equal figures."""
        gpus = {}
        for gpu in snapshot.gpus if snapshot else ():
            models = {m.model_id: _rounded(m.bytes) for m in self.on_gpu(gpu.uuid)}
            gpus[gpu.uuid] = {"used": _rounded(gpu.memory_used), "models": models}
        return json.dumps(gpus, sort_keys=True, separators=(",", ":"))


def _rounded(value: int) -> int:
    return -(-max(value, 0) // PUBLISH_GRANULE_BYTES) * PUBLISH_GRANULE_BYTES


def admission_problem(
    gpu: GpuInfo, request: int, booked_others: Iterable[int], reserve: int
) -> str:
    """Why a model of `request` bytes cannot load on `gpu` now ("" when it can)."""
    booked = sum(booked_others)
    capacity = gpu.memory_total - reserve
    if booked + request > capacity:
        return (
            f"GPU {gpu.index} ({gpu.uuid}) has {capacity} bytes for models and "
            f"{booked} are booked by the other pods placed on it, so {request} more do not fit"
        )
    free = gpu.memory_free - reserve
    if request > free:
        return (
            f"NVML shows {gpu.memory_free} bytes free on GPU {gpu.index} ({gpu.uuid}); after the "
            f"{reserve}-byte reserve that is {max(free, 0)}, less than the {request} requested"
        )
    return ""
