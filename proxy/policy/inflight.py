"""The node's in-flight budget at Triton, split evenly among the pods sending (the gateway's).

Each pod's `Limiter` bounds its own requests at Triton (its declared concurrency, or the gateway's
`--max-in-flight-per-pod`). That bounds Triton's queue, not a pod's part of Triton's work: a pod
flooding within its own limit of 64 keeps 64 requests at Triton, and every neighbour's request
then shares Triton (and, on a CPU, the node's cores) with them. So while more than one pod is
sending, the node's budget `B` (`--max-in-flight-node`) is split evenly: with N pods sending, each
may have `max(1, B // N)` requests at Triton, never more than its own limit. A pod sending alone
keeps its own limit (dynamic batching needs its concurrency, and nobody else wants Triton then).

A pod counts as sending from its first request until it has had none in flight, none waiting and
none started for `active_seconds`; a sweep every half of that notices pods that stopped. Each
change of the count sets every pod's limit once (`Limiter.set_limit`, which hands freed room to
the pod's waiters); nothing here runs per request but the limiter's check of its own flag.

A pod's queue is not shrunk with its limit: what it may hold in the gateway stays its own limit
plus its queue (`gateway.budget`), and a pod's proxy, which sends at most its declared
concurrency, is never refused for its share, only made to wait. Pure policy: the clock and the
timer are injected.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from proxy.policy.limiter import Limiter

ACTIVE: Final = 1.0
"""A pod with nothing in flight or waiting and no request started within this many seconds no
longer counts as sending."""

Timer = Callable[[float, Callable[[], None]], object]
"""Run the callback after this many seconds (the loop's `call_later`)."""


def share_of(own: int, budget: int, sending: int) -> int:
    """The in-flight limit (0: none) of a pod whose own limit is `own` (0: none) while `sending`
    pods send, under a node budget of `budget` (0: none)."""
    if budget <= 0 or sending <= 1:
        return own
    fair = max(1, budget // sending)
    return fair if own == 0 or fair < own else own


class InFlightShares:
    """The node's in-flight budget and the pods' limiters it is split among."""

    def __init__(
        self,
        budget: int,
        timer: Timer,
        *,
        active_seconds: float = ACTIVE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if budget < 0:
            raise ValueError(f"the node's in-flight budget must be 0 or more, not {budget}")
        self.budget = budget
        self._timer = timer
        self._active_seconds = active_seconds
        self.clock = clock
        self._limiters: list[Limiter] = []
        self.sending = 0
        """Pods counted as sending now."""
        self._sweeping = False

    def add(self, limiter: Limiter) -> None:
        """A new pod's limiter: its limit follows the split from now on."""
        limiter.node = self
        self._limiters.append(limiter)
        limiter.set_limit(share_of(limiter.own_limit, self.budget, self.sending + 1))

    def remove(self, limiter: Limiter) -> None:
        """The pod is gone: it counts no more."""
        if limiter in self._limiters:
            self._limiters.remove(limiter)
            limiter.node = None
            if limiter.sending:
                limiter.sending = False
                self.sending -= 1
                self._split()

    def woke(self, limiter: Limiter) -> None:
        """`limiter`'s pod starts sending (its limiter calls this before taking a slot)."""
        limiter.sending = True
        limiter.last = self.clock()
        self.sending += 1
        self._split()
        if not self._sweeping:
            self._sweeping = True
            self._timer(self._active_seconds / 2, self._sweep)

    def _sweep(self) -> None:
        self._sweeping = False
        since = self.clock() - self._active_seconds
        stopped = 0
        for limiter in self._limiters:
            if (
                limiter.sending
                and limiter.last < since
                and limiter.in_flight == 0
                and not limiter.queued
            ):
                limiter.sending = False
                stopped += 1
        if stopped:
            self.sending -= stopped
            self._split()
        if self.sending:
            self._sweeping = True
            self._timer(self._active_seconds / 2, self._sweep)

    def _split(self) -> None:
        """Set every pod's limit for the number sending now. A pod not sending gets what it
        would have as one more sender, so its first request finds its limit already set."""
        budget, sending = self.budget, self.sending
        for limiter in self._limiters:
            count = sending if limiter.sending else sending + 1
            limiter.set_limit(share_of(limiter.own_limit, budget, count))
