"""The core/v1 Event a part records about a pod or a node, as kube-scheduler and the kubelet
write them.

The binder records why a pod is pending; the agent records why it refused a pod or what it did to
its model, and what is wrong with its node's GPUs. Both send the same shape, built here so the two
cannot drift apart. Pure: it returns the body; each part's Kubernetes adapter sends it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

MESSAGE_LIMIT = 1024
"""kube-apiserver refuses longer Event messages."""

NODE_EVENT_NAMESPACE = "default"
"""Where the kubelet records a node's Events, and so where `kubectl describe node` finds them."""


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
    involved = {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": namespace, "uid": uid}
    return _event(
        namespace, involved, reason, message, component, instance, action, event_type, now
    )


def node_event(
    name: str,
    *,
    reason: str,
    message: str,
    component: str,
    instance: str,
    action: str,
    event_type: str = "Warning",
    now: datetime | None = None,
) -> dict[str, Any]:
    """The body to POST to `/api/v1/namespaces/default/events` about node `name` (the kubelet
    names a node's uid by the node's name, so `kubectl describe node` shows it)."""
    involved = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": name}
    return _event(
        NODE_EVENT_NAMESPACE,
        involved,
        reason,
        message,
        component,
        instance,
        action,
        event_type,
        now,
    )


def _event(
    namespace: str,
    involved: dict[str, str],
    reason: str,
    message: str,
    component: str,
    instance: str,
    action: str,
    event_type: str,
    now: datetime | None,
) -> dict[str, Any]:
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
        "involvedObject": involved,
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
