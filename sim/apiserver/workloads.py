"""Deployments and ReplicaSets (apps/v1) as the API server stores them: defaults, validation, the
generation, and the autoscaling/v1 Scale subresource.

What upstream's apps registry does to these objects on write, and nothing of what its controllers
do: rolling a Deployment and keeping a ReplicaSet's pods is `sim.controllers`, an API client like
kube-controller-manager. Defaults are apps/v1's (`replicas: 1`, RollingUpdate 25%/25%,
`revisionHistoryLimit: 10`, `progressDeadlineSeconds: 600`, the pod template's spec defaults);
validation carries upstream's messages for the fields the controllers read. Pure; no I/O.
"""

from __future__ import annotations

import re
from typing import Any

from sim.apiserver.admission.matching import selector_matches
from sim.apiserver.resources import DEPLOYMENTS, Resource

JsonObject = dict[str, Any]
Causes = list[tuple[str, str]]

_PERCENT = re.compile(r"^[0-9]+%$")
DEFAULT_SURGE_AND_UNAVAILABLE = "25%"
DEFAULT_REVISION_HISTORY = 10
DEFAULT_PROGRESS_DEADLINE_SECONDS = 600
_STRATEGIES = ("Recreate", "RollingUpdate")


def _pod_spec_defaults(spec: JsonObject) -> None:
    """SetDefaults_PodSpec for the fields a pod gets from the API server as well."""
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")


def apply_defaults(resource: Resource, obj: JsonObject) -> None:
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict):
        return
    spec.setdefault("replicas", 1)
    template = spec.get("template")
    if isinstance(template, dict) and isinstance(template.get("spec"), dict):
        _pod_spec_defaults(template["spec"])
    if resource is not DEPLOYMENTS:
        return
    strategy = spec.setdefault("strategy", {})
    if isinstance(strategy, dict):
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            if isinstance(rolling, dict):
                rolling.setdefault("maxUnavailable", DEFAULT_SURGE_AND_UNAVAILABLE)
                rolling.setdefault("maxSurge", DEFAULT_SURGE_AND_UNAVAILABLE)
    spec.setdefault("revisionHistoryLimit", DEFAULT_REVISION_HISTORY)
    spec.setdefault("progressDeadlineSeconds", DEFAULT_PROGRESS_DEADLINE_SECONDS)


def decoding_problem(resource: Resource, obj: JsonObject) -> str | None:
    """Why the spec does not decode into its Go types (IntOrString, LabelSelector), or None."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return None
    where = f"{resource.kind}Spec.spec"
    rolling = (spec.get("strategy") or {}).get("rollingUpdate") if resource is DEPLOYMENTS else None
    if isinstance(rolling, dict):
        for key in ("maxSurge", "maxUnavailable"):
            value = rolling.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | str)):
                return (
                    f"cannot unmarshal {type(value).__name__} into Go struct field"
                    f" RollingUpdateDeployment.spec.strategy.rollingUpdate.{key}"
                )
    for key in ("selector", "template"):
        value = spec.get(key)
        if value is not None and not isinstance(value, dict):
            return f"cannot unmarshal {type(value).__name__} into Go struct field {where}.{key}"
    return None


def _int_or_percent_causes(value: Any, where: str) -> Causes:
    if isinstance(value, str):
        if not _PERCENT.match(value):
            return [
                (where, f"Invalid value: \"{value}\": must be an integer or percentage (e.g '5%')")
            ]
        return []
    if isinstance(value, int) and value < 0:
        return [(where, f"Invalid value: {value}: must be greater than or equal to 0")]
    return []


def _zero(value: Any) -> bool:
    if isinstance(value, str):
        return bool(_PERCENT.match(value)) and int(value[:-1]) == 0
    return bool(value == 0)


def _non_negative(spec: JsonObject, key: str) -> Causes:
    value = spec.get(key)
    if isinstance(value, int) and value < 0:
        return [(f"spec.{key}", f"Invalid value: {value}: must be greater than or equal to 0")]
    return []


def _strategy_causes(spec: JsonObject) -> Causes:
    strategy = spec.get("strategy") or {}
    kind = strategy.get("type")
    rolling = strategy.get("rollingUpdate")
    where = "spec.strategy.rollingUpdate"
    if kind not in _STRATEGIES:
        return [
            (
                "spec.strategy.type",
                f'Unsupported value: "{kind}": supported values: "Recreate", "RollingUpdate"',
            )
        ]
    if kind == "Recreate":
        if rolling is not None:
            return [(where, "Forbidden: may not be specified when strategy `type` is 'Recreate'")]
        return []
    if not isinstance(rolling, dict):
        return [(where, "Required value: this should be defaulted and never be nil")]
    unavailable, surge = rolling.get("maxUnavailable"), rolling.get("maxSurge")
    causes = _int_or_percent_causes(unavailable, f"{where}.maxUnavailable")
    causes += _int_or_percent_causes(surge, f"{where}.maxSurge")
    if _zero(unavailable) and _zero(surge):
        # A rollout that may neither add a pod nor take one away can never progress.
        causes.append(
            (
                f"{where}.maxUnavailable",
                f"Invalid value: {_show(unavailable)}: may not be 0 when `maxSurge` is 0",
            )
        )
    if isinstance(unavailable, str) and _PERCENT.match(unavailable) and int(unavailable[:-1]) > 100:
        causes.append(
            (
                f"{where}.maxUnavailable",
                f'Invalid value: "{unavailable}": must not be greater than 100%',
            )
        )
    return causes


def _show(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value)


def spec_causes(resource: Resource, obj: JsonObject) -> Causes:
    """The 422 causes of a Deployment's or ReplicaSet's spec, with upstream's messages (the
    template's pod spec is checked by `sim.apiserver.validation`, as a pod's)."""
    spec = obj.get("spec") or {}
    causes: Causes = []
    for key in ("replicas", "minReadySeconds", "revisionHistoryLimit", "progressDeadlineSeconds"):
        causes += _non_negative(spec, key)
    selector = spec.get("selector")
    template = spec.get("template")
    if not isinstance(selector, dict):
        causes.append(("spec.selector", "Required value"))
    elif not selector.get("matchLabels") and not selector.get("matchExpressions"):
        causes.append(
            (
                "spec.selector",
                f"Invalid value: {selector}: empty selector is invalid for {resource.kind.lower()}",
            )
        )
    if not isinstance(template, dict):
        if resource is DEPLOYMENTS or int(spec.get("replicas") or 0) > 0:
            causes.append(("spec.template", "Required value"))
    else:
        labels = (template.get("metadata") or {}).get("labels") or {}
        if isinstance(selector, dict) and not selector_matches(selector, labels):
            causes.append(
                (
                    "spec.template.metadata.labels",
                    f"Invalid value: {labels}: `selector` does not match template `labels`",
                )
            )
        restart = (template.get("spec") or {}).get("restartPolicy")
        if restart not in (None, "Always"):
            causes.append(
                (
                    "spec.template.spec.restartPolicy",
                    f'Unsupported value: "{restart}": supported values: "Always"',
                )
            )
    if resource is DEPLOYMENTS:
        causes += _strategy_causes(spec)
        deadline, ready = spec.get("progressDeadlineSeconds"), spec.get("minReadySeconds") or 0
        if isinstance(deadline, int) and isinstance(ready, int) and deadline <= ready:
            causes.append(
                (
                    "spec.progressDeadlineSeconds",
                    f"Invalid value: {deadline}: must be greater than minReadySeconds",
                )
            )
    return causes


def update_causes(old: JsonObject, new: JsonObject) -> Causes:
    """apps/v1 makes the selector immutable once created."""
    before = (old.get("spec") or {}).get("selector")
    after = (new.get("spec") or {}).get("selector")
    if before != after:
        return [("spec.selector", f"Invalid value: {after}: field is immutable")]
    return []


def prepare_create(resource: Resource, obj: JsonObject) -> None:
    """As upstream's strategy: a new object starts at generation 1 with an empty status (a
    ReplicaSet's `status.replicas` is never omitted)."""
    obj["metadata"]["generation"] = 1
    obj["status"] = {} if resource is DEPLOYMENTS else {"replicas": 0}


def next_generation(old: JsonObject, new: JsonObject, subresource: str) -> int:
    """The generation counts spec changes; the controllers' observedGeneration trails it."""
    generation = int(old["metadata"].get("generation") or 1)
    if subresource != "status" and new.get("spec") != old.get("spec"):
        generation += 1
    return generation


# the scale subresource


def _selector_text(selector: JsonObject) -> str:
    """A LabelSelector as the Scale's `status.selector` string (`a=b,c in (d)`)."""
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression.get("key"), expression.get("operator")
        values = ",".join(sorted(expression.get("values") or []))
        if operator == "In":
            parts.append(f"{key} in ({values})")
        elif operator == "NotIn":
            parts.append(f"{key} notin ({values})")
        elif operator == "Exists":
            parts.append(str(key))
        elif operator == "DoesNotExist":
            parts.append(f"!{key}")
    return ",".join(parts)


def scale_of(obj: JsonObject) -> JsonObject:
    """The autoscaling/v1 Scale view of a Deployment or ReplicaSet."""
    meta = obj["metadata"]
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            key: meta[key]
            for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if key in meta
        },
        "spec": {"replicas": int(spec.get("replicas") or 0)},
        "status": {
            "replicas": int(status.get("replicas") or 0),
            "selector": _selector_text(spec.get("selector") or {}),
        },
    }


def scale_replicas(scale: Any) -> int:
    """`spec.replicas` of a Scale written by a client; ValueError says what is wrong."""
    if not isinstance(scale, dict):
        raise ValueError("the request body must be a JSON object (Scale)")
    replicas = (scale.get("spec") or {}).get("replicas", 0)
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise ValueError(
            f"cannot unmarshal {type(replicas).__name__} into Go struct field"
            " ScaleSpec.spec.replicas of type int32"
        )
    return replicas
