"""kube-scheduler's node filters as the simulated default scheduler and Cluster Autoscaler apply
them: NodeUnschedulable, NodeName, TaintToleration, NodeAffinity (nodeSelector and required
node affinity: matchExpressions and matchFields), NodeResourcesFit (requests against
allocatable minus the requests of the pods already there: cpu, memory, pods and any extended
resource) and InterPodAffinity's required anti-affinity by `kubernetes.io/hostname`, the incoming
pod's and the running pods' (`namespaces`, or `namespaceSelector: {}` for all). Not simulated:
other pod (anti-)affinity, topology spread, host ports, volumes.

Pure: API-shaped objects in, the first failed filter's kube-scheduler phrase (or None) out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

JsonObject = dict[str, Any]

_SUFFIXES: dict[str, Decimal | int] = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}  # fmt: skip
_ENDED = frozenset({"Succeeded", "Failed"})


def quantity(value: Any) -> Decimal:
    """A Kubernetes quantity ("500m", "2Gi", 3) as a number; ValueError when it is none."""
    text = str(value).strip()
    for suffix in sorted(_SUFFIXES, key=len, reverse=True):
        if text.endswith(suffix):
            number, factor = text[: -len(suffix)], Decimal(_SUFFIXES[suffix])
            break
    else:
        number, factor = text, Decimal(1)
    try:
        return Decimal(number) * factor
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a Kubernetes quantity") from None


def requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """The pod's effective requests, as kube-scheduler computes them (the sum of its containers,
    at least each init container's; a limit without a request requests it), and `pods: 1`."""
    spec = pod.get("spec") or {}

    def of(container: Mapping[str, Any]) -> dict[str, Decimal]:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {k: quantity(v) for k, v in merged.items()}

    total: dict[str, Decimal] = {"pods": Decimal(1)}
    for container in spec.get("containers") or []:
        for name, amount in of(container).items():
            total[name] = total.get(name, Decimal(0)) + amount
    for container in spec.get("initContainers") or []:
        for name, amount in of(container).items():
            total[name] = max(total.get(name, Decimal(0)), amount)
    return total


def running_on(pods: Iterable[Mapping[str, Any]], node: str) -> list[Mapping[str, Any]]:
    """The pods bound to `node` that are not terminated."""
    return [
        p
        for p in pods
        if (p.get("spec") or {}).get("nodeName") == node
        and (p.get("status") or {}).get("phase") not in _ENDED
    ]


def _expression(expression: Mapping[str, Any], value: str | None) -> bool:
    operator, values = expression.get("operator"), list(expression.get("values") or [])
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _term(term: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    name = (node.get("metadata") or {}).get("name")
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches no node
    return all(_expression(e, labels.get(e.get("key"))) for e in expressions) and all(
        _expression(f, name if f.get("key") == "metadata.name" else None) for f in fields
    )


def _tolerated(taint: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    for toleration in tolerations:
        effect = toleration.get("effect")
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key")
        if toleration.get("operator") == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (toleration.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def _selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(
        _expression(e, labels.get(e.get("key"))) for e in selector.get("matchExpressions") or []
    )


def _shuns(pod: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """`pod`'s required anti-affinity by hostname keeps it off a node where `other` runs."""
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("podAntiAffinity") or {}
    own = (pod.get("metadata") or {}).get("namespace")
    metadata = other.get("metadata") or {}
    for term in affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or []:
        if term.get("topologyKey") != "kubernetes.io/hostname":
            continue
        every = term.get("namespaceSelector") == {}
        namespaces = set(term.get("namespaces") or ([] if every else [own]))
        if (every or metadata.get("namespace") in namespaces) and _selects(
            term.get("labelSelector") or {}, metadata.get("labels") or {}
        ):
            return True
    return False


def unfit(
    pod: Mapping[str, Any], node: Mapping[str, Any], others: Iterable[Mapping[str, Any]]
) -> str | None:
    """Why `pod` does not fit `node` beside `others` (the pods running there), in
    kube-scheduler's words; None when it fits."""
    spec, node_spec = pod.get("spec") or {}, node.get("spec") or {}
    metadata = node.get("metadata") or {}
    tolerations = spec.get("tolerations") or []
    if node_spec.get("unschedulable") and not _tolerated(
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}, tolerations
    ):
        return "node(s) were unschedulable"
    if spec.get("nodeName") and spec["nodeName"] != metadata.get("name"):
        return "node(s) didn't match the requested node name"
    for taint in node_spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(
            taint, tolerations
        ):
            return f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"
    labels = metadata.get("labels") or {}
    selector = spec.get("nodeSelector") or {}
    required = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms")
    if any(labels.get(k) != v for k, v in selector.items()) or (
        required and not any(_term(t, node) for t in required)
    ):
        return "node(s) didn't match Pod's node affinity/selector"
    others = list(others)
    if any(_shuns(pod, other) for other in others):
        return "node(s) didn't match pod anti-affinity rules"
    if any(_shuns(other, pod) for other in others):
        return "node(s) didn't satisfy existing pods anti-affinity rules"
    allocatable = (node.get("status") or {}).get("allocatable")
    if allocatable is None:
        return None  # a node object made by hand: NodeResourcesFit does not judge it
    used: dict[str, Decimal] = {}
    for other in others:
        for name, amount in requests(other).items():
            used[name] = used.get(name, Decimal(0)) + amount
    for name, amount in sorted(requests(pod).items()):
        if amount <= 0:
            continue
        free = quantity(allocatable.get(name, 0)) - used.get(name, Decimal(0))
        if amount > free:
            return "Too many pods" if name == "pods" else f"Insufficient {name}"
    return None


def fit_error(total: int, reasons: Mapping[str, int]) -> str:
    """kube-scheduler's FitError message."""
    counts = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
    return (
        f"0/{total} nodes are available: {counts}." if counts else f"0/{total} nodes are available."
    )
