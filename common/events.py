"""The core/v1 Event a part records about a pod or a node, as kube-scheduler and the kubelet
write them, and the one rule by which a repeat is recorded.

The binder records why a pod is pending; the agent records why it refused a pod or what it did to
its model, and what is wrong with its node's GPUs. Both send the same shape, built here (`event`,
about any object; `EventText`, what one says) so the two cannot drift apart, and both
de-duplicate with `EventAggregator`, kube's own rule (client-go's event correlator): Events about
one object with one reason and message are one Event whose `count` and `lastTimestamp` grow.
Pure: it returns what to write, and what to write next after an answer (`answered`); the one
recorder (common/kubeapi/eventrecorder.py) only sends it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NotRequired, TypedDict, Unpack

MESSAGE_LIMIT = 1024
"""kube-apiserver refuses longer Event messages."""

NODE_EVENT_NAMESPACE = "default"
"""Where the kubelet records a node's Events, and so where `kubectl describe node` finds them."""


class EventText(TypedDict):
    """What an Event says: `reason` (UpperCamelCase), `message`, and `event_type` (Warning,
    the default, or Normal)."""

    reason: str
    message: str
    event_type: NotRequired[str]


class EventFields(EventText):
    """What an Event says and who says it: `component` (source.component and
    reportingComponent), `instance` (reportingInstance), `action`; `now`: its time (the
    clock's when left out)."""

    component: str
    instance: str
    action: str
    now: NotRequired[datetime | None]


def pod_ref(namespace: str, name: str, uid: str) -> dict[str, str]:
    """The involvedObject of an Event about a pod."""
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "namespace": namespace, "uid": uid}


def node_ref(name: str) -> dict[str, str]:
    """The involvedObject of an Event about a node (the kubelet names a node's uid by the
    node's name, so `kubectl describe node` shows it)."""
    return {"apiVersion": "v1", "kind": "Node", "name": name, "uid": name}


def pod_event(namespace: str, name: str, uid: str, **fields: Unpack[EventFields]) -> dict[str, Any]:
    """The body to POST to `/api/v1/namespaces/{namespace}/events`."""
    return event(pod_ref(namespace, name, uid), **fields)


def node_event(name: str, **fields: Unpack[EventFields]) -> dict[str, Any]:
    """The body to POST to `/api/v1/namespaces/default/events` about node `name`."""
    return event(node_ref(name), **fields)


def event(involved: Mapping[str, str], **fields: Unpack[EventFields]) -> dict[str, Any]:
    """The body of an Event about any object (`involved`: apiVersion, kind, name, uid, and
    namespace unless the object has none: then it is recorded in NODE_EVENT_NAMESPACE, as the
    kubelet records a node's)."""
    namespace = involved.get("namespace") or NODE_EVENT_NAMESPACE
    stamp = _stamp(fields.get("now") or datetime.now(UTC))
    component = fields["component"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
        "involvedObject": dict(involved),
        "reason": fields["reason"],
        "message": fields["message"][:MESSAGE_LIMIT],
        "type": fields.get("event_type", "Warning"),
        "count": 1,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": fields["instance"],
        "action": fields["action"],
    }


REMEMBERED = 10_000
"""Events whose repeats are counted; past that all are forgotten, and a repeat starts anew."""


@dataclass(frozen=True)
class EventWrite:
    """What to send: a new Event (`create`: POST `body` to the namespace's events), or a repeat
    (PATCH `body`, its count and last time, onto the Event `name`)."""

    namespace: str
    name: str
    body: dict[str, Any]
    create: bool
    key: tuple[str, ...]
    event: dict[str, Any]
    """The Event recorded, whole (a repeat whose Event is gone creates it from this)."""


@dataclass
class _Seen:
    name: str
    count: int


def event_key(body: dict[str, Any]) -> tuple[str, ...]:
    """What makes two Events one: the object, the reporter, the type, the reason, the message."""
    involved = body["involvedObject"]
    return (
        str(body["metadata"]["namespace"]),
        str(involved.get("kind", "")),
        str(involved.get("name", "")),
        str(involved.get("uid", "")),
        str(involved.get("fieldPath", "")),
        str(body.get("reportingComponent", "")),
        str(body.get("type", "")),
        str(body.get("reason", "")),
        str(body.get("message", "")),
    )


class EventAggregator:
    """Turns each Event a part records into the write that records it: the first of its key is
    created (named `<object>.<hex nanoseconds>`, as client-go names Events, so a repeat can find
    it without reading an answer); a repeat raises its count and last time. How often a thing
    is said is its caller's to bound (a tenant can make the agent refuse in a loop:
    agent/kube/events.py says each refusal once per period). Thread-safe: the binder records from
    worker threads."""

    def __init__(
        self,
        *,
        remembered: int = REMEMBERED,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._remembered = remembered
        self._now = now
        self._seen: dict[tuple[str, ...], _Seen] = {}
        self._lock = threading.Lock()

    def write_for(self, body: dict[str, Any]) -> EventWrite:
        """The write that records `body` (an Event built by `event`)."""
        key = event_key(body)
        namespace = key[0]
        with self._lock:
            seen = self._seen.get(key)
            if seen is None:
                if len(self._seen) >= self._remembered:
                    self._seen.clear()
                name = f"{body['involvedObject']['name']}.{time.time_ns():x}"
                self._seen[key] = _Seen(name, 1)
                metadata = {"name": name, "namespace": namespace}
                created = {**body, "metadata": metadata}
                return EventWrite(namespace, name, created, True, key, body)
            seen.count += 1
            patch = {"count": seen.count, "lastTimestamp": _stamp(self._now())}
            return EventWrite(namespace, seen.name, patch, False, key, body)

    def answered(self, write: EventWrite, *, found: bool) -> EventWrite | None:
        """What to send after `write` was answered (`found`: False when the API server answered
        404): nothing, or, for a repeat whose Event is gone (expired, deleted), the write that
        records it anew. Each part's adapter sends `write_for`'s write, then these, until None;
        after a failed send it calls `failed`."""
        if found:
            return None
        self.lost(write)
        return None if write.create else self.write_for(write.event)

    def lost(self, write: EventWrite) -> None:
        """The Event of `write` is gone (expired, deleted): its next repeat creates it anew."""
        with self._lock:
            seen = self._seen.get(write.key)
            if seen is not None and seen.name == write.name:
                del self._seen[write.key]

    def failed(self, write: EventWrite) -> None:
        """A create failed: forget it, so the next one tries again (after a failed patch the
        next repeat writes the count)."""
        if write.create:
            self.lost(write)


def _stamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")
