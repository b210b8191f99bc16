"""The concurrency limit on inference requests, its bounded queue, and concurrency accounting.

A request takes a slot (`acquire`) before it is forwarded and gives it back (`release`) when its
answer is complete. With the limit reached, a request waits in a FIFO queue of bounded size for at
most the queue timeout; a full queue or a timeout refuses it at once with a clear message, which
the transports answer as 503 / RESOURCE_EXHAUSTED. A freed slot is handed straight to the oldest
waiter, so a newcomer can never overtake the queue. Under the gateway's node budget a slot also
belongs to the pod's namespace (`policy.inflight`): a freed one goes back to it, and it hands it
to its pods in turn (`grant`), a pod's oldest waiter first.

It also integrates the requests it holds over time (request-seconds), each from its arrival to
its end, whether in flight or waiting for a slot, as Knative's queue-proxy counts concurrency:
`rate()` of that counter in Prometheus is the time-weighted average concurrency, the metric
KServe/Knative users scale on. Requests that wait count, so a replica at its limit shows the
demand beyond it and an autoscaler adds replicas for it.
The clock is injected, so the accounting is tested without sleeping. No I/O here.

Every relayed request passes here twice, with or without a limit (0: unlimited still counts), so
the accounting costs one clock read and two additions per step: the area is kept as sums of start
and end times (`_starts`, `_ends`) and folded into `_area` at most once a second, at a checkpoint,
rather than integrated on every step.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from proxy.policy.probation import HELD_REQUEST_SECONDS, Turns
from proxy.policy.refusals import HeldError, OverloadedError, ProxyError, QueueTimeoutError
from proxy.policy.share import LoopShare


class NodeBudget(Protocol):
    """What a limiter needs of the budget its limit is a share of (`policy.inflight`, which
    imports this module, not the other way round)."""

    def woke(self, limiter: Limiter) -> None:
        """`limiter`'s pod starts sending: its limit may change before it takes a slot."""

    def take(self, limiter: Limiter) -> bool:
        """One of the slots of `limiter`'s namespace, if one is free and none of its pods
        waits for one (False: `limiter` must queue)."""

    def waiting(self, limiter: Limiter) -> None:
        """`limiter` has a request queued: it takes a turn at its namespace's next free slot."""

    def released(self, limiter: Limiter) -> None:
        """`limiter` gave a slot back: its namespace hands it to its pods in turn."""


class Sleeper(Protocol):
    """What a limiter needs of an on-demand model's residency (`proxy.residency`, which
    imports this module, not the other way round)."""

    asleep: bool
    """True while the model is not loaded: requests wake it before they take a slot."""

    async def wake(self) -> None:
        """Return once the model is loaded; raise a `refusals.WakeError` when it cannot be."""


class Limiter:
    """In-flight limit (0 = unlimited), queue, and time-weighted concurrency."""

    def __init__(
        self,
        limit: int,
        queue_limit: int,
        queue_timeout: float,
        *,
        window: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        """The limit now: `own_limit`, or less while the node's budget is split among several
        sending pods (`policy.inflight`)."""
        self.own_limit = limit
        self.queue_limit = queue_limit
        self.queue_timeout = queue_timeout
        self.window = window
        self._clock = clock
        self.share: LoopShare | None = None
        """The pod's share of the event loop that serves it beside other pods (the node
        gateway's, `policy.share`): its connections charge their reads to it and stop reading
        while it is paused. None where the loop serves one pod (the proxy)."""
        self.node: NodeBudget | None = None
        """The node's in-flight budget this pod's limit is a share of (the gateway's); None in a
        proxy, or where the gateway has no node budget."""
        self.sending = False  # counted by `node` as sending
        self.last = 0.0  # when a request of it last took a slot (went to Triton)
        self.left = 0.0  # when a request last left (answered, or gave up waiting)
        self.refusal: ProxyError | None = None
        """Set: every request is refused with it, none takes a slot (a quarantined pod at the
        node gateway)."""
        self.unready = ""
        """Set: the pod's readiness calls are answered not ready, saying this, and its other
        calls are served (a model pod the node gateway takes out of its Service while the node
        pod stops, `common.callers.Caller.stopping`)."""
        self.probation: Turns | None = None
        """Set: the pod is on probation at the node gateway, and a request of it goes to Triton
        only in the pod's turn in this lane (`policy.probation`; a pod with several limiters,
        a model host, takes its turns as one: `PodTurns`)."""
        self._hold: asyncio.Event | None = None
        self._hold_after_restore = True
        """Set while the pod is held (`hold`): a new request waits for the event first."""
        self.hold_seconds = HELD_REQUEST_SECONDS
        self.on_held: Callable[[str, float], None] | None = None
        """Told of each request a hold kept: how it ended (`policy.probation.HELD_OUTCOMES`)
        and the seconds it was held."""
        self._trial: HeldError | None = None
        """Set while the pod is held for a suspect's trial (`hold`): a new request is refused
        with it instead of held."""
        self.restoring: asyncio.Event | None = None
        """Set while Triton comes back from an exit and the model is not READY in it again (the
        node gateway's `gateway.restore`): a new request waits for the event first, at most
        `restore_seconds`, so that it finds its model loaded again rather than missing."""
        self.restore_seconds = 0.0
        self.on_unknown: Callable[[], bool] | None = None
        """The node gateway's (`gateway.restore.Restore.missing`): told when Triton answered a
        request of the model that it has no such model, which the gateway's table serves; True
        when that Triton was started again (the model is held until READY), and the relay then
        answers the request as unanswered (`Tritonshare-Unanswered`): Triton did not run it.
        None in a proxy."""
        self.in_flight = 0
        self.held = 0
        """Requests here now: in flight or waiting for a slot (what the area integrates)."""
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.residency: Sleeper | None = None
        """The on-demand model's residency (the proxy's, with --residency on-demand): a request
        finding it asleep waits for its wake first. None: the model is always loaded."""
        # Request-seconds up to now: _area + _ends - _starts + held * now. _area holds what was
        # folded in at self._since; since then, _starts sums the arrival times of requests (and
        # self._since once per request then held), _ends the times they left.
        self._area = 0.0
        self._since = clock()
        self._starts = 0.0
        self._ends = 0.0
        # (time, area) checkpoints, at most one a second, for the windowed average.
        self._checkpoints: deque[tuple[float, float]] = deque([(self._since, 0.0)])
        self._next_checkpoint = self._since + 1.0

    @property
    def queued(self) -> int:
        """Requests waiting for a slot."""
        return len(self._waiters)

    def _account(self, now: float) -> None:
        """Fold the sums into the area at `now`, and checkpoint when a second has passed."""
        self._area += self._ends - self._starts + self.held * now
        self._starts = self.held * now
        self._ends = 0.0
        self._since = now
        if now - self._checkpoints[-1][0] >= 1.0:
            self._checkpoints.append((now, self._area))
            self._next_checkpoint = now + 1.0
            horizon = now - self.window
            while len(self._checkpoints) > 1 and self._checkpoints[1][0] <= horizon:
                self._checkpoints.popleft()

    def try_acquire(self) -> bool:
        """Take a slot if one is free and nobody waits; never waits itself, and never takes one
        while the pod is held (`acquire` waits for the hold first)."""
        return self._hold is None and self.restoring is None and self._try_take()

    def _try_take(self) -> bool:
        if self.refusal is not None:
            return False
        if not self.sending and self.node is not None:
            self.node.woke(self)  # may change the limit: first
        residency = self.residency
        if residency is not None and residency.asleep:
            return False  # `acquire` wakes the model first
        if self.limit == 0 or (self.in_flight < self.limit and not self._waiters):
            lane = self.probation
            if lane is not None and not lane.enters(self):
                return False
            if self.node is not None and not self.node.take(self):
                if lane is not None and lane.holds(self) and not self.in_flight:
                    lane.freed(self)  # no slot of its namespace: the turn passes on
                return False
            now = self._clock()
            self.last = now
            self._starts += now
            self.in_flight += 1
            self.held += 1
            if now >= self._next_checkpoint:
                self._account(now)
            return True
        return False

    @property
    def holding(self) -> bool:
        """Whether the pod's new requests are held (`hold`, `restoring`)."""
        return self._hold is not None or self.restoring is not None

    def hold(self, on: bool, *, trial: bool = False, after_restore: bool = True) -> None:
        """Hold the pod's new requests (`on`) or let them go: a probationer's while a load
        the agent watches is in flight or just ended (`policy.probation`), any pod's through a
        suspected file's trial; with `trial` (a suspect's load in flight or settling), refuse
        them instead. Not `after_restore` (a pod not on probation), a request held until its
        model is back after Triton's exit is not held again."""
        self._hold_after_restore = after_restore
        self._trial = (
            HeldError(
                "the pod is on probation on this node (its requests were at Triton when it "
                "exited beside another's), and a model under suspicion is loading or settling "
                "there: its requests are refused until that model has proved itself, so that an "
                "exit of Triton meanwhile is not blamed on them; retry shortly"
            )
            if on and trial
            else None
        )
        if on and self._hold is None:
            self._hold = asyncio.Event()
        elif not on and self._hold is not None:
            self._hold.set()
            self._hold = None

    async def _wait_held(self, event: asyncio.Event, seconds: float) -> None:
        """Wait for `event`, at most `seconds` (then the request goes on all the same: a hold
        delays, it never refuses), counted as concurrency meanwhile; a probation hold's
        (`hold`) tells `on_held` how it ended, "released" or "timed_out", and how long."""
        told = self.on_held if event is self._hold else None  # decided now: the hold may end
        started = self._clock()
        self._starts += started
        self.held += 1
        outcome = "released"
        try:
            async with asyncio.timeout(seconds):
                await event.wait()
        except TimeoutError:
            outcome = "timed_out"
        finally:
            now = self._clock()
            self._left(now)
            if told is not None:
                told(outcome, now - started)

    async def acquire(self) -> None:
        """Take a slot, waiting in the queue if needed; raise when refused. A request for a
        model Triton has not loaded again since an exit first waits for it (at most
        `restore_seconds`; one queued for a slot when the exit came, once it has its slot), a
        request for an asleep model for its wake, and a held pod's for
        the hold's end (at most `hold_seconds` from its arrival, a restore's wait before
        included; then for a restore begun meanwhile), held
        (counted as concurrency) meanwhile."""
        arrived = self._clock()
        restoring = self.restoring
        if restoring is not None and self.refusal is None:
            await self._wait_held(restoring, self.restore_seconds)  # READY in Triton again
        if self._hold is not None and self.refusal is None:
            if self._trial is not None:
                if self.on_held is not None:
                    self.on_held("refused", 0.0)
                raise self._trial
            if restoring is None or self._hold_after_restore:
                # A pod not on probation whose request waited out a restore goes on: a
                # suspect's trial waits for the restores to end and for what they let go to be
                # answered (`common.activity.Activity.restoring`), and two holds in a row would
                # outlast its client's patience. A probationer's is held what is left of
                # `hold_seconds` since it arrived: the restore before counts, or a hold through
                # loads in a row (a crasher's) would come on top of it.
                left = self.hold_seconds - (self._clock() - arrived)
                await self._wait_held(self._hold, max(left, 0.0))
                after = self.restoring
                if after is not None and self.refusal is None:
                    # Triton went away while it was held (the load it was held for killed it,
                    # say): it waits for its model to be back rather than fail at a dead Triton,
                    # where the gateway's witness would count it beside the exit.
                    await self._wait_held(after, self.restore_seconds)
        residency = self.residency
        if residency is not None and residency.asleep:
            self._starts += self._clock()
            self.held += 1
            try:
                await residency.wake()
            finally:
                self._left(self._clock())
        if self._try_take():
            return
        if self.refusal is not None:
            raise self.refusal
        if len(self._waiters) >= self.queue_limit:
            raise OverloadedError(
                f"the model is at its concurrency limit ({self.limit} in flight) and its queue "
                f"is full ({self.queue_limit} waiting); retry later or scale the model out"
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._starts += self._clock()  # a waiting request counts from its arrival
        self.held += 1
        if self.probation is not None:
            self.probation.wait(self)  # may hand it the lane, and the waiter a slot, at once
        if self.node is not None:
            self.node.waiting(self)
        try:
            async with asyncio.timeout(self.queue_timeout):
                await waiter
        except (TimeoutError, asyncio.CancelledError) as e:
            if waiter.done() and not waiter.cancelled():
                # The slot was handed over just as we gave up: pass it on, do not leak it.
                self.release()
            else:
                if waiter in self._waiters:  # `release` drops a cancelled waiter it meets
                    waiter.cancel()
                    self._waiters.remove(waiter)
                self._left(self._clock())
                lane = self.probation
                if lane is not None and not self.in_flight and not self._waiters:
                    lane.freed(self)  # a turn with nothing left to send passes on
            if isinstance(e, TimeoutError):
                raise QueueTimeoutError(
                    f"the request waited {self.queue_timeout:g} s for one of the model's "
                    f"{self.limit} concurrency slots and timed out; retry later or scale out"
                ) from None
            raise
        restoring = self.restoring
        if restoring is not None and self.refusal is None:
            # Triton exited while it waited in the queue: it keeps its slot until its model is
            # READY again (at most `restore_seconds`), not sent to a Triton without the model.
            try:
                async with asyncio.timeout(self.restore_seconds):
                    await restoring.wait()
            except TimeoutError:
                pass
            except asyncio.CancelledError:
                self.release()
                raise

    def release(self) -> None:
        """Give a slot back, handing it to the oldest waiter if there is one (and the limit,
        which may have shrunk meanwhile, still has room for it). Under a node budget the slot
        goes back to the pod's namespace instead, which hands it to its pods in turn."""
        lane = self.probation
        if self.node is not None:
            self.in_flight -= 1
            self._left(self._clock())
            self.node.released(self)
            if lane is not None and not self.in_flight:
                lane.freed(self)
            return
        while (
            self._waiters
            and (self.limit == 0 or self.in_flight <= self.limit)
            and (lane is None or lane.enters(self))
        ):
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot changes hands; in_flight is unchanged
                self.last = now = self._clock()
                self._left(now)
                return
        self.in_flight -= 1
        self._left(self._clock())
        if lane is not None and not self.in_flight:
            lane.freed(self)

    def _left(self, now: float) -> None:
        """One request is no longer held (answered, or gave up waiting)."""
        self.left = now
        self._ends += now
        self.held -= 1
        if now >= self._next_checkpoint:
            self._account(now)

    def grant(self) -> bool:
        """Hand a slot of the namespace to the oldest live waiter, if the pod's own limit has
        room for it (False: it took nothing)."""
        if self.limit and self.in_flight >= self.limit:
            return False
        lane = self.probation
        if lane is not None and not lane.enters(self):
            return False  # not its turn at Triton: the lane re-queues it when it is
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.in_flight += 1  # held since it arrived: counted then
                self.last = self._clock()
                waiter.set_result(None)
                return True
        return False

    def set_limit(self, limit: int) -> None:
        """Change the limit (0: none); room it opens goes to the oldest waiters at once (under
        a node budget, when its namespace next deals its slots)."""
        self.limit = limit
        if self.node is not None:
            return
        while (
            self._waiters
            and (limit == 0 or self.in_flight < limit)
            and (self.probation is None or self.probation.enters(self))
        ):
            waiter = self._waiters.popleft()
            if waiter.done():
                continue
            self.in_flight += 1  # held since it arrived: counted then
            self.last = self._clock()
            waiter.set_result(None)

    def lane_opened(self) -> None:
        """The probation lane is this pod's turn: its oldest waiters take slots (under a node
        budget, as its namespace deals them)."""
        if self.node is not None:
            self.node.waiting(self)
        else:
            self.set_limit(self.limit)

    def concurrency_seconds(self) -> float:
        """Held requests (in flight or waiting) integrated over time since start, in
        request-seconds."""
        self._account(self._clock())
        return self._area

    def average_concurrency(self) -> float:
        """Time-weighted average of held requests over about the last `window` seconds."""
        now = self._clock()
        self._account(now)
        # The newest checkpoint at or before the window's start (pruning keeps one), else the
        # oldest: the average then spans a little more than the window, never less.
        start_time, start_area = self._checkpoints[0]
        for checkpoint in self._checkpoints:
            if checkpoint[0] > now - self.window:
                break
            start_time, start_area = checkpoint
        span = now - start_time
        if span <= 0:
            return float(self.held)
        return (self._area - start_area) / span
