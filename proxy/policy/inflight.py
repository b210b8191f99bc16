"""The node's in-flight budget at Triton, split by namespace, then among a namespace's pods
sending (the gateway's).

Each pod's `Limiter` bounds its own requests at Triton (its declared concurrency, or the gateway's
`--max-in-flight-per-pod`). That bounds Triton's queue, not a pod's part of Triton's work: a pod
flooding within its own limit of 64 keeps 64 requests at Triton, and every neighbour's request
then shares Triton (and, on a CPU, the node's cores) with them. So while more than one pod is
sending, the node's budget `B` (`--max-in-flight-node`) is split as Kubernetes' API Priority and
Fairness splits a server's seats: first evenly among the namespaces sending, then evenly among a
namespace's pods sending. With N namespaces sending, and n pods of a pod's namespace among them,
the pod may have `max(1, max(1, B // N) // n)` requests at Triton, never more than its own limit.
A namespace cannot take more of the node by creating pods: seven pods of one namespace beside
one pod of another share half of `B`, and the lone pod has the other half. A pod sending alone
keeps its own limit (dynamic batching needs its concurrency, and nobody else wants Triton then).
Every pod sending keeps at least one request at Triton, so many namespaces or pods may together
pass `B` by up to one request each.

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
from typing import Final

from proxy.policy.limiter import Limiter

ACTIVE: Final = 1.0
"""A pod with nothing in flight or waiting and no request started within this many seconds no
longer counts as sending."""

Timer = Callable[[float, Callable[[], None]], object]
"""Run the callback after this many seconds (the loop's `call_later`)."""


def share_of(own: int, budget: int, namespaces: int, pods: int = 1) -> int:
    """The in-flight limit (0: none) of a pod whose own limit is `own` (0: none) while
    `namespaces` namespaces send, `pods` pods of its own among them (itself counted), under a
    node budget of `budget` (0: none)."""
    if budget <= 0 or (namespaces <= 1 and pods <= 1):
        return own
    fair = max(1, max(1, budget // namespaces) // pods)
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
        self._namespace_of: dict[Limiter, str] = {}
        self.sending = 0
        """Pods counted as sending now."""
        self.by_namespace: dict[str, int] = {}
        """Pods counted as sending now, by namespace (only namespaces with one or more)."""
        self._sweeping = False

    @property
    def namespaces(self) -> int:
        """Namespaces with a pod counted as sending now."""
        return len(self.by_namespace)

    def add(self, limiter: Limiter, namespace: str = "") -> None:
        """A new pod's limiter, of a pod of `namespace`: its limit follows the split from now
        on."""
        limiter.node = self
        self._namespace_of[limiter] = namespace
        limiter.set_limit(self._limit_of(limiter, namespace))

    def remove(self, limiter: Limiter) -> None:
        """The pod is gone: it counts no more."""
        namespace = self._namespace_of.pop(limiter, None)
        if namespace is None:
            return
        limiter.node = None
        if limiter.sending:
            limiter.sending = False
            self._stopped(namespace)
            self._split()

    def woke(self, limiter: Limiter) -> None:
        """`limiter`'s pod starts sending (its limiter calls this before taking a slot)."""
        limiter.sending = True
        limiter.last = self.clock()
        namespace = self._namespace_of.get(limiter, "")
        self.sending += 1
        self.by_namespace[namespace] = self.by_namespace.get(namespace, 0) + 1
        self._split()
        if not self._sweeping:
            self._sweeping = True
            self._timer(self._active_seconds / 2, self._sweep)

    def _stopped(self, namespace: str) -> None:
        self.sending -= 1
        left = self.by_namespace[namespace] - 1
        if left:
            self.by_namespace[namespace] = left
        else:
            del self.by_namespace[namespace]

    def _sweep(self) -> None:
        self._sweeping = False
        since = self.clock() - self._active_seconds
        stopped = False
        for limiter, namespace in self._namespace_of.items():
            if (
                limiter.sending
                and limiter.last < since
                and limiter.in_flight == 0
                and not limiter.queued
            ):
                limiter.sending = False
                self._stopped(namespace)
                stopped = True
        if stopped:
            self._split()
        if self.sending:
            self._sweeping = True
            self._timer(self._active_seconds / 2, self._sweep)

    def _limit_of(self, limiter: Limiter, namespace: str) -> int:
        """The limit of `limiter`'s pod for the pods sending now. A pod not sending gets what it
        would have as one more sender, so its first request finds its limit already set."""
        pods = self.by_namespace.get(namespace, 0)
        namespaces = len(self.by_namespace)
        if not limiter.sending:
            if not pods:
                namespaces += 1
            pods += 1
        return share_of(limiter.own_limit, self.budget, namespaces, pods)

    def _split(self) -> None:
        """Set every pod's limit for the pods sending now."""
        for limiter, namespace in self._namespace_of.items():
            limiter.set_limit(self._limit_of(limiter, namespace))
