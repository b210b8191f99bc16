"""The node as the agent's model operations see it: Triton and its repository, the node's policy,
its GPUs, what each model is billed of them and of Triton's host memory, the metrics and clocks.

`agent.app` builds each of these once; `agent.models.nodemodels.Models` hands the one `Node` to
the parts it composes (`agent.models.loads`, `agent.models.gpuroom`), which read and call them.
What it must not do: hold state of its own, or decide anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from agent.gpus.apart import ApartMemory
from agent.gpus.inventory import GpuInfo, GpuSnapshot
from agent.gpus.memory import MemoryLedger
from agent.installs.limits import ModelLimits
from agent.installs.repository import Repository
from agent.metrics import AgentMetrics
from agent.models.tritonram import HostMemory
from agent.triton import TritonClient

__all__ = ["Gpus", "Node"]


class Gpus(Protocol):
    """The node's GPUs as model operations see them (`agent.status.node.NodePublisher`)."""

    @property
    def snapshot(self) -> GpuSnapshot | None:
        """The latest reading of every GPU; None before the first."""

    async def read_gpu(self, uuid: str) -> GpuInfo | None:
        """A fresh reading of one GPU, by UUID; None when it is not on the node."""


@dataclass(frozen=True)
class Node:
    """What every part of the node's model operations reads or calls, and none owns."""

    triton: TritonClient
    repository: Repository
    """The model files Triton loads (`agent.installs.repository`)."""
    limits: ModelLimits
    """The node's policy for models."""
    gpus: Gpus
    ledger: MemoryLedger
    """What each loaded model is billed of its GPU (`agent.gpus.memory`)."""
    host: HostMemory
    """Admits loads on Triton's host memory and bills them (`agent.models.tritonram`): with no
    limit or no Triton PID known, every load goes unmeasured."""
    apart: ApartMemory
    """What models measured apart hold (`agent.gpus.apart`): with no Triton PID known, no model
    is measured apart."""
    metrics: AgentMetrics
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    """Unix seconds: what is written down or compared with another process's times."""
