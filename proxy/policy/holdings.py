"""The node's byte budget: what the gateway holds for all its pods together, and each pod's share.

Each pod's holdings in the gateway are bounded on their own (`gateway.budget`), but those bounds
add up over pods: enough pods each holding partial messages within their own bound pass the
gateway's memory limit together, and the gateway is OOM-killed with every model of the node. So
the gateway keeps the bytes it holds for all pods under `limit`, split fairly among the pods that
hold anything or are active, by namespace first: a pod's fair share is `limit / N / n` with N
namespaces having such pods and n of them in its own namespace, so a namespace's many pods share
what one pod of another namespace has, and the shares still add up to `limit`.

How it is counted. Exactly, but not per call: the gateway walks every pod's connections (`measured`:
bytes received and not yet forwarded, answers held for the pod, bytes waiting in write buffers)
every `PERIOD` seconds, or `QUIET_PERIOD` while the node is far from its budget; between walks
each read from a pod's sockets counts against its allowance (`LoopShare.read`, one addition per
read), so what a pod can add between walks is decided before it is read, not after. A pod that
reads past its allowance asks `tripped`. While the node, counted pessimistically (each pod's last
figure plus what it read since, or was allowed to), is under `limit`, the pod gets a further slice
of what is left. Once it is over, a pod under its fair share may still read up to that share (a
pod under its share is never held back by others), and a pod past it stops being read
(`LoopShares.hold`, the same pause as the loop's share) and asks for a walk at once.

Pausing frees nothing, so a pod still over its share at a walk while the node is over `limit`,
for longer than `GRACE` (at once while the node is over twice `limit`), is returned by
`measured` with the bytes it must give up; the gateway closes its largest connections with a
clear error until it is back under its share.

What Triton sends for a pod counts too (`LoopShare.took`, from the pod's channels to Triton), but
stopping the pod's reading does not stop answers to requests already at Triton: those are bounded
per pod by its in-flight requests times Triton's window per stream. A stopped pod that is sent
another fair share asks for a walk, which sheds the pods over their share at once if the node is
past twice its budget.

The bound. A pod over its share got there only while the node was under `limit` (plus the one
read that tripped it), and the pods under their share may then grow to it: the bytes held stay
under `2 x limit` (plus one read per pod, and the answers to requests already at Triton when a
pod is stopped), and come back under `limit` within `GRACE` and a walk.

Pure policy: the walk's figures, the clock, and what holding a pod means (its share's pause) are
given to it; it reads no socket and closes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Final

from proxy.policy.share import ACTIVE, UNLIMITED, LoopShare, LoopShares

PERIOD: Final = 0.1
"""Seconds between two walks of every pod's connections while the budget is `busy` (longer while a
walk is slow: the gateway waits 20 times a walk's duration, so walking takes at most 5 % of its
loop); a pod stopped between walks asks for one at once (`on_hold`)."""
QUIET_PERIOD: Final = 10.0
"""Seconds between two walks while the node holds under half its budget and no pod is stopped:
every byte from a pod or from Triton for it counts against the pod's allowance meanwhile, and a
pod stopped for it asks for a walk at once, so this walk only refreshes the figures (and costs
the requests nothing)."""
GRACE: Final = 1.0
"""Seconds a pod may stay over its share, paused, while the node is over its budget before its
largest connections are closed."""
SHED_DRAIN_SECONDS: Final = 1.0
"""Seconds a connection closed for the budget has to take its refusals (a reading tenant learns
why) before it is dropped with what it still holds (a tenant that reads nothing)."""
_SLICE_FLOOR: Final = 64 * 1024
"""The least further allowance a pod is given while the node has room, so that a pod near the
budget asks once per read at most, not once per byte."""


class ByteBudget:
    """The node's byte budget over every pod's share (see the module docstring)."""

    def __init__(
        self,
        limit: int,
        shares: LoopShares,
        *,
        grace: float = GRACE,
        clock: Callable[[], float] = time.monotonic,
        on_hold: Callable[[], None] = lambda: None,
    ) -> None:
        if limit <= 0:
            raise ValueError(f"a byte budget must be positive, not {limit}")
        self.limit = limit
        self._shares = shares
        self._grace = grace
        self._clock = clock
        self._on_hold = on_hold  # a pod stopped between walks: walk soon, it may hold less
        self._held: dict[LoopShare, int] = {}  # each pod's bytes at the last walk
        self._over: dict[LoopShare, float] = {}  # since when each pod has been shed-worthy
        self._pods = 1  # pods sharing the budget at the last count (a walk, or a trip)
        self._sharing: dict[str, int] = {}  # and how many of them each namespace has
        self.total = 0
        """Bytes held for every pod at the last walk."""
        self.holds = 0
        """Times a pod's reading was stopped for the budget (for the metrics)."""
        self.sheds = 0
        """Times a pod's connections were closed for the budget (for the metrics)."""
        # A new pod's first read asks the budget: it is counted from its first byte.
        shares.allowance = 0
        shares.on_tripped = self.tripped

    def held_of(self, share: LoopShare) -> int:
        """What `share`'s pod held at the last walk."""
        return self._held.get(share, 0)

    def fair_of(self, share: LoopShare) -> int:
        """`share`'s pod's fair share of the budget, as of the last count: its namespace's part,
        split among the namespace's pods."""
        sharing = self._sharing
        return self.limit // max(len(sharing), 1) // (sharing.get(share.namespace) or 1)

    def _count(self, sharing: dict[str, int]) -> None:
        self._sharing = sharing
        self._pods = max(sum(sharing.values()), 1)

    def tripped(self, share: LoopShare) -> None:
        """`share` read past its allowance: give it more, or stop its reading until a walk."""
        if share.held:
            # Stopped, yet Triton still answers what it sent before: each further share of
            # answers asks for a walk, which sheds at once past twice the budget.
            share.allowance = share.read + max(self.fair_of(share), _SLICE_FLOOR)
            self._on_hold()
            return
        # Counted now, not at the last walk: pods that came since share the budget at once.
        # What is left counts what the others were promised and have not read yet, so that
        # slices given one after another never add up past the budget.
        since = self._clock() - ACTIVE
        last = self._held
        committed = self.total + share.read
        sharing: dict[str, int] = {}
        for each in self._shares.shares:
            if each is not share:
                allowance = each.allowance
                committed += each.read if allowance == UNLIMITED else max(each.read, allowance)
            if each.read or last.get(each, 0) or each.last >= since:
                sharing[each.namespace] = sharing.get(each.namespace, 0) + 1
        self._count(sharing)
        pods = self._pods
        held = last.get(share, 0) + share.read
        fair = self.fair_of(share)
        room = self.limit - committed
        # Under the budget, a slice of what is left, not all of it (a pod that comes before the
        # next walk finds room too); over it, a pod under its share may still reach its share.
        more = max(room // (pods + 1), min(_SLICE_FLOOR, room)) if room > 0 else fair - held
        if more > 0:
            share.allowance = share.read + more
            return
        share.allowance = share.read + max(fair, _SLICE_FLOOR)  # see above: answers still come
        self.holds += 1
        self._shares.hold(share)
        self._on_hold()

    @property
    def busy(self) -> bool:
        """Whether walks should come every PERIOD: a pod is stopped, or the node held more than
        half its budget at the last walk."""
        return 2 * self.total > self.limit or any(s.held for s in self._shares.shares)

    def measured(self, held: Mapping[LoopShare, int]) -> list[tuple[LoopShare, int]]:
        """A walk's figures: bytes held for each pod now. Sets every pod's allowance, stops or
        resumes their reading, and returns the pods to shed with how many bytes each must give
        up (over their share, while the node is over budget, for longer than the grace)."""
        now = self._clock()
        since = now - ACTIVE
        total = sum(held.values())
        sharing: dict[str, int] = {}
        for share, size in held.items():
            if size > 0 or share.last >= since:
                sharing[share.namespace] = sharing.get(share.namespace, 0) + 1
        self._count(sharing)
        pods = self._pods
        self._held = dict(held)
        self.total = total
        room = max(self.limit - total, 0)
        over_budget = total > self.limit
        shed: list[tuple[LoopShare, int]] = []
        for share, size in held.items():
            share.read = 0
            fair = self.fair_of(share)
            over = over_budget and size > fair
            share.allowance = max(room // pods, fair - size, 0)
            if not over:
                self._over.pop(share, None)
                if share.held:
                    self._shares.release(share)
                continue
            if not share.held:
                self.holds += 1
                self._shares.hold(share)
            share.allowance = max(fair, _SLICE_FLOOR)  # answers to what it sent still come
            began = self._over.setdefault(share, now)
            # Past twice the budget (answers Triton sent before the pods were stopped): no grace.
            if now - began >= self._grace or total > 2 * self.limit:
                del self._over[share]
                self.sheds += 1
                shed.append((share, size - fair))
        for share in list(self._over):
            if share not in held:
                del self._over[share]
        return shed
