"""The object store: current objects, the one resourceVersion counter, event history, watchers.

Like etcd behind kube-apiserver, every write takes the next resourceVersion from a single
cluster-wide counter and appends one event (ADDED, MODIFIED, DELETED) to a bounded history that
watches replay; a watch or exact list older than the history is told it expired (410). Pods are
indexed by namespace and by `spec.nodeName`, so a node-scoped list does not scan every pod.
Observers (the server's own controllers, such as the disruption controller) see each event after
the watchers.

Stored objects are immutable once committed: readers share them without copying and take their
JSON from a per-version cache, and writers build a new dict for each version (`Stored.copy()`).
Watch streams register a `Watcher` inbox; each write is offered to the unindexed watchers of its
kind and to the pod watchers of the node(s) it concerns. The store validates nothing and knows
no verb semantics (that is `sim.apiserver.rest`). It is used from one event loop only; no I/O.
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import json
import secrets
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from sim.apiserver.errors import expired
from sim.apiserver.resources import PODS, STORED, Resource

JsonObject = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped kinds

ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"


@functools.cache
def _head(kind: str, api_version: str) -> bytes:
    return json.dumps({"kind": kind, "apiVersion": api_version}, separators=(",", ":")).encode()


class Stored:
    """One committed version of an object, with its JSON rendered at most once."""

    __slots__ = ("_body", "obj", "rv")

    def __init__(self, obj: JsonObject, rv: int) -> None:
        self.obj = obj
        self.rv = rv
        self._body: bytes | None = None

    @property
    def namespace(self) -> str:
        return str(self.obj["metadata"].get("namespace", ""))

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    def body(self) -> bytes:
        """The object's JSON without kind/apiVersion, as list items are served."""
        if self._body is None:
            self._body = json.dumps(
                {k: v for k, v in self.obj.items() if k not in ("kind", "apiVersion")},
                separators=(",", ":"),
            ).encode()
        return self._body

    def full(self) -> bytes:
        """The whole object's JSON, kind and apiVersion first."""
        head = _head(str(self.obj.get("kind")), str(self.obj.get("apiVersion")))
        body = self.body()
        return head[:-1] + b"," + body[1:] if len(body) > 2 else head

    def copy(self) -> JsonObject:
        """A deep, mutable copy (a JSON round trip is faster than copy.deepcopy)."""
        result: JsonObject = json.loads(self.full())
        return result


class Event:
    """One history entry: what happened to which object at which resourceVersion."""

    __slots__ = ("prev", "resource", "rv", "stored", "type")

    def __init__(self, type_: str, resource: Resource, stored: Stored, prev: Stored | None) -> None:
        self.type = type_
        self.resource = resource
        self.rv = stored.rv
        self.stored = stored
        self.prev = prev


TRIGGER_FIELDS = {PODS.group_resource: "spec.nodeName"}
"""The field whose equality selector indexes a kind's watchers (upstream: pods by node)."""


def trigger_value(resource: Resource, stored: Stored) -> str:
    if resource is PODS:
        return str(stored.obj.get("spec", {}).get("nodeName") or "")
    return ""


class Watcher:
    """One watch's inbox: events offered by the store, and the wake-up its stream waits on.

    The inbox is bounded. A watcher that falls `capacity` events behind stops being offered
    events and is marked `behind`: its stream then reads the history ring from its last position
    instead (and gets 410 Expired if the history no longer reaches back that far).
    """

    __slots__ = ("behind", "capacity", "concerns", "queue", "resource", "trigger", "wake")

    def __init__(
        self,
        resource: Resource,
        trigger: str | None,
        capacity: int,
        concerns: Callable[[Event], bool] | None = None,
    ) -> None:
        self.resource = resource
        self.trigger = trigger
        self.capacity = capacity
        self.concerns = concerns
        self.queue: deque[Event] = deque()
        self.wake = asyncio.Event()
        self.behind = False

    def offer(self, event: Event) -> None:
        # Filtering here, in the write, spares waking the stream of every watch an event does
        # not concern (thousands of label-selected watches would each wake for every write).
        if self.behind or (self.concerns is not None and not self.concerns(event)):
            return
        if len(self.queue) >= self.capacity:
            self.queue.clear()
            self.behind = True
        else:
            self.queue.append(event)
        self.wake.set()


class Store:
    """All objects of all stored kinds, their history and the watchers' wake-up signal."""

    def __init__(self, history_size: int = 10_000) -> None:
        if history_size < 1:
            raise ValueError(f"history_size must be at least 1, got {history_size}")
        self.rv = 0
        self.history_size = history_size
        self.service_cursor = secrets.randbelow(1 << 16)
        """Where in the service range this cluster looks for its next Service's cluster IP
        (`sim.apiserver.services`): at random, then onward, so that clusters of one machine
        draw apart."""
        self._ring: list[Event | None] = [None] * history_size
        self._first_event_rv = 1
        # Keyed by group_resource: a custom resource's bucket appears with its first write.
        self._objects: dict[str, dict[str, dict[str, Stored]]] = {
            r.group_resource: {} for r in STORED
        }
        self._sorted: dict[tuple[str, str], list[str]] = {}
        self._pods_by_node: dict[str, dict[Key, Stored]] = {}
        self._unindexed: dict[str, set[Watcher]] = {r.group_resource: set() for r in STORED}
        self._by_trigger: dict[str, dict[str, set[Watcher]]] = {
            r.group_resource: {} for r in STORED
        }
        self._observers: list[Callable[[Event], None]] = []
        self.closed = False

    # reads

    def _bucket(self, resource: Resource) -> dict[str, dict[str, Stored]]:
        return self._objects.setdefault(resource.group_resource, {})

    def get(self, resource: Resource, namespace: str, name: str) -> Stored | None:
        return self._objects.get(resource.group_resource, {}).get(namespace, {}).get(name)

    def count(self, resource: Resource) -> int:
        return sum(len(names) for names in self._objects.get(resource.group_resource, {}).values())

    def namespaces_of(self, resource: Resource) -> Iterable[str]:
        return self._objects.get(resource.group_resource, {}).keys()

    def objects(
        self, resource: Resource, namespace: str | None, after: Key | None = None
    ) -> Iterator[Stored]:
        """Objects sorted by namespace then name (etcd's key order), those after `after` only."""
        spaces = self._objects.get(resource.group_resource, {})
        chosen = [namespace] if namespace is not None else sorted(spaces)
        for space in chosen:
            if after is not None and space < after[0]:
                continue
            names = spaces.get(space)
            if not names:
                continue
            order = self._sorted.get((resource.group_resource, space))
            if order is None:
                order = sorted(names)
                self._sorted[(resource.group_resource, space)] = order
            start = bisect.bisect_right(order, after[1]) if after and space == after[0] else 0
            for name in order[start:]:
                yield names[name]

    def pods_on_node(
        self, node_name: str, namespace: str | None, after: Key | None = None
    ) -> list[Stored]:
        pods = self._pods_by_node.get(node_name, {})
        keys = sorted(
            k
            for k in pods
            if (namespace is None or k[0] == namespace) and (after is None or k > after)
        )
        return [pods[k] for k in keys]

    # writes

    def insert(self, resource: Resource, obj: JsonObject) -> Stored:
        stored = self._commit(resource, obj)
        names = self._bucket(resource).setdefault(stored.namespace, {})
        names[stored.name] = stored
        self._sorted.pop((resource.group_resource, stored.namespace), None)
        self._index(resource, None, stored)
        self._record(Event(ADDED, resource, stored, None))
        return stored

    def replace(self, resource: Resource, obj: JsonObject) -> Stored:
        stored = self._commit(resource, obj)
        names = self._bucket(resource)[stored.namespace]
        prev = names[stored.name]
        names[stored.name] = stored
        self._index(resource, prev, stored)
        self._record(Event(MODIFIED, resource, stored, prev))
        return stored

    def remove(self, resource: Resource, namespace: str, name: str) -> Stored:
        """Delete the object; the DELETED event (and the result) is its last state at a new rv."""
        names = self._bucket(resource)[namespace]
        prev = names.pop(name)
        if not names:
            del self._bucket(resource)[namespace]
        self._sorted.pop((resource.group_resource, namespace), None)
        last = dict(prev.obj)
        last["metadata"] = dict(prev.obj["metadata"])
        stored = self._commit(resource, last)
        self._index(resource, prev, None)
        self._record(Event(DELETED, resource, stored, prev))
        return stored

    def _commit(self, resource: Resource, obj: JsonObject) -> Stored:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        return Stored(obj, self.rv)

    def _index(self, resource: Resource, old: Stored | None, new: Stored | None) -> None:
        if resource is not PODS:
            return
        if old is not None:
            node = old.obj.get("spec", {}).get("nodeName", "")
            bucket = self._pods_by_node.get(node)
            if bucket is not None:
                bucket.pop((old.namespace, old.name), None)
                if not bucket:
                    del self._pods_by_node[node]
        if new is not None:
            node = new.obj.get("spec", {}).get("nodeName", "")
            self._pods_by_node.setdefault(node, {})[(new.namespace, new.name)] = new

    def _record(self, event: Event) -> None:
        self._ring[event.rv % self.history_size] = event
        key = event.resource.group_resource
        for watcher in self._unindexed.get(key, ()):
            watcher.offer(event)
        triggers = self._by_trigger.get(key)
        if triggers:
            values = {trigger_value(event.resource, event.stored)}
            if event.prev is not None:
                values.add(trigger_value(event.resource, event.prev))
            for value in values:
                for watcher in triggers.get(value, ()):
                    watcher.offer(event)
        for observer in self._observers:
            observer(event)

    def observe(self, observer: Callable[[Event], None]) -> None:
        """Call `observer` with every event once it is committed and offered to watchers (the
        server's own controllers; an observer may write, its writes are observed in turn)."""
        self._observers.append(observer)

    # history

    @property
    def oldest_replayable_rv(self) -> int:
        """The smallest resourceVersion a watch may start from and still see every event."""
        return max(self._first_event_rv, self.rv - self.history_size + 1) - 1

    def events_after(self, rv: int, limit: int = 1000) -> list[Event]:
        """Events with resourceVersion > rv, oldest first; 410 Expired if some were dropped."""
        if rv < self.oldest_replayable_rv:
            raise expired(f"too old resource version: {rv} ({self.oldest_replayable_rv})")
        end = min(self.rv, rv + limit)
        events = []
        for version in range(rv + 1, end + 1):
            event = self._ring[version % self.history_size]
            assert event is not None and event.rv == version
            events.append(event)
        return events

    def state_at(self, resource: Resource, namespace: str | None, rv: int) -> list[Stored]:
        """The objects as they were at `rv` (for exact-version lists), by undoing later events."""
        if rv < self.oldest_replayable_rv:
            raise expired(f"too old resource version: {rv} ({self.oldest_replayable_rv})")
        state = {(s.namespace, s.name): s for s in self.objects(resource, namespace)}
        for version in range(self.rv, rv, -1):
            event = self._ring[version % self.history_size]
            assert event is not None
            if event.resource.group_resource != resource.group_resource:
                continue
            key = (event.stored.namespace, event.stored.name)
            if namespace is not None and key[0] != namespace:
                continue
            if event.prev is None:
                state.pop(key, None)
            else:
                state[key] = event.prev
        return [state[k] for k in sorted(state)]

    # watchers

    def add_watcher(
        self,
        resource: Resource,
        trigger: str | None,
        concerns: Callable[[Event], bool] | None = None,
    ) -> Watcher:
        """Register a watcher; with a trigger it is offered only events whose object (before or
        after) has that trigger value (a pod's `spec.nodeName`), as upstream's indexed triggers
        do, so a write does not wake every node's watch."""
        watcher = Watcher(resource, trigger, self.history_size, concerns)
        key = resource.group_resource
        if trigger is None or key not in TRIGGER_FIELDS:
            self._unindexed.setdefault(key, set()).add(watcher)
        else:
            self._by_trigger.setdefault(key, {}).setdefault(trigger, set()).add(watcher)
        return watcher

    def remove_watcher(self, watcher: Watcher) -> None:
        key = watcher.resource.group_resource
        self._unindexed.get(key, set()).discard(watcher)
        if watcher.trigger is not None:
            triggers = self._by_trigger.get(key, {})
            bucket = triggers.get(watcher.trigger)
            if bucket is not None:
                bucket.discard(watcher)
                if not bucket:
                    del triggers[watcher.trigger]

    @property
    def watcher_count(self) -> int:
        unindexed = sum(len(ws) for ws in self._unindexed.values())
        indexed = sum(len(ws) for t in self._by_trigger.values() for ws in t.values())
        return unindexed + indexed

    def reopen(self) -> None:
        """Accept watches again after `close`, keeping every object and the history (a server
        restarted over the same storage)."""
        self.closed = False

    def close(self) -> None:
        """Wake every watcher so streams end before the server stops."""
        self.closed = True
        for watchers in self._unindexed.values():
            for watcher in watchers:
                watcher.wake.set()
        for triggers in self._by_trigger.values():
            for watchers in triggers.values():
                for watcher in watchers:
                    watcher.wake.set()
