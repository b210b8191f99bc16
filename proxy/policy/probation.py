"""The node gateway's probation lane: no two probationers' requests at Triton at once.

A pod is on probation when its requests were at Triton with another pod's at an unexpected exit
(`agent.suspects`): nothing in that exit tells them apart, so until the probation lapses their
requests take turns, and the next exit finds one of them alone. The lane is held by one
probationer while it has requests in flight; another probationer's requests wait in their pod's
own queue (`policy.limiter`, with its bound and timeout). Turns go by pod, oldest waiting first:
once another probationer waits, the holder admits no new request and hands no freed slot on, so
its requests drain and the lane passes; neither can starve the other. Pods not on probation never
touch it. What it must not do: decide who is on probation (the agent's caller table does).
"""

from __future__ import annotations

from typing import Protocol


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

    def __init__(self) -> None:
        self.holder: LaneUser | None = None
        self._waiting: dict[LaneUser, None] = {}
        """Probationers with requests waiting for the lane, oldest first (an ordered set)."""

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def enters(self, pod: LaneUser) -> bool:
        """Whether a new request of `pod` may go to Triton now; takes the lane when it is free."""
        if self.holder is None and not self._waiting:
            self.holder = pod
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
            if self.holder is None:
                self._pass_on()

    def freed(self, pod: LaneUser) -> None:
        """`pod` has no request in flight any more: the lane passes on (back to `pod` after the
        others when it still has requests waiting)."""
        if self.holder is pod:
            self.holder = None
            if pod.queued:
                self._waiting.setdefault(pod, None)
            self._pass_on()

    def join(self, pod: LaneUser) -> None:
        """`pod` goes on probation: requests it has in flight already hold the lane if it is
        free (if it is not, they finish beside the holder's; its next ones wait their turn)."""
        if self.holder is None and pod.in_flight:
            self.holder = pod

    def leave(self, pod: LaneUser) -> None:
        """`pod` is off probation, or gone: it holds and waits for nothing here any more."""
        self._waiting.pop(pod, None)
        if self.holder is pod:
            self.holder = None
            self._pass_on()

    def _pass_on(self) -> None:
        """The free lane goes to the oldest waiting pod that still has a request waiting."""
        while self.holder is None and self._waiting:
            following = next(iter(self._waiting))
            del self._waiting[following]
            self.holder = following
            following.lane_opened()
            if not following.in_flight:
                self.holder = None  # every request it had waiting gave up meanwhile
