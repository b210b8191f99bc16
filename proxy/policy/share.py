"""Each calling pod's share of the one event loop that serves them all (the node gateway's).

The gateway reads every pod's sockets on one event loop. A pod that sends as fast as Triton
answers, within its in-flight limit, would otherwise take as many of the loop's turns as it has
ready sockets: every other pod's request then waits behind a whole turn of its work, and the
node's CPUs run its flood. So the loop's time is dealt out in rounds of `ROUND` seconds, and each
pod is charged the CPU time the loop spends reading its sockets (`LoopShare.charge`, the loop
thread's CPU clock read around each read: wall time would charge a pod for the moments the OS
ran other processes, and make it owe rounds it never used). While more than one pod is active
(read from in the last `ACTIVE` seconds), a pod that has spent its budget for the round has its
sockets' reading paused until a round covers what it owes (one long read can take more than a
round's budget): its next requests wait in its own kernel socket buffers, not in the loop, and it
holds nothing more here. Its budget is the larger of

- its fair share, split by namespace first: `ROUND / N / n` with N namespaces active and n
  pods of its namespace among them (so a namespace's many pods share what one pod of another
  namespace has), and
- what the others left of `busy_share x ROUND` in the last round (`busy_share x ROUND` minus
  their reading then), so a pod beside idle or light neighbours is not held to 1/N,

and a pod alone is never paused: its budget is unbounded (work-conserving when nobody else
wants the loop). `busy_share` below 1 keeps part of each round free while others are active, so
a neighbour's request finds the loop between turns instead of behind one.

The same pause serves the node's byte budget (`policy.holdings`): each read's size is counted
against the pod's allowance, and past it the budget is asked, which may `hold` the pod's reading
until it `release`s it; a pod held so stays paused across rounds.

Pure policy: the clock and the timer that ends a paused round are injected; what pausing means
(the relays' sockets stop reading) is the pod's `on_pause` / `on_resume`. In a proxy, which
serves one pod, there is no share at all (`Limiter.share` is None).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Final

ROUND: Final = 0.010
"""Seconds of one round: the longest a paused pod waits, and about the longest a neighbour's read
waits behind one pod's turn."""
ACTIVE: Final = 0.5
"""A pod read from within this many seconds counts as wanting the loop."""

UNLIMITED: Final = 1 << 62
"""The allowance of a pod when the gateway has no byte budget: never reached."""

Timer = Callable[[float, Callable[[], None]], object]
"""Run the callback after this many seconds (the loop's `call_later`)."""


class LoopShare:
    """One pod's share: what it spent this round, and whether its reading is paused."""

    __slots__ = (
        "_shares",
        "allowance",
        "budget",
        "cpu",
        "fair",
        "held",
        "last",
        "namespace",
        "on_pause",
        "on_resume",
        "paused",
        "pauses",
        "previous",
        "read",
        "seconds",
        "spent",
    )

    def __init__(
        self,
        shares: LoopShares,
        on_pause: Callable[[], None],
        on_resume: Callable[[], None],
        namespace: str = "",
    ) -> None:
        self._shares = shares
        self.namespace = namespace
        self.cpu = shares.cpu  # the relays read it around each read
        self.on_pause = on_pause
        self.on_resume = on_resume
        self.spent = 0.0  # seconds of reading in this round (and what it still owes)
        self.previous = 0.0  # in the round before it
        self.budget = math.inf  # set when a round begins (a newcomer is unbounded until then)
        self.fair = math.inf  # the part of the round it is sure of, whatever the others spend
        self.last = -math.inf  # when it was last read from
        self.paused = False
        self.pauses = 0  # times paused, for the metrics
        self.seconds = 0.0  # reading charged in all, for the metrics
        # The node's byte budget (`policy.holdings`): bytes read from the pod since its holdings
        # were last measured, how many it may read before the budget is asked again, and whether
        # the budget stopped its reading (apart from the loop's rounds).
        self.read = 0
        self.allowance = shares.allowance
        self.held = False

    def charge(self, started: float, ended: float, size: int = 0) -> None:
        """The loop read `size` bytes of this pod's socket from CPU time `started` to `ended`
        (`LoopShares.cpu`)."""
        shares = self._shares
        now = shares.clock()
        self.last = now  # first: a pod that starts reading counts as active in a new round
        if now >= shares.round_end:
            shares.begin_round(now)
        spent = ended - started
        self.spent += spent
        self.seconds += spent
        if self.spent > self.budget and not self.paused:
            shares.pause(self)
        self.read += size
        if self.read > self.allowance:
            shares.tripped(self)

    def took(self, size: int) -> None:
        """Triton sent `size` bytes for this pod (answers the gateway may hold for it): counted
        against its allowance of the node's byte budget, not against its share of the loop."""
        self.read += size
        if self.read > self.allowance:
            self._shares.tripped(self)


class LoopShares:
    """Every pod's share of one event loop (see the module docstring)."""

    def __init__(
        self,
        busy_share: float,
        timer: Timer,
        *,
        round_seconds: float = ROUND,
        active_seconds: float = ACTIVE,
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        if not 0.0 < busy_share <= 1.0:
            raise ValueError(f"busy_share must be in (0, 1], not {busy_share}")
        self.busy_share = busy_share
        self.clock = clock
        """Wall time: rounds, and when a pod was last active."""
        self.cpu = cpu
        """The loop thread's CPU time, read around each read of a pod's socket."""
        self._timer = timer
        self._round_seconds = round_seconds
        self._active_seconds = active_seconds
        self._shares: list[LoopShare] = []
        self._paused: list[LoopShare] = []
        self._waking = False
        self.round = 0
        self.round_end = clock() + round_seconds
        self.allowance = UNLIMITED
        """What a new pod may read before the node's byte budget is asked."""
        self.on_tripped: Callable[[LoopShare], None] | None = None
        """The node's byte budget (`policy.holdings`), asked when a pod reads past its
        allowance; None: no budget."""

    @property
    def shares(self) -> list[LoopShare]:
        """Every pod's share."""
        return self._shares

    def share(
        self, on_pause: Callable[[], None], on_resume: Callable[[], None], namespace: str = ""
    ) -> LoopShare:
        """A new share for a pod of `namespace`; `on_pause` stops reading its sockets,
        `on_resume` starts again."""
        share = LoopShare(self, on_pause, on_resume, namespace)
        self._shares.append(share)
        return share

    def remove(self, share: LoopShare) -> None:
        """The pod is gone: it counts no more."""
        if share in self._shares:
            self._shares.remove(share)
        if share in self._paused:
            self._paused.remove(share)

    def active(self, now: float) -> int:
        """Pods read from within the last `active_seconds`."""
        since = now - self._active_seconds
        return sum(1 for share in self._shares if share.last >= since)

    def begin_round(self, now: float) -> None:
        """End the round: each pod's reading in it becomes its `previous`, and its budget for the
        new round follows from how many pods are active and what the others spent."""
        self.round += 1
        # A round with no read at all is skipped whole: the next one starts now.
        self.round_end = now + self._round_seconds
        since = now - self._active_seconds
        active = 0
        total = 0.0
        for share in self._shares:
            spent = share.previous = share.spent
            # What a pod took past its budget (one long read can) is still owed: it starts the
            # new round with it spent, and stays paused until a round's budget covers it.
            share.spent = max(spent - share.budget, 0.0)
            total += share.previous
            if share.last >= since:
                active += 1
        if active <= 1:
            for share in self._shares:
                share.budget = share.fair = math.inf
            return
        # Counted only now: a pod reading alone, the common case, pays nothing for namespaces.
        by_namespace: dict[str, int] = {}
        for share in self._shares:
            if share.last >= since:
                by_namespace[share.namespace] = by_namespace.get(share.namespace, 0) + 1
        # A namespace's part, then its pods'. A pod not active is given what the active pods
        # of its namespace have, or a whole namespace's part: the next round counts it.
        part = self._round_seconds / len(by_namespace)
        busy = self.busy_share * self._round_seconds
        for share in self._shares:
            fair = share.fair = part / (by_namespace.get(share.namespace) or 1)
            share.budget = max(fair, busy - (total - share.previous))

    def tripped(self, share: LoopShare) -> None:
        """`share` read past its allowance of the node's byte budget: ask the budget."""
        if self.on_tripped is None:
            share.allowance = UNLIMITED
        else:
            self.on_tripped(share)

    def hold(self, share: LoopShare) -> None:
        """The node's byte budget stops `share`'s reading until `release`, whatever its rounds."""
        if not share.held:
            share.held = True
            share.on_pause()  # even if its round paused it: the budget may stop more than that

    def release(self, share: LoopShare) -> None:
        """The byte budget lets `share` read again (unless its round still holds it)."""
        if share.held:
            share.held = False
            if not share.paused:
                share.on_resume()

    def pause(self, share: LoopShare) -> None:
        """`share` spent its budget: its reading waits for the end of the round."""
        share.paused = True
        share.pauses += 1
        self._paused.append(share)
        if not share.held:
            share.on_pause()
        if not self._waking:
            self._waking = True
            self._timer(max(self.round_end - self.clock(), 0.0), self._wake)

    def _wake(self) -> None:
        self._waking = False
        now = self.clock()
        if now >= self.round_end:
            self.begin_round(now)
        paused, self._paused = self._paused, []
        for share in paused:
            if share.spent > share.budget:  # still owes more than this round's budget
                self._paused.append(share)
            else:
                share.paused = False
                if not share.held:
                    share.on_resume()
        if self._paused:
            self._waking = True
            self._timer(max(self.round_end - self.clock(), 0.0), self._wake)
