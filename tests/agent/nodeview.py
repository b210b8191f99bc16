"""What `agent.models.nodemodels.Models` reads of the node, for tests that build Models alone: a
CPU-only node (no GPU to read) and pods whose recorded owners are all alive or all gone."""

from __future__ import annotations

from agent.gpus.inventory import GpuInfo, GpuSnapshot
from agent.pods.ownership import OwnerRecord
from agent.pods.proofs import Proven


class NoGpus:
    """A node without GPUs (`Gpus`)."""

    @property
    def snapshot(self) -> GpuSnapshot | None:
        return None

    async def read_gpu(self, uuid: str) -> GpuInfo | None:
        return None


class OwnersAlive:
    """No other proven pod on the node; every recorded owner alive, or none (`Pods`)."""

    def __init__(self, alive: bool) -> None:
        self.alive = alive

    def all_proven(self) -> list[Proven]:
        return []

    async def owner_alive(self, owner: OwnerRecord) -> bool:
        return self.alive
