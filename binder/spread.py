"""kube-scheduler's PodTopologySpread plugin: the filter (DoNotSchedule constraints) and the score
(ScheduleAnyway ones, and the cluster's default constraints), over every node at once.

A constraint counts the bound pods of the pod's namespace that its selector matches (pods being
deleted do not count) per topology domain, a domain being a value of the constraint's
`topologyKey` on the nodes that have every filter constraint's key and pass its node inclusion
policies (`nodeAffinityPolicy`, default Honor: the pod's nodeSelector and required node affinity;
`nodeTaintsPolicy`, default Ignore: the node's NoSchedule/NoExecute taints tolerated). A node
fails when placing the pod there would make its domain's count (plus one when the pod matches
its own selector) exceed the smallest domain's count by more than `maxSkew`; with fewer eligible
domains than `minDomains` the smallest count is 0. A node without the key fails with the
"missing required label" reason, which no preemption cures.

The score follows upstream's: per constraint, the matching pods in the node's domain times
log(domains + 2), plus `maxSkew - 1`, summed and rounded; normalised so the fewest pods score
100. With explicit constraints, nodes lacking a key score 0. The default constraints apply to a
pod with none of its own that a ReplicaSet, StatefulSet or ReplicationController owns
(`kubernetes.io/hostname` maxSkew 3, `topology.kubernetes.io/zone` maxSkew 5, ScheduleAnyway).
kube-scheduler selects their pods by the selectors of the Services selecting the pod and of its
owner, which the binder does not watch: it selects the pods of the pod's namespace that carry all
of the pod's labels, the per-pod ones a StatefulSet adds left out, which are the same pods for
the replicas of a Deployment or a StatefulSet.

Pure: reads the state, no I/O, no clock.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from binder.model import PodInfo
from binder.podterms import (
    DO_NOT_SCHEDULE,
    HONOR,
    HOSTNAME_KEY,
    SCHEDULE_ANYWAY,
    ZONE_KEY,
    LabelRequirement,
    LabelSelector,
    SpreadConstraint,
)
from binder.state import ClusterState, IntArray

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

REASON_SPREAD = "node(s) didn't match pod topology spread constraints"
REASON_MISSING_LABEL = (
    "node(s) didn't match pod topology spread constraints (missing required label)"
)
SPREAD_WEIGHT = 2
MAX_SCORE = 100
OWNER_KINDS = frozenset({"ReplicaSet", "StatefulSet", "ReplicationController"})
PER_POD_LABELS = frozenset({"statefulset.kubernetes.io/pod-name", "apps.kubernetes.io/pod-index"})
DEFAULT_CONSTRAINTS = (
    SpreadConstraint(3, HOSTNAME_KEY, SCHEDULE_ANYWAY, LabelSelector()),
    SpreadConstraint(5, ZONE_KEY, SCHEDULE_ANYWAY, LabelSelector()),
)


def _default_selector(pod: PodInfo) -> LabelSelector | None:
    if pod.owner.partition("/")[0] not in OWNER_KINDS:
        return None
    requirements = tuple(
        LabelRequirement(key, "In", frozenset({value}))
        for key, value in sorted(pod.labels.items())
        if key not in PER_POD_LABELS
    )
    return LabelSelector(requirements) if requirements else None


def constraints_of(
    pod: PodInfo,
) -> tuple[tuple[SpreadConstraint, ...], tuple[SpreadConstraint, ...]]:
    """(DoNotSchedule ones, ScheduleAnyway ones): the pod's own, or the defaults."""
    if pod.spread:
        hard = tuple(c for c in pod.spread if c.when_unsatisfiable == DO_NOT_SCHEDULE)
        soft = tuple(c for c in pod.spread if c.when_unsatisfiable == SCHEDULE_ANYWAY)
        return hard, soft
    selector = _default_selector(pod)
    if selector is None:
        return (), ()
    return (), tuple(
        SpreadConstraint(c.max_skew, c.topology_key, c.when_unsatisfiable, selector)
        for c in DEFAULT_CONSTRAINTS
    )


def _node_counts(state: ClusterState, pod: PodInfo, selector: LabelSelector) -> IntArray:
    """Per node (index order), the bound pods of the pod's namespace the selector matches, pods
    being deleted left out."""
    counts = np.zeros(len(state.names), np.int64)
    if not selector.valid:
        return counts
    index = state.index
    for group in state.pods.groups(pod.namespace):
        if not selector.matches(group.labels):
            continue
        for node, count in group.nodes.items():
            i = index.get(node)
            if i is not None:
                counts[i] += count - group.deleting.get(node, 0)
    return counts


def _has_keys(state: ClusterState, constraints: tuple[SpreadConstraint, ...]) -> BoolArray:
    mask = np.ones(len(state.names), np.bool_)
    for c in constraints:
        mask &= state.topology_domains(c.topology_key)[0] >= 0
    return mask


def _included(state: ClusterState, pod: PodInfo, c: SpreadConstraint) -> BoolArray:
    return state.eligible(
        pod.constraints, c.node_affinity_policy == HONOR, c.node_taints_policy == HONOR
    )


def spread_filter(state: ClusterState, pod: PodInfo) -> dict[int, str]:
    """Node index -> why the filter rejects it, for every node it rejects."""
    hard, _ = constraints_of(pod)
    if not hard:
        return {}
    state.arrays()
    eligible = _has_keys(state, hard)
    rejected: dict[int, str] = {}
    for c in hard:
        ids, values = state.topology_domains(c.topology_key)
        counts = _node_counts(state, pod, c.selector)
        counted = eligible & _included(state, pod, c)
        per_domain = np.bincount(ids[counted], weights=counts[counted], minlength=len(values))
        present = np.zeros(len(values), np.bool_)
        present[ids[counted]] = True
        domains = int(np.count_nonzero(present))
        smallest = int(per_domain[present].min()) if domains else 2**31 - 1
        if domains < c.min_domains:
            smallest = 0
        own = 1 if c.selector.matches(pod.labels) else 0
        missing = ids < 0
        skew = per_domain[np.maximum(ids, 0)] + own - smallest
        for i in np.flatnonzero(missing):
            rejected.setdefault(int(i), REASON_MISSING_LABEL)
        for i in np.flatnonzero(~missing & (skew > c.max_skew)):
            rejected.setdefault(int(i), REASON_SPREAD)
    return rejected


def spread_scores(state: ClusterState, pod: PodInfo, candidates: IntArray) -> FloatArray | None:
    """PodTopologySpread's normalised score (0..100) per candidate node index, or None when it
    scores every candidate alike."""
    _, soft = constraints_of(pod)
    if not soft or candidates.size < 2:
        return None
    state.arrays()
    require_all = bool(pod.spread)
    has_keys = _has_keys(state, soft) if require_all else np.ones(len(state.names), np.bool_)
    ignored = ~has_keys[candidates]
    scored_nodes = candidates[~ignored]
    if not scored_nodes.size:
        return None
    raw = np.zeros(candidates.size, np.float64)
    for c in soft:
        counts = _node_counts(state, pod, c.selector)
        ids, values = state.topology_domains(c.topology_key)
        on_candidates = ids[candidates]
        if not counts.any():
            raw += np.where(on_candidates >= 0, float(c.max_skew - 1), 0.0)
            continue
        if c.topology_key == HOSTNAME_KEY:
            size = int(scored_nodes.size)
            count = counts[candidates].astype(np.float64)
        else:
            domains = np.unique(ids[scored_nodes][ids[scored_nodes] >= 0])
            size = int(domains.size)
            counted = has_keys & _included(state, pod, c) & (ids >= 0)
            per_domain = np.bincount(ids[counted], weights=counts[counted], minlength=len(values))
            count = np.where(on_candidates >= 0, per_domain[np.maximum(on_candidates, 0)], 0.0)
        weight = math.log(size + 2)
        raw += np.where(on_candidates >= 0, count * weight + (c.max_skew - 1), 0.0)
    # Go's math.Round (halves away from zero) of each node's sum, then NormalizeScore.
    raw = np.floor(raw + 0.5)
    live = raw[~ignored]
    low, high = float(live.min()), float(live.max())
    if high == low and not ignored.any():
        return None
    if high == 0:
        return np.where(ignored, 0.0, float(MAX_SCORE))
    return np.where(ignored, 0.0, (MAX_SCORE * (high + low - raw)) // high)
