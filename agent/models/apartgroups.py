"""A GPU's loads measured apart, as one group from the first under way until the last has ended.

Models measured apart (`agent.gpus.apart`: Python's stubs) load beside each other on a GPU, each
billed what NVML lists for its own processes. NVML's per-process figure leaves out the driver's
part of each process's CUDA context (5.5-5.75 MiB a process on an H200), which the GPU's used
memory shows: so the GPU is read (`MemoryLedger.net`) before the group's first load and after its
last, and what it grew by beyond the processes' figures is billed to the group's models by their
processes (`MemoryLedger.share_apart`, capped a process). Unloads of models measured apart are
members too: their processes leave with their figures and their billed shares (the ledger drops
both as the unload ends), so the growth read over the group is still the loads' shares. Only such
turns share the GPU's slot meanwhile (`agent.gpus.gpuqueue`), so nothing else is loaded or
unloaded there across the group. `agent.models.gpuadmission` runs them and calls `join` and
`leave` around each.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from agent.gpus.apart import ApartMemory
from agent.gpus.inventory import GpuInfo
from agent.gpus.memory import MemoryLedger
from agent.metrics import AgentMetrics

log = logging.getLogger(__name__)


@dataclass
class ApartGroup:
    """One GPU's loads measured apart under way, and those loaded since the first began."""

    net_before: int | None
    """The GPU's net used bytes (`MemoryLedger.net`) before the first (None: not read)."""
    loading: dict[str, int] = field(default_factory=dict)
    """The loads (and unloads, at 0) under way, each with its request: admitted as if it were
    allocated."""
    loaded: list[str] = field(default_factory=list)
    """Those loaded and billed, which share the GPU's growth beyond their processes."""


class ApartGroups:
    """Every GPU's group of loads measured apart; `read_gpu` reads a GPU afresh, with what its
    models measured apart hold refreshed in the ledger."""

    def __init__(
        self,
        ledger: MemoryLedger,
        apart: ApartMemory,
        metrics: AgentMetrics,
        read_gpu: Callable[[str], Awaitable[GpuInfo | None]],
    ) -> None:
        self.ledger = ledger
        self.apart = apart
        self.metrics = metrics
        self._read_gpu = read_gpu
        self._groups: dict[str, ApartGroup] = {}

    def under_way(self, uuid: str) -> int:
        """Bytes the GPU's loads under way asked for (not allocated yet, perhaps)."""
        group = self._groups.get(uuid)
        return sum(group.loading.values()) if group is not None else 0

    def join(self, uuid: str, name: str, request: int, reading: GpuInfo | None) -> ApartGroup:
        """`name`'s load begins on the GPU (`reading`: the GPU read just before, for a group's
        first): the GPU's changes are the group's until its last load ends."""
        group = self._groups.get(uuid)
        if group is None:
            group = ApartGroup(None if reading is None else self.ledger.net(reading))
            self._groups[uuid] = group
        group.loading[name] = request
        self.ledger.loading.add(uuid)
        return group

    async def leave(self, uuid: str, index: int, name: str, *, loaded: bool) -> None:
        """`name`'s load has ended (`loaded`: billed); after the group's last, the GPU's growth
        beyond their processes is billed to those loaded."""
        group = self._groups[uuid]
        del group.loading[name]
        if loaded:
            group.loaded.append(name)
        if not group.loading:
            await self._close(uuid, index, group)

    async def _close(self, uuid: str, index: int, group: ApartGroup) -> None:
        try:
            reading = await self._read_gpu(uuid)
            listed = await self.apart.listed(index)
            if group.loading:
                return  # another joined meanwhile: the last of them closes the group
            if reading is None or listed is None or group.net_before is None:
                return
            grown = self.ledger.net(reading) - group.net_before
            counts = {name: listed.get(name, 0) for name in group.loaded}
            rest = self.ledger.share_apart(uuid, grown, counts)
            if rest > 0:
                self.metrics.gpu_memory_unexplained.labels(uuid).inc(rest)
                log.warning(
                    "GPU %d (%s) grew %d bytes beyond what the %d models loaded there at once "
                    "hold by their processes: %d of them could not be billed to them (more than "
                    "a driver's share a process).",
                    index,
                    uuid,
                    grown,
                    len(group.loaded),
                    rest,
                )
        finally:
            if not group.loading:
                self._groups.pop(uuid, None)
                self.ledger.loading.discard(uuid)
