"""GPU memory per node as a pod of one residency class sees it: what placement reads.

A `MemoryView` holds, per node in the cluster state's index order, the usable capacity, the
largest free block, the total free memory, each GPU's (usable size, free block) for binpack's
index of free blocks (binder.cluster.index) and the room to wake one on-demand model, and those
blocks as matrices for binpack's vectorised scan, written only when read. `ResidencyViews`
keeps one for `always` pods and, once needed, one for `on-demand` pods
(binder.cluster.residencyfit), each the same object for the cluster state's life
(binder.cluster.clusterstate, which writes their rows and moves them as nodes join and leave).
Pure: no I/O, no clock.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from binder.cluster.gpumemory import Offer
from binder.cluster.gpusizes import GpuSizes, SizeCounts
from binder.cluster.index import Blocks

IntArray = npt.NDArray[np.int64]


class MemoryView:
    """Per node (index order): GPU memory as a pod of one residency class sees it."""

    def __init__(self) -> None:
        self.capacity: IntArray = np.zeros(0, np.int64)
        """The usable memory of the node's GPUs."""
        self.max_free: IntArray = np.zeros(0, np.int64)
        """The largest free block (-1 without GPUs)."""
        self.free_total: IntArray = np.zeros(0, np.int64)
        self.gpu_blocks: list[Blocks] = []
        """Per GPU: (usable size, free block)."""
        self.wake: IntArray = np.zeros(0, np.int64)
        """The most room any GPU leaves to wake one on-demand model
        (`binder.cluster.residencyfit.wake_room`; -1 without GPUs): for the unschedulable
        reasons. Where nothing is on-demand and nothing over-commits, the largest free block."""
        self._size: IntArray = np.zeros((0, 1), np.int64)
        self._room: IntArray = np.full((0, 1), -1, np.int64)
        self._stale: set[int] = set()
        """Rows of those matrices behind `gpu_blocks`: written only when `gpu_matrices` is read."""

    def reset(self, count: int) -> None:
        """`count` nodes with nothing written yet."""
        self.capacity = np.zeros(count, np.int64)
        self.max_free = np.full(count, -1, np.int64)
        self.free_total = np.zeros(count, np.int64)
        self.gpu_blocks = [()] * count
        self.wake = np.full(count, -1, np.int64)
        self._size = np.zeros((count, 1), np.int64)
        self._room = np.full((count, 1), -1, np.int64)
        self._stale.clear()

    def copy_from(self, other: MemoryView) -> None:
        """Take the other view's figures (its matrices are written again when read)."""
        count = len(other.gpu_blocks)
        self.capacity = other.capacity.copy()
        self.max_free = other.max_free.copy()
        self.wake = other.max_free.copy()
        self.free_total = other.free_total.copy()
        self.gpu_blocks = list(other.gpu_blocks)
        self._size = np.zeros((count, 1), np.int64)
        self._room = np.full((count, 1), -1, np.int64)
        self._stale = set(range(count))

    def write(self, i: int, free: list[int], sizes: list[int], wake: int | None = None) -> bool:
        """Node `i`'s GPUs offer `free` of their usable `sizes`; `wake`: the room to wake an
        on-demand model, when not the largest free block. True when its blocks changed."""
        blocks = tuple(zip(sizes, free, strict=True))
        changed = blocks != self.gpu_blocks[i]
        if changed:
            self.capacity[i] = sum(sizes)
            self.max_free[i] = max(free) if free else -1
            self.free_total[i] = sum(free)
            self.gpu_blocks[i] = blocks
            self._stale.add(i)
        self.wake[i] = self.max_free[i] if wake is None else wake
        return changed

    def insert(self, position: int) -> None:
        """A node joined at `position`: an empty row there, the later rows one down."""
        self.gpu_matrices()  # stale rows are counted by index: settle them before the shift
        self.capacity = np.insert(self.capacity, position, 0)
        self.max_free = np.insert(self.max_free, position, -1)
        self.wake = np.insert(self.wake, position, -1)
        self.free_total = np.insert(self.free_total, position, 0)
        self.gpu_blocks.insert(position, ())
        self._size = np.insert(self._size, position, 0, axis=0)
        self._room = np.insert(self._room, position, -1, axis=0)

    def delete(self, position: int) -> None:
        """The node at `position` left: its row goes, the later rows one up."""
        self.gpu_matrices()
        self.capacity = np.delete(self.capacity, position)
        self.max_free = np.delete(self.max_free, position)
        self.wake = np.delete(self.wake, position)
        self.free_total = np.delete(self.free_total, position)
        del self.gpu_blocks[position]
        self._size = np.delete(self._size, position, axis=0)
        self._room = np.delete(self._room, position, axis=0)

    def gpu_matrices(self) -> tuple[IntArray, IntArray]:
        """`gpu_blocks` as two matrices, a row per node: each GPU's usable size (0 past the
        node's GPUs) and free block (-1 there), for binpack's vectorised scan. Kept up to date
        only when read: the common decision reads the index instead."""
        if self._stale:
            self._size, self._room = _fill_rows(
                self._size, self._room, self.gpu_blocks, self._stale
            )
        return self._size, self._room


class ResidencyViews:
    """The view of `always` pods and, once a node over-commits or a pod is on-demand (`split`),
    a view of their own for `on-demand` pods; until then both read the plain one and the other
    costs nothing. With the plain view's GPUs counted by size (`sizes`)."""

    def __init__(self) -> None:
        self.plain = MemoryView()
        self._on_demand = MemoryView()
        self.split = False
        self._size_counts = SizeCounts()
        """Over the plain view's blocks: kept as blocks change, so `sizes` costs no pass."""

    def of(self, on_demand: bool) -> MemoryView:
        """The view a pod of that residency class reads."""
        return self._on_demand if on_demand and self.split else self.plain

    def split_off(self) -> None:
        """From now on the on-demand view keeps its own figures: the plain ones to start."""
        self.split = True
        self._on_demand.copy_from(self.plain)

    def reset(self, count: int) -> None:
        """`count` nodes with nothing written yet, in both views."""
        self.plain.reset(count)
        self._size_counts.clear()
        if self.split:
            self._on_demand.copy_from(self.plain)

    def write(self, i: int, offer: Offer) -> bool:
        """What node `i`'s GPUs offer; True when either view's blocks changed."""
        was = self.plain.gpu_blocks[i]
        changed = self.plain.write(i, offer.free, offer.sizes)
        if changed:
            self._size_counts.recount(was, self.plain.gpu_blocks[i])
        if self.split and offer.on_demand is not None:
            free, wake = offer.on_demand
            changed |= self._on_demand.write(i, free, offer.sizes, wake)
        elif self.split:  # nothing on-demand, no over-commit: the plain figures
            changed |= self._on_demand.write(i, offer.free, offer.sizes)
        return changed

    def insert(self, position: int) -> None:
        """A node joined at `position`: an empty row there in each view."""
        self.plain.insert(position)
        if self.split:
            self._on_demand.insert(position)

    def delete(self, position: int) -> None:
        """The node at `position` left: its row goes from each view."""
        self._size_counts.recount(self.plain.gpu_blocks[position], ())
        self.plain.delete(position)
        if self.split:
            self._on_demand.delete(position)

    def sizes(self) -> GpuSizes:
        """The cluster's healthy GPUs by usable size (`binder.cluster.gpusizes`)."""
        return self._size_counts.read(self.plain.gpu_blocks)


def _fill_rows(
    size: IntArray, room: IntArray, blocks: list[Blocks], rows: set[int]
) -> tuple[IntArray, IntArray]:
    """Write the `rows` of the (size, free block) matrices from `blocks` and empty `rows`;
    widened first when a node has more GPUs than any before."""
    widest = max(len(blocks[i]) for i in rows)
    width = size.shape[1]
    if widest > width:
        extra = ((0, 0), (0, widest - width))
        size = np.pad(size, extra, constant_values=0)
        room = np.pad(room, extra, constant_values=-1)
    for i in rows:
        row = blocks[i]
        size[i] = 0
        room[i] = -1
        size[i, : len(row)] = [s for s, _ in row]
        room[i, : len(row)] = [f for _, f in row]
    rows.clear()
    return size, room
