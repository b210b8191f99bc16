"""Room on a GPU: what its placements hold, and idle on-demand models put to sleep for a load.

A GPU's placements hold the larger of their request and what their model is measured to use, an
on-demand one only while its model is loaded (`Bookings`). A load that does not fit first puts
on-demand models of its GPU to sleep, idle ones or those past their namespace's share, inside
its own GPU turn (`RoomMaker`); which ones is `agent.models.evictor`'s and
`agent.models.eviction`'s, each eviction measured like any unload (`agent.models.gpuadmission`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from agent.errors import AgentError
from agent.gpus.inventory import GpuInfo
from agent.gpus.memory import MemoryLedger, admission_problem
from agent.models.eviction import Gpu, Loaded
from agent.models.evictor import Evictor
from agent.models.gpuadmission import GpuAdmission
from agent.models.node import Node
from agent.models.records import ModelRecords
from agent.phases import Event, Phase
from agent.pods.owners import Owners
from agent.pods.provenpods import Proven
from agent.quarantine.crashledger import CrashLedger

__all__ = ["Bookings", "RoomMaker"]

log = logging.getLogger(__name__)


class Bookings:
    """What the proven placements on each GPU hold."""

    def __init__(
        self,
        ownership: Owners,
        records: ModelRecords,
        ledger: MemoryLedger,
        all_proven: Callable[[], list[Proven]],
        *,
        clock: Callable[[], float],
        wall: Callable[[], float],
    ) -> None:
        self.ownership = ownership
        self.records = records
        self.ledger = ledger
        self._all_proven = all_proven
        """Every live pod of the node with a proven placement (`Pods.all_proven`)."""
        self.clock = clock
        self._wall = wall

    def booked(self, gpu_uuid: str, except_uid: str) -> list[int]:
        """What every proven placement on a GPU holds but one pod's: the larger of its request and
        what its model is measured to use."""
        held = []
        for proven in self._all_proven():
            if proven.gpu_uuid != gpu_uuid or proven.uid == except_uid:
                continue
            try:
                name = self.ownership.triton_name(proven)
            except AgentError:
                name = ""  # no model of it can be loaded here: its request alone counts
            owner = self.ownership.store.get(name)
            mine = owner is not None and owner.uid == proven.uid
            if proven.on_demand and not (mine and self.records.held_loaded(name)):
                continue  # asleep, or not loaded yet: it takes room only once loaded
            held.append(max(proven.request, self.ledger.measured(name) if mine else 0))
        return held

    def held_on(self, gpu_uuid: str, except_uid: str) -> dict[str, tuple[Loaded, Proven]]:
        """What every proven placement on a GPU holds but one pod's, as `booked` counts it, by
        name in Triton, for the eviction rule."""
        held = {}
        now, wall = self.clock(), self._wall()
        for proven in self._all_proven():
            if proven.gpu_uuid != gpu_uuid or proven.uid == except_uid:
                continue
            try:
                name = self.ownership.triton_name(proven)
            except AgentError:
                continue
            owner = self.ownership.store.get(name)
            mine = owner is not None and owner.uid == proven.uid
            if proven.on_demand and not (mine and self.records.held_loaded(name)):
                continue
            record = self.records.get(name)
            touched = record.last_activity if record else now
            # A refused or lost load is booked but holds nothing to free: not a victim.
            resting = proven.on_demand and not (record and record.life.phase is Phase.READY)
            held[name] = (
                Loaded(
                    name,
                    proven.namespace,
                    proven.model_id,
                    max(proven.request, self.ledger.measured(name) if mine else 0),
                    proven.on_demand,
                    busy=self.records.is_busy(name) or resting,
                    last_used=wall - (now - touched),
                ),
                proven,
            )
        return held


class RoomMaker:
    """Puts on-demand models of a GPU to sleep so that a load fits."""

    def __init__(
        self,
        node: Node,
        evictor: Evictor,
        bookings: Bookings,
        admission: GpuAdmission,
        records: ModelRecords,
        crashes: CrashLedger,
    ) -> None:
        self.evictor = evictor
        self.bookings = bookings
        self.admission = admission
        self.records = records
        self.triton = node.triton
        self.ledger = node.ledger
        self.limits = node.limits
        self._gpus = node.gpus
        self.crashes = crashes
        self.host = node.host

    async def make_room(
        self, owner: Proven, gpu: GpuInfo, problem: str, waking: bool
    ) -> tuple[GpuInfo | None, str]:
        """Put on-demand models of the owner's GPU to sleep until its load fits (idle ones,
        or those past their namespace's share), as `agent.models.eviction` chooses; inside the
        load's GPU turn, holding the lock of the model to load, after admission found `problem`. The
        GPU's reading after, and what still stands in the way ("" when it fits)."""
        reserve = self.limits.gpu_mem_reserve
        capacity = gpu.memory_total - reserve
        booked = sum(self.bookings.booked(gpu.uuid, owner.uid))
        needed = max(booked + owner.request - capacity, owner.request - (gpu.memory_free - reserve))
        held = self.bookings.held_on(gpu.uuid, owner.uid)
        if not any(m.on_demand for m, _ in held.values()):
            return gpu, problem  # nothing on the GPU may ever make room
        label = f"GPU {gpu.index} ({gpu.uuid})"
        claim = owner.request if owner.on_demand else 0
        choice = self.evictor.choose(
            Gpu(label, capacity), [m for m, _ in held.values()], owner.namespace, needed, claim
        )
        if choice.problem:
            return gpu, f"{problem}, and no room can be made: {choice.problem}"
        why = f"a {'wake' if waking else 'load'} of another model needed it"
        for victim in choice.victims:
            if self.records.is_busy(victim.name):
                continue  # taken by an operation meanwhile: the check below tells
            try:
                await self.evict(victim.name, gpu.uuid)
            except AgentError as e:
                log.warning("Putting idle model %s to sleep failed: %s", victim.name, e)
                return await self._gpus.read_gpu(gpu.uuid), (
                    f"an idle model on {label} could not be put to sleep to make room"
                )
            _, proven = held[victim.name]
            self.evictor.evicted(
                victim,
                proven.key,
                proven.uid,
                why,
                waking,
                reclaimed=victim.name in choice.reclaimed,
            )
        after = await self.admission.read_gpu(gpu.uuid)
        if after is None:
            return None, ""
        self.admission.unexplained(self.ledger.observe_gpu(after))
        booked_after = self.bookings.booked(gpu.uuid, owner.uid)
        return after, admission_problem(after, owner.request, booked_after, reserve)

    async def evict(self, name: str, uuid: str) -> None:
        """Put the on-demand model `name` to sleep inside a turn already held on its GPU
        (`uuid`), measured like any unload. Takes its lock, which nothing holds (checked)."""
        async with self.records.lock(name):
            record = self.records.record(name)
            if not record.life.held_loaded:
                return
            self.records.step(name, record, Event.UNLOAD_STARTED)
            try:
                before = await self.admission.read_gpu(uuid)
                before_net = None if before is None else self.ledger.net(before)
                await self.triton.unload(name)
                await self.triton.wait_unloaded(name, self.limits.unload_timeout)
                after = await self.admission.read_gpu(uuid)
            except BaseException:
                self.records.step(name, record, Event.UNLOAD_FAILED)
                raise
            if before_net is not None and after is not None:
                self.ledger.record_unload(name, before_net, self.ledger.net(after))
            self.ledger.forget(name)
        self.host.forget(name)
        self.crashes.answered(name)
        self.records.step(name, record, Event.UNLOADED)
        self.records.step(name, record, Event.IDLE)
