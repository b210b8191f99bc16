"""The cluster's healthy GPUs counted by usable size, for binpack's scoring (`GpuSizes`).

`SizeCounts` follows the cluster state's per-node GPU blocks (binder.cluster.index's `Blocks`:
per GPU its usable size and free block) as they change, so reading the counts costs no pass over
every GPU. Pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from binder.cluster.index import Blocks


@dataclass(frozen=True)
class GpuSizes:
    """The cluster's healthy GPUs grouped by usable size (ascending): for binpack's scoring."""

    sizes: tuple[int, ...]
    below: tuple[int, ...]
    """For each size, the next kind's: the largest size under nine tenths of it (sizes within a
    tenth of each other are one kind), 0 for the smallest kind. A pod larger than that needs a
    GPU of this size or more."""
    gpus: tuple[int, ...]
    """GPUs of each size."""
    whole: tuple[int, ...]
    """Of those, the GPUs nothing is charged to (their free block is their whole size)."""
    roomy: tuple[int, ...]
    """Of those, the GPUs with a free block a pod that needs this size could use (at least the
    next kind's size, `below`)."""


def next_kind_below(sizes: list[int], size: int) -> int:
    """The largest of the ascending `sizes` under nine tenths of `size` (s * 10 < size * 9);
    0 when none is."""
    under = bisect_left(sizes, -(-size * 9 // 10))
    return sizes[under - 1] if under else 0


class SizeCounts:
    """Healthy GPUs per usable size, and those of them with nothing taken (free block = size)
    or with room for a pod of their size, kept as blocks change."""

    def __init__(self) -> None:
        self._gpus_of_size: Counter[int] = Counter()
        self._whole_of_size: Counter[int] = Counter()
        self._roomy_of_size: Counter[int] = Counter()
        self._below: dict[int, int] | None = None
        """Each size's next kind (`GpuSizes.below`); None when a size came or went, and the
        roomy counts with it are recounted at the next read."""
        self._sizes: GpuSizes | None = None

    def clear(self) -> None:
        """Forget every GPU: the blocks are about to be counted again from nothing."""
        self._gpus_of_size.clear()
        self._whole_of_size.clear()
        self._below = None
        self._sizes = None

    def recount(self, old: Blocks, new: Blocks) -> None:
        """Follow the per-size counts from a node's old blocks to its new ones. A charge changes
        one GPU's block and seldom turns it whole, used, or roomy: then the counts and the
        `read` answer are kept as they are."""
        below = self._below
        if below is not None and len(old) == len(new):
            changed = [(was, now) for was, now in zip(old, new, strict=True) if was != now]
            if all(
                was[0] == now[0]
                and was[0] in below
                and (was[1] == was[0]) == (now[1] == now[0])
                and (was[1] >= below[was[0]]) == (now[1] >= below[now[0]])
                for was, now in changed
            ):
                return  # no GPU changed size, wholeness or room (unhealthy ones are size 0)
        for sign, blocks in ((-1, old), (1, new)):
            for size, free in blocks:
                if size <= 0:
                    continue  # an unhealthy GPU offers nothing and is not counted
                self._gpus_of_size[size] += sign
                self._whole_of_size[size] += sign * (free == size)
                if below is not None and size in below:
                    self._roomy_of_size[size] += sign * (free >= below[size])
                else:
                    below = self._below = None  # a size new to the cluster: recount on read
        for size in [size for size, count in self._gpus_of_size.items() if not count]:
            del self._gpus_of_size[size], self._whole_of_size[size]
            self._below = None
        self._sizes = None

    def read(self, blocks: Iterable[Blocks]) -> GpuSizes:
        """The counts, given every node's blocks (read only when a size came or went)."""
        if self._below is None:
            # A size came or went (rare: a node of a new GPU model): each size's next kind may
            # have changed, so its roomy GPUs are counted again, once.
            sizes = sorted(self._gpus_of_size)
            below = {size: next_kind_below(sizes, size) for size in sizes}
            self._roomy_of_size = Counter()
            for node in blocks:
                for size, free in node:
                    if size > 0:
                        self._roomy_of_size[size] += free >= below[size]
            self._below = below
            self._sizes = None
        if self._sizes is None:
            sizes = sorted(self._gpus_of_size)
            self._sizes = GpuSizes(
                tuple(sizes),
                tuple(self._below[size] for size in sizes),
                tuple(self._gpus_of_size[size] for size in sizes),
                tuple(self._whole_of_size[size] for size in sizes),
                tuple(self._roomy_of_size[size] for size in sizes),
            )
        return self._sizes
