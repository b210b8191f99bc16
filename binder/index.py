"""Feasible nodes by free memory: per constraint class (kube-scheduler's equivalence class), the
nodes that pass Kubernetes' rules, in buckets of equal scoring inputs, each sorted by free memory.

Placement scores a node from four numbers: its preferred node affinity sum, its untolerated
PreferNoSchedule taints, its usable GPU capacity and its free GPU memory. Nodes that share the
first three form a bucket, and within a bucket the score moves only with free memory, and
monotonically. So the best node of a bucket is the first feasible one in free-memory order (the
fullest for binpack, the emptiest for spread), and a decision reads the head of each bucket
instead of every node. Ties stay next to each other, in one run of equal free memory.

The cluster state logs the nodes whose free memory or capacity changed; an index catches up on
that log only when it is used, so a class no pending pod uses costs nothing. Pure bookkeeping: no
I/O, no clock.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]

SHIFT = 32
"""An entry is `free << SHIFT | node index`: one int orders by free memory, then node order."""
NODE_MASK = (1 << SHIFT) - 1

Bucket = tuple[int, int, int]
"""(preferred affinity sum, untolerated PreferNoSchedule taints, usable capacity in bytes)."""


def entry(free: int, node: int) -> int:
    return free << SHIFT | node


class FreeIndex:
    """One class's nodes, bucketed by scoring inputs, each bucket sorted by free memory."""

    def __init__(
        self,
        nodes: IntArray,
        affinity: IntArray,
        prefer: IntArray,
        capacity: IntArray,
        free: IntArray,
        cursor: int,
    ) -> None:
        self.buckets: dict[Bucket, list[int]] = {}
        self._scoring: dict[int, tuple[int, int]] = {}
        """Node index -> (affinity, PreferNoSchedule count): fixed while the class lives."""
        self._placed: dict[int, tuple[Bucket, int]] = {}
        """Node index -> its bucket and entry now."""
        self.cursor = cursor
        """How far into the state's change log this index has caught up."""
        for i, a, p in zip(nodes.tolist(), affinity.tolist(), prefer.tolist(), strict=True):
            self._scoring[i] = (a, p)
            bucket = (a, p, int(capacity[i]))
            key = entry(int(free[i]), i)
            self.buckets.setdefault(bucket, []).append(key)
            self._placed[i] = (bucket, key)
        for keys in self.buckets.values():
            keys.sort()

    def refile(self, node: int, scoring: tuple[int, int] | None, capacity: int, free: int) -> None:
        """The node's rules were evaluated again: `scoring` is its (affinity, PreferNoSchedule
        count), or None when the class's rules now reject it."""
        self._remove(node)
        if scoring is None:
            self._scoring.pop(node, None)
            return
        self._scoring[node] = scoring
        self._add(node, (*scoring, capacity), entry(free, node))

    def shift(self, at: int, delta: int) -> None:
        """Node indices `at` and later move by `delta` (a node joined or left before them in name
        order). Each bucket stays sorted: no index moves past another one."""
        for bucket, keys in self.buckets.items():
            self.buckets[bucket] = [k + delta if k & NODE_MASK >= at else k for k in keys]
        self._scoring = {(i + delta if i >= at else i): s for i, s in self._scoring.items()}
        placed = {i: p for i, p in self._placed.items() if i < at}
        placed.update({i + delta: (b, k + delta) for i, (b, k) in self._placed.items() if i >= at})
        self._placed = placed

    def _remove(self, node: int) -> None:
        placed = self._placed.pop(node, None)
        if placed is None:
            return
        bucket, key = placed
        keys = self.buckets[bucket]
        del keys[bisect_left(keys, key)]
        if not keys:
            del self.buckets[bucket]

    def _add(self, node: int, bucket: Bucket, key: int) -> None:
        insort(self.buckets.setdefault(bucket, []), key)
        self._placed[node] = (bucket, key)

    def catch_up(
        self, changes: Sequence[int], capacity: IntArray, free: IntArray, upto: int
    ) -> None:
        """Re-file the nodes logged as changed since the last call (`changes[cursor:upto]`)."""
        for i in set(changes[self.cursor : upto]):
            placed = self._placed.get(i)
            if placed is None:
                continue  # a node this class's rules reject
            a, p = self._scoring[i]
            bucket = (a, p, int(capacity[i]))
            key = entry(int(free[i]), i)
            if (bucket, key) != placed:
                self._remove(i)
                self._add(i, bucket, key)
        self.cursor = upto
