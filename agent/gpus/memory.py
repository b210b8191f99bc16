"""GPU memory per model: what each loaded model is measured to use, how sure that figure is, and
the rules built on it.

A model's request (`tritonshare.io/gpu-mem`, proved by the binder's signature) is what the binder
booked. What it really uses is measured here, on NVML readings of its GPU that
`agent.models.nodemodels` takes around every load and unload, one at a time per GPU (two loads not
measured apart never overlap on a GPU; a load may share an unload's window, read as one), and on
the node's polls between them:

- a model **measured apart** (its backend runs it in processes of its own: Python's stubs) is billed
  what its own processes hold on its GPU, as NVML lists each process's memory, refreshed at every
  reading: exact, whatever loads beside it, so such loads share their GPU (`agent.gpus.gpuqueue`).
  NVML's per-process figure leaves out the driver's part of each process's CUDA context (5.5-5.75
  MiB a process on an H200): the GPU's growth across loads measured apart beyond what their
  processes hold is billed to them by their processes (`share_apart`, at most `DRIVER_SHARE_CAP`
  a process; the rest is unexplained), as their **share**, which is also their uncertainty.
  Every other figure and rule below is on the GPU's used memory **less** what the models measured
  apart hold (`net`), so their loads and growth are never billed to another model; they still
  count as neighbours (what escapes their processes, such as a process outside Triton's, may
  grow beside them), so nothing is billed beside them but up to a request;
- a load's figure is Triton's own per-model figure when the backend reports one; else the growth
  of the GPU's used memory across the load. When the model was the only one on its GPU, that
  growth is its own. When other models were loaded there, or unloaded during its window, any of
  them may have allocated or freed memory during the window: the load is billed its growth up to
  its request, and the rest stays on the GPU as **unexplained** memory, billed to no one;
- a reading between loads (the node's poll, and the first reading of each load) gives a GPU's
  change since the last one to its only model; on a GPU with several models the change is
  unexplained (growth there is reported for the GPU, never blamed on a model);
- an unload that frees less than the model's figure leaves the rest unexplained (Triton's
  allocators may keep it, or a neighbour grew meanwhile).

Every figure carries an **uncertainty**: the unexplained bytes on its GPU, which another tenant's
model may have caused and which a model alone on its GPU has in its figure (0 for Triton's figures
and for a GPU whose every change was attributed). From these:

- admission: a load fits only if the GPU's booked memory (every proven placement on it, the new
  one included, each at the larger of request and measured) fits its capacity minus the reserve,
  and NVML shows at least the request free beyond the reserve;
- enforcement: a model measured above its request by more than the tolerance (5% or 256Mi,
  whichever is larger) is over, and gets the warning; it may be evicted only when it would still be
  over with its uncertainty taken away (`Excess.sure`): no other tenant could have made it over;
- publication: the `<prefix>gpu-usage` node annotation (per GPU: NVML used bytes; per model:
  measured bytes), rounded so that noise does not cause writes.

Pure: the ledger is fed numbers and returns numbers; NVML, Triton, logs and the API are elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from agent.gpus.inventory import GpuInfo, GpuSnapshot

MIB = 1024**2
DRIVER_SHARE_CAP = 16 * MIB
"""The most a process measured apart is billed of its GPU's growth beyond NVML's per-process
figures: the driver's part of a CUDA context is 5.5-5.75 MiB (an H200, driver 580); more than
this is not taken to be theirs."""
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
    """The model's name in Triton (`agent.models.nodemodels`: its pod's private name, or a legacy
    id): two pods of one public id are two entries."""
    gpu_uuid: str
    request: int
    bytes: int
    source: str
    """`triton` (the backend's own statistics), `nvml` (its GPU's used memory) or `process`
    (its own processes' memory, NVML's per-process figures: measured apart)."""
    floor: int = 0
    """Triton's figure at load: a model alone on its GPU is never measured below it."""
    share: int = 0
    """Of a model measured apart, the bytes of its figure that its processes cost the GPU beyond
    NVML's per-process figures (`MemoryLedger.share_apart`)."""
    adopted: bool = False
    """Found loaded after an agent restart: its load was never read, its GPU's baseline is
    unknown."""


@dataclass(frozen=True)
class Excess:
    """A model measured above its request plus the tolerance."""

    model: Measured
    uncertainty: int
    """Bytes of its figure (or of its GPU's) that another tenant's model may have caused."""

    @property
    def over_by(self) -> int:
        return self.model.bytes - self.model.request

    def sure(self, allowed: int) -> bool:
        """Over even if every uncertain byte belonged to someone else (`allowed`: the
        tolerance above the request)."""
        return self.model.bytes - self.uncertainty > self.model.request + allowed

    def doubt(self) -> str:
        """Why the figure cannot justify an eviction, as a clause ("" when it can)."""
        if not self.uncertainty:
            return ""
        return (
            f"{self.uncertainty} bytes of it appeared on the GPU while other models shared it, "
            f"so they may not be this model's"
        )


@dataclass(frozen=True)
class Unexplained:
    """Growth on a GPU that no model can be billed for: reported for the GPU, blamed on no one."""

    gpu_uuid: str
    grown: int
    total: int
    models: tuple[str, ...]
    during_load_of: str = ""


def describe(growth: Unexplained) -> str:
    """The log line for growth no model is billed for."""
    where = (
        f"while model {growth.during_load_of} loaded beside {', '.join(growth.models)}"
        if growth.during_load_of
        else f"between two readings, shared by {', '.join(growth.models)}"
    )
    return (
        f"GPU {growth.gpu_uuid} grew by {growth.grown} bytes {where}; no model can be told to "
        f"own them, so none is billed, warned or evicted for them ({growth.total} bytes of the "
        f"GPU are now unattributed; the binder sees them through NVML's free memory)"
    )


class MemoryLedger:
    """Measured memory of the node's loaded models, and what of their GPUs no model explains."""

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
        """Per GPU: used bytes that belong to no model (CUDA contexts, Triton itself), as read
        when the GPU last held no model."""
        self._unexplained: dict[str, int] = {}
        """Per GPU: bytes that appeared while several models could have caused them."""
        self._used: dict[str, int] = {}
        self.loading: set[str] = set()
        """GPUs with a load or unload in progress: their change belongs to it, not to a poll."""

    def measured(self, model_id: str) -> int:
        entry = self.models.get(model_id)
        return entry.bytes if entry else 0

    def on_gpu(self, gpu_uuid: str) -> list[Measured]:
        return [m for m in self.models.values() if m.gpu_uuid == gpu_uuid]

    def attributed(self, gpu_uuid: str) -> int:
        """Bytes billed to the models on the GPU that are not measured apart."""
        return sum(m.bytes for m in self._windowed(gpu_uuid))

    def _windowed(self, gpu_uuid: str) -> list[Measured]:
        """The GPU's models measured by its used memory (or Triton's figures), not apart."""
        return [m for m in self.on_gpu(gpu_uuid) if m.source != "process"]

    def apart(self, gpu_uuid: str) -> list[Measured]:
        """The GPU's models measured apart, by their own processes."""
        return [m for m in self.on_gpu(gpu_uuid) if m.source == "process"]

    def net(self, gpu: GpuInfo) -> int:
        """The GPU's used bytes less what its models measured apart hold (as last refreshed)."""
        return gpu.memory_used - sum(m.bytes for m in self.apart(gpu.uuid))

    def record_apart(self, model_id: str, gpu_uuid: str, request: int, held: int) -> Measured:
        """A load measured apart finished: it is billed `held`, what its own processes hold."""
        entry = Measured(model_id, gpu_uuid, request, held, "process")
        self.models[model_id] = entry
        return entry

    def refresh_apart(self, gpu_uuid: str, held: dict[str, int]) -> None:
        """What each model measured apart holds on the GPU now, by its name (a model with no
        process listed holds nothing, not even its share)."""
        for m in self.apart(gpu_uuid):
            m.bytes = held[m.model_id] + m.share if m.model_id in held else 0

    def share_apart(self, gpu_uuid: str, grown: int, processes: dict[str, int]) -> int:
        """The GPU's `grown` bytes (`net`) across loads measured apart, billed to the models
        loaded there by their processes (`processes`: each model's count), at most
        `DRIVER_SHARE_CAP` a process; returns what is left unexplained."""
        billed = {
            name: n
            for name, n in processes.items()
            if name in self.models and self.models[name].source == "process" and n > 0
        }
        count = sum(billed.values())
        each = min(grown // count, DRIVER_SHARE_CAP) if grown > 0 and count else 0
        for name, n in billed.items():
            self.models[name].share += each * n
            self.models[name].bytes += each * n
        rest = max(grown, 0) - each * count
        if rest:
            self._unexplained[gpu_uuid] = self._unexplained.get(gpu_uuid, 0) + rest
        return rest

    def uncertainty(self, model_id: str) -> int:
        """Bytes of the model's figure another tenant may have caused (0 for Triton's own)."""
        entry = self.models.get(model_id)
        if entry is None or entry.source == "triton":
            return 0
        if entry.source == "process":
            return entry.share  # spread over the loads of its window: a neighbour's, perhaps
        if any(m.adopted for m in self._windowed(entry.gpu_uuid)):
            # Loaded before this agent started: nothing on its GPU was read from empty.
            return entry.bytes
        return max(self._unexplained.get(entry.gpu_uuid, 0), 0)

    def adopt(self, model_id: str, gpu_uuid: str, request: int) -> None:
        """A model already loaded when the agent started: counted at its request, so that its
        neighbours' loads are measured as shared, and never sure until its GPU has been empty."""
        if model_id not in self.models:
            self.models[model_id] = Measured(model_id, gpu_uuid, request, request, "nvml")
            self.models[model_id].adopted = True

    def record_load(
        self,
        model_id: str,
        gpu_uuid: str,
        request: int,
        used_before: int,
        used_after: int,
        reported: int | None,
        *,
        beside: tuple[str, ...] = (),
    ) -> tuple[Measured, Unexplained | None]:
        """A load finished (`used_before` was observed first; both readings `net`): its figure,
        and the growth of its window that could not be billed to it (None when there was none).
        `beside`: models unloaded during the window, which it is billed as loaded beside."""
        previous = self.models.get(model_id)
        if previous is not None:
            # A reload replaces the model in place: what it held before is its own, not the
            # GPU's baseline, and its figure is that plus the change.
            used_before -= previous.bytes
        growth = used_after - used_before
        # Models measured apart are others too: what escapes their figure may grow meanwhile.
        others = [m.model_id for m in self.on_gpu(gpu_uuid) if m.model_id != model_id]
        others += beside
        if not others:
            # Nothing else on the GPU could change during the window: what was there before is
            # not a model's, and the growth is this model's.
            self._baseline[gpu_uuid] = used_before
            self._unexplained[gpu_uuid] = 0
        if reported is not None:
            entry = Measured(model_id, gpu_uuid, request, reported, "triton", floor=reported)
        elif not others:
            entry = Measured(model_id, gpu_uuid, request, max(growth, 0), "nvml")
        else:
            entry = Measured(model_id, gpu_uuid, request, min(max(growth, 0), request), "nvml")
        self.models[model_id] = entry
        self._used[gpu_uuid] = used_after
        rest = growth - entry.bytes if others or reported is not None else 0
        self._unexplained[gpu_uuid] = self._unexplained.get(gpu_uuid, 0) + rest
        if not others or rest <= 0:
            return entry, None
        names = tuple(sorted(set(others)))
        total = self._unexplained[gpu_uuid]
        return entry, Unexplained(gpu_uuid, rest, total, names, during_load_of=model_id)

    def record_unload(self, model_id: str, used_before: int, used_after: int) -> None:
        """An unload finished, read before and after (`net`): what it did not free stays
        unexplained. A model measured apart freed what its processes held: they are gone."""
        entry = self.models.pop(model_id, None)
        if entry is None or entry.source == "process":
            return
        self._used[entry.gpu_uuid] = used_after
        if not self.on_gpu(entry.gpu_uuid):
            self._baseline[entry.gpu_uuid] = used_after
            self._unexplained[entry.gpu_uuid] = 0
            return
        kept = entry.bytes - (used_before - used_after)
        self._unexplained[entry.gpu_uuid] = self._unexplained.get(entry.gpu_uuid, 0) + kept

    def forget(self, model_id: str) -> None:
        """An unload that could not be read: the model's memory is taken to be freed."""
        entry = self.models.pop(model_id, None)
        if entry is not None and entry.source != "process":
            used = self._used.get(entry.gpu_uuid, 0)
            self._used[entry.gpu_uuid] = max(used - entry.bytes, 0)

    def observe(self, snapshot: GpuSnapshot) -> list[Unexplained]:
        """A new NVML reading of every GPU, except those with a load or unload in progress."""
        found = (self.observe_gpu(g) for g in snapshot.gpus if g.uuid not in self.loading)
        return [u for u in found if u is not None]

    def observe_gpu(self, gpu: GpuInfo) -> Unexplained | None:
        """A GPU's change since its last reading (`net`: what models measured apart hold, as
        last refreshed, is theirs) is its sole model's; on a GPU with several, it is unexplained
        (returned when it grew by more than the tolerance's minimum)."""
        if not gpu.healthy:
            return None
        used = self.net(gpu)
        self._used[gpu.uuid] = used
        models = self.on_gpu(gpu.uuid)
        if not models:
            self._baseline[gpu.uuid] = used
            self._unexplained[gpu.uuid] = 0
            return None
        baseline = self._baseline.setdefault(gpu.uuid, 0)
        if len(models) == 1 and models[0].source != "process":
            # Alone on its GPU: every change is its own. What is unexplained stays so, as the
            # figure's uncertainty: it may be what a neighbour grew, or left behind.
            sole = models[0]
            sole.bytes = max(used - baseline, sole.floor)
            return None
        before = self._unexplained.get(gpu.uuid, 0)
        now = used - baseline - self.attributed(gpu.uuid)
        self._unexplained[gpu.uuid] = now
        if now - before <= self.tolerance_min:
            return None
        names = tuple(sorted(m.model_id for m in models))
        return Unexplained(gpu.uuid, now - before, now, names)

    def unattributed(self, gpu_uuid: str) -> int:
        """Used bytes on the GPU that no model's figure (those measured apart included) and no
        baseline accounts for (may be < 0 while an unload is finishing)."""
        used = self._used.get(gpu_uuid, 0)
        return used - self._baseline.get(gpu_uuid, 0) - self.attributed(gpu_uuid)

    def allowed(self, request: int) -> int:
        return tolerance(request, self.tolerance_fraction, self.tolerance_min)

    def over(self) -> list[Excess]:
        """Models measured above their request by more than the tolerance, with how sure."""
        return [
            Excess(m, self.uncertainty(m.model_id))
            for m in self.models.values()
            if m.bytes > m.request + self.allowed(m.request)
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
