"""The Deployment controller's arithmetic: which ReplicaSets to create, scale and delete, and the
Deployment's status and conditions.

`sync` is kube-controller-manager's `syncDeployment` as a function of the Deployment, the
ReplicaSets it owns, their pods and the time, returning one step of writes (`Rollout`):

- **the new ReplicaSet** is the one whose template equals the Deployment's but for the
  `pod-template-hash` label; when there is none it is created as `<deployment>-<hash>`, its
  template and selector carrying the hash, with the next revision (`deployment.kubernetes.io/
  revision`: one more than the old ReplicaSets' highest) and the Deployment's annotations;
- **RollingUpdate**: maxSurge rounds up and maxUnavailable rounds down against `spec.replicas`
  (both 0 after rounding: maxUnavailable 1); the new ReplicaSet grows while the total of
  `spec.replicas` stays within replicas + maxSurge; old ReplicaSets shrink, oldest first, their
  unhealthy replicas first, while the available pods (ReplicaSets' `availableReplicas`, which
  count neither terminating pods nor pods Ready for less than minReadySeconds) stay at least
  replicas - maxUnavailable;
- **Recreate**: every old ReplicaSet is scaled to 0, and the new one is created and scaled up
  only once no old pod is left, terminating ones included;
- **status**: replicas, updatedReplicas, readyReplicas, availableReplicas, unavailableReplicas
  from the ReplicaSets; the Available condition; the Progressing condition (NewReplicaSetCreated,
  ReplicaSetUpdated on any progress, NewReplicaSetAvailable once complete, ProgressDeadlineExceeded
  when no progress was seen for progressDeadlineSeconds); a ReplicaSet's ReplicaFailure copied;
- **history**: old ReplicaSets scaled to 0 beyond revisionHistoryLimit are deleted, oldest
  revision first.

Left out, as docs/sim.md says: proportional scaling of a Deployment resized mid-rollout (the new
ReplicaSet takes the change, old ones shrink as in a rollout), `paused` (a paused Deployment's
status is kept, nothing is rolled or scaled), rollback annotations, adoption of orphaned
ReplicaSets. Pure; no I/O.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from sim.controllers.podtemplate import (
    HASH_LABEL,
    equal_ignoring_hash,
    owner_reference,
    parse_time,
    rfc3339,
    scaled_value,
    template_hash,
)

JsonObject = dict[str, Any]

REVISION = "deployment.kubernetes.io/revision"
DESIRED_REPLICAS = "deployment.kubernetes.io/desired-replicas"
MAX_REPLICAS = "deployment.kubernetes.io/max-replicas"
_NOT_COPIED = frozenset(
    {
        "kubectl.kubernetes.io/last-applied-configuration",
        REVISION,
        "deployment.kubernetes.io/revision-history",
        DESIRED_REPLICAS,
        MAX_REPLICAS,
        "deprecated.deployment.rollback.to",
    }
)
PROGRESSING = "Progressing"
AVAILABLE = "Available"
REPLICA_FAILURE = "ReplicaFailure"
NEW_RS_CREATED = "NewReplicaSetCreated"
RS_UPDATED = "ReplicaSetUpdated"
NEW_RS_AVAILABLE = "NewReplicaSetAvailable"
TIMED_OUT = "ProgressDeadlineExceeded"


@dataclass
class Rollout:
    """The writes of one sync, in the order the controller makes them."""

    create: JsonObject | None = None
    """A new ReplicaSet to create."""
    updates: dict[str, JsonObject] = field(default_factory=dict)
    """ReplicaSets to write back (by name), as they must be: replicas, annotations."""
    delete: list[str] = field(default_factory=list)
    """Old ReplicaSets beyond the revision history limit."""
    annotations: dict[str, str] | None = None
    """The Deployment's annotations, when its revision changes."""
    status: JsonObject | None = None
    """The Deployment's status, when it changes."""
    recheck_at: float | None = None
    """When to sync again without an event: the progress deadline."""


# spec arithmetic


def replicas_of(obj: JsonObject) -> int:
    return int((obj.get("spec") or {}).get("replicas") or 0)


def _status_int(obj: JsonObject, key: str) -> int:
    return int((obj.get("status") or {}).get(key) or 0)


def _rolling(d: JsonObject) -> JsonObject | None:
    strategy = d["spec"].get("strategy") or {}
    if strategy.get("type", "RollingUpdate") != "RollingUpdate":
        return None
    return dict(strategy.get("rollingUpdate") or {"maxSurge": "25%", "maxUnavailable": "25%"})


def fenceposts(d: JsonObject) -> tuple[int, int]:
    """(maxSurge, maxUnavailable) as pod counts: surge rounds up, unavailable down; if both
    come to 0, unavailable is 1 (a rollout must be able to move)."""
    rolling = _rolling(d)
    if rolling is None:
        return 0, 0
    desired = replicas_of(d)
    surge = scaled_value(rolling.get("maxSurge", "25%"), desired, round_up=True)
    unavailable = scaled_value(rolling.get("maxUnavailable", "25%"), desired, round_up=False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


def max_surge(d: JsonObject) -> int:
    return fenceposts(d)[0]


def max_unavailable(d: JsonObject) -> int:
    if _rolling(d) is None or replicas_of(d) == 0:
        return 0
    return min(fenceposts(d)[1], replicas_of(d))


def new_rs_replicas(d: JsonObject, all_rss: list[JsonObject], new_rs: JsonObject | None) -> int:
    """How big the new ReplicaSet may be now (upstream's NewRSNewReplicas)."""
    current_new = replicas_of(new_rs) if new_rs is not None else 0
    rolling = _rolling(d)
    if rolling is None:
        return replicas_of(d)
    surge = scaled_value(rolling.get("maxSurge", "25%"), replicas_of(d), round_up=True)
    current = sum(replicas_of(rs) for rs in all_rss)
    most = replicas_of(d) + surge
    if current >= most:
        return current_new
    return current_new + min(most - current, replicas_of(d) - current_new)


def revision_of(rs: JsonObject) -> int:
    try:
        return int((rs["metadata"].get("annotations") or {}).get(REVISION) or 0)
    except ValueError:
        return 0


def _by_age(rss: list[JsonObject]) -> list[JsonObject]:
    return sorted(
        rss,
        key=lambda rs: (str(rs["metadata"].get("creationTimestamp") or ""), rs["metadata"]["name"]),
    )


def find_new(d: JsonObject, rss: list[JsonObject]) -> tuple[JsonObject | None, list[JsonObject]]:
    """The new ReplicaSet (the oldest whose template is the Deployment's but for the hash) and
    the old ones."""
    template = d["spec"].get("template") or {}
    ordered = _by_age(rss)
    new = next(
        (rs for rs in ordered if equal_ignoring_hash(rs["spec"]["template"], template)), None
    )
    return new, [rs for rs in ordered if rs is not new]


# the ReplicaSets


def _copied_annotations(d: JsonObject) -> dict[str, str]:
    annotations = d["metadata"].get("annotations") or {}
    return {k: v for k, v in annotations.items() if k not in _NOT_COPIED}


def new_replica_set(d: JsonObject, revision: int, replicas: int) -> JsonObject:
    collision = (d.get("status") or {}).get("collisionCount")
    template = copy.deepcopy(d["spec"]["template"])
    digest = template_hash(template, collision)
    template.setdefault("metadata", {}).setdefault("labels", {})[HASH_LABEL] = digest
    selector = copy.deepcopy(d["spec"]["selector"])
    selector.setdefault("matchLabels", {})[HASH_LABEL] = digest
    annotations = _copied_annotations(d) | {
        REVISION: str(revision),
        DESIRED_REPLICAS: str(replicas_of(d)),
        MAX_REPLICAS: str(replicas_of(d) + max_surge(d)),
    }
    spec: JsonObject = {"replicas": replicas, "selector": selector, "template": template}
    if d["spec"].get("minReadySeconds"):
        spec["minReadySeconds"] = d["spec"]["minReadySeconds"]
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": f"{d['metadata']['name']}-{digest}",
            "namespace": d["metadata"]["namespace"],
            "labels": dict(template["metadata"]["labels"]),
            "annotations": annotations,
            "ownerReferences": [owner_reference(d)],
        },
        "spec": spec,
    }


class _Step:
    """The ReplicaSets as this sync leaves them (copies), and what it wrote."""

    def __init__(self, d: JsonObject, rss: list[JsonObject]) -> None:
        self.d = d
        self.rollout = Rollout()
        self.rss = {rs["metadata"]["name"]: copy.deepcopy(rs) for rs in rss}

    def get(self, rs: JsonObject) -> JsonObject:
        return self.rss[rs["metadata"]["name"]]

    def write(self, rs: JsonObject) -> None:
        self.rollout.updates[rs["metadata"]["name"]] = rs

    def scale(self, rs: JsonObject, replicas: int) -> bool:
        """Scale `rs` (and keep its replica annotations current); whether its size changed."""
        rs = self.get(rs)
        desired, most = str(replicas_of(self.d)), str(replicas_of(self.d) + max_surge(self.d))
        annotations = rs["metadata"].setdefault("annotations", {})
        resized = replicas_of(rs) != replicas
        if (
            resized
            or annotations.get(DESIRED_REPLICAS) != desired
            or (annotations.get(MAX_REPLICAS) != most)
        ):
            rs["spec"]["replicas"] = replicas
            annotations[DESIRED_REPLICAS] = desired
            annotations[MAX_REPLICAS] = most
            self.write(rs)
        return resized


def _reconcile_new(step: _Step, new: JsonObject, all_rss: list[JsonObject]) -> bool:
    desired = replicas_of(step.d)
    if replicas_of(new) == desired:
        return False
    if replicas_of(new) > desired:
        return step.scale(new, desired)
    return step.scale(new, new_rs_replicas(step.d, all_rss, new))


def _reconcile_old(step: _Step, new: JsonObject, olds: list[JsonObject]) -> bool:
    active = [rs for rs in olds if replicas_of(rs) > 0]
    if not active:
        return False
    all_count = sum(replicas_of(rs) for rs in [*olds, new])
    min_available = replicas_of(step.d) - max_unavailable(step.d)
    new_unavailable = replicas_of(new) - _status_int(new, "availableReplicas")
    most_scaled_down = all_count - min_available - new_unavailable
    if most_scaled_down <= 0:
        return False
    # First the old ReplicaSets' unhealthy replicas: removing them costs no availability.
    cleaned = 0
    for rs in _by_age(active):
        if cleaned >= most_scaled_down:
            break
        unhealthy = replicas_of(rs) - _status_int(rs, "availableReplicas")
        if replicas_of(rs) == 0 or unhealthy <= 0:
            continue
        count = min(most_scaled_down - cleaned, unhealthy)
        step.scale(rs, replicas_of(rs) - count)
        cleaned += count
    # Then as many available ones as keep replicas - maxUnavailable available.
    current = [step.get(rs) for rs in active]
    available = sum(_status_int(rs, "availableReplicas") for rs in [*current, new])
    scaled_down = 0
    if available > min_available:
        budget = available - min_available
        for rs in _by_age(current):
            if scaled_down >= budget:
                break
            if replicas_of(rs) == 0:
                continue
            count = min(replicas_of(rs), budget - scaled_down)
            step.scale(rs, replicas_of(rs) - count)
            scaled_down += count
    return cleaned + scaled_down > 0


def _history_to_delete(d: JsonObject, olds: list[JsonObject]) -> list[str]:
    limit = d["spec"].get("revisionHistoryLimit")
    if limit is None:
        return []
    alive = [rs for rs in olds if not rs["metadata"].get("deletionTimestamp")]
    surplus = len(alive) - int(limit)
    if surplus <= 0:
        return []
    names: list[str] = []
    for rs in sorted(alive, key=lambda r: (revision_of(r), r["metadata"].get("creationTimestamp"))):
        if len(names) >= surplus:
            break
        if (
            replicas_of(rs) != 0
            or _status_int(rs, "replicas") != 0
            or int(rs["metadata"].get("generation") or 0) > _status_int(rs, "observedGeneration")
        ):
            continue
        names.append(rs["metadata"]["name"])
    return names


# status


def _condition(type_: str, status: str, reason: str, message: str, now: float) -> JsonObject:
    stamp = rfc3339(now)
    return {
        "type": type_,
        "status": status,
        "lastUpdateTime": stamp,
        "lastTransitionTime": stamp,
        "reason": reason,
        "message": message,
    }


def _get(conditions: list[JsonObject], type_: str) -> JsonObject | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def set_condition(conditions: list[JsonObject], new: JsonObject) -> list[JsonObject]:
    """Upstream's SetDeploymentCondition: the same status and reason change nothing; the same
    status keeps its transition time."""
    old = _get(conditions, new["type"])
    if (
        old is not None
        and old.get("status") == new["status"]
        and old.get("reason") == new["reason"]
    ):
        return conditions
    if old is not None and old.get("status") == new["status"]:
        new = dict(new, lastTransitionTime=old.get("lastTransitionTime"))
    return [c for c in conditions if c.get("type") != new["type"]] + [new]


def _remove(conditions: list[JsonObject], type_: str) -> list[JsonObject]:
    return [c for c in conditions if c.get("type") != type_]


def has_progress_deadline(d: JsonObject) -> bool:
    deadline = d["spec"].get("progressDeadlineSeconds")
    return deadline is not None and deadline != 2**31 - 1


def complete(d: JsonObject, status: JsonObject) -> bool:
    desired = replicas_of(d)
    return (
        int(status.get("updatedReplicas") or 0) == desired
        and int(status.get("replicas") or 0) == desired
        and int(status.get("availableReplicas") or 0) == desired
        and int(status.get("observedGeneration") or 0) >= int(d["metadata"].get("generation") or 0)
    )


def _progressing(d: JsonObject, new: JsonObject) -> bool:
    old = d.get("status") or {}

    def get(status: JsonObject, key: str) -> int:
        return int(status.get(key) or 0)

    return (
        get(new, "updatedReplicas") > get(old, "updatedReplicas")
        or get(new, "replicas") - get(new, "updatedReplicas")
        < get(old, "replicas") - get(old, "updatedReplicas")
        or get(new, "readyReplicas") > get(old, "readyReplicas")
        or get(new, "availableReplicas") > get(old, "availableReplicas")
    )


def _timed_out(d: JsonObject, conditions: list[JsonObject], now: float) -> bool:
    if not has_progress_deadline(d):
        return False
    condition = _get(conditions, PROGRESSING)
    if condition is None or condition.get("reason") == NEW_RS_AVAILABLE:
        return False
    if condition.get("reason") == TIMED_OUT:
        return True
    since = parse_time(condition.get("lastUpdateTime"))
    return since is not None and since + int(d["spec"]["progressDeadlineSeconds"]) < now


def calculate_status(
    d: JsonObject, all_rss: list[JsonObject], new: JsonObject | None, now: float
) -> JsonObject:
    available = sum(_status_int(rs, "availableReplicas") for rs in all_rss)
    total = sum(replicas_of(rs) for rs in all_rss)
    old: JsonObject = d.get("status") or {}
    status: JsonObject = {
        "observedGeneration": int(d["metadata"].get("generation") or 0),
        "replicas": sum(_status_int(rs, "replicas") for rs in all_rss),
        "updatedReplicas": _status_int(new, "replicas") if new is not None else 0,
        "readyReplicas": sum(_status_int(rs, "readyReplicas") for rs in all_rss),
        "availableReplicas": available,
        "unavailableReplicas": max(0, total - available),
    }
    if old.get("collisionCount") is not None:
        status["collisionCount"] = old["collisionCount"]
    conditions = list(old.get("conditions") or [])
    if available >= replicas_of(d) - max_unavailable(d):
        minimum = _condition(
            AVAILABLE,
            "True",
            "MinimumReplicasAvailable",
            "Deployment has minimum availability.",
            now,
        )
    else:
        minimum = _condition(
            AVAILABLE,
            "False",
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.",
            now,
        )
    status["conditions"] = set_condition(conditions, minimum)
    return status


def rollout_status(
    d: JsonObject, all_rss: list[JsonObject], new: JsonObject | None, now: float
) -> JsonObject:
    """The status after this sync, with the Progressing condition (upstream's
    syncRolloutStatus)."""
    status = calculate_status(d, all_rss, new, now)
    conditions: list[JsonObject] = status["conditions"]
    if not has_progress_deadline(d):
        conditions = _remove(conditions, PROGRESSING)
    current = _get(list((d.get("status") or {}).get("conditions") or []), PROGRESSING)
    finished = (
        status["replicas"] == status["updatedReplicas"]
        and current is not None
        and current.get("reason") == NEW_RS_AVAILABLE
    )
    name = new["metadata"]["name"] if new is not None else ""
    if has_progress_deadline(d) and not finished:
        if complete(d, status):
            message = (
                f'ReplicaSet "{name}" has successfully progressed.'
                if new is not None
                else f'Deployment "{d["metadata"]["name"]}" has successfully progressed.'
            )
            conditions = set_condition(
                conditions, _condition(PROGRESSING, "True", NEW_RS_AVAILABLE, message, now)
            )
        elif _progressing(d, status):
            message = (
                f'ReplicaSet "{name}" is progressing.'
                if new is not None
                else f'Deployment "{d["metadata"]["name"]}" is progressing.'
            )
            progress = _condition(PROGRESSING, "True", RS_UPDATED, message, now)
            # Any progress moves lastUpdateTime, even with the same reason (the deadline counts
            # from the last progress); a True condition keeps its transition time.
            if current is not None and current.get("status") == "True":
                progress["lastTransitionTime"] = current.get("lastTransitionTime")
            conditions = [*_remove(conditions, PROGRESSING), progress]
        elif _timed_out(d, conditions, now):
            message = (
                f'ReplicaSet "{name}" has timed out progressing.'
                if new is not None
                else f'Deployment "{d["metadata"]["name"]}" has timed out progressing.'
            )
            conditions = set_condition(
                conditions, _condition(PROGRESSING, "False", TIMED_OUT, message, now)
            )
    failure = _replica_failure(all_rss, new)
    if failure is not None:
        conditions = set_condition(
            conditions,
            _condition(
                REPLICA_FAILURE,
                "True",
                str(failure.get("reason")),
                str(failure.get("message")),
                now,
            ),
        )
    else:
        conditions = _remove(conditions, REPLICA_FAILURE)
    status["conditions"] = conditions
    return status


def _replica_failure(all_rss: list[JsonObject], new: JsonObject | None) -> JsonObject | None:
    ordered = ([new] if new is not None else []) + [rs for rs in all_rss if rs is not new]
    for rs in ordered:
        found = _get(list((rs.get("status") or {}).get("conditions") or []), REPLICA_FAILURE)
        if found is not None and found.get("status") == "True":
            return found
    return None


def _recheck(d: JsonObject, status: JsonObject) -> float | None:
    """When the progress deadline would pass if nothing happens (upstream's
    requeueStuckDeployment, one second late)."""
    condition = _get(list(status.get("conditions") or []), PROGRESSING)
    if not has_progress_deadline(d) or condition is None or complete(d, status):
        return None
    if condition.get("reason") in (TIMED_OUT, NEW_RS_AVAILABLE):
        return None
    since = parse_time(condition.get("lastUpdateTime"))
    if since is None:
        return None
    return since + int(d["spec"]["progressDeadlineSeconds"]) + 1


def _finish(step: _Step, new: JsonObject | None, olds: list[JsonObject], now: float) -> Rollout:
    current_olds = [step.get(rs) for rs in olds]
    current_new = step.get(new) if new is not None and new["metadata"]["name"] in step.rss else new
    all_rss = current_olds + ([current_new] if current_new is not None else [])
    status = rollout_status(step.d, all_rss, current_new, now)
    if status != (step.d.get("status") or {}):
        step.rollout.status = status
    step.rollout.recheck_at = _recheck(step.d, status)
    return step.rollout


def _sync_revision(step: _Step, new: JsonObject, olds: list[JsonObject]) -> None:
    """The new ReplicaSet's revision (one more than the old ones' highest), its copy of the
    Deployment's annotations and minReadySeconds; the Deployment's own revision annotation."""
    revision = max([revision_of(rs) for rs in olds], default=0) + 1
    rs = step.get(new)
    annotations = rs["metadata"].setdefault("annotations", {})
    wanted = dict(annotations) | _copied_annotations(step.d)
    if revision_of(rs) < revision:
        wanted[REVISION] = str(revision)
    changed = wanted != annotations
    rs["metadata"]["annotations"] = wanted
    min_ready = step.d["spec"].get("minReadySeconds") or 0
    if (rs["spec"].get("minReadySeconds") or 0) != min_ready:
        rs["spec"]["minReadySeconds"] = min_ready
        changed = True
    if changed:
        step.write(rs)
    _set_deployment_revision(step, wanted[REVISION])


def _set_deployment_revision(step: _Step, revision: str) -> None:
    annotations = dict(step.d["metadata"].get("annotations") or {})
    if annotations.get(REVISION) != revision:
        step.rollout.annotations = annotations | {REVISION: revision}


def _create_new(step: _Step, olds: list[JsonObject], now: float) -> Rollout:
    revision = max([revision_of(rs) for rs in olds], default=0) + 1
    replicas = new_rs_replicas(step.d, olds, None)
    created = new_replica_set(step.d, revision, replicas)
    step.rollout.create = created
    _set_deployment_revision(step, str(revision))
    status = calculate_status(step.d, olds, None, now)
    if has_progress_deadline(step.d):
        message = f'Created new replica set "{created["metadata"]["name"]}"'
        status["conditions"] = set_condition(
            status["conditions"], _condition(PROGRESSING, "True", NEW_RS_CREATED, message, now)
        )
    status["updatedReplicas"] = 0
    step.rollout.status = status
    step.rollout.recheck_at = _recheck(step.d, status)
    return step.rollout


def _old_pods_running(olds: list[JsonObject], pods_by_rs: dict[str, list[JsonObject]]) -> bool:
    """Recreate waits until no old pod is left that is not finished, terminating ones included."""
    if sum(_status_int(rs, "replicas") for rs in olds) > 0:
        return True
    for rs in olds:
        for pod in pods_by_rs.get(rs["metadata"]["uid"], []):
            if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                return True
    return False


def sync(
    d: JsonObject,
    rss: list[JsonObject],
    pods_by_rs: dict[str, list[JsonObject]],
    now: float,
) -> Rollout:
    """One sync of Deployment `d` over the ReplicaSets it owns (`rss`) and their pods (by the
    ReplicaSet's uid); see the module docstring."""
    step = _Step(d, rss)
    new, olds = find_new(d, rss)
    if d["metadata"].get("deletionTimestamp") or d["spec"].get("paused"):
        return _finish(step, new, olds, now)
    if _rolling(d) is None:
        scaled_down = False
        for rs in olds:
            if replicas_of(rs) > 0:
                step.scale(rs, 0)
                scaled_down = True
        if scaled_down or _old_pods_running(olds, pods_by_rs):
            return _finish(step, new, olds, now)
        if new is None:
            return _create_new(step, olds, now)
        _sync_revision(step, new, olds)
        step.scale(new, replicas_of(d))
    else:
        if new is None:
            return _create_new(step, olds, now)
        _sync_revision(step, new, olds)
        if _reconcile_new(step, step.get(new), [step.get(rs) for rs in [*olds, new]]):
            return _finish(step, new, olds, now)
        if _reconcile_old(step, step.get(new), [step.get(rs) for rs in olds]):
            return _finish(step, new, olds, now)
    if complete(d, d.get("status") or {}):
        step.rollout.delete = _history_to_delete(d, olds)
    return _finish(step, new, olds, now)
