"""kube-scheduler's PodTopologySpread plugin: its Filter (the DoNotSchedule constraints) and its
Score (the ScheduleAnyway ones, or the system default constraints), over every node at once.

Filter. Per constraint, a domain is a value of its `topologyKey` on the nodes that carry every
DoNotSchedule constraint's key and pass the constraint's node inclusion policies
(`nodeAffinityPolicy`, Honor by default: the pod's nodeSelector and required node affinity;
`nodeTaintsPolicy`, Ignore by default: its NoSchedule/NoExecute taints tolerated). A domain
counts the bound pods of the pod's namespace that the selector matches, pods being deleted left
out. A node is rejected when its domain's count, plus one if the pod matches the selector itself,
exceeds the smallest domain's count by more than `maxSkew`; with fewer domains than `minDomains`
the smallest count is 0. A node without a constraint's key is rejected with the "missing required
label" reason (which no preemption cures), constraints checked in the pod's order.

Score. Per ScheduleAnyway constraint, a candidate node scores the matching pods of its domain
(for `kubernetes.io/hostname`, of the node itself, whatever the policies) times log(domains + 2),
domains counted among the candidates, plus `maxSkew - 1`; the sum is rounded as Go rounds, and
normalised so that the fewest pods score 100. With the pod's own constraints, candidates lacking
a key are ignored (they score 0); with the defaults they are not, and add nothing for that key.

Defaults. A pod with no constraints of its own that a ReplicaSet, StatefulSet or
ReplicationController controls spreads by `kubernetes.io/hostname` (maxSkew 3) and
`topology.kubernetes.io/zone` (maxSkew 5), ScheduleAnyway. kube-scheduler selects their pods
by the selectors of the Services that select the pod and of its owner; the binder watches
neither, so it selects the pods of the pod's namespace that carry every label of the pod except
the per-pod ones a StatefulSet adds (`statefulset.kubernetes.io/pod-name`,
`apps.kubernetes.io/pod-index`, `controller-revision-hash`). Those are the owner's pods for a
ReplicaSet (its pods share `pod-template-hash`) and a StatefulSet; a Service that also selects
other workloads' pods, or an owner whose selector is narrower than its pods' labels, counts
differently upstream, and a pod selected by a Service but controlled by nothing gets no defaults.

What depends only on the nodes (domain ids, the masks of counted nodes, the nodes missing a key)
is kept per state until `nodes_version` moves; a node's inclusion is NodeAffinity's and
TaintToleration's verdict (binder.framework.noderules); pods are read through the state's label
groups, never one by one. Pure: reads the state, no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import repeat
from weakref import WeakKeyDictionary

import numpy as np
import numpy.typing as npt

from binder.cluster.clusterstate import ClusterState, IntArray
from binder.cluster.objects import Constraints, PodInfo
from binder.cluster.podindex import LabelGroup
from binder.cluster.podterms import (
    DO_NOT_SCHEDULE,
    HONOR,
    HOSTNAME_KEY,
    SCHEDULE_ANYWAY,
    ZONE_KEY,
    LabelRequirement,
    LabelSelector,
    SpreadConstraint,
)
from binder.framework.noderules import first_untolerated_taint, matches_required_affinity

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
SpreadConstraints = tuple[SpreadConstraint, ...]

REASON_SPREAD = "node(s) didn't match pod topology spread constraints"
REASON_MISSING_LABEL = (
    "node(s) didn't match pod topology spread constraints (missing required label)"
)
SPREAD_WEIGHT = 2
"""PodTopologySpread's weight in kube-scheduler's default profile."""
MAX_SCORE = 100
OWNER_KINDS = frozenset({"ReplicaSet", "StatefulSet", "ReplicationController"})
PER_POD_LABELS = frozenset(
    {
        "statefulset.kubernetes.io/pod-name",
        "apps.kubernetes.io/pod-index",
        "controller-revision-hash",
    }
)
DEFAULT_CONSTRAINTS: SpreadConstraints = (
    SpreadConstraint(3, HOSTNAME_KEY, SCHEDULE_ANYWAY, LabelSelector()),
    SpreadConstraint(5, ZONE_KEY, SCHEDULE_ANYWAY, LabelSelector()),
)
"""kube-scheduler's system defaults (their selector is each pod's default selector)."""


@lru_cache(maxsize=4096)
def _defaults_for(labels: frozenset[tuple[str, str]]) -> SpreadConstraints:
    requirements = tuple(
        LabelRequirement(key, "In", frozenset({value}))
        for key, value in sorted(labels)
        if key not in PER_POD_LABELS
    )
    if not requirements:  # an empty default selector means no default constraints upstream
        return ()
    selector = LabelSelector(requirements)
    return tuple(
        SpreadConstraint(c.max_skew, c.topology_key, c.when_unsatisfiable, selector)
        for c in DEFAULT_CONSTRAINTS
    )


def constraints_of(pod: PodInfo) -> tuple[SpreadConstraints, SpreadConstraints]:
    """(DoNotSchedule ones, ScheduleAnyway ones): the pod's own, or, when it has none and a
    ReplicaSet, StatefulSet or ReplicationController controls it, the system defaults with its
    default selector."""
    if pod.spread:
        hard = tuple(c for c in pod.spread if c.when_unsatisfiable == DO_NOT_SCHEDULE)
        soft = tuple(c for c in pod.spread if c.when_unsatisfiable == SCHEDULE_ANYWAY)
        return hard, soft
    if pod.owner.partition("/")[0] not in OWNER_KINDS:
        return (), ()
    return (), _defaults_for(frozenset(pod.labels.items()))


# ---- what depends only on the nodes ------------------------------------------------------------


@dataclass(frozen=True)
class _Domains:
    """One filter constraint over the nodes: domain ids, which nodes count, the domains."""

    ids: IntArray
    safe_ids: IntArray
    """`ids` with -1 turned into 0, for indexing (those nodes are masked out)."""
    counted: BoolArray
    values: int
    domains: int
    present: BoolArray
    missing: BoolArray


@dataclass(frozen=True)
class _FilterPlan:
    parts: tuple[_Domains, ...]
    any_missing: bool
    missing_reasons: Mapping[int, str]
    """Node index -> the reason, when no constraint rejects a node by skew."""


@dataclass
class _NodeViews:
    version: tuple[int, int]
    keys: dict[tuple[str, ...], BoolArray] = field(default_factory=dict)
    plans: dict[tuple[SpreadConstraints, Constraints], _FilterPlan] = field(default_factory=dict)
    included: dict[tuple[Constraints, bool, bool], BoolArray] = field(default_factory=dict)
    with_empty: dict[str, tuple[IntArray, int]] = field(default_factory=dict)


_VIEWS: WeakKeyDictionary[ClusterState, _NodeViews] = WeakKeyDictionary()


def _views(state: ClusterState) -> _NodeViews:
    state.arrays()
    version = (state.nodes_version, len(state.names))
    views = _VIEWS.get(state)
    if views is None or views.version != version:
        views = _VIEWS[state] = _NodeViews(version)
    elif len(views.plans) > 256:
        # Plans are many (one per selector); the inclusion masks (a few) are kept.
        views = _VIEWS[state] = _NodeViews(version, included=views.included)
    return views


def _has_keys(state: ClusterState, views: _NodeViews, keys: tuple[str, ...]) -> BoolArray:
    mask = views.keys.get(keys)
    if mask is None:
        mask = np.ones(len(state.names), np.bool_)
        for key in keys:
            mask &= state.filters.topology_domains(key)[0] >= 0
        views.keys[keys] = mask
    return mask


def _included(
    state: ClusterState, views: _NodeViews, constraints: Constraints, c: SpreadConstraint
) -> BoolArray:
    """Per node, whether the constraint counts it for a pod of these constraints: its
    nodeSelector and required node affinity match (`nodeAffinityPolicy` Honor) and its
    NoSchedule/NoExecute taints are tolerated (`nodeTaintsPolicy` Honor)."""
    honor_affinity = c.node_affinity_policy == HONOR
    honor_taints = c.node_taints_policy == HONOR
    key = (constraints, honor_affinity, honor_taints)
    mask = views.included.get(key)
    if mask is not None:
        return mask
    mask = np.ones(len(state.names), np.bool_)
    if honor_affinity or honor_taints:
        tolerations = constraints.tolerations
        for i, name in enumerate(state.names):
            node = state.nodes[name]
            affinity_ok = not honor_affinity or matches_required_affinity(constraints, node)
            taints_ok = not honor_taints or first_untolerated_taint(node, tolerations) is None
            mask[i] = affinity_ok and taints_ok
    if len(views.included) > 1024:
        views.included.clear()
    views.included[key] = mask
    return mask


def _filter_plan(state: ClusterState, pod: PodInfo, hard: SpreadConstraints) -> _FilterPlan:
    views = _views(state)
    key = (hard, pod.constraints)
    plan = views.plans.get(key)
    if plan is not None:
        return plan
    all_keys = _has_keys(state, views, tuple(c.topology_key for c in hard))
    parts = []
    missing_any = np.zeros(len(state.names), np.bool_)
    for c in hard:
        ids, values = state.filters.topology_domains(c.topology_key)
        counted = all_keys & _included(state, views, pod.constraints, c)
        present = np.zeros(len(values), np.bool_)
        present[ids[counted]] = True
        missing = ids < 0
        missing_any |= missing
        parts.append(
            _Domains(
                ids,
                np.maximum(ids, 0),
                counted,
                len(values),
                int(np.count_nonzero(present)),
                present,
                missing,
            )
        )
    reasons = dict.fromkeys(np.flatnonzero(missing_any).tolist(), REASON_MISSING_LABEL)
    plan = views.plans[key] = _FilterPlan(tuple(parts), bool(missing_any.any()), reasons)
    return plan


# ---- what depends on the pods ------------------------------------------------------------------

Matched = tuple[IntArray, FloatArray] | None
"""The node indices of the matching pods' groups and their counts (pods being deleted as
negative counts), or None when the selector matches no bound pod of the namespace."""


def _selected_groups(
    state: ClusterState, namespace: str, selector: LabelSelector
) -> list[LabelGroup]:
    """The namespace's label groups the selector matches. Groups are first narrowed by one
    requirement read inline (a Deployment's namespace may hold thousands of label sets)."""
    groups = state.pods.groups(namespace)
    if selector.empty:
        return list(groups)
    probe = next((r for r in selector.requirements if r.operator == "In"), None)
    if probe is not None:
        key, values = probe.key, probe.values
        groups = iter([g for g in groups if g.labels.get(key) in values])
    return [g for g in groups if selector.matches(g.labels)]


def _matched(state: ClusterState, namespace: str, selector: LabelSelector) -> Matched:
    if not selector.valid:
        return None
    index = state.index
    nodes: list[IntArray] = []
    counts: list[IntArray] = []
    for group in _selected_groups(state, namespace, selector):
        for counter, sign in ((group.nodes, 1), (group.deleting, -1)):
            if counter:
                nodes.append(np.fromiter(map(index.get, counter, repeat(-1)), np.int64))
                counts.append(sign * np.fromiter(counter.values(), np.int64))
    if not nodes:
        return None
    at = np.concatenate(nodes)
    known = at >= 0
    return at[known], np.concatenate(counts)[known].astype(np.float64)


def _matched_by_selector(
    state: ClusterState, pod: PodInfo, constraints: SpreadConstraints
) -> list[Matched]:
    seen: dict[LabelSelector, Matched] = {}
    for c in constraints:
        if c.selector not in seen:
            seen[c.selector] = _matched(state, pod.namespace, c.selector)
    return [seen[c.selector] for c in constraints]


def spread_filter(state: ClusterState, pod: PodInfo) -> dict[int, str]:
    """Node index -> the reason the Filter rejects it, for every node it rejects (empty: none)."""
    hard, _ = constraints_of(pod)
    if not hard:
        return {}
    plan = _filter_plan(state, pod, hard)
    bad: list[BoolArray | None] = []
    for c, part, matched in zip(
        hard, plan.parts, _matched_by_selector(state, pod, hard), strict=True
    ):
        if matched is None:  # no pod anywhere: every skew is the pod's own 0 or 1
            bad.append(None)
            continue
        at, counts = matched
        keep = part.counted[at]
        per_domain = np.bincount(part.ids[at[keep]], counts[keep], part.values)
        smallest = 0.0
        if part.domains >= c.min_domains:
            smallest = float(per_domain[part.present].min())
        own = 1 if c.selector.matches(pod.labels) else 0
        too_many = per_domain + own - smallest > c.max_skew
        bad.append(too_many[part.safe_ids] & ~part.missing if too_many.any() else None)
    if all(b is None for b in bad):
        return dict(plan.missing_reasons)
    if not plan.any_missing:
        union = np.zeros(len(state.names), np.bool_)
        for b in bad:
            if b is not None:
                union |= b
        return dict.fromkeys(np.flatnonzero(union).tolist(), REASON_SPREAD)
    # A node missing a later constraint's key but over an earlier one's skew is over the skew.
    code = np.zeros(len(state.names), np.int8)
    for part, b in zip(plan.parts, bad, strict=True):
        code[part.missing & (code == 0)] = 1
        if b is not None:
            code[b & (code == 0)] = 2
    rejected = dict.fromkeys(np.flatnonzero(code == 1).tolist(), REASON_MISSING_LABEL)
    rejected.update(dict.fromkeys(np.flatnonzero(code == 2).tolist(), REASON_SPREAD))
    return rejected


def _with_empty(state: ClusterState, views: _NodeViews, key: str) -> tuple[IntArray, int]:
    """Domain ids where a node without the label is in the domain of value "" (as Go reads a
    missing label), and how many ids there are."""
    cached = views.with_empty.get(key)
    if cached is None:
        ids, values = state.filters.topology_domains(key)
        empty = values.index("") if "" in values else len(values)
        cached = views.with_empty[key] = (np.where(ids < 0, empty, ids), len(values) + 1)
    return cached


def spread_scores(state: ClusterState, pod: PodInfo, candidates: IntArray) -> FloatArray | None:
    """PodTopologySpread's normalized score (0..100, as its NormalizeScore) for each candidate
    node index, or None when every candidate would score the same (nothing to score)."""
    _, soft = constraints_of(pod)
    if not soft or candidates.size < 2:
        return None
    views = _views(state)
    require_all = bool(pod.spread)
    all_keys = _has_keys(state, views, tuple(c.topology_key for c in soft))
    live = all_keys[candidates] if require_all else np.ones(candidates.size, np.bool_)
    if not live.any():
        return None
    raw = np.zeros(candidates.size, np.float64)
    for c, matched in zip(soft, _matched_by_selector(state, pod, soft), strict=True):
        ids, values = state.filters.topology_domains(c.topology_key)
        has = ids[candidates] >= 0
        count: FloatArray = np.zeros(candidates.size, np.float64)
        if c.topology_key == HOSTNAME_KEY:
            # Per node, whatever the inclusion policies; the domains are the scored candidates.
            size = int(np.count_nonzero(live))
            if matched is not None:
                at, counts = matched
                per_node = np.asarray(np.bincount(at, counts, len(state.names)), np.float64)
                count = per_node[candidates]
        else:
            if require_all:
                domain, domains = np.maximum(ids, 0), len(values)
            else:
                domain, domains = _with_empty(state, views, c.topology_key)
            present = np.zeros(domains, np.bool_)
            present[domain[candidates[live]]] = True
            size = int(np.count_nonzero(present))
            if matched is not None:
                at, counts = matched
                counted = _included(state, views, pod.constraints, c)
                if require_all:
                    counted = counted & all_keys
                keep = counted[at]
                per_domain = np.asarray(
                    np.bincount(domain[at[keep]], counts[keep], domains), np.float64
                )
                count = per_domain[domain[candidates]]
        weight = math.log(size + 2)
        raw += np.where(has, count * weight + float(c.max_skew - 1), 0.0)
    # Go's math.Round: halves away from zero (every sum here is >= 0).
    rounded = np.floor(raw)
    rounded += (raw - rounded) >= 0.5
    scores = rounded[live]
    low, high = float(scores.min()), float(scores.max())
    if high == 0:
        normalized = np.full(candidates.size, float(MAX_SCORE))
    else:
        normalized = (MAX_SCORE * (high + low - rounded)) // high
    normalized[~live] = 0.0
    if normalized.min() == normalized.max():
        return None
    return normalized
