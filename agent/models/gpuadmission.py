"""GPU admission: one GPU's loads and unloads in turns, measured, admitted and billed.

A load on a GPU waits for that GPU's turn (`agent.gpus.gpuqueue`), reads the GPU, is admitted
against what the GPU's placements book (`agent.gpus.memory.admission_problem`; a load that does not
fit may first have room made, by a `MakeRoom` its caller passes), and is billed what it grew the
GPU by when its window closes (`agent.gpus.memory.MemoryLedger`). An unload runs in a window of
its own, which a load may share; a model measured apart (its own processes) loads beside the GPU's
other such loads and is billed what its processes hold. A turn past its budget is cut short
(LoadTimedOutError). What the agent does with a model around its load is `agent.models.nodemodels`'.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace

from agent.errors import LoadTimedOutError, ResourceExhaustedError
from agent.gpus.gpuqueue import GIB, GpuQueue, Turn, Work, load_budget
from agent.gpus.inventory import GpuInfo
from agent.gpus.memory import Unexplained, admission_problem, describe
from agent.models.apartgroups import ApartGroups
from agent.models.loadplan import LoadRequest
from agent.models.node import Node
from agent.pods.provenpods import Proven

__all__ = ["WAKE_FAILED_REASON", "GpuAdmission", "MakeRoom"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Billed:
    """A load to bill when its GPU's window closes."""

    name: str
    request: int
    reported: int | None
    model_id: str
    pod: str
    index: int


class _AloneError(Exception):
    """A load granted beside an unload cannot share its window (it does not fit without the
    unload's memory, or the unload has ended): it asks for its turn again, alone."""


@dataclass
class _Window:
    """One GPU's measured window (`GpuAdmission.window`): an unload's, a load's, or both."""

    before: GpuInfo | None = None
    """The GPU's reading when the window opened (after the evictions of a load that made room)."""
    before_net: int = 0
    """Its used bytes less what the models measured apart held then (`MemoryLedger.net`)."""
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once `before` is read (or its reading failed)."""
    members: int = 0
    closing: bool = False
    """Its last turn has left and it is being billed: no turn joins it."""
    unloads: list[tuple[str, int]] = field(default_factory=list)
    """The models unloaded in it, each with its figure as its unload began."""
    load: _Billed | None = None


WAKE_FAILED_REASON = "ModelWakeFailed"
"""The reason of the Warning Event on a pod whose sleeping model could not be woken."""


MakeRoom = Callable[[Proven, GpuInfo, str, bool], Awaitable[tuple[GpuInfo | None, str]]]
"""Makes room on a GPU for a load that does not fit (`agent.models.gpuroom.RoomMaker`): given
the load's owner, the GPU's reading, the admission's problem and whether it wakes the model, the
GPU's reading after and what still stands in the way ("" when it fits)."""


class GpuAdmission:
    """Every GPU's turns and measured windows on the node, and what loads are billed."""

    def __init__(self, node: Node, *, booked: Callable[[str, str], list[int]]) -> None:
        self.triton = node.triton
        self.limits = limits = node.limits
        self.ledger = ledger = node.ledger
        self._gpus = node.gpus
        self.metrics = metrics = node.metrics
        self._booked = booked
        """What every proven placement on a GPU holds but one pod's
        (`agent.models.gpuroom.Bookings.booked`)."""
        self.apart = node.apart if node.apart.known else None
        """Reads what models measured apart hold (None, Triton's processes unknown: every load
        keeps its GPU to itself)."""
        self.clock = node.clock
        self.budget = load_budget(
            limits.load_timeout_base, limits.load_timeout_per_gib, limits.load_timeout
        )
        self.queue = GpuQueue(self.budget, parallel=limits.parallel_loads)
        self.groups = (
            ApartGroups(ledger, self.apart, metrics, self.read_gpu) if self.apart else None
        )
        """Each GPU's loads measured apart under way (None: none is measured apart)."""
        self._granted: dict[int, asyncio.Future[None]] = {}
        """Turn number -> what its waiter awaits until the GPU queue grants it."""
        self._windows: dict[str, _Window] = {}
        """GPU UUID -> its measured window open now."""

    def timed_out(self, size: int, bound: float) -> LoadTimedOutError:
        return LoadTimedOutError(
            f"its load took longer than the {bound:g} s this node allows a model of "
            f"{size / GIB:.2f} GiB (--load-timeout-base-seconds plus "
            f"--load-timeout-per-gib-seconds per GiB of files, at most --load-timeout-seconds); "
            f"the agent abandoned and unloaded it: make the model load faster, or ask the "
            f"operator to raise those flags"
        )

    async def load_measured(
        self,
        request: LoadRequest,
        *,
        on_ready: Callable[[], None] | None = None,
        make_room: MakeRoom | None = None,
    ) -> None:
        """Load, admitted and measured when the model's GPU can be read: one load at a time per
        GPU (beside at most an unload, measured as one window with it), and the GPU's change
        since its last reading is observed first, so what grew before the load is not billed
        to it (`agent.gpus.memory` decides whose the window's growth is). `on_ready()` runs as soon
        as Triton answers the load READY, before it is measured."""
        if not request.uuid or request.index < 0:
            await self._load_on_cpu(request, on_ready)
            return
        if request.apart:
            try:
                await self._load_apart(request, on_ready)
                return
            except _AloneError:
                pass  # it does not fit as things are: a window of its own makes room, or refuses
        try:
            await self._load_in(request, on_ready, make_room)
        except _AloneError:
            # In line behind the unload, whose end frees what it needs.
            await self._load_in(request, on_ready, make_room, alone=True)

    async def _load_on_cpu(self, request: LoadRequest, on_ready: Callable[[], None] | None) -> None:
        """`load_measured` of a model on no GPU: within its time budget, not measured."""
        name, size = request.name, request.size
        bound = self.budget(Turn(0, "", Work.LOAD, name, request.owner.namespace, 0.0, size))
        timeout = asyncio.timeout(bound)
        try:
            async with timeout:
                await self.triton.load(name, request.override)
                if on_ready is not None:
                    on_ready()
        except TimeoutError as e:
            if not timeout.expired():
                raise
            raise self.timed_out(size, bound or 0.0) from e

    async def _load_in(
        self,
        request: LoadRequest,
        on_ready: Callable[[], None] | None,
        make_room: MakeRoom | None,
        alone: bool = False,
    ) -> None:
        """`load_measured` on a GPU; _AloneError when it was granted beside an unload and does
        not fit without that unload's memory."""
        name, owner, uuid, index, waking = (
            request.name,
            request.owner,
            request.uuid,
            request.index,
            request.waking,
        )
        model_id = owner.model_id
        work = Work.WAKE if waking else Work.LOAD
        window = self.window(uuid, work, name, owner.namespace, request.size, alone=alone)
        async with window as (shared, before, beside):
            if before is not None:
                problem = admission_problem(
                    before,
                    owner.request,
                    self._booked(uuid, owner.uid),
                    self.limits.gpu_mem_reserve,
                )
                if problem and beside:
                    raise _AloneError  # it needs what the unload beside it frees
                if problem and make_room is not None:
                    # Idle on-demand models of the GPU make room (`agent.models.eviction`), inside
                    # this turn: what they free is measured before this load begins.
                    before, problem = await make_room(owner, before, problem, waking)
                    shared.before = before
                    if before is not None:
                        shared.before_net = self.ledger.net(before)
                if problem and waking:
                    raise ResourceExhaustedError(
                        f"model {model_id!r} of pod {owner.key} cannot wake: {problem}; it "
                        f"stays asleep and its next request tries again",
                        event_reason=WAKE_FAILED_REASON,
                    )
                if problem:
                    raise ResourceExhaustedError(
                        f"model {model_id!r} of pod {owner.key} does not fit: {problem}; "
                        f"the pod stays unloaded, delete it so the binder places it again",
                        event_reason="InsufficientGPUMemory",
                    )
            await self.triton.load(name, request.override)
            if on_ready is not None:
                on_ready()
            reported = await self.triton.gpu_memory(name, index)
            shared.load = _Billed(name, owner.request, reported, model_id, owner.key, index)

    async def _load_apart(self, request: LoadRequest, on_ready: Callable[[], None] | None) -> None:
        """`load_measured` of a model measured apart: beside the GPU's other such loads, billed
        what its own processes hold once loaded, and its share of what the loads beside it
        grew the GPU by beyond that (`agent.models.apartgroups`); _AloneError when it does not
        fit beside the loads under way (a window of its own may make room)."""
        assert self.apart is not None and self.groups is not None
        name, owner, uuid, index = request.name, request.owner, request.uuid, request.index
        work = Work.WAKE if request.waking else Work.LOAD
        async with self.turn(uuid, work, name, owner.namespace, request.size, apart=True):
            reading = await self.read_gpu(uuid)
            if reading is not None:
                # What the loads under way have not allocated yet counts as used.
                seen = replace(
                    reading, memory_used=reading.memory_used + self.groups.under_way(uuid)
                )
                booked = self._booked(uuid, owner.uid)
                if admission_problem(seen, owner.request, booked, self.limits.gpu_mem_reserve):
                    raise _AloneError
            self.groups.join(uuid, name, owner.request, reading)
            loaded = False
            try:
                await self.triton.load(name, request.override)
                if on_ready is not None:
                    on_ready()
                held = await self.apart.held(index)
                if held is None:
                    log.warning(
                        "What model %s's processes hold on GPU %d cannot be read now: billed its "
                        "request until the next reading.",
                        name,
                        index,
                    )
                figure = owner.request if held is None else held.get(name, 0)
                entry = self.ledger.record_apart(name, uuid, owner.request, figure)
                loaded = True
                log.info(
                    "Model %s of pod %s uses %d bytes of GPU %d (%s) by its own processes; it "
                    "asked for %d.",
                    owner.model_id,
                    owner.key,
                    entry.bytes,
                    index,
                    uuid,
                    owner.request,
                )
            finally:
                await self.groups.leave(uuid, index, name, loaded=loaded)

    async def read_gpu(self, uuid: str) -> GpuInfo | None:
        """A fresh reading of the GPU, with what its models measured apart hold refreshed in
        the ledger (so that `MemoryLedger.net` of it is right)."""
        reading = await self._gpus.read_gpu(uuid)
        if reading is not None and self.apart is not None and self.ledger.apart(uuid):
            held = await self.apart.held(reading.index)
            if held is not None:
                self.ledger.refresh_apart(uuid, held)
        return reading

    @contextlib.asynccontextmanager
    async def turn(
        self,
        uuid: str,
        work: Work,
        name: str,
        namespace: str,
        size: int = 0,
        *,
        alone: bool = False,
        apart: bool = False,
    ) -> AsyncIterator[Turn]:
        """Hold the GPU's slot for one turn (or a load's beside an unload's, unless `alone`, or
        beside other loads measured `apart`), waiting as long as the GPU queue
        (`agent.gpus.gpuqueue`) says; a turn still at work past its budget is cut short
        (LoadTimedOutError) and the slot passed on."""
        turn = self.queue.ask(
            uuid, work, name, namespace, self.clock(), size, alone=alone, apart=apart
        )
        if not self.queue.granted(turn):
            granted = asyncio.get_running_loop().create_future()
            self._granted[turn.number] = granted
            try:
                await granted
            except BaseException:
                self._granted.pop(turn.number, None)
                self._pass_on(turn)
                raise
        try:
            deadline = self.queue.deadline_of(turn)
            if deadline is None:
                yield turn
            else:
                bound = deadline - self.clock()
                timeout = asyncio.timeout(bound)
                try:
                    async with timeout:
                        yield turn
                except TimeoutError as e:
                    if not timeout.expired():
                        raise
                    raise self.timed_out(size, self.budget(turn) or 0.0) from e
        finally:
            self._pass_on(turn)

    def _pass_on(self, turn: Turn) -> None:
        following = self.queue.done_all(turn, self.clock())
        for next_turn in (*following, self.queue.beside(turn.gpu)):
            granted = self._granted.pop(next_turn.number, None) if next_turn else None
            # A waiter cancelled meanwhile finds its turn granted and gives it back itself.
            if granted is not None and not granted.done():
                granted.set_result(None)

    @contextlib.asynccontextmanager
    async def window(
        self,
        uuid: str,
        work: Work,
        name: str,
        namespace: str = "",
        size: int = 0,
        *,
        alone: bool = False,
    ) -> AsyncIterator[tuple[_Window, GpuInfo | None, bool]]:
        """A measured window on one GPU: no other load or unload on it meanwhile, but for a load
        granted beside an unload (`agent.gpus.gpuqueue`), which shares the unload's window; its
        change since the last poll observed first (so it is not billed to what the window does), the
        GPU marked busy for the pollers, and what was loaded and unloaded in it billed when the last
        turn in it leaves. Yields the window, a fresh reading (None: unreadable) and whether the
        turn was granted beside an unload."""
        async with self.turn(uuid, work, name, namespace, size, alone=alone) as turn:
            beside = self.queue.beside(uuid) == turn
            window = self._windows.get(uuid)
            if window is not None and window.closing:
                raise _AloneError  # the unload it was granted beside is being billed: it has ended
            opens = window is None
            if window is None:
                window = self._windows[uuid] = _Window()
                self.ledger.loading.add(uuid)
            window.members += 1
            try:
                if opens:
                    try:
                        reading = window.before = await self.read_gpu(uuid)
                        if reading is not None:
                            window.before_net = self.ledger.net(reading)
                            self.unexplained(self.ledger.observe_gpu(reading))
                    finally:
                        window.opened.set()
                else:
                    await window.opened.wait()  # a reading before the opener's starts nothing
                    reading = await self.read_gpu(uuid)
                yield window, reading, beside
            finally:
                window.members -= 1
                if window.members == 0:
                    window.closing = True
                    try:
                        await self._bill(uuid, window)
                    finally:
                        del self._windows[uuid]
                        self.ledger.loading.discard(uuid)

    async def _bill(self, uuid: str, window: _Window) -> None:
        """Bill what a closed window loaded and unloaded on its GPU. An unload with a load beside
        it is taken to free its whole figure, and the load is billed as one beside other models
        (up to its request, the rest unexplained), so that what the unload kept, or freed late,
        is never billed past the load's request."""
        before, after = window.before, await self.read_gpu(uuid)
        if before is None or after is None:
            return
        beside = tuple(name for name, _ in window.unloads) if window.load else ()
        used, used_after = window.before_net, self.ledger.net(after)
        for name, figure in window.unloads:
            if beside:
                self.ledger.record_unload(name, used, used - figure)
                used -= figure
            else:
                self.ledger.record_unload(name, used, used_after)
        load = window.load
        if load is None:
            return
        entry, rest = self.ledger.record_load(
            load.name, uuid, load.request, used, used_after, load.reported, beside=beside
        )
        log.info(
            "Model %s of pod %s uses %d bytes of GPU %d (%s) by %s; it asked for %d.",
            load.model_id,
            load.pod,
            entry.bytes,
            load.index,
            uuid,
            "Triton's statistics" if entry.source == "triton" else "NVML",
            load.request,
        )
        self.unexplained(rest)

    def unexplained(self, growth: Unexplained | None) -> None:
        if growth is not None:
            self.metrics.gpu_memory_unexplained.labels(growth.gpu_uuid).inc(growth.grown)
            log.warning("%s.", describe(growth))

    async def unload_measured(self, name: str, work: Work) -> None:
        """Unload and wait until Triton has; on a measured GPU, in a window (a load may share
        it), read before and after so that what it did not free stays unexplained; a model
        measured apart, beside the GPU's loads measured apart (`_unload_apart`)."""
        entry = self.ledger.models.get(name)
        if entry is None:
            await self.triton.unload(name)
            await self.triton.wait_unloaded(name, self.limits.unload_timeout)
            return
        apart = entry.source == "process" and self.groups is not None
        if apart and await self._unload_apart(name, work, entry.gpu_uuid):
            return
        async with self.window(entry.gpu_uuid, work, name) as (window, _, _):
            # Measured apart, it was never in the GPU's net used memory the window reads.
            figure = 0 if entry.source == "process" else entry.bytes
            await self.triton.unload(name)
            await self.triton.wait_unloaded(name, self.limits.unload_timeout)
            window.unloads.append((name, figure))

    async def _unload_apart(self, name: str, work: Work, uuid: str) -> bool:
        """`unload_measured` of a model measured apart: its processes leave with what they hold,
        which the GPU's net used memory never counted, so it needs no window of the GPU's: it
        shares the slot with the GPU's loads measured apart (`agent.gpus.gpuqueue`) and is one
        of their group (`agent.models.apartgroups`), whose reading after its last member finds
        the driver's share of the unloaded processes gone with its bill. False when the GPU
        cannot be read now (the caller unloads in a window)."""
        assert self.groups is not None
        async with self.turn(uuid, work, name, "", apart=True):
            reading = await self.read_gpu(uuid)
            if reading is None:
                return False
            self.groups.join(uuid, name, 0, reading)
            try:
                await self.triton.unload(name)
                await self.triton.wait_unloaded(name, self.limits.unload_timeout)
                self.ledger.record_unload(name, 0, 0)  # its processes are gone
            finally:
                await self.groups.leave(uuid, reading.index, name, loaded=False)
        return True
