"""Processes on the node's GPUs that are not its Triton: found, counted and reported.

Every `--gpu-poll-seconds` NVML's running compute and graphics processes of each healthy GPU are
compared with Triton's process tree (`agent.gpus.processes`); any other PID is foreign: something
outside the binder's accounting holds that GPU. Each GPU's count is a metric, and each foreign
process gets one Warning Event `ForeignGPUProcess` on the Node (again only after it was gone).
NVML lists PIDs in the agent's PID namespace and leaves out the processes it cannot see there,
so the check sees the node pod's own processes, and every process on the GPUs only where the
node pod shares the host's PID namespace. Without Triton's PID nothing is checked.
Owns the comparison (`foreign`, pure) and its loop; NVML is `agent.gpus.nvml`'s, the API
`agent.kube.client`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Protocol, Unpack

from agent.errors import AgentError
from agent.gpus.inventory import GpuInfo, GpuSnapshot
from agent.gpus.nvml import GpuProcess, GpuReader
from agent.gpus.processes import TritonProcesses
from common.events import EventText

log = logging.getLogger(__name__)

EVENT_REASON = "ForeignGPUProcess"
REMEMBERED = 10_000


@dataclass(frozen=True)
class ForeignProcess:
    """A process on a GPU that is not Triton's."""

    gpu_index: int
    gpu_uuid: str
    pid: int
    used: int | None


class NodeEventWriter(Protocol):
    async def record_node_event(
        self, name: str, *, component: str, **said: Unpack[EventText]
    ) -> None: ...


def foreign(
    listed: Sequence[tuple[GpuInfo, Sequence[GpuProcess]]], triton: frozenset[int]
) -> list[ForeignProcess]:
    """The processes of `listed` (each GPU with NVML's processes) whose PID is not Triton's."""
    return [
        ForeignProcess(gpu.index, gpu.uuid, p.pid, p.used)
        for gpu, processes in listed
        for p in processes
        if p.pid not in triton
    ]


def describe(process: ForeignProcess) -> str:
    held = "memory NVML does not report" if process.used is None else f"{process.used} bytes"
    return (
        f"process {process.pid} holds {held} on GPU {process.gpu_index} ({process.gpu_uuid}) "
        f"and is not this node's Triton: only the tritonshare node pod may use a tritonshare "
        f"node's GPUs, and the binder does not count this memory; find the pod that runs it "
        f"(docs/runbooks.md, ForeignGPUProcess)"
    )


class ForeignWatch:
    """Checks the GPUs' processes every period; `counts` feeds the metric. `executor` runs the
    checks, which call NVML and read /proc (the agent's own thread: never the loop's default
    executor, which other work may fill)."""

    def __init__(
        self,
        reader: GpuReader,
        processes: TritonProcesses,
        kube: NodeEventWriter,
        node_name: str,
        *,
        period: float,
        executor: Executor,
    ) -> None:
        self._reader = reader
        self._processes = processes
        self._kube = kube
        self._node = node_name
        self._period = period
        self._executor = executor
        self._reported: set[tuple[str, int]] = set()
        self._counts: dict[tuple[str, str], int] = {}

    def check(self, snapshot: GpuSnapshot | None) -> list[ForeignProcess] | None:
        """Foreign processes now (blocking: NVML and /proc); None when Triton's PID is unknown."""
        if snapshot is None:
            return None
        tree = self._processes.tree()
        if tree is None:
            return None
        healthy = [g for g in snapshot.gpus if g.healthy]
        found = foreign([(g, self._reader.processes(g.index)) for g in healthy], tree.pids)
        counts = {(str(g.index), g.uuid): 0 for g in healthy}
        for process in found:
            counts[(str(process.gpu_index), process.gpu_uuid)] += 1
        self._counts = counts
        return found

    def counts(self) -> dict[tuple[str, str], int]:
        """(GPU index, UUID) -> foreign processes at the last check."""
        return dict(self._counts)

    async def report(self, found: Sequence[ForeignProcess]) -> None:
        """One Event per foreign process not reported while it lasted."""
        now = {(p.gpu_uuid, p.pid) for p in found}
        self._reported &= now
        if len(self._reported) >= REMEMBERED:
            self._reported.clear()
        for process in found:
            key = (process.gpu_uuid, process.pid)
            if key in self._reported:
                continue
            self._reported.add(key)
            message = describe(process)
            log.warning("Node %s: %s.", self._node, message)
            try:
                await self._kube.record_node_event(
                    self._node,
                    reason=EVENT_REASON,
                    message=message,
                    component="tritonshare-agent",
                )
            except AgentError as e:
                log.warning("Recording %s on node %s has failed: %s", EVENT_REASON, self._node, e)

    async def run(self, stop: asyncio.Event, snapshot: Callable[[], GpuSnapshot | None]) -> None:
        """Check every period until `stop`."""
        if not self._processes.known:
            log.info(
                "Triton's PID is not known (--triton-pid-file): GPU processes other than "
                "Triton's are not looked for."
            )
            return
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            try:
                found = await loop.run_in_executor(self._executor, self.check, snapshot())
            except AgentError as e:
                log.warning("Listing the GPUs' processes has failed (%s): trying again.", e)
                found = None
            if found is not None:
                await self.report(found)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._period)
