"""Kubernetes' own node rules, as kube-scheduler applies them: NodeUnschedulable, TaintToleration
and NodeAffinity (filter and score), then tritonshare's TenantCode filter (nodes dedicated to the
namespaces allowed to run their own code in Triton).

The semantics follow kube-scheduler's plugins and k8s.io/component-helpers, including the corners
people trip on: a malformed node selector term matches nothing instead of failing the pod, an empty
term matches nothing, `matchFields` only knows `metadata.name`, a toleration with an empty key and
`Exists` tolerates every taint, an empty toleration effect matches every effect, `Gt`/`Lt`
compare 64-bit integers only (Go's ParseInt), a preferred term that does not parse is an error of
NodeAffinity's PreScore (not a score of 0), and PreferNoSchedule taints only lower a node's score.

Every kube-scheduler rule the binder applies lives in binder.framework: these node rules here, the
rules that look at other pods beside them (fit, interpod, spread) and our own (tritonversion).
The cluster state keeps these rules' verdicts per set of pod constraints, node by node
(binder.cluster.classes' `ConstraintClass`), and re-evaluates a node when it changes: it is built
with `NODE_RULES`, which answers its `NodeRules` questions, so the cluster caches what this
module decides and never decides it. Pure: no I/O, no clock, no GPU knowledge.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache

from binder.cluster.objects import (
    Constraints,
    NodeInfo,
    Requirement,
    SelectorTerm,
    Taint,
    Toleration,
)

REASON_UNSCHEDULABLE = "node(s) were unschedulable"
REASON_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
REASON_NOT_DEDICATED = "node(s) are not dedicated to tenant code"
REASON_DEDICATED = "node(s) are dedicated to tenant code"
UNSCHEDULABLE_TAINT = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")
FILTERING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})

_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_INT_RE = re.compile(r"[+-]?[0-9]+")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")

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


def parse_int64(text: str) -> int | None:
    """Go's strconv.ParseInt(text, 10, 64): ASCII digits with an optional sign, within int64;
    None when it fails (kube then treats the label or the requirement as not an integer)."""
    if not _INT_RE.fullmatch(text):
        return None
    number = int(text)
    return number if INT64_MIN <= number <= INT64_MAX else None


def _go_strings(values: Sequence[str]) -> str:
    """A []string as Go's %#v prints it in field errors."""
    return "[]string{" + ", ".join(f'"{v}"' for v in values) + "}"


def _label_requirement_errors(req: Requirement, path: str) -> list[str]:
    """labels.NewRequirement's field errors for a `matchExpressions` entry, in its order."""
    op, key, values = req.operator, req.key, req.values
    if op not in LABEL_OPERATORS:
        supported = ", ".join(f'"{o}"' for o in LABEL_OPERATORS)
        # component-helpers refuses the operator before building the requirement: one error.
        return [f'{path}.operator: Unsupported value: "{op}": supported values: {supported}']
    errors = []
    if not _valid_label_key(key):
        errors.append(f'{path}.key: Invalid value: "{key}": not a valid label key')
    listed = _go_strings(values)
    if op in ("In", "NotIn") and not values:
        errors.append(
            f"{path}.values: Invalid value: {listed}: for 'in', 'notin' operators, values set "
            f"can't be empty"
        )
    elif op in ("Exists", "DoesNotExist") and values:
        errors.append(
            f"{path}.values: Invalid value: {listed}: values set must be empty for exists and "
            f"does not exist"
        )
    elif op in ("Gt", "Lt"):
        if len(values) != 1:
            errors.append(
                f"{path}.values: Invalid value: {listed}: for 'Gt', 'Lt' operators, exactly one "
                f"value is required"
            )
        for i, value in enumerate(values):
            if parse_int64(value) is None:
                errors.append(
                    f"{path}.values[{i}]: Invalid value: \"{value}\": for 'Gt', 'Lt' "
                    f"operators, the value must be an integer"
                )
    for i, value in enumerate(values):
        if not _valid_label_value(value):
            errors.append(f'{path}.values[{i}]: Invalid value: "{value}": not a valid label value')
    return errors


def _label_matcher(req: Requirement) -> Matcher:
    """Requirement.Matches for a requirement that parsed."""
    op, key = req.operator, req.key
    if op in ("In", "NotIn"):
        allowed = frozenset(req.values)
        if op == "In":
            return lambda labels, _name: key in labels and labels[key] in allowed
        return lambda labels, _name: key not in labels or labels[key] not in allowed
    if op == "Exists":
        return lambda labels, _name: key in labels
    if op == "DoesNotExist":
        return lambda labels, _name: key not in labels
    bound = parse_int64(req.values[0])
    assert bound is not None  # the requirement parsed
    greater = op == "Gt"

    def compare(labels: Mapping[str, str], _name: str) -> bool:
        raw = labels.get(key)
        number = None if raw is None else parse_int64(raw)
        if number is None:
            return False  # kube's Matches: a label that does not parse never compares
        return number > bound if greater else number < bound

    return compare


def _field_requirement_errors(req: Requirement, path: str) -> list[str]:
    """A `matchFields` entry's errors: In/NotIn with exactly one value (any key parses; a node
    has only `metadata.name`, every other field reads as empty)."""
    if req.operator not in ("In", "NotIn"):
        return [
            f'{path}.operator: Unsupported value: "{req.operator}": supported values: "In", "NotIn"'
        ]
    if len(req.values) != 1:
        return [f"{path}.values: Invalid value: {_go_strings(req.values)}: must have one element"]
    return []


def _field_matcher(req: Requirement) -> Matcher:
    wanted = req.values[0]
    is_name = req.key == "metadata.name"
    if req.operator == "In":
        return lambda _labels, name: (name if is_name else "") == wanted
    return lambda _labels, name: (name if is_name else "") != wanted


def _all(matchers: Sequence[Matcher]) -> Matcher:
    return lambda labels, name: all(m(labels, name) for m in matchers)


@lru_cache(maxsize=4096)
def term_errors(term: SelectorTerm, path: str = "") -> tuple[str, ...]:
    """Why k8s.io/component-helpers cannot parse the term (field errors under `path`), or ()."""
    errors: list[str] = []
    for i, req in enumerate(term.match_expressions):
        errors += _label_requirement_errors(req, f"{path}.matchExpressions[{i}]".lstrip("."))
    for i, req in enumerate(term.match_fields):
        errors += _field_requirement_errors(req, f"{path}.matchFields[{i}]".lstrip("."))
    return tuple(errors)


@lru_cache(maxsize=4096)
def compile_term(term: SelectorTerm) -> Matcher | None:
    """A term's matcher, or None when the term matches nothing (empty or malformed)."""
    if not term.match_expressions and not term.match_fields:
        return None
    if term_errors(term):
        return None
    matchers = [_label_matcher(r) for r in term.match_expressions]
    matchers += [_field_matcher(r) for r in term.match_fields]
    return _all(matchers)


def preferred_terms_error(constraints: Constraints) -> str:
    """NodeAffinity PreScore's error for the pod's preferred terms, or "" when they all parse.

    As NewPreferredSchedulingTerms: terms of weight 0 and empty terms are skipped unparsed; the
    errors of the others are aggregated (one as is, several as "[a, b]", duplicates once)."""
    errors: list[str] = []
    for i, term in enumerate(constraints.preferred_terms):
        preference = term.preference
        if term.weight == 0 or not (preference.match_expressions or preference.match_fields):
            continue
        for error in term_errors(preference, f"[{i}]"):
            if error not in errors:
                errors.append(error)
    if not errors:
        return ""
    detail = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    return f'running PreScore plugin "NodeAffinity": {detail}'


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
    order (NodeUnschedulable, TaintToleration, NodeAffinity), then TenantCode's verdict; empty
    when the node fits.
    kube-scheduler stops at the first failing plugin, so the first reason is the one it reports."""
    reasons = []
    if node.unschedulable and not tolerated(constraints.tolerations, UNSCHEDULABLE_TAINT):
        reasons.append(REASON_UNSCHEDULABLE)
    taint = first_untolerated_taint(node, constraints.tolerations)
    if taint is not None:
        reasons.append(untolerated_reason(taint))
    if not matches_required_affinity(constraints, node):
        reasons.append(REASON_AFFINITY)
    dedication = tenant_code_reason(constraints, node)
    if dedication:
        reasons.append(dedication)
    return reasons


def first_kubernetes_reason(constraints: Constraints, node: NodeInfo) -> str:
    """The reason kube-scheduler would report for this node (TenantCode's after its own rules),
    or "" when the node fits."""
    if node.unschedulable and not tolerated(constraints.tolerations, UNSCHEDULABLE_TAINT):
        return REASON_UNSCHEDULABLE
    taint = first_untolerated_taint(node, constraints.tolerations)
    if taint is not None:
        return untolerated_reason(taint)
    if not matches_required_affinity(constraints, node):
        return REASON_AFFINITY
    return tenant_code_reason(constraints, node)


def tenant_code_reason(constraints: Constraints, node: NodeInfo) -> str:
    """The TenantCode filter, after kube-scheduler's node rules: a pod whose namespace may run
    its own code in the shared Triton goes only to a node dedicated to it, and any other pod
    never does, so no other team's model shares a Triton with tenant code; "" when it passes."""
    if constraints.tenant_code and not node.tenant_code:
        return REASON_NOT_DEDICATED
    if node.tenant_code and not constraints.tenant_code:
        return REASON_DEDICATED
    return ""


class KubernetesNodeRules:
    """The node rules as the cluster state's constraint classes ask them
    (`binder.cluster.classes.NodeRules`): the reason a node fails, the scores of one that passes,
    and NodeAffinity PreScore's error."""

    def reason(self, constraints: Constraints, node: NodeInfo) -> str:
        return first_kubernetes_reason(constraints, node)

    def scores(self, constraints: Constraints, node: NodeInfo) -> tuple[int, int]:
        return (
            preferred_affinity_score(constraints, node),
            prefer_no_schedule_count(node, constraints.tolerations),
        )

    def preferred_error(self, constraints: Constraints) -> str:
        return preferred_terms_error(constraints)


NODE_RULES = KubernetesNodeRules()
"""The rules every cluster state is built with."""
