"""The constraint classes the cluster state keeps, each with its free-memory indexes.

Per pod constraints: Kubernetes' rules evaluated over every node (binder.cluster.classes, asking
the rules the cache is built with: binder.framework.noderules) and, per residency class, its
feasible nodes by free memory (binder.cluster.index), fed by a log of the node indices whose free
memory or capacity changed. A node joining, leaving, or changing its
labels, taints or cordon is evaluated alone, in every class and index, not every node again. The
cluster state (binder.cluster.clusterstate) owns the node rows and passes in the memory views
(binder.cluster.memoryviews) the indexes read; pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable

from binder.cluster.classes import (
    ConstraintClass,
    NodeRules,
    evaluate,
    reevaluate,
    shifted,
    without,
)
from binder.cluster.index import FreeIndex
from binder.cluster.memoryviews import MemoryView
from binder.cluster.objects import Constraints, NodeInfo

Views = Callable[[bool], MemoryView]
"""The memory view of each residency class (on-demand or not)."""

CLASS_LIMIT = 1024
"""Classes kept; past it all are forgotten and evaluated again as pods ask."""
CHANGE_LOG_LIMIT = 1 << 16
"""Logged node changes kept for the free-memory indexes; past it they are rebuilt on next use."""


class ClassCache:
    """Constraint classes and their free-memory indexes, kept node by node."""

    def __init__(self, rules: NodeRules) -> None:
        self._rules = rules
        """What a class is evaluated by."""
        self.classes: dict[Constraints, ConstraintClass] = {}
        self.indexes: dict[Constraints, FreeIndex] = {}
        self.od_indexes: dict[Constraints, FreeIndex] = {}
        """The indexes as an on-demand pod sees the memory."""
        self.changes: list[int] = []
        """Indices of nodes whose free memory or capacity changed, in order (for the indexes)."""

    def constraint_class(
        self, constraints: Constraints, nodes: Callable[[], list[NodeInfo]]
    ) -> ConstraintClass:
        """The class of these constraints, evaluated over `nodes()` (in index order) if new."""
        cached = self.classes.get(constraints)
        if cached is not None:
            return cached
        result = evaluate(self._rules, constraints, nodes())
        if len(self.classes) > CLASS_LIMIT:
            self.forget()
        self.classes[constraints] = result
        return result

    def free_index(
        self,
        constraints: Constraints,
        cls: ConstraintClass,
        on_demand: bool,
        view: MemoryView,
    ) -> FreeIndex:
        """The class's index for that residency class, caught up with the change log."""
        if len(self.changes) > CHANGE_LOG_LIMIT:
            self.indexes.clear()
            self.od_indexes.clear()
            self.changes.clear()
        indexes = self.indexes_of(on_demand)
        index = indexes.get(constraints)
        if index is None:
            index = FreeIndex(cls.nodes, cls.affinity, cls.prefer_no_schedule, len(self.changes))
            indexes[constraints] = index
        else:
            upto = len(self.changes)
            index.catch_up(self.changes, view.capacity, view.free_total, view.gpu_blocks, upto)
        return index

    def indexes_of(self, on_demand: bool) -> dict[Constraints, FreeIndex]:
        return self.od_indexes if on_demand else self.indexes

    def reclassify(self, i: int, node: NodeInfo, views: Views) -> None:
        """Node `i`'s labels, taints or cordon changed: evaluate Kubernetes' rules again for
        that node only, in every class and its indexes."""
        for constraints, cls in list(self.classes.items()):
            self.classes[constraints], scoring = reevaluate(self._rules, cls, constraints, i, node)
            for on_demand in (False, True):
                index = self.indexes_of(on_demand).get(constraints)
                if index is not None:
                    view = views(on_demand)
                    free = int(view.free_total[i])
                    index.refile(i, scoring, int(view.capacity[i]), free, view.gpu_blocks[i])

    def settle(self, views: Views) -> None:
        """Bring every index up to the change log and empty it: its node indices are about to
        shift."""
        upto = len(self.changes)
        for on_demand in (False, True):
            view = views(on_demand)
            for index in self.indexes_of(on_demand).values():
                index.catch_up(self.changes, view.capacity, view.free_total, view.gpu_blocks, upto)
                index.cursor = 0
        self.changes.clear()

    def insert(self, position: int) -> None:
        """A node joined at `position`: the later nodes' indices move up by one (`settle`
        first). Its own rules are filled in by `reclassify`."""
        for constraints, cls in self.classes.items():
            self.classes[constraints] = shifted(cls, position, 1)
        for index in self._all_indexes():
            index.shift(position, 1)

    def delete(self, position: int) -> None:
        """The node at `position` left: drop it and move the later nodes' indices down by one
        (`settle` first)."""
        for constraints, cls in self.classes.items():
            self.classes[constraints] = shifted(without(cls, position), position + 1, -1)
        for index in self._all_indexes():
            index.refile(position, None, 0, 0, ())
            index.shift(position + 1, -1)

    def forget(self) -> None:
        self.classes.clear()
        self.indexes.clear()
        self.od_indexes.clear()
        self.changes.clear()

    def forget_on_demand(self) -> None:
        """The on-demand columns were copied afresh: their indexes are built again."""
        self.od_indexes.clear()

    def _all_indexes(self) -> list[FreeIndex]:
        return [*self.indexes.values(), *self.od_indexes.values()]
