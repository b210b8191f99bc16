"""The node's NVML readings handed to the GPU memory ledger.

The node publisher (`agent.status.node`) reads NVML on its own thread; the ledger
(`agent.gpus.memory`) belongs to the event loop, which changes it around loads. So each good
reading is taken with what the models measured apart hold at that moment (their processes'
figures, read on the same thread) and handed to the loop, where the ledger observes it: growth
no model explains is counted and logged, and a model over its request asks the reconciler for a
pass now. A GPU with a load or unload measured apart under way keeps its figures until the load
is billed. Before the loop runs (at start), a reading is applied at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from agent.gpus.apart import ApartMemory
from agent.gpus.inventory import GpuSnapshot
from agent.gpus.memory import MemoryLedger, describe
from agent.metrics import AgentMetrics

log = logging.getLogger(__name__)


class MemoryReadings:
    """Hands each NVML reading to the ledger on `loop`; sets `over` when a model is over its
    request."""

    def __init__(
        self, ledger: MemoryLedger, apart: ApartMemory, metrics: AgentMetrics, over: asyncio.Event
    ) -> None:
        self.ledger = ledger
        self.apart = apart
        self.metrics = metrics
        self.over = over
        self.loop: asyncio.AbstractEventLoop | None = None
        """The loop the ledger belongs to (None: not running yet)."""

    def observe(self, snapshot: GpuSnapshot) -> None:
        """Called where NVML was read (its own thread)."""
        apart: dict[int, dict[str, int]] = {}
        if self.apart.known:
            # Read here with the snapshot: what models measured apart hold is theirs.
            apart = self.apart.held_on([g.index for g in snapshot.gpus if g.healthy])
        if self.loop is None:
            self.apply(snapshot, apart)
            return
        with contextlib.suppress(RuntimeError):  # the loop is closing at shutdown
            self.loop.call_soon_threadsafe(self.apply, snapshot, apart)

    def apply(self, snapshot: GpuSnapshot, apart: dict[int, dict[str, int]] | None = None) -> None:
        """The reading, on the ledger's loop."""
        for gpu in snapshot.gpus:
            if apart and gpu.index in apart and gpu.uuid not in self.ledger.loading:
                self.ledger.refresh_apart(gpu.uuid, apart[gpu.index])
        for growth in self.ledger.observe(snapshot):
            self.metrics.gpu_memory_unexplained.labels(growth.gpu_uuid).inc(growth.grown)
            log.warning("%s.", describe(growth))
        if self.ledger.over():
            self.over.set()
