"""ResourceQuotas over pods: their validation, the quota admission of a pod create, and the status
kube's resource quota controller keeps.

A pod's usage (upstream's pod evaluator, pkg/quota/v1/evaluator/core/pods.go): `count/pods` is 1
for every stored pod; a pod not in a terminal phase also counts 1 in `pods`, its effective
requests (sum of containers, max with each init container, as the scheduler counts them) in
`requests.<resource>` (and in `cpu`, `memory`, `ephemeral-storage`, `hugepages-<size>`
alone), and its effective limits in `limits.<resource>` for cpu, memory and ephemeral-storage. An
extended resource (`tritonshare.io/gpu-mem`) counts only as `requests.<resource>`, its request
being its limit when the container sets only the limit.

Admission of a pod create, for each quota of the namespace (by name) whose `status.hard` names a
resource the pod evaluator tracks: a quota on cpu or memory first requires every container to
set it (`failed quota: NAME: must specify ...`); then the pod is refused (403 Forbidden) when its
usage would take any tracked resource past the hard limit, in the API server's words
(`exceeded quota: NAME, requested: ..., used: ..., limited: ...`).

`QuotaController` keeps each quota's status (`hard` = spec.hard, `used` = the namespace's pods'
usage of each tracked resource) current in the same step as every pod or quota write, as
upstream's controller does a moment later (cost of a pod write in a namespace with quotas: one
pass over its pods per quota). Of scopes, only `PriorityClass` (in `scopes`, or in
`scopeSelector` with In, NotIn, Exists or DoesNotExist, matched against the pod's
`spec.priorityClassName` as upstream's pod evaluator does): such a quota admits and counts only the
pods it selects. Not simulated: the other scopes (a quota with one is refused at create), object
counts of kinds other than pods, and the end of the charge of a pod stuck terminating past twice
its grace period (charged here until it is gone). No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from common.podresources import CPU, EPHEMERAL, MEMORY, pod_limits, pod_requests
from common.quantity import (
    DECIMAL_SI,
    QuantityError,
    format_quantity,
    quantity_decimal,
    quantity_format,
)
from sim.apiserver.errors import ApiError
from sim.apiserver.resources import PODS, RESOURCE_QUOTAS
from sim.apiserver.store import DELETED, Event, Store

JsonObject = dict[str, Any]
Causes = list[tuple[str, str]]
Usage = dict[str, tuple[Decimal, str]]
"""Quota resource name -> (amount, the quantity format it is written in)."""

POD_COUNT, POD_OBJECTS = "pods", "count/pods"
_COMPUTE = (CPU, MEMORY, EPHEMERAL)
_POD_RESOURCES = frozenset(
    {POD_COUNT, POD_OBJECTS}
    | {f"{prefix}{name}" for name in _COMPUTE for prefix in ("", "requests.", "limits.")}
)
_MUST_SPECIFY = frozenset(
    {CPU, MEMORY, f"requests.{CPU}", f"requests.{MEMORY}", f"limits.{CPU}", f"limits.{MEMORY}"}
)
"""Upstream's validationSet: a quota on these requires every container to set them."""
_STANDARD = _POD_RESOURCES | {
    "services",
    "services.loadbalancers",
    "services.nodeports",
    "secrets",
    "configmaps",
    "persistentvolumeclaims",
    "replicationcontrollers",
    "resourcequotas",
    "requests.storage",
}
_HUGEPAGES = ("hugepages-", "requests.hugepages-")


def _native(name: str) -> bool:
    """No domain, or a kubernetes.io one (upstream's IsNativeResource)."""
    return "/" not in name or "kubernetes.io/" in name


def tracked(name: str) -> bool:
    """Whether the pod evaluator counts this quota resource (upstream's MatchingResources)."""
    return (
        name in _POD_RESOURCES
        or name.startswith(_HUGEPAGES)
        or (name.startswith("requests.") and not _native(name))
    )


# spec


def spec_causes(quota: JsonObject) -> Causes:
    """The 422 causes of a quota's spec, with upstream's messages."""
    spec = quota.get("spec") or {}
    causes: Causes = []
    for name, raw in (spec.get("hard") or {}).items():
        where = f"spec.hard[{name}]"
        if "/" not in name and name not in _STANDARD and not name.startswith(_HUGEPAGES):
            causes.append(
                (where, f'Invalid value: "{name}": must be a standard resource for quota')
            )
        value = quantity_decimal(str(raw))
        if value is not None and value < 0:
            causes.append((where, f'Invalid value: "{raw}": must be greater than or equal to 0'))
    unsupported = [e for e in _scope_expressions(quota) if e.get("scopeName") != PRIORITY_CLASS]
    for field in ("scopes", "scopeSelector") if unsupported else ():
        if spec.get(field):
            causes.append(
                (
                    f"spec.{field}",
                    "Forbidden: quota scopes other than PriorityClass are not implemented by the"
                    " simulated API server; create the quota without them",
                )
            )
    return causes


PRIORITY_CLASS = "PriorityClass"


def _scope_expressions(quota: JsonObject) -> list[JsonObject]:
    """Each scope as upstream's getScopeSelectorsFromQuota reads it: a name in `scopes` is an
    Exists expression, then the scopeSelector's expressions."""
    spec = quota.get("spec") or {}
    found: list[JsonObject] = [
        {"scopeName": str(name), "operator": "Exists"} for name in spec.get("scopes") or []
    ]
    selector = spec.get("scopeSelector") or {}
    found += [e for e in selector.get("matchExpressions") or [] if isinstance(e, dict)]
    return found


def selects(quota: JsonObject, pod: JsonObject) -> bool:
    """Whether the quota's scopes select the pod (upstream's podMatchesScopeFunc for
    PriorityClass: Exists is a non-empty class name; the others match the name as the value of
    a label that is always there, so DoesNotExist never matches)."""
    name = str((pod.get("spec") or {}).get("priorityClassName") or "")
    for expression in _scope_expressions(quota):
        operator = expression.get("operator")
        values = [str(v) for v in expression.get("values") or []]
        if operator == "Exists":
            matched = name != ""
        elif operator in ("In", "NotIn"):
            matched = (name in values) == (operator == "In")
        else:
            matched = False
        if not matched:
            return False
    return True


# usage


def _terminal(pod: JsonObject) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _forms(spec: Mapping[str, Any], part: str) -> dict[str, str]:
    """Resource -> the format of the first quantity the pod writes for it under `part`
    (`requests`; for requests, a limit stands in for a missing request)."""
    forms: dict[str, str] = {}
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            resources = (container or {}).get("resources") or {}
            for source in (part, "limits"):
                for resource, raw in (resources.get(source) or {}).items():
                    forms.setdefault(str(resource), quantity_format(str(raw)))
    return forms


def _value(resource: str, amount: int) -> Decimal:
    return Decimal(amount) / 1000 if resource == CPU else Decimal(amount)


def pod_usage(pod: JsonObject) -> Usage:
    """The quota resources a stored pod uses (upstream's PodUsageFunc)."""
    one = (Decimal(1), DECIMAL_SI)
    usage: Usage = {POD_OBJECTS: one}
    if _terminal(pod):
        return usage
    usage[POD_COUNT] = one
    spec = pod.get("spec") or {}
    try:
        requests, limits = pod_requests(spec), pod_limits(spec)
    except QuantityError:
        return usage  # the API server refuses such a pod at decoding: none is stored
    request_forms, limit_forms = _forms(spec, "requests"), _forms(spec, "limits")
    for resource, amount in requests.items():
        quantity = (_value(resource, amount), request_forms.get(resource, DECIMAL_SI))
        if resource in _COMPUTE or resource.startswith("hugepages-"):
            usage[resource] = quantity
            usage[f"requests.{resource}"] = quantity
        elif not _native(resource) and not resource.startswith("requests."):
            usage[f"requests.{resource}"] = quantity
    for resource, amount in limits.items():
        if resource in _COMPUTE:
            quantity = (_value(resource, amount), limit_forms.get(resource, DECIMAL_SI))
            usage[f"limits.{resource}"] = quantity
    return usage


def _add(total: Usage, more: Mapping[str, tuple[Decimal, str]]) -> None:
    """resource.Quantity.Add: a zero takes the format of what is added to it."""
    for name, (value, form) in more.items():
        before, before_form = total.get(name, (Decimal(0), DECIMAL_SI))
        total[name] = (before + value, before_form if before else form)


def _quantity(raw: Any) -> tuple[Decimal, str]:
    text = str(raw)
    return quantity_decimal(text) or Decimal(0), quantity_format(text)


def _text(quantity: tuple[Decimal, str]) -> str:
    return format_quantity(*quantity)


def desired_status(quota: JsonObject, pods: Iterable[JsonObject]) -> JsonObject:
    """The status the quota controller writes: `hard` from the spec, `used` for each tracked
    resource of it (canonical quantities, as the API writes them)."""
    hard = {
        name: _quantity(raw) for name, raw in ((quota.get("spec") or {}).get("hard") or {}).items()
    }
    names = [name for name in hard if tracked(name)]
    used: Usage = {name: (Decimal(0), DECIMAL_SI) for name in names}
    for pod in pods:
        if selects(quota, pod):
            _add(used, {k: v for k, v in pod_usage(pod).items() if k in used})
    return {
        "hard": {name: _text(value) for name, value in sorted(hard.items())},
        "used": {name: _text(value) for name, value in sorted(used.items())},
    }


# admission


def _forbidden(pod: str, why: str) -> ApiError:
    return ApiError(
        403, "Forbidden", f'pods "{pod}" is forbidden: {why}', {"name": pod, "kind": "pods"}
    )


def _pretty(items: Mapping[str, tuple[Decimal, str]]) -> str:
    return ",".join(f"{name}={_text(items[name])}" for name in sorted(items))


def _missing(spec: Mapping[str, Any], required: set[str]) -> str:
    """Upstream's Constraints: each container must set each cpu and memory resource quota'd."""
    missing: dict[str, set[str]] = {}
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            resources = (container or {}).get("resources") or {}
            requests = set(resources.get("limits") or {}) | set(resources.get("requests") or {})
            has = {r for r in requests if r in (CPU, MEMORY)}
            has |= {f"requests.{r}" for r in has}
            has |= {f"limits.{r}" for r in resources.get("limits") or {} if r in (CPU, MEMORY)}
            for name in required - has:
                missing.setdefault(name, set()).add(str(container.get("name", "")))
    return "; ".join(f"{name} for: {','.join(sorted(missing[name]))}" for name in sorted(missing))


def admit_pod(store: Store, namespace: str, pod: JsonObject) -> None:
    """Refuse a pod create that a quota of its namespace forbids (ApiError 403)."""
    if namespace not in store.namespaces_of(RESOURCE_QUOTAS):
        return
    name = str(pod["metadata"].get("name", ""))
    spec = pod.get("spec") or {}
    usage = pod_usage(pod)
    for stored in sorted(store.objects(RESOURCE_QUOTAS, namespace), key=lambda q: q.name):
        if not selects(stored.obj, pod):
            continue
        status = stored.obj.get("status") or {}
        hard = {n: _quantity(raw) for n, raw in (status.get("hard") or {}).items() if tracked(n)}
        if not hard:
            continue
        missing = _missing(spec, set(hard) & _MUST_SPECIFY)
        if missing:
            raise _forbidden(name, f"failed quota: {stored.name}: must specify {missing}")
        used = {n: _quantity(raw) for n, raw in (status.get("used") or {}).items()}
        requested = {n: usage[n] for n in hard if n in usage and usage[n][0] != 0}
        exceeded = [
            n
            for n, (value, _) in requested.items()
            if used.get(n, (Decimal(0), ""))[0] + value > hard[n][0]
        ]
        if exceeded:
            raise _forbidden(
                name,
                f"exceeded quota: {stored.name},"
                f" requested: {_pretty({n: requested[n] for n in exceeded})},"
                f" used: {_pretty({n: used.get(n, (Decimal(0), DECIMAL_SI)) for n in exceeded})},"
                f" limited: {_pretty({n: hard[n] for n in exceeded})}",
            )


# the controller


class QuotaController:
    """Keeps each quota's status what `desired_status` says, on every pod or quota write."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._syncing = False
        store.observe(self._on_event)

    def _on_event(self, event: Event) -> None:
        if self._syncing:
            return  # its own status writes
        if event.resource is PODS:
            namespace = event.stored.namespace
            if namespace not in self.store.namespaces_of(RESOURCE_QUOTAS):
                return  # the common case, kept to one lookup per pod write
            names = [q.name for q in self.store.objects(RESOURCE_QUOTAS, namespace)]
        elif event.resource is RESOURCE_QUOTAS and event.type != DELETED:
            namespace, names = event.stored.namespace, [event.stored.name]
        else:
            return
        self._syncing = True
        try:
            for name in names:
                self.sync(namespace, name)
        finally:
            self._syncing = False

    def sync(self, namespace: str, name: str) -> None:
        current = self.store.get(RESOURCE_QUOTAS, namespace, name)
        if current is None:
            return
        pods = (p.obj for p in self.store.objects(PODS, namespace))
        status = desired_status(current.obj, pods)
        if status == current.obj.get("status"):
            return
        updated = current.copy()
        updated["status"] = status
        self.store.replace(RESOURCE_QUOTAS, updated)
