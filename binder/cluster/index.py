"""Feasible nodes by free memory: per constraint class (kube-scheduler's equivalence class), the
nodes that pass Kubernetes' rules, in buckets of equal scoring inputs, each sorted by free memory.

Placement scores a node from its preferred node affinity sum, its untolerated PreferNoSchedule
taints and its GPU memory. The first two are fixed while the class lives; nodes that share them
(and, for `spread`, their usable capacity) form a bucket, within which the score moves only with
free memory, and monotonically. Two orders serve the two policies, each built the first time a
decision of its policy reads it (a binder runs one policy, so it keeps one):

- `spread` scores a node by its free memory relative to its capacity: buckets of nodes sorted by
  their total free memory, read from the empty end.
- `binpack` scores a node by its best GPU that fits the pod (by the GPU's size and whether it is
  used), then the tightest free block: buckets of GPUs of one size sorted by their free block
  (the used ones first, as an empty GPU's block is its whole size), so a bisection finds the
  tightest block that fits in each, in O(log GPUs), and the next entries are the next tightest.

Equal keys stay next to each other, in node order. The cluster state logs the nodes whose free
memory or capacity changed; an index catches up on that log only when it is used, so a class no
pending pod uses costs nothing. Pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]

SHIFT = 32
"""A node entry is `free << SHIFT | node index`: one int orders by free memory, then node order."""
NODE_MASK = (1 << SHIFT) - 1
GPU_BITS = 16
"""A GPU entry is `free << BLOCK_SHIFT | node index << GPU_BITS | GPU position`. A Node object is
at most about 1.5 MB (etcd's limit), so its GPU annotation lists far fewer than 2**16 GPUs."""
BLOCK_SHIFT = SHIFT + GPU_BITS

Scoring = tuple[int, int]
"""(preferred affinity sum, untolerated PreferNoSchedule taints): fixed while the class lives."""
Bucket = tuple[int, int, int]
"""Scoring and a usable size in bytes: the node's capacity (for spread), a GPU's (binpack)."""
Blocks = tuple[tuple[int, int], ...]
"""A node's GPUs, in its order: (usable size, free block) of each, in bytes."""


def entry(free: int, node: int) -> int:
    return free << SHIFT | node


def block_entry(free: int, node: int, position: int) -> int:
    return free << BLOCK_SHIFT | node << GPU_BITS | position


def block_node(key: int) -> int:
    return (key >> GPU_BITS) & NODE_MASK


class SortedKeys:
    """Ints kept sorted in chunks of a few hundred, so adding or removing one moves a chunk's
    worth of pointers, not a whole bucket's (a binpack bucket holds every GPU of one size in the
    class: tens of thousands at 5,000 nodes)."""

    CHUNK = 512

    def __init__(self, keys: list[int]) -> None:
        keys.sort()
        self._chunks = [keys[i : i + self.CHUNK] for i in range(0, len(keys), self.CHUNK)]
        self._maxes = [chunk[-1] for chunk in self._chunks]

    def __len__(self) -> int:
        return sum(len(chunk) for chunk in self._chunks)

    def __bool__(self) -> bool:
        return bool(self._chunks)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SortedKeys) and list(self) == list(other)

    def __iter__(self) -> Iterator[int]:
        for chunk in self._chunks:
            yield from chunk

    def add(self, key: int) -> None:
        if not self._chunks:
            self._chunks, self._maxes = [[key]], [key]
            return
        i = min(bisect_left(self._maxes, key), len(self._chunks) - 1)
        chunk = self._chunks[i]
        insort(chunk, key)
        self._maxes[i] = chunk[-1]
        if len(chunk) > 2 * self.CHUNK:
            self._chunks[i : i + 1] = [chunk[: self.CHUNK], chunk[self.CHUNK :]]
            self._maxes[i : i + 1] = [chunk[self.CHUNK - 1], chunk[-1]]

    def remove(self, key: int) -> None:
        """Remove `key`, which must be present."""
        i = bisect_left(self._maxes, key)
        chunk = self._chunks[i]
        del chunk[bisect_left(chunk, key)]
        if chunk:
            self._maxes[i] = chunk[-1]
        else:
            del self._chunks[i]
            del self._maxes[i]

    def from_key(self, key: int) -> Iterator[int]:
        """The keys >= `key`, in order."""
        i = bisect_left(self._maxes, key)
        if i == len(self._chunks):
            return
        chunk = self._chunks[i]
        for position in range(bisect_left(chunk, key), len(chunk)):
            yield chunk[position]
        for chunk in self._chunks[i + 1 :]:
            yield from chunk

    def map(self, shift: int, at: int) -> None:
        """Add `shift` to the keys whose node index is `at` or later (order is kept)."""
        self._chunks = [[k + shift if block_node(k) >= at else k for k in c] for c in self._chunks]
        self._maxes = [chunk[-1] for chunk in self._chunks]


class FreeIndex:
    """One class's nodes, bucketed by scoring inputs: by free memory (for `spread`) and their
    GPUs by free block (for `binpack`), each order built when first read."""

    def __init__(self, nodes: IntArray, affinity: IntArray, prefer: IntArray, cursor: int) -> None:
        self._scoring: dict[int, Scoring] = dict(
            zip(nodes.tolist(), zip(affinity.tolist(), prefer.tolist(), strict=True), strict=True)
        )
        """Node index -> its scoring inputs, for the nodes the class's rules let through."""
        self.cursor = cursor
        """How far into the state's change log this index has caught up."""
        self._buckets: dict[Bucket, list[int]] | None = None
        self._placed: dict[int, tuple[Bucket, int]] = {}
        """Node index -> its bucket and entry now (once `buckets` is built)."""
        self._blocks: dict[Bucket, SortedKeys] | None = None
        self._seen: dict[int, Blocks] = {}
        """Node index -> the blocks its GPUs are filed under (once `blocks` is built): each GPU's
        bucket and entry follow from them, so they are not kept (the state's tuple is shared)."""

    def buckets(self, capacity: IntArray, free: IntArray) -> dict[Bucket, list[int]]:
        """Nodes by (scoring, capacity), each bucket sorted by free memory: for `spread`."""
        if self._buckets is None:
            built: dict[Bucket, list[int]] = {}
            for i, scoring in self._scoring.items():
                bucket, key = (*scoring, int(capacity[i])), entry(int(free[i]), i)
                built.setdefault(bucket, []).append(key)
                self._placed[i] = (bucket, key)
            for keys in built.values():
                keys.sort()
            self._buckets = built
        return self._buckets

    def blocks(self, blocks: Sequence[Blocks]) -> dict[Bucket, SortedKeys]:
        """GPUs by (their node's scoring, their size), each bucket sorted by free block: for
        `binpack`."""
        if self._blocks is None:
            built: dict[Bucket, list[int]] = {}
            for i, scoring in self._scoring.items():
                for bucket, key in _gpu_entries(i, scoring, blocks[i]):
                    built.setdefault(bucket, []).append(key)
                self._seen[i] = blocks[i]
            self._blocks = {bucket: SortedKeys(keys) for bucket, keys in built.items()}
        return self._blocks

    def refile(
        self, node: int, scoring: Scoring | None, capacity: int, free: int, blocks: Blocks
    ) -> None:
        """The node's rules were evaluated again: `scoring` is its (affinity, PreferNoSchedule
        count), or None when the class's rules now reject it."""
        self._remove_node(node)
        self._remove_gpus(node)
        if scoring is None:
            self._scoring.pop(node, None)
            return
        self._scoring[node] = scoring
        if self._buckets is not None:
            self._add_node(node, (*scoring, capacity), entry(free, node))
        if self._blocks is not None:
            self._add_gpus(node, scoring, blocks)

    def shift(self, at: int, delta: int) -> None:
        """Node indices `at` and later move by `delta` (a node joined or left before them in name
        order). Each bucket stays sorted: no index moves past another one."""
        self._scoring = {(i + delta if i >= at else i): s for i, s in self._scoring.items()}
        if self._buckets is not None:
            for bucket, keys in self._buckets.items():
                self._buckets[bucket] = [k + delta if k & NODE_MASK >= at else k for k in keys]
            placed = {i: p for i, p in self._placed.items() if i < at}
            placed.update(
                {i + delta: (b, k + delta) for i, (b, k) in self._placed.items() if i >= at}
            )
            self._placed = placed
        if self._blocks is not None:
            step = delta << GPU_BITS
            for gpu_keys in self._blocks.values():
                gpu_keys.map(step, at)
            self._seen = {(i + delta if i >= at else i): b for i, b in self._seen.items()}

    def _remove_node(self, node: int) -> None:
        placed = self._placed.pop(node, None)
        if placed is None or self._buckets is None:
            return
        _discard(self._buckets, *placed)

    def _add_node(self, node: int, bucket: Bucket, key: int) -> None:
        assert self._buckets is not None
        insort(self._buckets.setdefault(bucket, []), key)
        self._placed[node] = (bucket, key)

    def _remove_gpus(self, node: int) -> None:
        """Take the node's GPUs out (before its scoring changes: their buckets follow from it)."""
        seen = self._seen.pop(node, None)
        if seen is None or self._blocks is None:
            return
        for bucket, key in _gpu_entries(node, self._scoring[node], seen):
            _remove_key(self._blocks, bucket, key)

    def _add_gpus(self, node: int, scoring: Scoring, blocks: Blocks) -> None:
        assert self._blocks is not None
        for bucket, key in _gpu_entries(node, scoring, blocks):
            _add_key(self._blocks, bucket, key)
        self._seen[node] = blocks

    def catch_up(
        self,
        changes: Sequence[int],
        capacity: IntArray,
        free: IntArray,
        blocks: Sequence[Blocks],
        upto: int,
    ) -> None:
        """Re-file the nodes logged as changed since the last call (`changes[cursor:upto]`)."""
        for i in set(changes[self.cursor : upto]):
            scoring = self._scoring.get(i)
            if scoring is None:
                continue  # a node this class's rules reject
            if self._buckets is not None:
                bucket = (*scoring, int(capacity[i]))
                key = entry(int(free[i]), i)
                if (bucket, key) != self._placed.get(i):
                    self._remove_node(i)
                    self._add_node(i, bucket, key)
            if self._blocks is not None:
                self._refile_gpus(i, scoring, blocks[i])
        self.cursor = upto

    def _refile_gpus(self, node: int, scoring: Scoring, blocks: Blocks) -> None:
        """Move only the node's GPUs whose block changed (one, when a pod is charged)."""
        before = self._seen.get(node)
        if before is None or len(before) != len(blocks):
            self._remove_gpus(node)
            self._add_gpus(node, scoring, blocks)
            return
        self._seen[node] = blocks
        gpu_buckets = self._blocks
        assert gpu_buckets is not None
        affinity, prefer = scoring
        at = node << GPU_BITS
        for position, (old, new) in enumerate(zip(before, blocks, strict=True)):
            if old != new:
                key = old[1] << BLOCK_SHIFT | at | position
                _remove_key(gpu_buckets, (affinity, prefer, old[0]), key)
                key = new[1] << BLOCK_SHIFT | at | position
                _add_key(gpu_buckets, (affinity, prefer, new[0]), key)


def _gpu_entries(node: int, scoring: Scoring, blocks: Blocks) -> list[tuple[Bucket, int]]:
    return [
        ((*scoring, size), block_entry(free, node, position))
        for position, (size, free) in enumerate(blocks)
    ]


def _discard(buckets: dict[Bucket, list[int]], bucket: Bucket, key: int) -> None:
    keys = buckets[bucket]
    del keys[bisect_left(keys, key)]
    if not keys:
        del buckets[bucket]


def _remove_key(buckets: dict[Bucket, SortedKeys], bucket: Bucket, key: int) -> None:
    keys = buckets[bucket]
    keys.remove(key)
    if not keys:
        del buckets[bucket]


def _add_key(buckets: dict[Bucket, SortedKeys], bucket: Bucket, key: int) -> None:
    keys = buckets.get(bucket)
    if keys is None:
        buckets[bucket] = SortedKeys([key])
    else:
        keys.add(key)
