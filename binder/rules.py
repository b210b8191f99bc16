"""Kubernetes' own node rules, as kube-scheduler applies them: NodeUnschedulable, TaintToleration
and NodeAffinity (filter and score).

The semantics follow kube-scheduler's plugins and k8s.io/component-helpers, including the corners
people trip on: a malformed node selector term matches nothing instead of failing the pod, an empty
term matches nothing, `matchFields` only knows `metadata.name`, a toleration with an empty key and
`Exists` tolerates every taint, an empty toleration effect matches every effect, and
PreferNoSchedule taints only lower a node's score. Pure: no I/O, no clock, no GPU knowledge.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache

from binder.model import Constraints, NodeInfo, Requirement, SelectorTerm, Taint, Toleration

REASON_UNSCHEDULABLE = "node(s) were unschedulable"
REASON_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
UNSCHEDULABLE_TAINT = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")
FILTERING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})

_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_INT_RE = re.compile(r"^[+-]?\d+$")

Matcher = Callable[[Mapping[str, str], str], bool]
"""(node labels, node name) -> whether a term matches."""


def untolerated_reason(taint: Taint) -> str:
    return f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}"


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """core/v1 Toleration.ToleratesTaint: empty effect and empty key are wildcards."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator in ("", "Equal"):
        return toleration.value == taint.value
    return toleration.operator == "Exists"


def tolerated(tolerations: Sequence[Toleration], taint: Taint) -> bool:
    return any(tolerates(t, taint) for t in tolerations)


def first_untolerated_taint(node: NodeInfo, tolerations: Sequence[Toleration]) -> Taint | None:
    """The first NoSchedule/NoExecute taint left untolerated (kube reports only the first)."""
    for taint in node.taints:
        if taint.effect in FILTERING_EFFECTS and not tolerated(tolerations, taint):
            return taint
    return None


def prefer_no_schedule_count(node: NodeInfo, tolerations: Sequence[Toleration]) -> int:
    """TaintToleration's raw score: PreferNoSchedule taints not tolerated by the tolerations whose
    effect is empty or PreferNoSchedule (lower is better)."""
    relevant = [t for t in tolerations if t.effect in ("", "PreferNoSchedule")]
    return sum(
        1
        for taint in node.taints
        if taint.effect == "PreferNoSchedule" and not tolerated(relevant, taint)
    )


def _valid_label_key(key: str) -> bool:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN_RE.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_NAME_RE.match(name))


def _valid_label_value(value: str) -> bool:
    return value == "" or (len(value) <= 63 and bool(_NAME_RE.match(value)))


def _label_requirement(req: Requirement) -> Matcher | None:
    """labels.NewRequirement plus Requirement.Matches; None when the requirement is malformed."""
    op, key, values = req.operator, req.key, req.values
    if not _valid_label_key(key) or not all(_valid_label_value(v) for v in values):
        return None
    if op in ("In", "NotIn"):
        if not values:
            return None
        allowed = frozenset(values)
        if op == "In":
            return lambda labels, _name: key in labels and labels[key] in allowed
        return lambda labels, _name: key not in labels or labels[key] not in allowed
    if op in ("Exists", "DoesNotExist"):
        if values:
            return None
        if op == "Exists":
            return lambda labels, _name: key in labels
        return lambda labels, _name: key not in labels
    if op in ("Gt", "Lt"):
        if len(values) != 1 or not _INT_RE.match(values[0]):
            return None
        bound = int(values[0])
        greater = op == "Gt"

        def compare(labels: Mapping[str, str], _name: str) -> bool:
            raw = labels.get(key)
            if raw is None or not _INT_RE.match(raw):
                return False
            number = int(raw)
            return number > bound if greater else number < bound

        return compare
    return None


def _field_requirement(req: Requirement) -> Matcher | None:
    """A `matchFields` requirement: In/NotIn with exactly one value; a node has only the field
    `metadata.name`, every other field reads as absent (empty)."""
    if req.operator not in ("In", "NotIn") or len(req.values) != 1:
        return None
    wanted = req.values[0]
    is_name = req.key == "metadata.name"
    if req.operator == "In":
        return lambda _labels, name: (name if is_name else "") == wanted
    return lambda _labels, name: (name if is_name else "") != wanted


def _all(matchers: Sequence[Matcher]) -> Matcher:
    return lambda labels, name: all(m(labels, name) for m in matchers)


@lru_cache(maxsize=4096)
def compile_term(term: SelectorTerm) -> Matcher | None:
    """A term's matcher, or None when the term matches nothing (empty or malformed)."""
    if not term.match_expressions and not term.match_fields:
        return None
    matchers: list[Matcher] = []
    for req in term.match_expressions:
        matcher = _label_requirement(req)
        if matcher is None:
            return None
        matchers.append(matcher)
    for req in term.match_fields:
        matcher = _field_requirement(req)
        if matcher is None:
            return None
        matchers.append(matcher)
    return _all(matchers)


def matches_required_affinity(constraints: Constraints, node: NodeInfo) -> bool:
    """nodeSelector (every pair present) AND required node affinity (terms ORed)."""
    labels = node.labels
    for key, value in constraints.node_selector:
        if labels.get(key) != value:
            return False
    if constraints.required_terms is None:
        return True
    for term in constraints.required_terms:
        matcher = compile_term(term)
        if matcher is not None and matcher(labels, node.name):
            return True
    return False


def preferred_affinity_score(constraints: Constraints, node: NodeInfo) -> int:
    """NodeAffinity's raw score: the sum of weights of the preferred terms the node matches.
    Zero-weight, empty and malformed terms count for nothing."""
    score = 0
    for term in constraints.preferred_terms:
        if term.weight == 0:
            continue
        matcher = compile_term(term.preference)
        if matcher is not None and matcher(node.labels, node.name):
            score += term.weight
    return score


def kubernetes_reasons(constraints: Constraints, node: NodeInfo) -> list[str]:
    """Every Kubernetes rule the node breaks for these constraints, in kube-scheduler's filter
    order (NodeUnschedulable, TaintToleration, NodeAffinity); empty when the node fits.
    kube-scheduler stops at the first failing plugin, so the first reason is the one it reports."""
    reasons = []
    if node.unschedulable and not tolerated(constraints.tolerations, UNSCHEDULABLE_TAINT):
        reasons.append(REASON_UNSCHEDULABLE)
    taint = first_untolerated_taint(node, constraints.tolerations)
    if taint is not None:
        reasons.append(untolerated_reason(taint))
    if not matches_required_affinity(constraints, node):
        reasons.append(REASON_AFFINITY)
    return reasons


def first_kubernetes_reason(constraints: Constraints, node: NodeInfo) -> str:
    """The reason kube-scheduler would report for this node, or "" when the node fits."""
    if node.unschedulable and not tolerated(constraints.tolerations, UNSCHEDULABLE_TAINT):
        return REASON_UNSCHEDULABLE
    taint = first_untolerated_taint(node, constraints.tolerations)
    if taint is not None:
        return untolerated_reason(taint)
    if not matches_required_affinity(constraints, node):
        return REASON_AFFINITY
    return ""
