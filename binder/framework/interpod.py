"""kube-scheduler's InterPodAffinity plugin, its Filter and its Score, over the binder's picture
of the cluster (`ClusterState`): which nodes a pod's pod affinity and anti-affinity, and the
anti-affinity of the pods already bound, keep it off, and how its preferred terms and the
existing pods' terms rank the nodes left.

It reads the bound pods by label group and by affinity group (`binder.cluster.podindex`), never pod
by pod, and turns the topology domains they occupy into node masks with numpy over the state's
cached topology domains (`binder.cluster.filtercolumns`), so a decision costs a few selector
matches and vector operations whatever the number of pods. Pods being deleted count, as they
count for upstream.

Upstream's conventions it keeps: the incoming pod's terms see a namespace through the namespace's
labels as listed (an unknown namespace only through a namespaceSelector of `{}`), while an
existing pod's terms see the incoming pod's namespace through its labels, or through no labels
at all when the namespace is unknown. A node that lacks a term's topology key fails the pod's
required affinity, ignores its anti-affinity and scores nothing for that term.

Pure: no I/O, no clock; it only reads the state.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import numpy.typing as npt

from binder.cluster.clusterstate import ClusterState
from binder.cluster.objects import PodInfo
from binder.cluster.podindex import LabelGroup
from binder.cluster.podterms import Labels, PodAffinityTerm

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

REASON_AFFINITY = "node(s) didn't match pod affinity rules"
REASON_ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"
REASON_EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"
AFFINITY_WEIGHT = 2
"""InterPodAffinity's weight in kube-scheduler's default profile."""
HARD_POD_AFFINITY_WEIGHT = 1
"""What an existing pod's required affinity term that the incoming pod matches adds to a node's
score (InterPodAffinityArgs.hardPodAffinityWeight's default)."""
MAX_NODE_SCORE = 100

_NO_LABELS: Labels = {}


def affinity_filter(state: ClusterState, pod: PodInfo) -> dict[int, str]:
    """Node index -> the reason kube-scheduler's InterPodAffinity Filter rejects it, for every node
    it rejects (empty: none)."""
    own = pod.affinity
    blocked = _existing_anti_affinity(state, pod)
    if not own.required and not own.required_anti and blocked is None:
        return {}
    state.arrays()
    reasons: dict[int, str] = {}
    if blocked is not None:
        reasons.update(
            dict.fromkeys(np.flatnonzero(blocked).tolist(), REASON_EXISTING_ANTI_AFFINITY)
        )
    if own.required_anti:
        refused = _anti_affinity(state, pod)
        reasons.update(dict.fromkeys(np.flatnonzero(refused).tolist(), REASON_ANTI_AFFINITY))
    if own.required:
        unmet = ~_affinity(state, pod)
        reasons.update(dict.fromkeys(np.flatnonzero(unmet).tolist(), REASON_AFFINITY))
    return reasons


def affinity_scores(state: ClusterState, pod: PodInfo, candidates: IntArray) -> FloatArray | None:
    """InterPodAffinity's normalized score (0..100, as its NormalizeScore) for each candidate node
    index, or None when every candidate would score the same (nothing to score: then placement
    skips it)."""
    own = pod.affinity
    holders = [
        g
        for g in state.pods.affinity_groups()
        if g.affinity.required or g.affinity.preferred or g.affinity.preferred_anti
    ]
    if (not own.preferred and not own.preferred_anti and not holders) or not len(candidates):
        return None
    tally = _Tally(state)
    for weighted in own.preferred:
        tally.add_matching(pod, weighted.term, weighted.weight)
    for weighted in own.preferred_anti:
        tally.add_matching(pod, weighted.term, -weighted.weight)
    seen_as = _namespace_labels_for_existing(state, pod)
    for group in holders:
        existing = group.affinity
        weighted_terms = [
            *((t, HARD_POD_AFFINITY_WEIGHT) for t in existing.required),
            *((w.term, w.weight) for w in existing.preferred),
            *((w.term, -w.weight) for w in existing.preferred_anti),
        ]
        for term, weight in weighted_terms:
            if term.matches(pod.namespace, pod.labels, seen_as):
                tally.add(term.topology_key, group.nodes.items(), weight)
    raw = tally.scores(candidates)
    if raw is None:
        return None
    low, high = int(raw.min()), int(raw.max())
    if high == low:
        return None
    # Upstream divides, then multiplies, then truncates: the same float steps give the same ints.
    shares: FloatArray = (raw - low).astype(np.float64) / float(high - low)
    scores: FloatArray = np.trunc(MAX_NODE_SCORE * shares)
    return scores


# ---- filter parts ----------------------------------------------------------------------------


def _existing_anti_affinity(state: ClusterState, pod: PodInfo) -> BoolArray | None:
    """Per node, whether an existing pod's required anti-affinity term that selects the incoming
    pod holds its topology domain; None when no term selects it."""
    seen_as: Labels | None = None
    blocked: BoolArray | None = None
    for group in state.pods.affinity_groups():
        for term in group.affinity.required_anti:
            if seen_as is None:
                seen_as = _namespace_labels_for_existing(state, pod)
            if term.matches(pod.namespace, pod.labels, seen_as):
                held = _domains_holding(state, term.topology_key, group.nodes)
                blocked = held if blocked is None else blocked | held
    if blocked is not None and not blocked.any():
        return None
    return blocked


def _anti_affinity(state: ClusterState, pod: PodInfo) -> BoolArray:
    """Per node, whether a pod one of the incoming pod's required anti-affinity terms selects runs
    in the node's domain of that term's topology key."""
    refused = np.zeros(len(state.names), np.bool_)
    for term in pod.affinity.required_anti:
        nodes = [n for g in _selected_groups(state, (term,)) for n in g.nodes]
        if nodes:
            refused |= _domains_holding(state, term.topology_key, nodes)
    return refused


def _affinity(state: ClusterState, pod: PodInfo) -> BoolArray:
    """Per node, whether it meets every required affinity term: each term's topology key is on
    the node and a pod that matches all the terms runs in the node's domain of each key; or, for
    the first pod of a series, no such pod runs anywhere (on a node with one of the keys) and the
    pod matches its own terms."""
    terms = pod.affinity.required
    nodes = [n for g in _selected_groups(state, terms) for n in g.nodes]
    met = np.ones(len(state.names), np.bool_)
    labelled = np.ones(len(state.names), np.bool_)
    anywhere = False
    for term in terms:
        column, _ = state.filters.topology_domains(term.topology_key)
        labelled &= column >= 0
        held = _domains_holding(state, term.topology_key, nodes)
        anywhere = anywhere or bool(held.any())
        met &= held
    if not anywhere:
        seen_as = state.namespace_labels.get(pod.namespace)
        if all(t.matches(pod.namespace, pod.labels, seen_as) for t in terms):
            return labelled
    return met & labelled


def _selected_groups(
    state: ClusterState, terms: tuple[PodAffinityTerm, ...]
) -> Iterator[LabelGroup]:
    """The bound pods' label groups that every one of the incoming pod's `terms` selects."""
    known = state.namespace_labels
    for namespace in state.pods.namespaces():
        labels = known.get(namespace)
        if not all(t.covers_namespace(namespace, labels) for t in terms):
            continue
        for group in state.pods.groups(namespace):
            if all(t.selector.matches(group.labels) for t in terms):
                yield group


def _domains_holding(state: ClusterState, key: str, nodes: Iterable[str]) -> BoolArray:
    """Per node, whether its value of label `key` is the value of one of `nodes` (False where it
    lacks the label; nodes the state does not know hold nothing)."""
    column, values = state.filters.topology_domains(key)
    index = state.index
    rows = np.fromiter((index.get(n, -1) for n in nodes), np.int64)
    ids = column[rows[rows >= 0]]
    hit = np.zeros(len(values) + 1, np.bool_)  # the last slot answers for -1: no label
    hit[ids[ids >= 0]] = True
    return hit[column]


def _namespace_labels_for_existing(state: ClusterState, pod: PodInfo) -> Labels:
    """The incoming pod's namespace as existing pods' terms see it: its labels, or none at all
    when the namespace is unknown (upstream matches their namespaceSelector against an empty
    set then)."""
    return state.namespace_labels.get(pod.namespace, _NO_LABELS)


# ---- score parts -----------------------------------------------------------------------------


class _Tally:
    """Per topology key, per domain of it, the sum of the weights of the pods there whose terms
    match (upstream's topologyScore)."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.by_key: dict[str, IntArray] = {}

    def add_matching(self, pod: PodInfo, term: PodAffinityTerm, weight: int) -> None:
        """Add `weight` for every existing pod the incoming pod's preferred `term` selects."""
        for group in _selected_groups(self.state, (term,)):
            self.add(term.topology_key, group.nodes.items(), weight)

    def add(self, key: str, nodes: Iterable[tuple[str, int]], weight: int) -> None:
        """Add `weight` once per pod, in the domain of its node (`nodes`: node name, pods)."""
        column, values = self.state.filters.topology_domains(key)
        index = self.state.index
        pairs = [(index[n], count) for n, count in nodes if n in index]
        if not pairs:
            return
        rows, counts = np.array(pairs, np.int64).T
        ids = column[rows]
        labelled = ids >= 0
        if not labelled.any():
            return
        sums = self.by_key.get(key)
        if sums is None:
            sums = self.by_key[key] = np.zeros(len(values) + 1, np.int64)
        np.add.at(sums, ids[labelled], counts[labelled] * weight)

    def scores(self, candidates: IntArray) -> IntArray | None:
        """Each candidate's raw score; None when no term counted anywhere (upstream skips)."""
        if not self.by_key:
            return None
        total = np.zeros(len(candidates), np.int64)
        for key, sums in self.by_key.items():
            column, _ = self.state.filters.topology_domains(key)
            total += sums[column[candidates]]  # -1 reads the last slot, which stays 0
        return total
