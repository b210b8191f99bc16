"""The node gateway's probation lane: no two probationers' requests at Triton at once.

A pod is on probation when its requests were at Triton with another pod's at an unexpected exit
(`agent.suspects`): nothing in that exit tells them apart, so until the probation lapses their
requests take turns, and the next exit finds one of them alone. The lane is held by one
probationer while it has requests in flight; another probationer's requests wait in their pod's
own queue (`policy.limiter`, with its bound and timeout). Turns go by pod, oldest waiting first:
once another probationer waits, the holder admits no new request and hands no freed slot on, so
its requests drain and the lane passes; neither can starve the other. Pods not on probation never
touch it. A turn whose requests failed with Triton gone (Triton died under it) closes the lane
until the gateway's witness of that death has named who was at Triton (`reopen`), or
`hold_seconds` when no death follows: a request let in behind it would fail too and be named with
it. What it must not do: decide who is on probation (the agent's caller table does).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

HOLD_SECONDS = 2.0
"""How long a lane closed by a failed turn stays closed when no witness reopens it."""


class LaneUser(Protocol):
    """What the lane needs of a probationer's limiter (`policy.limiter.Limiter`)."""

    in_flight: int

    @property
    def queued(self) -> int:
        """Its requests waiting (for its own limit or for the lane)."""

    def lane_opened(self) -> None:
        """The lane is this pod's now: admit its waiting requests (as its limit allows)."""


class ProbationLane:
    """The one probationer whose requests may be at Triton now, and the others waiting."""

    def __init__(self, *, hold_seconds: float = HOLD_SECONDS) -> None:
        self.holder: LaneUser | None = None
        self._waiting: dict[LaneUser, None] = {}
        """Probationers with requests waiting for the lane, oldest first (an ordered set)."""
        self.hold_seconds = hold_seconds
        self.closed = False
        """A turn ended and is not judged yet, or its requests failed: nobody enters."""
        self._failures: dict[LaneUser, Callable[[], int]] = {}
        self._failed_before = 0
        """The holder's failures with Triton gone when its turn began."""
        self._reopening: asyncio.TimerHandle | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def enters(self, pod: LaneUser) -> bool:
        """Whether a new request of `pod` may go to Triton now; takes the lane when it is free."""
        if self.holder is None and not self._waiting and not self.closed:
            self._begin(pod)
            return True
        return self.holder is pod and not self.others_wait(pod)

    def others_wait(self, pod: LaneUser) -> bool:
        """Whether a probationer other than `pod` waits for the lane (`pod` must not keep it)."""
        return any(waiting is not pod for waiting in self._waiting)

    def wait(self, pod: LaneUser) -> None:
        """A request of `pod` waits: unless `pod` holds the lane, it gets a turn after the pods
        already waiting."""
        if self.holder is not pod:
            self._waiting.setdefault(pod, None)
            self._pass_on()

    def freed(self, pod: LaneUser) -> None:
        """`pod` has no request in flight any more: the lane passes on (back to `pod` after the
        others when it still has requests waiting)."""
        if self.holder is pod:
            self.holder = None
            if pod.queued:
                self._waiting.setdefault(pod, None)
            failures = self._failures.get(pod)
            if failures is None:
                self._pass_on()
                return
            # The relay counts the answer of the request that freed it just after: judge the
            # turn once it has.
            self.closed = True
            asyncio.get_running_loop().call_soon(self._judge, failures)

    def _judge(self, failures: Callable[[], int]) -> None:
        if not self.closed or self._reopening is not None:
            return  # the witness reopened it meanwhile, or a hold is already under way
        if failures() > self._failed_before:
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

    def join(self, pod: LaneUser, failures: Callable[[], int] | None = None) -> None:
        """`pod` goes on probation: requests it has in flight already hold the lane if it is
        free (if it is not, they finish beside the holder's; its next ones wait their turn).
        `failures()` counts its requests failed with Triton gone."""
        if failures is not None:
            self._failures[pod] = failures
        if self.holder is None and pod.in_flight and not self.closed:
            self._begin(pod)

    def leave(self, pod: LaneUser) -> None:
        """`pod` is off probation, or gone: it holds and waits for nothing here any more."""
        self._waiting.pop(pod, None)
        self._failures.pop(pod, None)
        if self.holder is pod:
            self.holder = None
            self._pass_on()

    def _begin(self, pod: LaneUser) -> None:
        self.holder = pod
        failures = self._failures.get(pod)
        self._failed_before = failures() if failures is not None else 0

    def _pass_on(self) -> None:
        """The free lane goes to the oldest waiting pod that still has a request waiting."""
        while self.holder is None and self._waiting and not self.closed:
            following = next(iter(self._waiting))
            del self._waiting[following]
            self._begin(following)
            following.lane_opened()
            if not following.in_flight:
                self.holder = None  # every request it had waiting gave up meanwhile
