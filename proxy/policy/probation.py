"""The node gateway's probation lane: no two probationers' requests at Triton at once.

A pod is on probation when its requests were at Triton with another pod's at an unexpected exit
(`agent.quarantine.suspects`): nothing in that exit tells them apart, so until the probation lapses
their requests take turns, and the next exit finds one of them alone. The lane is held by one
probationer for a turn; another probationer's requests wait in their pod's own queue
(`policy.limiter`, with its bound and timeout). A pod is one probationer however many limiters it
has (a model host has one per model: `PodTurns`), since the witness names pods: its models share its
turns, with no turn nor gap between them. A turn is bounded: once another probationer waits, the
holder admits no new request past `turn_requests` in its turn or past `turn_seconds` since the turn
began, and hands no freed slot on, so its requests drain and the lane passes. Until then the turn is
the holder's even between its requests (`LINGER_SECONDS` idle at most): a client that sends one
request after another gets as many answers in its turn as one that keeps several overlapping, so a
probationer's share of the lane is its turn's, whatever the others send, and it waits at most a turn
and a gap per other probationer (its requests' time at Triton past `turn_seconds` included). Turns
go by namespace first, then by pod within it, each in the order it began waiting: a namespace gains
no turns by putting more pods on probation, and none can hold the lane however it keeps requests
overlapping. Between two pods' turns the lane stays quiet for `gap_seconds` after the last request
of the first is answered (the gateway's crash witness window), so that a harm one pod's request
leaves behind lands before the next pod's requests are at Triton, not on them. Pods not on probation
never touch it.

A turn whose requests failed with Triton gone (Triton died under it) closes the lane until the
gateway's witness of that death has named who was at Triton (`reopen`), or `hold_seconds` when
no death follows: a request let in behind it would fail too and be named with it. A pod whose
last `clean_turns` turns each had requests answered with Triton alive, while another probationer
waited, leaves the lane early (its `on_clear`), since kept apart from the others that often it
did not take Triton down; a turn nobody waited for cost it nothing and counts for nothing (or a
lone probationer would leave before the other sends again, and be at its next exit with it). A
pod named at an exit afterwards takes turns again until its probation ends
(`Tenant.present_at_exit`). While a load the agent watches is in flight or just ended, the agent
marks probationers held: their new requests wait, each at most `HELD_REQUEST_SECONDS`, so that an
exit then is the load's alone (`agent.models.probationhold`); through a suspect's trial they are
refused instead. `HeldRequests` counts what holds cost, by namespace. What it must not do: decide
who is on probation or held (the agent's caller table does).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

HOLD_SECONDS = 2.0
"""How long a lane closed by a failed turn stays closed when no witness reopens it."""

HELD_REQUEST_SECONDS = 8.0
"""How long, at most, a new request of a held probationer (`common.callers.Caller.held`: a load
the agent watches is in flight or just ended) waits before it goes on to Triton all the same
(`policy.limiter.Limiter.hold`), counted from its arrival, a wait for Triton's restore before
included: under a client's 10 s deadline with room for its answer."""

TURN_REQUESTS = 8
"""The most requests a probationer's turn admits once another probationer waits."""

TURN_SECONDS = 0.5
"""How long, from its start, a probationer's turn admits new requests once another waits; its
requests in flight then finish before the next turn begins."""

LINGER_SECONDS = 0.1
"""How long a holder whose turn is not spent keeps the lane with nothing in flight, for its
client's next request, while another probationer waits."""

GAP_SECONDS = 0.0
"""How long the lane stays quiet between two pods' turns (the gateway sets its witness's
window)."""

CLEAN_TURNS = 10
"""Turns in a row, each with another probationer waiting, with requests answered and none failed
with Triton gone, after which a pod leaves the lane for the rest of its probation (unless named
at another exit)."""


MAX_HELD_NAMESPACES = 100
"""Namespaces `HeldRequests` counts apart; the others' holds are counted under "" (bounded
series however many namespaces come and go)."""

HELD_OUTCOMES = ("released", "timed_out", "refused")
"""How a held request ended: its hold ended, its bound passed (it went on), or it was refused
(a suspect's trial)."""


class HeldRequests:
    """Requests held for probation, by namespace: how many by outcome, and the seconds held."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str], int] = {}
        """(namespace, outcome) -> requests."""
        self.seconds: dict[str, float] = {}
        """namespace -> seconds requests of it were held."""

    def record(self, namespace: str, outcome: str, seconds: float) -> None:
        """One request of `namespace` held `seconds`, ended by `outcome` (`HELD_OUTCOMES`)."""
        if namespace not in self.seconds and len(self.seconds) >= MAX_HELD_NAMESPACES:
            namespace = ""
        self.requests[namespace, outcome] = self.requests.get((namespace, outcome), 0) + 1
        self.seconds[namespace] = self.seconds.get(namespace, 0.0) + seconds


class LaneUser(Protocol):
    """What the lane needs of a probationer's limiter (`policy.limiter.Limiter`), or of a pod's
    limiters together (`PodTurns`)."""

    @property
    def in_flight(self) -> int:
        """Its requests at Triton."""

    @property
    def queued(self) -> int:
        """Its requests waiting (for its own limit or for the lane)."""

    def lane_opened(self) -> None:
        """The lane is this pod's now: admit its waiting requests (as its limit allows)."""


class Turns(Protocol):
    """The lane as a probationer's limiter sees it (`policy.limiter.Limiter.probation`): the
    lane itself, or its pod's `PodTurns` when the pod has several limiters."""

    def enters(self, pod: LaneUser) -> bool: ...

    def wait(self, pod: LaneUser) -> None: ...

    def freed(self, pod: LaneUser) -> None: ...

    def holds(self, pod: LaneUser) -> bool: ...


class _Member:
    """What the lane keeps of one probationer."""

    __slots__ = ("clean", "failures", "namespace", "on_clear")

    def __init__(
        self,
        namespace: str,
        failures: Callable[[], int] | None,
        on_clear: Callable[[], None] | None,
    ) -> None:
        self.namespace = namespace
        self.failures = failures
        """Its requests failed with Triton gone, so far (None: not judged)."""
        self.on_clear = on_clear
        """Called when it leaves the lane early after its clean turns (None: it never does)."""
        self.clean = 0
        """Its clean turns in a row."""


class ProbationLane:
    """The one probationer whose requests may be at Triton now, and the others waiting."""

    def __init__(
        self,
        *,
        hold_seconds: float = HOLD_SECONDS,
        turn_requests: int = TURN_REQUESTS,
        turn_seconds: float = TURN_SECONDS,
        clean_turns: int = CLEAN_TURNS,
        gap_seconds: float = GAP_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.holder: LaneUser | None = None
        self._waiting: dict[str, dict[LaneUser, None]] = {}
        """Probationers with requests waiting for the lane, by namespace in turn order, each
        namespace's pods oldest first (ordered sets)."""
        self.hold_seconds = hold_seconds
        self.turn_requests = turn_requests
        self.turn_seconds = turn_seconds
        self.clean_turns = clean_turns
        self.gap_seconds = gap_seconds
        self._clock = clock
        self._last: LaneUser | None = None
        """The pod whose turn ended last."""
        self._quiet_until = 0.0
        """Until when no other pod's turn begins (`gap_seconds` after the last one ended)."""
        self._passing: asyncio.TimerHandle | None = None
        self.closed = False
        """A turn ended and is not judged yet, or its requests failed: nobody enters."""
        self._members: dict[LaneUser, _Member] = {}
        self._admitted = 0
        """Requests the holder's turn has admitted."""
        self._turn_ends = 0.0
        """When the holder's turn stops admitting new requests while another waits."""
        self._failed_before = 0
        """The holder's failures with Triton gone when its turn began."""
        self._contested = False
        """Another probationer waited during the holder's turn."""
        self._reopening: asyncio.TimerHandle | None = None
        self._lingering: asyncio.TimerHandle | None = None
        """The holder's idle moment in its unspent turn ends then (`freed`)."""
        self._namespace = ""
        """The namespace of the last turn's pod."""
        self.turns = 0
        """Turns begun since start."""
        self.held = HeldRequests()
        """What the hold of probationers' requests cost, by namespace."""

    @property
    def waiting(self) -> int:
        return sum(len(pods) for pods in self._waiting.values())

    def enters(self, pod: LaneUser) -> bool:
        """Whether a new request of `pod` may go to Triton now; takes the lane when it is free.
        A holder whose turn is spent while another waits gets False, and with nothing in flight
        passes the lane on."""
        if self.holder is None and not self._waiting and not self.closed and not self._quiet(pod):
            self._begin(pod)
        elif self.holder is not pod:
            return False
        elif self.others_wait(pod) and (
            self._admitted >= self.turn_requests or self._clock() >= self._turn_ends
        ):
            if not pod.in_flight:
                self.freed(pod)
            return False
        self._admitted += 1
        return True

    def others_wait(self, pod: LaneUser) -> bool:
        """Whether a probationer other than `pod` waits for the lane."""
        return any(waiting is not pod for pods in self._waiting.values() for waiting in pods)

    def wait(self, pod: LaneUser) -> None:
        """A request of `pod` waits: unless `pod` holds the lane, it gets a turn after its
        namespace's turn comes, after the pods of its namespace already waiting."""
        if self.holder is not pod:
            self._contested = self._contested or self.holder is not None
            self._queue(pod)
            self._pass_on()

    def _queue(self, pod: LaneUser) -> None:
        member = self._members.get(pod)
        self._waiting.setdefault(member.namespace if member else "", {}).setdefault(pod, None)

    def _unqueue(self, pod: LaneUser) -> None:
        for namespace, pods in list(self._waiting.items()):
            if pods.pop(pod, False) is None and not pods:
                del self._waiting[namespace]

    def freed(self, pod: LaneUser) -> None:
        """`pod` has no request in flight any more: the lane passes on (back to `pod` after the
        others when it still has requests waiting), once its turn is spent or it has sent
        nothing for `LINGER_SECONDS`."""
        if self.holder is pod and not pod.queued and not self._spent():
            if self._lingering is None:
                loop = asyncio.get_running_loop()
                delay = min(LINGER_SECONDS, self._turn_ends - self._clock())
                self._lingering = loop.call_later(delay, self._lingered, pod)
                # The relay counts a request failed with Triton gone just after: that ends it.
                loop.call_soon(self._lingered, pod, True)
            return
        if self.holder is pod:
            self.holder = None
            self._last = pod
            self._quiet_until = self._clock() + self.gap_seconds
            if pod.queued:
                self._queue(pod)
            member = self._members.get(pod)
            if member is None or member.failures is None:
                self._pass_on()
                return
            # The relay counts the answer of the request that freed it just after: judge the
            # turn once it has.
            self.closed = True
            asyncio.get_running_loop().call_soon(
                self._judge, pod, member, self._admitted, self._failed_before, self._contested
            )

    def _spent(self) -> bool:
        """Whether the holder's turn admits nothing more (another probationer waiting)."""
        return (
            self._admitted >= self.turn_requests
            or self._clock() >= self._turn_ends
            or not any(w.queued for pods in self._waiting.values() for w in pods)
        )

    def _lingered(self, pod: LaneUser, failed_only: bool = False) -> None:
        """The holder's idle moment is over (`failed_only`: only if its requests failed)."""
        if failed_only:
            member = self._members.get(pod)
            failures = member.failures if member is not None else None
            if failures is None or failures() <= self._failed_before:
                return
        if self._lingering is not None:
            self._lingering.cancel()
            self._lingering = None
        if self.holder is pod and not pod.in_flight:
            self._turn_ends = min(self._turn_ends, self._clock())  # idle: the turn is over
            self.freed(pod)

    def _judge(
        self, pod: LaneUser, member: _Member, admitted: int, failed_before: int, contested: bool
    ) -> None:
        failed = member.failures is not None and member.failures() > failed_before
        if failed:
            member.clean = 0
        elif admitted and contested and self._members.get(pod) is member:
            member.clean += 1
            if member.on_clear is not None and member.clean >= self.clean_turns:
                member.on_clear()  # it leaves the lane
        if not self.closed or self._reopening is not None:
            return  # the witness reopened it meanwhile, or a hold is already under way
        if failed:
            self._reopening = asyncio.get_running_loop().call_later(self.hold_seconds, self.reopen)
            return
        self.reopen()

    def reopen(self) -> None:
        """The gateway's witness has named who had requests at Triton when it went away (or
        `hold_seconds` passed): the lane passes on."""
        if self._reopening is not None:
            self._reopening.cancel()
            self._reopening = None
        if self.closed and self.holder is None:
            self.closed = False
            self._pass_on()

    def join(
        self,
        pod: LaneUser,
        failures: Callable[[], int] | None = None,
        *,
        namespace: str = "",
        on_clear: Callable[[], None] | None = None,
    ) -> None:
        """`pod`, of `namespace`, goes on probation: requests it has in flight already hold the
        lane if it is free (if it is not, they finish beside the holder's; its next ones wait
        their turn). `failures()` counts its requests failed with Triton gone; `on_clear` is
        called after `clean_turns` clean turns in a row, to take it off the lane (`leave`);
        None: it stays."""
        self._members[pod] = _Member(namespace, failures, on_clear)
        if self.holder is None and pod.in_flight and not self.closed:
            self._begin(pod)

    def holds(self, pod: LaneUser) -> bool:
        """Whether the lane is `pod`'s turn now."""
        return self.holder is pod

    def present(self, pod: LaneUser) -> None:
        """`pod` was at Triton at an exit: its clean turns start over."""
        member = self._members.get(pod)
        if member is not None:
            member.clean = 0

    def leave(self, pod: LaneUser) -> None:
        """`pod` is off probation, or gone: it holds and waits for nothing here any more."""
        self._unqueue(pod)
        self._members.pop(pod, None)
        if self.holder is pod:
            self.holder = None
            self._pass_on()

    def _quiet(self, pod: LaneUser) -> bool:
        """Whether `pod`'s turn must wait for the quiet gap after another pod's."""
        return pod is not self._last and self._clock() < self._quiet_until

    def _quiet_ended(self) -> None:
        self._passing = None
        self._pass_on()

    def _begin(self, pod: LaneUser) -> None:
        self.holder = pod
        self.turns += 1
        self._admitted = 0
        self._contested = self.others_wait(pod)
        self._turn_ends = self._clock() + self.turn_seconds
        member = self._members.get(pod)
        self._namespace = member.namespace if member is not None else ""
        failures = member.failures if member is not None else None
        self._failed_before = failures() if failures is not None else 0

    def _pass_on(self) -> None:
        """The free lane goes to the first waiting pod of the namespace whose turn it is."""
        while self.holder is None and self._waiting and not self.closed:
            namespace, pods = next(iter(self._waiting.items()))
            if namespace == self._namespace and len(self._waiting) > 1:
                # The namespace whose turn just ended goes after the others.
                del self._waiting[namespace]
                self._waiting[namespace] = pods
                pods = next(iter(self._waiting.values()))
            following = next(iter(pods))
            if self._quiet(following):
                if self._passing is None:
                    delay = self._quiet_until - self._clock()
                    self._passing = asyncio.get_running_loop().call_later(delay, self._quiet_ended)
                return
            self._unqueue(following)
            self._begin(following)
            following.lane_opened()
            if not following.in_flight and not following.queued:
                self.holder = None  # every request it had waiting gave up meanwhile


class PodTurns:
    """One calling pod's limiters taking their turns in the lane as one probationer: a model
    host has one limiter per model (and per replica of a spread), and the lane keeps probationer
    pods apart, not a pod's models, since the crash witness names pods. In the pod's turn any of
    its limiters admits requests (the turn's bound counts them all); the turn passes on once none
    of them has one in flight, and no quiet gap separates one of its models from another. Each
    limiter on probation has this as its `probation` and joins it (`join`); the pod is a member
    of the lane while one of them is."""

    def __init__(self, lane: ProbationLane, namespace: str) -> None:
        self.lane = lane
        self.namespace = namespace
        self._users: dict[LaneUser, tuple[Callable[[], int] | None, Callable[[], None] | None]] = {}
        """Each limiter on probation -> what it was joined with (`join`)."""

    @property
    def in_flight(self) -> int:
        return sum(user.in_flight for user in self._users)

    @property
    def queued(self) -> int:
        return sum(user.queued for user in self._users)

    def lane_opened(self) -> None:
        for user in list(self._users):
            user.lane_opened()

    def enters(self, pod: LaneUser) -> bool:
        return self.lane.enters(self)

    def wait(self, pod: LaneUser) -> None:
        self.lane.wait(self)

    def freed(self, pod: LaneUser) -> None:
        if not self.in_flight:
            self.lane.freed(self)

    def holds(self, pod: LaneUser) -> bool:
        return self.lane.holds(self)

    def join(
        self,
        user: LaneUser,
        failures: Callable[[], int] | None = None,
        *,
        on_clear: Callable[[], None] | None = None,
    ) -> None:
        """`user`, a limiter of the pod, goes on probation: `failures()` counts its requests
        failed with Triton gone; `on_clear` is called when the pod leaves the lane after its
        clean turns (None: `user` stays)."""
        first = not self._users
        self._users[user] = (failures, on_clear)
        if first:
            on_pod_clear = self._cleared if self.lane.clean_turns else None
            self.lane.join(self, self._failures, namespace=self.namespace, on_clear=on_pod_clear)

    def leave(self, user: LaneUser) -> None:
        """`user` is off probation, or gone; the pod leaves the lane with its last limiter."""
        if self._users.pop(user, None) is None:
            return
        if not self._users:
            self.lane.leave(self)
        elif self.lane.holds(self) and not self.in_flight:
            self.lane.freed(self)  # what is left of its turn had nothing in flight

    def present(self, user: LaneUser) -> None:
        """The pod was at Triton at an exit: its clean turns start over."""
        if user in self._users:
            self.lane.present(self)

    def _failures(self) -> int:
        return sum(count() for count, _ in self._users.values() if count is not None)

    def _cleared(self) -> None:
        for _, on_clear in list(self._users.values()):
            if on_clear is not None:
                on_clear()
