"""Writing a pod's status as the kubelet does: read, merge, replace, retried on conflicts.

Owns the merge rules: the kubelet's own conditions (Initialized, ContainersReady, Ready) keep
their lastTransitionTime while their status is unchanged, and conditions others own (PodScheduled,
written by the scheduler) are kept as they are; a pod another writer marked Succeeded or Failed
keeps that phase. It must not decide what the status says; the pod worker (`sim.node.podworker`)
does.
"""

from __future__ import annotations

import json
import logging
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sim.node.containers import now_rfc3339

log = logging.getLogger(__name__)

KUBELET_CONDITIONS = frozenset({"Initialized", "ContainersReady", "Ready"})
TERMINAL = frozenset({"Succeeded", "Failed"})
_ATTEMPTS = 10


def write_status(
    core: client.CoreV1Api, namespace: str, name: str, uid: str, status: dict[str, Any]
) -> dict[str, Any] | None:
    """Replace the pod's status with `status` merged into what the API holds; the pod as written,
    or None if the pod is gone (or replaced by one with another uid) or kept conflicting."""
    for _ in range(_ATTEMPTS):
        try:
            response = core.read_namespaced_pod(name, namespace, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        current: dict[str, Any] = json.loads(cast(Any, response).data)
        if current["metadata"].get("uid") != uid:
            return None
        if current.get("status", {}).get("phase") in TERMINAL and status["phase"] not in TERMINAL:
            # As the kubelet's status manager: a pod never leaves a terminal phase that another
            # writer (an eviction, a node agent) gave it while this status was being made.
            return current
        old = {c["type"]: c for c in current.get("status", {}).get("conditions", [])}
        stamp = now_rfc3339()
        conditions = []
        for condition in status["conditions"]:
            previous = old.get(condition["type"], {})
            unchanged = previous.get("status") == condition["status"]
            since = previous.get("lastTransitionTime", stamp) if unchanged else stamp
            conditions.append({**condition, "lastTransitionTime": since})
        others = [c for kind, c in old.items() if kind not in KUBELET_CONDITIONS]
        current["status"] = {
            **current.get("status", {}),
            **status,
            "conditions": others + conditions,
        }
        try:
            core.replace_namespaced_pod_status(
                name, namespace, cast(Any, current), _preload_content=False
            )
        except ApiException as e:
            if e.status == 409:
                continue
            if e.status == 404:
                return None
            raise
        return current
    log.warning(
        "Pod %s/%s: its status kept conflicting; writing it on the next change.", namespace, name
    )
    return None
