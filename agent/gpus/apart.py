"""What each model measured apart holds on a GPU: NVML's per-process memory, summed over the
model's own processes.

A model whose backend runs it in processes of its own (Python's stubs, `common.backends`) holds
its GPU memory in those processes, and NVML lists each process's memory on each GPU: the sum
over the model's processes (`agent.gpus.processes` tells whose each stub is) is its figure,
exact whatever else loads or grows on the GPU meanwhile. NVML lists PIDs in the agent's PID
namespace, which the node pod shares with Triton (`agent.gpus.foreign`). Reads only; the
ledger (`agent.gpus.memory`) bills.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor

from agent.errors import AgentError
from agent.gpus.nvml import GpuReader
from agent.gpus.processes import TritonProcesses


class ApartMemory:
    """Reads, per GPU, what each model measured apart holds; `executor` runs the NVML calls (the
    agent's own thread: never the loop's default executor, which other work may fill)."""

    def __init__(
        self, reader: GpuReader, processes: TritonProcesses, *, executor: Executor
    ) -> None:
        self._reader = reader
        self._processes = processes
        self._executor = executor

    @property
    def known(self) -> bool:
        """Whether models can be measured apart at all: Triton's PID is known."""
        return self._processes.known

    def held_now(self, index: int) -> dict[str, int] | None:
        """Bytes each model's processes hold on GPU `index`, by the model's name in Triton
        (models with no process on it absent); None when that cannot be told now (Triton's
        processes unknown, NVML failing, or a process of a model whose memory NVML does not
        say)."""
        return self.held_on([index]).get(index)

    def held_on(self, indexes: list[int]) -> dict[int, dict[str, int]]:
        """`held_now` of each GPU of `indexes` (Triton's processes read once), those that can
        be told."""
        by_model = self._processes.by_model()
        if by_model is None:
            return {}
        found = {}
        for index in indexes:
            held = self._held(index, by_model)
            if held is not None:
                found[index] = held
        return found

    def listed_now(self, index: int) -> dict[str, int] | None:
        """How many of each model's processes NVML lists on GPU `index` (models with none
        absent); None when that cannot be told now."""
        by_model = self._processes.by_model()
        if by_model is None:
            return None
        try:
            listed = {p.pid for p in self._reader.processes(index)}
        except AgentError:
            return None
        counts = {name: len(pids & listed) for name, pids in by_model.items()}
        return {name: n for name, n in counts.items() if n}

    async def listed(self, index: int) -> dict[str, int] | None:
        """`listed_now` off the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.listed_now, index)

    def _held(self, index: int, by_model: dict[str, frozenset[int]]) -> dict[str, int] | None:
        try:
            listed = {p.pid: p.used for p in self._reader.processes(index)}
        except AgentError:
            return None
        held: dict[str, int] = {}
        for name, pids in by_model.items():
            used = [listed[pid] for pid in pids if pid in listed]
            if any(u is None for u in used):
                return None
            if used:
                held[name] = sum(u for u in used if u is not None)
        return held

    async def held(self, index: int) -> dict[str, int] | None:
        """`held_now` off the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.held_now, index)
