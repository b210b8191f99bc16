"""The ReplicaSet controller's arithmetic: how many pods to create, which to delete, the status.

`plan` is kube-controller-manager's `syncReplicaSet` as a function: the ReplicaSet's active pods
(owned by it, not finished, not being deleted) against `spec.replicas`; the missing ones are
created (at most 500 per sync, upstream's burst), the surplus deleted in upstream's order of
preference (unscheduled before scheduled, Pending before Unknown before Running, not Ready before
Ready, lower `controller.kubernetes.io/pod-deletion-cost` first, Ready more recently first, more
restarts first, newer first). The status counts active pods only, so a terminating pod is neither
a replica nor ready nor available; available means Ready for `minReadySeconds`. Pure; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.controllers.podtemplate import (
    controller_uid,
    is_active,
    is_available,
    owner_reference,
    ready_since,
    rfc3339,
)

JsonObject = dict[str, Any]

BURST_REPLICAS = 500
"""Upstream's burstReplicas: the most pods one sync creates or deletes."""
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
FAILURE = "ReplicaFailure"
_PHASE_RANK = {"Pending": 0, "Unknown": 1, "Running": 2}


@dataclass(frozen=True)
class ReplicaSetPlan:
    create: int
    """Pods to create from the template."""
    delete: tuple[str, ...]
    """Names of the pods to delete, in upstream's order of preference."""
    status: JsonObject
    """The status the ReplicaSet should have (written only when it differs)."""
    recheck_at: float | None
    """When a Ready pod becomes available (minReadySeconds), to sync again then."""


def owned_pods(rs: JsonObject, pods: list[JsonObject]) -> list[JsonObject]:
    uid = rs["metadata"]["uid"]
    return [p for p in pods if controller_uid(p) == uid]


def pod_from_template(rs: JsonObject) -> JsonObject:
    """The pod the ReplicaSet creates: its template, named `<rs>-<random>`, owned by it."""
    template = rs["spec"].get("template") or {}
    metadata = template.get("metadata") or {}
    meta: JsonObject = {
        "generateName": f"{rs['metadata']['name']}-",
        "namespace": rs["metadata"]["namespace"],
        "ownerReferences": [owner_reference(rs)],
    }
    for key in ("labels", "annotations", "finalizers"):
        if metadata.get(key):
            meta[key] = dict(metadata[key]) if key != "finalizers" else list(metadata[key])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template.get("spec")}


def _deletion_cost(pod: JsonObject) -> int:
    try:
        return int(((pod["metadata"].get("annotations") or {}).get(DELETION_COST)) or 0)
    except ValueError:
        return 0


def _restarts(pod: JsonObject) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return sum(int(s.get("restartCount") or 0) for s in statuses)


def _deletion_rank(pod: JsonObject) -> tuple[int, int, int, int, float, int, str]:
    """Smaller goes first (upstream's ActivePodsWithRanks, without the doubled-up-on-a-node rank
    and the logarithmic bucketing of ready times)."""
    since = ready_since(pod)
    created = str(pod["metadata"].get("creationTimestamp") or "")
    return (
        1 if (pod.get("spec") or {}).get("nodeName") else 0,
        _PHASE_RANK.get(str((pod.get("status") or {}).get("phase")), 0),
        0 if since is None else 1,
        _deletion_cost(pod),
        -(since or 0.0),
        -_restarts(pod),
        # Newer first: the inverse of the timestamp's order, kept a string.
        "".join(chr(0x10FFFF - ord(c)) for c in created),
    )


def _set_failure(conditions: list[JsonObject], failure: str | None, now: float) -> list[JsonObject]:
    kept = [c for c in conditions if c.get("type") != FAILURE]
    if failure is None:
        return kept
    old = next((c for c in conditions if c.get("type") == FAILURE), None)
    stamp = old.get("lastTransitionTime") if old and old.get("status") == "True" else rfc3339(now)
    return [
        *kept,
        {
            "type": FAILURE,
            "status": "True",
            "reason": "FailedCreate",
            "message": failure,
            "lastTransitionTime": stamp,
        },
    ]


def status_of(
    rs: JsonObject, active: list[JsonObject], now: float, failure: str | None = None
) -> JsonObject:
    min_ready = int(rs["spec"].get("minReadySeconds") or 0)
    template_labels = ((rs["spec"].get("template") or {}).get("metadata") or {}).get("labels") or {}
    old: JsonObject = rs.get("status") or {}
    status: JsonObject = {
        "replicas": len(active),
        "fullyLabeledReplicas": sum(
            1
            for p in active
            if template_labels.items() <= (p["metadata"].get("labels") or {}).items()
        ),
        "readyReplicas": sum(1 for p in active if ready_since(p) is not None),
        "availableReplicas": sum(1 for p in active if is_available(p, min_ready, now)),
        "observedGeneration": int(rs["metadata"].get("generation") or 0),
    }
    conditions = _set_failure(list(old.get("conditions") or []), failure, now)
    if conditions:
        status["conditions"] = conditions
    return status


def plan(
    rs: JsonObject, pods: list[JsonObject], now: float, failure: str | None = None
) -> ReplicaSetPlan:
    """One sync of the ReplicaSet over the pods of its namespace (its own are picked out);
    `failure`: why the last pod creation failed, for the ReplicaFailure condition."""
    active = [p for p in owned_pods(rs, pods) if is_active(p)]
    desired = int(rs["spec"].get("replicas") or 0)
    diff = len(active) - desired
    create, delete = 0, ()
    if not rs["metadata"].get("deletionTimestamp"):
        if diff < 0:
            create = min(-diff, BURST_REPLICAS)
        elif diff > 0:
            ranked = sorted(active, key=_deletion_rank)
            delete = tuple(p["metadata"]["name"] for p in ranked[: min(diff, BURST_REPLICAS)])
    min_ready = int(rs["spec"].get("minReadySeconds") or 0)
    waiting = [
        since + min_ready
        for p in active
        if (since := ready_since(p)) is not None and not is_available(p, min_ready, now)
    ]
    return ReplicaSetPlan(
        create=create,
        delete=delete,
        status=status_of(rs, active, now, failure),
        recheck_at=min(waiting) if waiting else None,
    )
