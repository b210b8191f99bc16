"""PodDisruptionBudgets: their validation and the status kube's disruption controller keeps.

A budget (policy/v1) selects pods of its namespace by `spec.selector` (absent: none; `{}`: all)
and says how many must stay healthy (`minAvailable`) or may be unavailable (`maxUnavailable`), as
an integer or a percentage rounded up, as upstream's `GetScaledValueFromIntOrPercent` does. Its
status (currentHealthy, desiredHealthy, expectedPods, disruptionsAllowed, disruptedPods,
observedGeneration and the DisruptionAllowed condition) is what the controller computes: a pod is
healthy when it is Ready, not being deleted, and not named in disruptedPods (an eviction granted
less than two minutes ago).

`DisruptionController` keeps every budget's status current: it observes the store and, on each
write of a pod or a budget, recomputes the budgets of that namespace that select the pod (before
or after the write), in the same step as the write (upstream's controller does it a moment
later). Cost of one pod write: one pass over the namespace's budgets, plus one pass over the
namespace's pods for each budget that selects the pod.

Where upstream reads a controller's `spec.replicas` (maxUnavailable, a percentage minAvailable),
so does this: a pod's ReplicaSet's Deployment, else the ReplicaSet (apps/v1, served here). A
controller the server does not serve (a StatefulSet, or a test playing one) counts its pods the
store holds, terminating ones included (a real controller's replica count does not drop when one
of its pods is evicted). A selected pod with no controller ownerReference fails the budget safe,
as upstream: no disruption allowed, condition reason SyncFailed. No I/O.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from sim.apiserver.admission.matching import labels_of, selector_matches
from sim.apiserver.clock import Clock, rfc3339
from sim.apiserver.resources import DEPLOYMENTS, POD_DISRUPTION_BUDGETS, PODS, REPLICA_SETS
from sim.apiserver.store import DELETED, Event, Store, Stored

JsonObject = dict[str, Any]
Causes = list[tuple[str, str]]

DELETION_TIMEOUT_SECONDS = 120
"""How long a pod an eviction was granted for counts as disrupted before it must be terminating
(upstream's DeletionTimeout)."""
MAX_DISRUPTED_PODS = 2000
"""Upstream's MaxDisruptedPodSize: evictions are refused while the budget names more pods."""
CONDITION = "DisruptionAllowed"
_PERCENT = re.compile(r"^[0-9]+%$")
_POLICIES = ("IfHealthyBudget", "AlwaysAllow")


class SyncFailedError(Exception):
    """The budget's expected pod count cannot be known; its message goes into the condition."""


# spec


def _int_or_percent_causes(value: Any, where: str) -> Causes:
    if isinstance(value, str):
        if not _PERCENT.match(value):
            return [
                (where, f"Invalid value: \"{value}\": must be an integer or percentage (e.g '5%')")
            ]
        if int(value[:-1]) > 100:
            return [(where, f'Invalid value: "{value}": must not be greater than 100%')]
        return []
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        return [(where, f"Invalid value: {value}: must be greater than or equal to 0")]
    return []


def spec_causes(pdb: JsonObject) -> Causes:
    """The 422 causes of a budget's spec, with upstream's messages."""
    spec = pdb.get("spec") or {}
    causes: Causes = []
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        causes.append(
            ("spec", "Invalid value: the spec: minAvailable and maxUnavailable cannot be both set")
        )
    for key in ("minAvailable", "maxUnavailable"):
        if spec.get(key) is not None:
            causes += _int_or_percent_causes(spec[key], f"spec.{key}")
    policy = spec.get("unhealthyPodEvictionPolicy")
    if policy is not None and policy not in _POLICIES:
        causes.append(
            (
                "spec.unhealthyPodEvictionPolicy",
                f'Unsupported value: "{policy}": supported values: "AlwaysAllow",'
                ' "IfHealthyBudget"',
            )
        )
    selector = spec.get("selector")
    if selector is not None:
        for expression in selector.get("matchExpressions") or []:
            operator = expression.get("operator")
            values = expression.get("values") or []
            if operator in ("In", "NotIn") and not values:
                causes.append(
                    (
                        "spec.selector.matchExpressions.values",
                        "Required value: must be specified when `operator` is 'In' or 'NotIn'",
                    )
                )
            elif operator in ("Exists", "DoesNotExist") and values:
                causes.append(
                    (
                        "spec.selector.matchExpressions.values",
                        "Forbidden: may not be specified when `operator` is 'Exists' or"
                        " 'DoesNotExist'",
                    )
                )
            elif operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
                causes.append(
                    (
                        "spec.selector.matchExpressions.operator",
                        f'Invalid value: "{operator}": not a valid selector operator',
                    )
                )
    return causes


def decoding_problem(pdb: JsonObject) -> str | None:
    """Why the spec does not decode into its Go types (IntOrString, LabelSelector), or None."""
    spec = pdb.get("spec")
    if not isinstance(spec, dict):
        return None
    where = "PodDisruptionBudgetSpec.spec"
    for key in ("minAvailable", "maxUnavailable"):
        value = spec.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | str)):
            return f"cannot unmarshal {type(value).__name__} into Go struct field {where}.{key}"
    selector = spec.get("selector")
    if selector is None:
        return None
    if not isinstance(selector, dict):
        return f"cannot unmarshal {type(selector).__name__} into Go struct field {where}.selector"
    labels = selector.get("matchLabels")
    if labels is not None and (
        not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values())
    ):
        return f"matchLabels must be an object of strings in Go struct field {where}.selector"
    expressions = selector.get("matchExpressions")
    if expressions is not None and (
        not isinstance(expressions, list) or not all(isinstance(e, dict) for e in expressions)
    ):
        return f"matchExpressions must be a list of objects in Go struct field {where}.selector"
    return None


def scaled(value: int | str, total: int, round_up: bool) -> int:
    """An IntOrString against `total`: the integer, or the percentage of total, rounded."""
    if isinstance(value, int):
        return value
    percent = int(value[:-1])
    return -(-percent * total // 100) if round_up else percent * total // 100


# status


def selects(pdb: JsonObject, labels: JsonObject) -> bool:
    """policy/v1: an absent selector selects nothing, an empty one every pod of the namespace."""
    selector = (pdb.get("spec") or {}).get("selector")
    if selector is None:
        return False
    return selector_matches(selector, labels)


def is_ready(pod: JsonObject) -> bool:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def _controller_uid(pod: JsonObject) -> str | None:
    for owner in pod["metadata"].get("ownerReferences") or []:
        if owner.get("controller"):
            return str(owner.get("uid", ""))
    return None


def _scale_of(
    uid: str, workloads: dict[str, JsonObject], namespace_pods: list[JsonObject]
) -> tuple[str, int]:
    """(the scale's owner uid, its replicas) for a pod's controller, as upstream's finders: a
    ReplicaSet's Deployment, else the ReplicaSet; a controller the server does not serve counts
    its pods in the store."""
    rs = workloads.get(uid)
    if rs is None:
        return uid, sum(1 for pod in namespace_pods if _controller_uid(pod) == uid)
    owner = _controller_uid(rs)
    deployment = workloads.get(owner) if owner is not None else None
    chosen = deployment if deployment is not None else rs
    return str(chosen["metadata"]["uid"]), int((chosen.get("spec") or {}).get("replicas") or 0)


def _expected_scale(
    selected: list[JsonObject], namespace_pods: list[JsonObject], workloads: dict[str, JsonObject]
) -> int:
    scales: dict[str, int] = {}
    for pod in selected:
        uid = _controller_uid(pod)
        if uid is None:
            raise SyncFailedError(f'found no controller ref for pod "{pod["metadata"]["name"]}"')
        owner, replicas = _scale_of(uid, workloads, namespace_pods)
        scales[owner] = replicas
    return sum(scales.values())


def _expected_and_desired(
    spec: JsonObject,
    selected: list[JsonObject],
    namespace_pods: list[JsonObject],
    workloads: dict[str, JsonObject],
) -> tuple[int, int]:
    max_unavailable = spec.get("maxUnavailable")
    min_available = spec.get("minAvailable")
    if max_unavailable is not None:
        expected = _expected_scale(selected, namespace_pods, workloads)
        desired = max(0, expected - scaled(max_unavailable, expected, round_up=True))
        return expected, desired
    if isinstance(min_available, int):
        return len(selected), min_available
    if isinstance(min_available, str):
        expected = _expected_scale(selected, namespace_pods, workloads)
        return expected, scaled(min_available, expected, round_up=True)
    return 0, 0


def _parse_time(text: Any) -> float | None:
    try:
        return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def _set_condition(
    conditions: list[JsonObject], status: str, reason: str, message: str, generation: int, now: str
) -> list[JsonObject]:
    """metav1 SetStatusCondition: the transition time moves only when the status does."""
    old = next((c for c in conditions if c.get("type") == CONDITION), None)
    changed = old is None or old.get("status") != status
    condition = {
        "type": CONDITION,
        "status": status,
        "observedGeneration": generation,
        "lastTransitionTime": now if changed or old is None else old.get("lastTransitionTime", now),
        "reason": reason,
        "message": message,
    }
    return [c for c in conditions if c.get("type") != CONDITION] + [condition]


def with_allowed_condition(status: JsonObject, now: float) -> JsonObject:
    """The status with its DisruptionAllowed condition matching disruptionsAllowed."""
    allowed = int(status.get("disruptionsAllowed") or 0) > 0
    result = dict(status)
    result["conditions"] = _set_condition(
        list(status.get("conditions") or []),
        "True" if allowed else "False",
        "SufficientPods" if allowed else "InsufficientPods",
        "",
        int(status.get("observedGeneration") or 0),
        rfc3339(now),
    )
    return result


def desired_status(
    pdb: JsonObject,
    namespace_pods: list[JsonObject],
    now: float,
    workloads: dict[str, JsonObject] | None = None,
) -> JsonObject:
    """The status the disruption controller would write for `pdb` over its namespace's pods and
    its Deployments and ReplicaSets (`workloads`, by uid)."""
    old: JsonObject = pdb.get("status") or {}
    selected = [p for p in namespace_pods if selects(pdb, labels_of(p))]
    try:
        expected, desired = _expected_and_desired(
            pdb.get("spec") or {}, selected, namespace_pods, workloads or {}
        )
    except SyncFailedError as e:
        failed = dict(old)
        failed["disruptionsAllowed"] = 0
        failed["conditions"] = _set_condition(
            list(old.get("conditions") or []),
            "False",
            "SyncFailed",
            str(e),
            int(old.get("observedGeneration") or 0),
            rfc3339(now),
        )
        return failed
    disrupted: JsonObject = {}
    granted: JsonObject = old.get("disruptedPods") or {}
    for pod in selected:
        name = pod["metadata"]["name"]
        if pod["metadata"].get("deletionTimestamp") or name not in granted:
            continue
        when = _parse_time(granted[name])
        if when is not None and when + DELETION_TIMEOUT_SECONDS >= now:
            disrupted[name] = granted[name]
    healthy = sum(
        1
        for pod in selected
        if not pod["metadata"].get("deletionTimestamp")
        and pod["metadata"]["name"] not in disrupted
        and is_ready(pod)
    )
    allowed = healthy - desired
    if expected <= 0 or allowed <= 0:
        allowed = 0
    status: JsonObject = {
        "observedGeneration": int(pdb["metadata"].get("generation") or 0),
        "disruptionsAllowed": allowed,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "conditions": list(old.get("conditions") or []),
    }
    if disrupted:
        status["disruptedPods"] = disrupted
    return with_allowed_condition(status, now)


def budgets_for(store: Store, pod: JsonObject) -> list[Stored]:
    """The budgets of the pod's namespace that select it."""
    namespace = str(pod["metadata"].get("namespace", ""))
    labels = labels_of(pod)
    return [b for b in store.objects(POD_DISRUPTION_BUDGETS, namespace) if selects(b.obj, labels)]


class DisruptionController:
    """Keeps each budget's status what `desired_status` says, on every pod or budget write."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self._pending: dict[tuple[str, str], None] = {}
        self._running = False
        store.observe(self._on_event)

    def _on_event(self, event: Event) -> None:
        if event.resource is PODS:
            namespace = event.stored.namespace
            if namespace not in self.store.namespaces_of(POD_DISRUPTION_BUDGETS):
                return  # the common case, kept to one lookup per pod write
            labels = [labels_of(event.stored.obj)]
            if event.prev is not None:
                labels.append(labels_of(event.prev.obj))
            for budget in self.store.objects(POD_DISRUPTION_BUDGETS, namespace):
                if any(selects(budget.obj, chosen) for chosen in labels):
                    self._pending[(namespace, budget.name)] = None
        elif event.resource is POD_DISRUPTION_BUDGETS and event.type != DELETED:
            self._pending[(event.stored.namespace, event.stored.name)] = None
        elif event.resource is DEPLOYMENTS or event.resource is REPLICA_SETS:
            # A workload's scale is its budgets' expected pods: any of the namespace's may use it.
            namespace = event.stored.namespace
            if namespace not in self.store.namespaces_of(POD_DISRUPTION_BUDGETS):
                return
            for budget in self.store.objects(POD_DISRUPTION_BUDGETS, namespace):
                self._pending[(namespace, budget.name)] = None
        else:
            return
        if self._running:
            return  # the loop below picks it up: writes it makes do not recurse
        self._running = True
        try:
            while self._pending:
                key = next(iter(self._pending))
                del self._pending[key]
                self.sync(*key)
        finally:
            self._running = False

    def sync(self, namespace: str, name: str) -> None:
        current = self.store.get(POD_DISRUPTION_BUDGETS, namespace, name)
        if current is None:
            return
        pods = [p.obj for p in self.store.objects(PODS, namespace)]
        workloads = {
            str(w.obj["metadata"]["uid"]): w.obj
            for kind in (DEPLOYMENTS, REPLICA_SETS)
            for w in self.store.objects(kind, namespace)
        }
        status = desired_status(current.obj, pods, self.clock.now(), workloads)
        if status == current.obj.get("status"):
            return
        updated = current.copy()
        updated["status"] = status
        self.store.replace(POD_DISRUPTION_BUDGETS, updated)
        # Its own write comes back as an event: drop it rather than recompute the same status.
        self._pending.pop((namespace, name), None)
