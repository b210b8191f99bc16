"""Equivalence classes: Kubernetes' rules evaluated once over every node for one set of pod
constraints (nodeSelector, node affinity, tolerations), as kube-scheduler groups pods, and then
kept up to date one node at a time when that node's labels, taints or cordon change, or when a
node joins or leaves (the other nodes' indices shift; their rules are not evaluated again).

Pods of one Deployment share their constraints, so they share one evaluation: a decision only
reads which nodes pass, their preferred-affinity sums and untolerated PreferNoSchedule counts,
and why each other node fails. The rules themselves are kube-scheduler's and live with its other
plugins (binder.framework.noderules): this module asks them through `NodeRules` and keeps their
answers in node order, so the cluster's picture caches what the framework decides and never
decides it. Pure functions of the constraints, the nodes and the rules; no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from binder.cluster.objects import Constraints, NodeInfo

IntArray = npt.NDArray[np.int64]


class NodeRules(Protocol):
    """Kubernetes' node rules, as a class asks them (binder.framework.noderules answers)."""

    def reason(self, constraints: Constraints, node: NodeInfo) -> str:
        """The reason kube-scheduler reports for the node, "" when it passes every rule."""
        ...

    def scores(self, constraints: Constraints, node: NodeInfo) -> tuple[int, int]:
        """A passing node's raw preferred-affinity sum and untolerated PreferNoSchedule count."""
        ...

    def preferred_error(self, constraints: Constraints) -> str:
        """NodeAffinity PreScore's error for the preferred terms, "" when they parse."""
        ...


@dataclass(frozen=True)
class ConstraintClass:
    """Kubernetes' rules evaluated once over every node for one set of pod constraints."""

    nodes: IntArray
    """Indices of the nodes that pass every Kubernetes rule, ascending (node name order)."""
    affinity: IntArray
    """Raw preferred node affinity score of each node in `nodes`."""
    prefer_no_schedule: IntArray
    """Untolerated PreferNoSchedule taints of each node in `nodes`."""
    rejected: dict[int, str]
    """For nodes that fail a rule: the reason kube-scheduler reports."""
    rejected_counts: dict[str, int]
    """How many nodes `rejected` holds for each reason."""
    preferred_error: str = ""
    """NodeAffinity PreScore's error for the preferred terms ("" when they parse): kube-scheduler
    fails the attempt with it when two or more nodes are feasible."""


def evaluate(
    rules: NodeRules, constraints: Constraints, nodes: Sequence[NodeInfo]
) -> ConstraintClass:
    """The class of `constraints` over `nodes` (indexed by their position)."""
    passing: list[int] = []
    affinity: list[int] = []
    prefer: list[int] = []
    rejected: dict[int, str] = {}
    for i, node in enumerate(nodes):
        reason = rules.reason(constraints, node)
        if reason:
            rejected[i] = reason
            continue
        passing.append(i)
        node_affinity, node_prefer = rules.scores(constraints, node)
        affinity.append(node_affinity)
        prefer.append(node_prefer)
    return ConstraintClass(
        np.array(passing, np.int64),
        np.array(affinity, np.int64),
        np.array(prefer, np.int64),
        rejected,
        dict(Counter(rejected.values())),
        rules.preferred_error(constraints),
    )


def shifted(cls: ConstraintClass, at: int, delta: int) -> ConstraintClass:
    """The class with the indices of nodes `at` and later moved by `delta`: a node joined (+1)
    or left (-1) before them in name order. Nothing is evaluated again."""
    nodes = cls.nodes + np.where(cls.nodes >= at, delta, 0)
    rejected = {(i + delta if i >= at else i): why for i, why in cls.rejected.items()}
    return ConstraintClass(
        nodes,
        cls.affinity,
        cls.prefer_no_schedule,
        rejected,
        cls.rejected_counts,
        cls.preferred_error,
    )


def without(cls: ConstraintClass, i: int) -> ConstraintClass:
    """The class with node `i` in neither its passing nor its rejected nodes."""
    position = int(np.searchsorted(cls.nodes, i))
    nodes, affinity, prefer = cls.nodes, cls.affinity, cls.prefer_no_schedule
    if position < nodes.size and nodes[position] == i:
        nodes = np.delete(nodes, position)
        affinity = np.delete(affinity, position)
        prefer = np.delete(prefer, position)
    rejected = dict(cls.rejected)
    counts = Counter(cls.rejected_counts)
    old_reason = rejected.pop(i, "")
    if old_reason:
        counts[old_reason] -= 1
        if not counts[old_reason]:
            del counts[old_reason]
    return ConstraintClass(nodes, affinity, prefer, rejected, dict(counts), cls.preferred_error)


def reevaluate(
    rules: NodeRules, cls: ConstraintClass, constraints: Constraints, i: int, node: NodeInfo
) -> tuple[ConstraintClass, tuple[int, int] | None]:
    """The class with node `i` (now `node`, or a node that just joined at `i`) evaluated again,
    and that node's (affinity, PreferNoSchedule count) when it passes, None when a rule rejects
    it."""
    reason = rules.reason(constraints, node)
    cls = without(cls, i)
    nodes, affinity, prefer = cls.nodes, cls.affinity, cls.prefer_no_schedule
    position = int(np.searchsorted(nodes, i))
    rejected = dict(cls.rejected)
    counts = Counter(cls.rejected_counts)
    scoring: tuple[int, int] | None = None
    if reason:
        rejected[i] = reason
        counts[reason] += 1
    else:
        scoring = rules.scores(constraints, node)
        nodes = np.insert(nodes, position, i)
        affinity = np.insert(affinity, position, scoring[0])
        prefer = np.insert(prefer, position, scoring[1])
    updated = ConstraintClass(nodes, affinity, prefer, rejected, dict(counts), cls.preferred_error)
    return updated, scoring
