"""The node's in-flight budget at Triton, split by namespace, then among a namespace's pods
sending (the gateway's).

Each pod's `Limiter` bounds its own requests at Triton (its declared concurrency, or the gateway's
`--max-in-flight-per-pod`). That bounds Triton's queue, not a pod's part of Triton's work: a pod
flooding within its own limit of 64 keeps 64 requests at Triton, and every neighbour's request
then shares Triton (and, on a CPU, the node's cores) with them. So while more than one pod is
sending, the node's budget `B` (`--max-in-flight-node`) is split as Kubernetes' API Priority and
Fairness splits a server's seats: first evenly among the namespaces sending, then evenly among a
namespace's pods sending. With N namespaces sending, and n pods of a pod's namespace among them,
the pod may have `max(1, max(1, B // N) // n)` requests at Triton, never more than its own limit,
and the namespace together `max(1, B // N)`. A namespace cannot take more of the node by creating
pods: seven pods of one namespace beside one pod of another share half of `B`, and the lone pod
has the other half. With more pods sending than its part has slots, a namespace's pods take its
slots in turn (`_Pool`): a slot given back goes to the pod that has waited longest for one, so
no pod of it is starved and the namespace still holds no more than its part. A pod sending alone
keeps its own limit (dynamic batching needs its concurrency, and nobody else wants Triton then).
Every namespace sending keeps at least one request at Triton, so many namespaces may together
pass `B` by up to one request each.

A pod counts as sending from its first request until it has had none in flight, none waiting and
none started for `active_seconds`; a sweep every half of that notices pods that stopped. Each
change of the count sets every pod's limit and every namespace's part once, and deals the room
that opened to the pods waiting. Per request, the namespace's pool counts the slot taken and
given back (`take`, `released`: a few additions while nobody waits). A namespace's part shrinks
at once but its requests already at Triton finish: meanwhile its pods wait, another namespace's
do not. A pod picked no more while it still holds requests (a replica a scale-down drains)
stays in its namespace's part until they are answered (`retire`), so what it had queued goes on
there, not beside it.

A pod's queue is not shrunk with its limit: what it may hold in the gateway stays its own limit
plus its queue (`gateway.budget`), and a pod's proxy, which sends at most its declared
concurrency, is never refused for its share, only made to wait. Pure policy: the clock and the
timer are injected.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Final

from proxy.policy.limiter import Limiter

ACTIVE: Final = 1.0
"""A pod with nothing in flight or waiting and no request started within this many seconds no
longer counts as sending."""

Timer = Callable[[float, Callable[[], None]], object]
"""Run the callback after this many seconds (the loop's `call_later`)."""


class _Pool:
    """One namespace's slots at Triton: how many it may hold, how many its pods hold, and its
    pods waiting for one, in the order they will get one."""

    __slots__ = ("cap", "in_flight", "limiters", "queue")

    def __init__(self) -> None:
        self.cap = 0
        """The most its pods may hold together; 0: no bound but each pod's own limit."""
        self.in_flight = 0
        self.limiters = 0
        """Pods of the namespace known to the gateway (the pool goes with the last)."""
        self.queue: deque[Limiter] = deque()

    def room(self) -> bool:
        return self.cap == 0 or self.in_flight < self.cap

    def enqueue(self, limiter: Limiter) -> None:
        """`limiter` takes its turn at the back, if it has a request waiting that its own
        limit lets through (a pod at its own limit waits for its own answers, not a turn)."""
        if (
            limiter.queued
            and (limiter.limit == 0 or limiter.in_flight < limiter.limit)
            and limiter not in self.queue
        ):
            self.queue.append(limiter)

    def deal(self) -> None:
        """Hand free slots to the waiting pods, one each in turn; a pod still waiting after
        its turn goes to the back (one at its own limit joins again when it gives a slot
        back)."""
        while self.queue and self.room():
            limiter = self.queue.popleft()
            if limiter.grant():
                self.in_flight += 1
                self.enqueue(limiter)


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
        self._pools: dict[str, _Pool] = {}
        self._pool_of: dict[Limiter, _Pool] = {}
        """Each limiter's namespace's pool: one look-up per request, not two."""
        self.sending = 0
        """Pods counted as sending now."""
        self.by_namespace: dict[str, int] = {}
        """Pods counted as sending now, by namespace (only namespaces with one or more)."""
        self._retiring: set[Limiter] = set()
        """Pods picked no more that still hold requests (`retire`)."""
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
        pool = self._pool_of[limiter] = self._pools.setdefault(namespace, _Pool())
        pool.limiters += 1
        pool.in_flight += limiter.in_flight
        pool.cap = self._cap_of(namespace)
        limiter.set_limit(self._limit_of(limiter, namespace))

    def remove(self, limiter: Limiter) -> None:
        """The pod is gone: it counts no more."""
        namespace = self._namespace_of.pop(limiter, None)
        if namespace is None:
            return
        self._retiring.discard(limiter)
        limiter.node = None
        pool = self._pool_of.pop(limiter)
        # Its requests in flight give their slots back to nobody now: free them here.
        pool.in_flight -= limiter.in_flight
        if limiter in pool.queue:
            pool.queue.remove(limiter)
        pool.limiters -= 1
        if not pool.limiters:
            del self._pools[namespace]
        if limiter.sending:
            limiter.sending = False
            self._stopped(namespace)
        self._split()

    def retire(self, limiter: Limiter) -> None:
        """The pod is picked no more (a replica that drains) but what it holds goes on: it
        stays in its namespace's part, its queued requests taking the namespace's slots in turn
        as before, until nothing of it is in flight or waiting; then it is removed. Removed at
        once, its queue would go on outside the part, on top of its namespace's other pods'."""
        if limiter not in self._namespace_of:
            return
        if limiter.in_flight or limiter.queued:
            self._retiring.add(limiter)
        else:
            self.remove(limiter)

    def take(self, limiter: Limiter) -> bool:
        """A slot of `limiter`'s namespace, if one is free and none of its pods waits."""
        pool = self._pool_of[limiter]
        if pool.queue:
            pool.deal()  # a pod that waits is served first: no overtaking its turn
            if pool.queue:
                return False
        if pool.cap and pool.in_flight >= pool.cap:
            return False
        pool.in_flight += 1
        return True

    def waiting(self, limiter: Limiter) -> None:
        """`limiter` has a request queued: it joins its namespace's turns (once)."""
        pool = self._pool_of[limiter]
        pool.enqueue(limiter)
        pool.deal()

    def released(self, limiter: Limiter) -> None:
        """A slot of `limiter`'s namespace is free: the next pod in turn takes it."""
        pool = self._pool_of[limiter]
        pool.in_flight -= 1
        if limiter.queued:
            pool.enqueue(limiter)
        if pool.queue:
            pool.deal()
        if (
            self._retiring
            and limiter in self._retiring
            and not limiter.in_flight
            and not limiter.queued
        ):
            self.remove(limiter)  # its last request is answered

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
        for limiter in [x for x in self._retiring if not x.in_flight and not x.queued]:
            self.remove(limiter)  # its last queued request gave up waiting
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

    def _cap_of(self, namespace: str) -> int:
        """The most `namespace`'s pods may hold together now (0: no bound but their own);
        for a namespace not sending, what it would have as one more."""
        if self.budget <= 0:
            return 0
        namespaces = len(self.by_namespace) + (namespace not in self.by_namespace)
        if namespaces > 1:
            return max(1, self.budget // namespaces)
        # Its pods alone: the whole budget among them, or a lone pod's own limit.
        return self.budget if self.by_namespace.get(namespace, 0) > 1 else 0

    def _split(self) -> None:
        """Set every pod's limit and every namespace's part for the pods sending now, then let
        the room that opened go to the pods waiting."""
        for namespace, pool in self._pools.items():
            pool.cap = self._cap_of(namespace)
        for limiter, namespace in self._namespace_of.items():
            limiter.set_limit(self._limit_of(limiter, namespace))
            self._pools[namespace].enqueue(limiter)
        for pool in self._pools.values():
            pool.deal()
