"""The core/v1 Event a part records about a pod, as kube-scheduler and the kubelet write them.

The binder records why a pod is pending; the agent records why it refused a pod or what it did to
its model. Both send the same shape, built here so the two cannot drift apart. Pure: it returns
the body; each part's Kubernetes adapter sends it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

MESSAGE_LIMIT = 1024
"""kube-apiserver refuses longer Event messages."""


def pod_event(
    namespace: str,
    name: str,
    uid: str,
    *,
    reason: str,
    message: str,
    component: str,
    instance: str,
    action: str,
    event_type: str = "Warning",
    now: datetime | None = None,
) -> dict[str, Any]:
    """The body to POST to `/api/v1/namespaces/{namespace}/events`."""
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": name,
            "namespace": namespace,
            "uid": uid,
        },
        "reason": reason,
        "message": message[:MESSAGE_LIMIT],
        "type": event_type,
        "count": 1,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": instance,
        "action": action,
    }
