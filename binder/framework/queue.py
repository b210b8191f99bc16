"""The scheduling queue: pending pods waiting for a decision, with per-pod exponential backoff.

A new or changed pending pod is active at once. A pod that did not fit waits: 1 s after its first
failure, doubling per failure up to a cap (2 min by default), and is retried when its wait ends.
A cluster change that could help (memory freed, a node added or changed, an agent alive) makes
every waiting pod active at once, keeping its failure count so the next wait is still longer.
A uid backed off as `capped` (a TritonModel's; every uid of a queue made with `event_backoff_max`
and no `capped_by_default=False`) follows kube-scheduler's backoff instead: a cluster change
retries it only once `min(its wait, event_backoff_max)` has passed since it failed (at that
moment, if the change came earlier), so however many changes come, each is tried at most once per
backoff; without a change it waits out its whole wait. One queue holds both kinds: the binder's
pods and TritonModels wait in one line.

Active pods are taken one namespace at a time, in turns: each namespace with active pods gives
one (its oldest) per turn, so a namespace that creates thousands of pending pods (or whose
thousands are made active at once by a cluster change) delays another namespace's pod by one of
its own, not by thousands. Within a namespace, first in, first out; no pod starves.

Owns no pods, only their uids; reads time from the clock it is given (fake in tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import math
import time
from collections import deque
from collections.abc import Callable


class SchedulingQueue:
    """Active uids (in turns by namespace, FIFO within one) plus uids waiting out a backoff."""

    def __init__(
        self,
        *,
        initial_seconds: float = 1.0,
        max_seconds: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        event_backoff_max: float | None = None,
        capped_by_default: bool = True,
    ) -> None:
        self._initial = initial_seconds
        self._max = max_seconds
        self._event_max = event_backoff_max
        self._capped_by_default = capped_by_default and event_backoff_max is not None
        self._clock = clock
        self._active: dict[str, deque[str]] = {}
        """Each namespace's active uids, oldest first; only namespaces with some."""
        self._turns: deque[str] = deque()
        """The namespaces with active uids, the one whose turn is next first."""
        self._namespace: dict[str, str] = {}
        """Each known uid's namespace, as `add` was last told."""
        self._queued: set[str] = set()
        self._waiting: dict[str, float] = {}
        self._due: list[tuple[float, str]] = []
        """Heap of (due time, uid) over the waiting pods: a pop looks at the due ones only, not
        at every waiting pod. Entries of pods no longer waiting, or waiting until another time,
        are stale and skipped; the heap is rebuilt when they outnumber the live ones."""
        self._failures: dict[str, int] = {}
        self._wakeup = asyncio.Event()
        self._failed_at: dict[str, tuple[float, float]] = {}
        """Each capped uid's last failure time and the end of its backoff (kept until `remove`:
        what tells a capped uid from another)."""
        self._backed_off: list[tuple[float, str]] = []
        """With `event_backoff_max`: heap of (end of backoff, uid) of the waiting uids."""
        self._parked: set[str] = set()
        """With `event_backoff_max`: waiting uids past their backoff, retried at the next change."""
        self._changed_at = -math.inf
        """With `event_backoff_max`: when the cluster last changed."""

    def __len__(self) -> int:
        return len(self._queued) + len(self._waiting)

    def __contains__(self, uid: object) -> bool:
        return uid in self._queued or uid in self._waiting

    def failures(self, uid: str) -> int:
        return self._failures.get(uid, 0)

    def _push(self, uid: str) -> None:
        self._queued.add(uid)
        namespace = self._namespace.get(uid, "")
        active = self._active.get(namespace)
        if active is None:
            active = self._active[namespace] = deque()
            self._turns.append(namespace)
        active.append(uid)

    def _drop(self, uid: str) -> None:
        """Take an active uid out of its namespace's line."""
        self._queued.discard(uid)
        namespace = self._namespace.get(uid, "")
        active = self._active[namespace]
        active.remove(uid)
        if not active:
            del self._active[namespace]
            self._turns.remove(namespace)

    def _take(self) -> str:
        """The next active uid: the oldest of the namespace whose turn it is."""
        namespace = self._turns.popleft()
        active = self._active[namespace]
        uid = active.popleft()
        if active:
            self._turns.append(namespace)
        else:
            del self._active[namespace]
        self._queued.discard(uid)
        return uid

    def add(self, uid: str, namespace: str | None = None) -> None:
        """Make a pod active now (new, or changed in a way that matters); `namespace` is the
        pod's (None: as it was last given)."""
        if namespace is not None and namespace != self._namespace.get(uid):
            if uid in self._queued:
                self._drop(uid)
            self._namespace[uid] = namespace
        self._waiting.pop(uid, None)
        if uid not in self._queued:
            self._push(uid)
            self._wakeup.set()

    def remove(self, uid: str) -> None:
        """Forget a pod entirely (bound, deleted, or no longer ours)."""
        self._waiting.pop(uid, None)
        self._failures.pop(uid, None)
        self._failed_at.pop(uid, None)
        self._parked.discard(uid)
        if uid in self._queued:
            self._drop(uid)
        self._namespace.pop(uid, None)

    def backoff(self, uid: str, *, capped: bool | None = None) -> float:
        """The pod did not fit: wait before retrying (`capped`: as kube-scheduler's, see the
        module; None: as the queue was made). Returns the wait in seconds."""
        failures = self._failures.get(uid, 0) + 1
        self._failures[uid] = failures
        delay: float = min(self._initial * 2.0 ** (failures - 1), self._max)
        if uid in self._queued:
            self._drop(uid)
        now = self._clock()
        due = now + delay
        self._waiting[uid] = due
        heapq.heappush(self._due, (due, uid))
        if len(self._due) > 2 * len(self._waiting) + 64:
            self._due = [(t, u) for u, t in self._waiting.items()]
            heapq.heapify(self._due)
        if self._event_max is not None and (self._capped_by_default if capped is None else capped):
            ends = now + min(delay, self._event_max)
            self._failed_at[uid] = (now, ends)
            self._parked.discard(uid)
            heapq.heappush(self._backed_off, (ends, uid))
            if len(self._backed_off) > 2 * len(self._waiting) + 64:
                live = self._failed_at.items()
                self._backed_off = [(e, u) for u, (_, e) in live if u in self._waiting]
                heapq.heapify(self._backed_off)
        self._wakeup.set()
        return delay

    def move_all_to_active(self) -> int:
        """A helpful cluster change: every waiting uid is retried now (a capped one: once past
        its backoff, now or as it ends). Returns how many now."""
        waiting = self._waiting
        moved = []
        if self._event_max is not None:
            self._changed_at = self._clock()
            parked, self._parked = self._parked, set()
            moved = [u for u in parked if u in waiting]
        capped = self._failed_at
        moved.extend(u for u in waiting if u not in capped)
        moved.sort(key=waiting.__getitem__)
        for uid in moved:
            del waiting[uid]
            self._push(uid)
        if not capped:
            self._due.clear()
        if moved:
            self._wakeup.set()
        return len(moved)

    def wake(self) -> None:
        """Wakes `pop` (and whoever waits on `woken`) though no uid became active: the binder's
        loop has other work."""
        self._wakeup.set()

    async def woken(self, within: float | None) -> None:
        """Waits until something is added, backed off or `wake`d since the last `pop` or
        `clear_wake`, or `within` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), within)

    def clear_wake(self) -> None:
        self._wakeup.clear()

    def _promote_due(self) -> float | None:
        """Move pods whose wait is over to active; return seconds until the next one is due."""
        heap = self._due
        if not heap and not self._backed_off:
            return None
        now = self._clock()
        waiting = self._waiting
        # In (due, uid) order, as sorting the due ones would give.
        while heap and heap[0][0] <= now:
            t, uid = heapq.heappop(heap)
            if waiting.get(uid) == t:
                del waiting[uid]
                self._push(uid)
        while heap and waiting.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        following = self._promote_backed_off(now)
        if heap:
            following = min(following, heap[0][0])
        return None if following == math.inf else max(0.0, following - now)

    def _promote_backed_off(self, now: float) -> float:
        """With `event_backoff_max`: uids whose backoff ended become active if the cluster changed
        since they failed, else wait for a change (parked). Returns when the next backoff ends."""
        heap = self._backed_off
        while heap and heap[0][0] <= now:
            t, uid = heapq.heappop(heap)
            failed, ends = self._failed_at.get(uid, (0.0, -1.0))
            if uid not in self._waiting or t != ends:
                continue  # retried, or failed again since: another entry stands for it
            if self._changed_at > failed:
                del self._waiting[uid]
                self._push(uid)
            else:
                self._parked.add(uid)
        return heap[0][0] if heap else math.inf

    def due_in(self) -> float | None:
        """Seconds until the next waiting uid is due (None: none waits), promoting due ones."""
        return self._promote_due()

    def pop_ready(self) -> str | None:
        """The next active pod, or None (promoting pods whose wait is over first)."""
        self._promote_due()
        if not self._turns:
            return None
        return self._take()

    async def pop(self) -> str:
        """Wait for the next pod to schedule."""
        while True:
            self._wakeup.clear()
            next_due = self._promote_due()
            if self._turns:
                return self._take()
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout=next_due)
            except TimeoutError:
                continue
