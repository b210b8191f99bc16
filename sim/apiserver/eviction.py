"""The pod eviction subresource: a delete that respects PodDisruptionBudgets, as kubectl drain uses.

`POST pods/{name}/eviction` with a policy/v1 Eviction follows kube-apiserver's EvictionREST:

- the Eviction's name must be the pod's (400 otherwise); a missing pod is 404;
- a pod that is Pending, Succeeded, Failed or already terminating is deleted without looking at
  budgets;
- a pod selected by more than one budget gets 500 (upstream does not support it);
- a pod that is not Ready is deleted without spending the budget when the budget's
  unhealthyPodEvictionPolicy is AlwaysAllow, or (IfHealthyBudget, the default) when the budget
  is met (currentHealthy >= desiredHealthy > 0);
- otherwise the budget must allow a disruption: if its status has not caught up with its spec
  (observedGeneration < generation) the answer is 429 with Retry-After 10; if disruptionsAllowed
  is 0 it is 429 TooManyRequests "Cannot evict pod as it would violate the pod's disruption
  budget." with a DisruptionBudget cause; else the budget's status is decremented and names the
  pod in disruptedPods, so the pod counts against it until it is gone.

An evicted pod gets the DisruptionTarget condition and is deleted gracefully, as the pod delete
verb does (deletionTimestamp, its grace period; the Eviction's deleteOptions apply). The answer is
a Status, built by the caller from what `evict` returns. No I/O.
"""

from __future__ import annotations

from typing import Any

from sim.apiserver import disruption
from sim.apiserver.clock import Clock, rfc3339
from sim.apiserver.errors import ApiError, bad_request, not_found
from sim.apiserver.resources import POD_DISRUPTION_BUDGETS, PODS
from sim.apiserver.rest import DeleteOptions, Registry, check_preconditions
from sim.apiserver.store import Stored

JsonObject = dict[str, Any]

VIOLATES = "Cannot evict pod as it would violate the pod's disruption budget."
MULTIPLE_BUDGETS = (
    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not"
    " support."
)
_API_VERSIONS = (None, "", "policy/v1", "policy/v1beta1")


def _too_many_requests(message: str, cause: str, retry_after: int) -> ApiError:
    details: JsonObject = {"causes": [{"reason": "DisruptionBudget", "message": cause}]}
    if retry_after:
        details = {"retryAfterSeconds": retry_after, **details}
    return ApiError(429, "TooManyRequests", message, details)


def _still_processing(budget: str) -> ApiError:
    return _too_many_requests(
        VIOLATES, f"The disruption budget {budget} is still being processed by the server.", 10
    )


def _forbidden(budget: str, why: str) -> ApiError:
    return ApiError(
        403,
        "Forbidden",
        f'poddisruptionbudget.policy "{budget}" is forbidden: {why}',
        {"name": budget, "group": "policy", "kind": "poddisruptionbudget"},
    )


def _delete_options(body: JsonObject) -> DeleteOptions:
    options = body.get("deleteOptions") or {}
    if not isinstance(options, dict):
        raise bad_request("Eviction deleteOptions must be an object")
    if options.get("dryRun"):
        raise bad_request(
            "dryRun is not implemented by the simulated API server: the eviction was not"
            " applied; send it without deleteOptions.dryRun"
        )
    grace = options.get("gracePeriodSeconds")
    if grace is not None and (isinstance(grace, bool) or not isinstance(grace, int)):
        raise bad_request(
            f"Eviction deleteOptions.gracePeriodSeconds must be an integer, got {grace!r}"
        )
    preconditions = options.get("preconditions") or {}
    if not isinstance(preconditions, dict):
        raise bad_request("Eviction deleteOptions.preconditions must be an object")
    uid, rv = preconditions.get("uid"), preconditions.get("resourceVersion")
    if not isinstance(uid, str | None) or not isinstance(rv, str | None):
        raise bad_request("Eviction preconditions uid and resourceVersion must be strings")
    return DeleteOptions(grace_period_seconds=grace, uid=uid, resource_version=rv)


def check_body(namespace: str, name: str, body: Any) -> DeleteOptions:
    """The Eviction's delete options, once the body is an Eviction of this pod."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be an Eviction object")
    if (
        body.get("kind") not in (None, "", "Eviction")
        or body.get("apiVersion") not in _API_VERSIONS
    ):
        raise bad_request(
            f"the body is a {body.get('apiVersion')}/{body.get('kind')}; send a policy/v1 Eviction"
        )
    meta = body.get("metadata") or {}
    if not isinstance(meta, dict):
        raise bad_request("Eviction metadata must be an object")
    if meta.get("name") != name:
        raise bad_request("name in URL does not match name in Eviction object")
    if meta.get("namespace") and meta["namespace"] != namespace:
        raise bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    return _delete_options(body)


def _can_ignore_budgets(pod: JsonObject) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Pending", "Succeeded", "Failed") or bool(
        pod["metadata"].get("deletionTimestamp")
    )


def _spend(registry: Registry, clock: Clock, budget: Stored, pod_name: str) -> None:
    """Take one disruption from the budget, naming the pod, or raise 429/403 as upstream."""
    obj = budget.obj
    status: JsonObject = obj.get("status") or {}
    allowed = int(status.get("disruptionsAllowed") or 0)
    if int(status.get("observedGeneration") or 0) < int(obj["metadata"].get("generation") or 0):
        raise _still_processing(budget.name)
    if allowed < 0:
        raise _forbidden(budget.name, "pdb disruptions allowed is negative")
    if len(status.get("disruptedPods") or {}) > disruption.MAX_DISRUPTED_PODS:
        raise _forbidden(
            budget.name,
            "DisruptedPods map too big - too many evictions not confirmed by PDB controller",
        )
    if allowed == 0:
        raise _too_many_requests(
            VIOLATES,
            f"The disruption budget {budget.name} needs {status.get('desiredHealthy', 0)} healthy"
            f" pods and has {status.get('currentHealthy', 0)} currently",
            0,
        )
    updated = budget.copy()
    new_status: JsonObject = updated.setdefault("status", {})
    new_status["disruptionsAllowed"] = allowed - 1
    new_status.setdefault("disruptedPods", {})[pod_name] = rfc3339(clock.now())
    if allowed - 1 == 0:
        updated["status"] = disruption.with_allowed_condition(new_status, clock.now())
    registry.store.replace(POD_DISRUPTION_BUDGETS, updated)


def _mark_and_delete(registry: Registry, clock: Clock, pod: Stored, options: DeleteOptions) -> None:
    """Add the DisruptionTarget condition, then delete the pod as the delete verb does."""
    # The condition is written only for a pod the delete's preconditions allow, as upstream.
    check_preconditions(PODS, pod, options)
    obj = pod.copy()
    conditions = obj.setdefault("status", {}).setdefault("conditions", [])
    target = {
        "type": "DisruptionTarget",
        "status": "True",
        "lastProbeTime": None,
        "lastTransitionTime": rfc3339(clock.now()),
        "reason": "EvictionByEvictionAPI",
        "message": "Eviction API: evicting",
    }
    for index, condition in enumerate(conditions):
        if condition.get("type") == "DisruptionTarget":
            if condition.get("status") == "True":
                target["lastTransitionTime"] = condition.get("lastTransitionTime")
            conditions[index] = target
            break
    else:
        conditions.append(target)
    marked = registry.store.replace(PODS, obj) if obj != pod.obj else pod
    if options.resource_version is not None:
        # We made the write the precondition would trip on: hold the delete to the new version.
        options = DeleteOptions(options.grace_period_seconds, options.uid, str(marked.rv))
    registry.delete(PODS, pod.namespace, pod.name, options)


def evict(
    registry: Registry, clock: Clock, namespace: str, name: str, options: DeleteOptions
) -> str | None:
    """Evict the pod, or raise why not. Returns the message of the 500 Failure Status upstream
    answers with, without a reason, when more than one budget selects the pod; None once the
    pod is evicted."""
    pod = registry.store.get(PODS, namespace, name)
    if pod is None:
        raise not_found(PODS.group_resource, name)
    if _can_ignore_budgets(pod.obj):
        _mark_and_delete(registry, clock, pod, options)
        return None
    budgets = disruption.budgets_for(registry.store, pod.obj)
    if len(budgets) > 1:
        return MULTIPLE_BUDGETS
    if budgets:
        budget = budgets[0]
        status: JsonObject = budget.obj.get("status") or {}
        spec: JsonObject = budget.obj.get("spec") or {}
        unhealthy_free = spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow" or (
            int(status.get("currentHealthy") or 0) >= int(status.get("desiredHealthy") or 0) > 0
        )
        if disruption.is_ready(pod.obj) or not unhealthy_free:
            _spend(registry, clock, budget, name)
        elif options.resource_version is None:
            # The pod must still be the unready one we judged when it is deleted.
            options = DeleteOptions(options.grace_period_seconds, options.uid, str(pod.rv))
    current = registry.store.get(PODS, namespace, name)
    assert current is not None  # spending a budget does not remove pods
    _mark_and_delete(registry, clock, current, options)
    return None
