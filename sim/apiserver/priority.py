"""PriorityClasses and the Priority admission plugin, as kube-apiserver has them.

On pod create: a `priorityClassName` must name an existing PriorityClass (else 403 Forbidden,
upstream's message); `spec.priority` and `spec.preemptionPolicy` come from it. Without a name,
the class marked `globalDefault` applies (its name is written into the pod), else priority 0. A
pod that writes a `spec.priority` of its own that differs from the resolved one is refused, so a
tenant cannot give itself a priority. PriorityClasses: a value above 1,000,000,000 and names
starting with `system-` are reserved for the built-in classes, and only one class may be the
global default. The two built-in classes exist from the start.
"""

from __future__ import annotations

from typing import Any

from sim.apiserver.errors import ApiError, invalid
from sim.apiserver.resources import PRIORITY_CLASSES
from sim.apiserver.store import Store

JsonObject = dict[str, Any]
HIGHEST_USER_PRIORITY = 1_000_000_000
SYSTEM_PREFIX = "system-"
BUILT_IN = (
    (
        "system-node-critical",
        2_000_001_000,
        "Used for system critical pods that must not be moved from their current node.",
    ),
    (
        "system-cluster-critical",
        2_000_000_000,
        "Used for system critical pods that must run in the cluster, but can be moved to another "
        "node if necessary.",
    ),
)


def built_in_classes() -> list[JsonObject]:
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name},
            "value": value,
            "description": description,
            "preemptionPolicy": "PreemptLowerPriority",
        }
        for name, value, description in BUILT_IN
    ]


def _forbidden(pod: str, why: str) -> ApiError:
    return ApiError(403, "Forbidden", f'pods "{pod}" is forbidden: {why}')


def _classes(store: Store) -> list[JsonObject]:
    return [stored.obj for stored in store.objects(PRIORITY_CLASSES, None)]


def admit_pod(store: Store, pod: JsonObject) -> None:
    """Resolve the pod's priority from its PriorityClass (mutating), or refuse it."""
    spec = pod.setdefault("spec", {})
    if not isinstance(spec, dict):
        return
    name = str(pod.get("metadata", {}).get("name", ""))
    class_name = spec.get("priorityClassName") or ""
    chosen: JsonObject | None = None
    if class_name:
        found = store.get(PRIORITY_CLASSES, "", str(class_name))
        if found is None:
            raise _forbidden(name, f"no PriorityClass with name {class_name} was found")
        chosen = found.obj
    else:
        defaults = [c for c in _classes(store) if c.get("globalDefault") is True]
        if defaults:
            chosen = min(defaults, key=lambda c: int(c.get("value", 0)))
            spec["priorityClassName"] = chosen["metadata"]["name"]
    priority = int(chosen.get("value", 0)) if chosen is not None else 0
    given = spec.get("priority")
    if given is not None and given != priority:
        raise _forbidden(
            name,
            f"the integer value of priority ({given}) must not be provided in pod spec; "
            f"priority admission controller computed {priority} from the given PriorityClass "
            f"name",
        )
    spec["priority"] = priority
    policy = chosen.get("preemptionPolicy") if chosen is not None else None
    spec["preemptionPolicy"] = policy or spec.get("preemptionPolicy") or "PreemptLowerPriority"


def validate_class(store: Store, obj: JsonObject, old: JsonObject | None) -> None:
    """Upstream's PriorityClass validation: reserved names and values, one global default, and
    value and preemptionPolicy immutable."""
    name = str(obj.get("metadata", {}).get("name", ""))
    value = obj.get("value")
    causes: list[tuple[str, str]] = []
    if not isinstance(value, int) or isinstance(value, bool):
        causes.append(("value", "Required value"))
    elif name.startswith(SYSTEM_PREFIX) and name not in {n for n, _, _ in BUILT_IN}:
        causes.append(
            (
                "metadata.name",
                f'Invalid value: "{name}": priority class names with '
                f"'{SYSTEM_PREFIX}' prefix are reserved for system use only",
            )
        )
    elif value > HIGHEST_USER_PRIORITY and name not in {n for n, _, _ in BUILT_IN}:
        causes.append(
            (
                "value",
                f"Invalid value: {value}: maximum allowed value of a user defined "
                f"priority is {HIGHEST_USER_PRIORITY}",
            )
        )
    policy = obj.get("preemptionPolicy", "PreemptLowerPriority")
    obj["preemptionPolicy"] = policy
    if policy not in ("PreemptLowerPriority", "Never"):
        causes.append(
            (
                "preemptionPolicy",
                f'Unsupported value: "{policy}": supported values: "Never", "PreemptLowerPriority"',
            )
        )
    if old is not None:
        if old.get("value") != value:
            causes.append(("value", "Forbidden: may not be changed in an update."))
        if old.get("preemptionPolicy", "PreemptLowerPriority") != policy:
            causes.append(("preemptionPolicy", "Invalid value: field is immutable"))
    if causes:
        raise invalid("PriorityClass", "scheduling.k8s.io", name, causes)
    if obj.get("globalDefault") is True:
        for other in _classes(store):
            other_name = other["metadata"]["name"]
            if other_name != name and other.get("globalDefault") is True:
                raise invalid(
                    "PriorityClass",
                    "scheduling.k8s.io",
                    name,
                    [
                        (
                            "globalDefault",
                            f"Invalid value: true: PriorityClass {other_name} is already marked as "
                            f"default. Only one default can exist",
                        )
                    ],
                )
