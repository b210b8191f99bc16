"""The simulated kube-controller-manager: the Deployment and ReplicaSet controllers, the Endpoints
and EndpointSlice controllers (`sim.controllers.endpoints`: each Service's, kept from the pods it
selects) and the garbage collector of their objects, as one API client of the simulated API
server; given a node monitor grace, also the node lifecycle controller
(`sim.controllers.nodelifecycle`).

Like the real one it acts only through the API (the official client): it lists and watches
Deployments, ReplicaSets and pods into a cache, syncs one object at a time from a queue, and
writes what `sim.controllers.deployment` and `sim.controllers.replicaset` decide. So the pods it
creates pass admission (tritonshare's webhook completes them), the binder places them and the
kubelets run them as any pod. Its own writes go into its cache at once (a newer resourceVersion
wins), which stands in for upstream's expectations: a sync never acts twice on a cache that has not
seen its last write yet. Timed work (a pod becoming available after minReadySeconds, a progress
deadline) is queued for its time on `clock`, the API server's clock in tests, so a test moves it
forward instead of sleeping (then calls `resync`).

The garbage collector deletes, in the background (as `propagationPolicy: Background`), the
dependents of a deleted owner: any Deployment, ReplicaSet, pod or custom object (every kind a
CustomResourceDefinition serves, watched from the moment the CRD appears) whose ownerReferences
name owners it saw and that the API no longer has (a live read confirms each, as upstream's
collector does). An object with several owners goes only once all of them are gone (its
references to those gone are removed meanwhile); one whose owner it never saw is left alone.

Threads: one list-and-watch per kind and one worker; `stop` ends them all. A write that fails
(conflict, refusal) requeues its object with back-off, from 0.5 s doubling to 30 s.
"""

from __future__ import annotations

import heapq
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sim.apiserver.clock import rfc3339
from sim.controllers import deployment, nodelifecycle, replicaset
from sim.controllers.endpointswriter import EndpointsWriter
from sim.controllers.podtemplate import controller_uid
from sim.watching import watch_events

log = logging.getLogger(__name__)

USER_AGENT = "tritonshare-sim-controller-manager"
JsonObject = dict[str, Any]
Key = tuple[str, str]
DEPLOYMENTS, REPLICA_SETS, PODS = "deployments", "replicasets", "pods"
SERVICES = "services"
ENDPOINTS = "endpoints"
"""The queue's kind for a Service whose Endpoints and EndpointSlices are to be synced."""
CRDS = "customresourcedefinitions"
BACKOFF_INITIAL, BACKOFF_MAX = 0.5, 30.0
TOMBSTONES_KEPT = 10_000


def _json(response: Any) -> Any:
    return json.loads(response.data)


def _key(obj: JsonObject) -> Key:
    return (str(obj["metadata"].get("namespace", "")), str(obj["metadata"]["name"]))


def _rv(obj: JsonObject) -> int:
    return int(obj["metadata"].get("resourceVersion") or 0)


def _owner_uids(obj: JsonObject) -> set[str]:
    return {
        str(ref.get("uid"))
        for ref in obj["metadata"].get("ownerReferences") or []
        if isinstance(ref, dict) and ref.get("uid")
    }


class _Cache:
    """Objects of one kind by (namespace, name), and by their controller's uid. A version older
    than the one held (or than a deletion seen) is ignored, so a slow watch and the worker's own
    writes can arrive in any order."""

    def __init__(self) -> None:
        self.objects: dict[Key, JsonObject] = {}
        self.by_owner: dict[str, set[Key]] = {}
        self.by_any_owner: dict[str, set[Key]] = {}
        """Every ownerReference's uid, controller or not: the garbage collector's index."""
        self._deleted: dict[Key, int] = {}

    def put(self, obj: JsonObject) -> bool:
        key = _key(obj)
        held = self.objects.get(key)
        if (held is not None and _rv(held) >= _rv(obj)) or self._deleted.get(key, -1) >= _rv(obj):
            return False
        if held is not None:
            self._unindex(key, held)
        self.objects[key] = obj
        owner = controller_uid(obj)
        if owner:
            self.by_owner.setdefault(owner, set()).add(key)
        for uid in _owner_uids(obj):
            self.by_any_owner.setdefault(uid, set()).add(key)
        return True

    def remove(self, obj: JsonObject) -> None:
        key = _key(obj)
        held = self.objects.pop(key, None)
        if held is not None:
            self._unindex(key, held)
        self._deleted[key] = max(_rv(obj), self._deleted.get(key, 0))
        if len(self._deleted) > TOMBSTONES_KEPT:
            self._deleted.pop(next(iter(self._deleted)))

    def _unindex(self, key: Key, obj: JsonObject) -> None:
        owner = controller_uid(obj)
        if owner and owner in self.by_owner:
            self.by_owner[owner].discard(key)
            if not self.by_owner[owner]:
                del self.by_owner[owner]
        for uid in _owner_uids(obj):
            keys = self.by_any_owner.get(uid)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self.by_any_owner[uid]

    def replace_all(self, objects: list[JsonObject]) -> None:
        self.objects.clear()
        self.by_owner.clear()
        self.by_any_owner.clear()
        for obj in objects:
            self.put(obj)

    def owned_by(self, uid: str) -> list[JsonObject]:
        return [self.objects[k] for k in sorted(self.by_owner.get(uid, ()))]


class ControllerManager:
    """Start with start(), stop with stop(); or use as a context manager."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        clock: Callable[[], float] = time.time,
        node_monitor_grace: float | None = None,
        node_monitor_period: float = nodelifecycle.PERIOD_SECONDS,
    ) -> None:
        """With `node_monitor_grace` (--node-monitor-grace-period), it also runs the node
        lifecycle controller and its taint eviction (`sim.controllers.nodelifecycle`)."""
        api_client.user_agent = USER_AGENT
        self.node_lifecycle = (
            None
            if node_monitor_grace is None
            else nodelifecycle.NodeLifecycleController(
                api_client, grace=node_monitor_grace, period=node_monitor_period, stamp=clock
            )
        )
        self.apps = cast(Any, client.AppsV1Api(api_client))
        self.core = cast(Any, client.CoreV1Api(api_client))
        self.extensions = cast(Any, client.ApiextensionsV1Api(api_client))
        self.custom = cast(Any, client.CustomObjectsApi(api_client))
        self.clock = clock
        self._endpoints = EndpointsWriter(api_client)
        kinds = (DEPLOYMENTS, REPLICA_SETS, PODS, SERVICES, CRDS)
        self._caches = {kind: _Cache() for kind in kinds}
        self._custom_kinds: dict[str, tuple[str, str, str, bool]] = {}
        """plural.group -> (group, version, plural, namespaced) of each CRD's served kind."""
        self._owners_seen: dict[str, tuple[str, Key]] = {}
        """uid -> (kind, key) of every object seen: the collector's owners."""
        self._owners_gone: dict[str, None] = {}
        """uids of owners seen deleted (the latest TOMBSTONES_KEPT), for dependents whose event
        arrives after their owner's deletion."""
        self._lock = threading.Condition()
        self._queue: list[tuple[float, str, Key]] = []
        self._due: dict[tuple[str, Key], float] = {}
        self._backoff: dict[tuple[str, Key], float] = {}
        self._failures: dict[Key, str] = {}
        self._retrying: set[tuple[str, Key]] = set()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._informer, args=(kind,), name=f"informer-{kind}")
            for kind in kinds
        ] + [threading.Thread(target=self._work, name="controller-manager")]
        self._synced = dict.fromkeys(kinds, False)
        self._started = False

    # lifecycle

    def start(self) -> None:
        with self._lock:
            self._started = True
            threads = list(self._threads)
        for thread in threads:
            thread.start()
        if self.node_lifecycle is not None:
            self.node_lifecycle.start()

    def stop(self) -> None:
        self._stop.set()
        if self.node_lifecycle is not None:
            self.node_lifecycle.stop()
        with self._lock:
            self._lock.notify_all()
            threads = list(self._threads)
        for thread in threads:
            if thread.is_alive():
                thread.join(30)

    def __enter__(self) -> ControllerManager:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_synced(self, timeout: float) -> bool:
        """Wait until every kind has been listed once (the caches hold the cluster)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not all(self._synced.values()):
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return False
                self._lock.wait(left)
        return True

    def synced_kinds(self) -> set[str]:
        """The kinds listed at least once (a CRD's kind named `plural.group`)."""
        with self._lock:
            return {kind for kind, synced in self._synced.items() if synced}

    def resync(self) -> None:
        """Sync every Deployment and ReplicaSet now (after a test moved the clock forward)."""
        with self._lock:
            keys = [(REPLICA_SETS, k) for k in self._caches[REPLICA_SETS].objects] + [
                (DEPLOYMENTS, k) for k in self._caches[DEPLOYMENTS].objects
            ]
        for kind, key in keys:
            self._enqueue(kind, key)

    # the queue

    def _enqueue(self, kind: str, key: Key, delay: float = 0.0) -> None:
        at = time.monotonic() + max(0.0, delay)
        with self._lock:
            if self._due.get((kind, key), float("inf")) <= at:
                return
            self._due[(kind, key)] = at
            heapq.heappush(self._queue, (at, kind, key))
            self._lock.notify_all()

    def _enqueue_at(self, kind: str, key: Key, when: float | None) -> None:
        if when is not None:
            self._enqueue(kind, key, when - self.clock() + 0.05)

    def _retry(self, kind: str, key: Key) -> float:
        """Sync the object again after its back-off, which doubles while it keeps failing."""
        item = (kind, key)
        delay = self._backoff.get(item, BACKOFF_INITIAL)
        self._backoff[item] = min(delay * 2, BACKOFF_MAX)
        self._retrying.add(item)
        self._enqueue(kind, key, delay)
        return delay

    def _next(self) -> tuple[str, Key] | None:
        with self._lock:
            while not self._stop.is_set():
                while (
                    self._queue
                    and self._due.get((self._queue[0][1], self._queue[0][2])) != (self._queue[0][0])
                ):
                    heapq.heappop(self._queue)  # superseded by an earlier entry
                if self._queue and self._queue[0][0] <= time.monotonic():
                    _, kind, key = heapq.heappop(self._queue)
                    del self._due[(kind, key)]
                    return kind, key
                wait = self._queue[0][0] - time.monotonic() if self._queue else None
                self._lock.wait(wait)
        return None

    def _work(self) -> None:
        while (item := self._next()) is not None:
            kind, key = item
            try:
                if kind == DEPLOYMENTS:
                    self._sync_deployment(key)
                elif kind == REPLICA_SETS:
                    self._sync_replica_set(key)
                elif kind == ENDPOINTS:
                    self._sync_endpoints(key)
                else:
                    self._collect(kind.removeprefix("gc-"), key)
                if item not in self._retrying:
                    self._backoff.pop(item, None)
                self._retrying.discard(item)
            except ApiException as e:
                delay = self._retry(kind, key)
                level = logging.DEBUG if e.status == 409 else logging.WARNING
                log.log(
                    level,
                    "Syncing %s %s/%s failed (%s %s): retrying in %.1f s.",
                    kind,
                    *key,
                    e.status,
                    e.reason,
                    delay,
                )
            except Exception:
                if self._stop.is_set():
                    return
                log.exception("Syncing %s %s/%s has failed: retrying in 5 s.", kind, *key)
                self._enqueue(kind, key, 5.0)

    # informers

    def _list(self, kind: str, **kwargs: Any) -> Any:
        if kind == DEPLOYMENTS:
            return self.apps.list_deployment_for_all_namespaces(**kwargs)
        if kind == REPLICA_SETS:
            return self.apps.list_replica_set_for_all_namespaces(**kwargs)
        if kind == PODS:
            return self.core.list_pod_for_all_namespaces(**kwargs)
        if kind == SERVICES:
            return self.core.list_service_for_all_namespaces(**kwargs)
        if kind == CRDS:
            return self.extensions.list_custom_resource_definition(**kwargs)
        group, version, plural, _ = self._custom_kinds[kind]
        return self.custom.list_cluster_custom_object(group, version, plural, **kwargs)

    def _informer(self, kind: str) -> None:
        while not self._stop.is_set() and kind in self._caches:
            try:
                listed = _json(self._list(kind, _preload_content=False))
                items = listed.get("items", [])
                with self._lock:
                    self._caches[kind].replace_all(items)
                for obj in items:
                    self._changed(kind, "ADDED", obj)
                with self._lock:
                    # After the ADDED calls: a CRD's kinds are known before it counts as synced.
                    self._synced[kind] = True
                    self._lock.notify_all()
                for event_type, obj in self._watch(kind, listed["metadata"]["resourceVersion"]):
                    with self._lock:
                        if event_type == "DELETED":
                            self._caches[kind].remove(obj)
                        elif not self._caches[kind].put(obj):
                            continue
                    self._changed(kind, event_type, obj)
            except Exception as e:
                if self._stop.is_set() or kind not in self._caches:
                    return
                log.warning("The %s watch failed: %s; listing again.", kind, e)
                self._stop.wait(0.5)

    def _served_kind(self, event_type: str, crd: JsonObject) -> None:
        """Watch the kind a CRD serves (its storage version) from now on, or stop with it."""
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        kind = f"{names.get('plural')}.{spec.get('group')}"
        if event_type == "DELETED":
            with self._lock:
                self._custom_kinds.pop(kind, None)
                self._caches.pop(kind, None)
                self._synced.pop(kind, None)
            return
        version = next(
            (v.get("name") for v in spec.get("versions") or [] if v.get("storage")), None
        )
        if version is None or kind in self._custom_kinds:
            return
        thread = threading.Thread(target=self._informer, args=(kind,), name=f"informer-{kind}")
        with self._lock:
            self._custom_kinds[kind] = (
                str(spec.get("group")),
                str(version),
                str(names.get("plural")),
                spec.get("scope") == "Namespaced",
            )
            self._caches[kind] = _Cache()
            self._synced[kind] = False
            self._threads.append(thread)
            started = self._started and not self._stop.is_set()
        if started:
            thread.start()

    def _watch(self, kind: str, resource_version: str) -> Iterator[tuple[str, JsonObject]]:
        return watch_events(lambda **kw: self._list(kind, **kw), self._stop, resource_version)

    def _changed(self, kind: str, event_type: str, obj: JsonObject) -> None:
        """What an event (or the worker's own write) makes due."""
        key = _key(obj)
        uid = str(obj["metadata"].get("uid", ""))
        if kind == CRDS:
            self._served_kind(event_type, obj)
            return
        self._owners_seen[uid] = (kind, key)
        if event_type == "DELETED":
            with self._lock:
                self._owners_gone[uid] = None
                if len(self._owners_gone) > TOMBSTONES_KEPT:
                    self._owners_gone.pop(next(iter(self._owners_gone)))
            self._collect_dependents(uid)
        elif any(owner in self._owners_gone for owner in _owner_uids(obj)):
            self._enqueue(f"gc-{kind}", key)
        if kind == SERVICES:
            self._enqueue(ENDPOINTS, key)
            return
        if kind == PODS:
            self._pod_endpoints_changed(key[0])
        if kind == DEPLOYMENTS:
            self._enqueue(DEPLOYMENTS, key)
            return
        if kind not in (REPLICA_SETS, PODS):
            return
        owner = self._owner(obj, "Deployment" if kind == REPLICA_SETS else "ReplicaSet")
        if kind == REPLICA_SETS:
            self._enqueue(REPLICA_SETS, key)
            if owner is not None:
                self._enqueue(DEPLOYMENTS, owner)
            return
        if owner is not None:
            self._enqueue(REPLICA_SETS, owner)
            with self._lock:
                rs = self._caches[REPLICA_SETS].objects.get(owner)
            deployment_key = self._owner(rs, "Deployment") if rs is not None else None
            if deployment_key is not None and event_type == "DELETED":
                # Recreate waits for the old pods to be gone, which changes no ReplicaSet.
                self._enqueue(DEPLOYMENTS, deployment_key)

    @staticmethod
    def _owner(obj: JsonObject, kind: str) -> Key | None:
        for owner in obj["metadata"].get("ownerReferences") or []:
            if owner.get("controller") and owner.get("kind") == kind:
                return (str(obj["metadata"].get("namespace", "")), str(owner.get("name")))
        return None

    # the controllers

    def _pod_endpoints_changed(self, namespace: str) -> None:
        """A pod of `namespace` changed: the endpoints of its Services with a selector may
        have (it may have joined or left one by its labels, readiness or deletion)."""
        with self._lock:
            services = [
                key
                for key, service in self._caches[SERVICES].objects.items()
                if key[0] == namespace and (service.get("spec") or {}).get("selector")
            ]
        for key in services:
            self._enqueue(ENDPOINTS, key)

    def _sync_endpoints(self, key: Key) -> None:
        """The Service's Endpoints and EndpointSlices from its pods (sim.controllers.endpoints)."""
        with self._lock:
            service = self._caches[SERVICES].objects.get(key)
            pods = [pod for (ns, _), pod in self._caches[PODS].objects.items() if ns == key[0]]
        self._endpoints.sync(key, service, pods)

    def _sync_replica_set(self, key: Key) -> None:
        with self._lock:
            rs = self._caches[REPLICA_SETS].objects.get(key)
            pods = self._caches[PODS].owned_by(rs["metadata"]["uid"]) if rs else []
        if rs is None:
            return
        now = self.clock()
        plan = replicaset.plan(rs, pods, now, self._failures.get(key))
        failure: str | None = None
        if plan.create:
            failure = self._create_pods(rs, plan.create)
        for name in plan.delete:
            self._delete(PODS, key[0], name)
        if failure != self._failures.get(key):
            plan = replicaset.plan(rs, pods, now, failure)
        if failure is not None and failure != self._failures.get(key):
            self._failed_create(rs, failure)
        if failure is None:
            self._failures.pop(key, None)
        else:
            self._failures[key] = failure
        if plan.status != (rs.get("status") or {}):
            body = dict(rs, status=plan.status)
            written = _json(
                self.apps.replace_namespaced_replica_set_status(
                    key[1], key[0], body, _preload_content=False
                )
            )
            self._remember(REPLICA_SETS, written)
        self._enqueue_at(REPLICA_SETS, key, plan.recheck_at)
        if failure is not None:
            self._retry(REPLICA_SETS, key)

    def _create_pods(self, rs: JsonObject, count: int) -> str | None:
        """Create `count` pods in batches of 1, 2, 4, ... (upstream's slow start: a template
        the API refuses fails once, not `count` times); the first refusal's message, or None."""
        batch, done = 1, 0
        while done < count:
            for _ in range(min(batch, count - done)):
                try:
                    created = _json(
                        self.core.create_namespaced_pod(
                            rs["metadata"]["namespace"],
                            replicaset.pod_from_template(rs),
                            _preload_content=False,
                        )
                    )
                except ApiException as e:
                    message = _status_message(e)
                    log.warning(
                        "ReplicaSet %s/%s could not create a pod: %s.",
                        rs["metadata"]["namespace"],
                        rs["metadata"]["name"],
                        message,
                    )
                    return message
                self._remember(PODS, created)
                done += 1
            batch *= 2
        return None

    def _failed_create(self, rs: JsonObject, message: str) -> None:
        """The Warning Event upstream's ReplicaSet controller records when the API refuses its
        pod (Pod Security, quota, a webhook): what `kubectl describe rs` and `get events` show."""
        meta = rs["metadata"]
        stamp = rfc3339(self.clock())
        body = {
            "metadata": {"generateName": f"{meta['name']}."},
            "involvedObject": {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": "Warning",
            "reason": "FailedCreate",
            "message": f"Error creating: {message}",
            "source": {"component": "replicaset-controller"},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            self.core.create_namespaced_event(meta["namespace"], body, _preload_content=False)
        except ApiException as e:
            log.warning(
                "Could not record FailedCreate on ReplicaSet %s: %s", meta["name"], e.reason
            )

    def _sync_deployment(self, key: Key) -> None:
        with self._lock:
            d = self._caches[DEPLOYMENTS].objects.get(key)
            if d is None:
                return
            rss = self._caches[REPLICA_SETS].owned_by(d["metadata"]["uid"])
            pods_by_rs = {
                rs["metadata"]["uid"]: self._caches[PODS].owned_by(rs["metadata"]["uid"])
                for rs in rss
            }
        plan = deployment.sync(d, rss, pods_by_rs, self.clock())
        namespace = key[0]
        if plan.create is not None and not self._create_replica_set(d, plan.create):
            return
        for body in plan.updates.values():
            written = _json(
                self.apps.replace_namespaced_replica_set(
                    body["metadata"]["name"], namespace, body, _preload_content=False
                )
            )
            self._remember(REPLICA_SETS, written)
        for name in plan.delete:
            self._delete(REPLICA_SETS, namespace, name)
        if plan.annotations is not None:
            d = dict(d, metadata=dict(d["metadata"], annotations=plan.annotations))
            d = _json(
                self.apps.replace_namespaced_deployment(
                    key[1], namespace, d, _preload_content=False
                )
            )
            self._remember(DEPLOYMENTS, d)
        if plan.status is not None:
            written = _json(
                self.apps.replace_namespaced_deployment_status(
                    key[1], namespace, dict(d, status=plan.status), _preload_content=False
                )
            )
            self._remember(DEPLOYMENTS, written)
        self._enqueue_at(DEPLOYMENTS, key, plan.recheck_at)

    def _create_replica_set(self, d: JsonObject, body: JsonObject) -> bool:
        """Create the new ReplicaSet; on a name taken by another template, count the collision
        in the Deployment's status (the next hash differs) and try again on the next sync."""
        namespace = d["metadata"]["namespace"]
        try:
            created = _json(
                self.apps.create_namespaced_replica_set(namespace, body, _preload_content=False)
            )
        except ApiException as e:
            if e.status != 409:
                raise
            existing = _json(
                self.apps.read_namespaced_replica_set(
                    body["metadata"]["name"], namespace, _preload_content=False
                )
            )
            if controller_uid(existing) == d["metadata"]["uid"]:
                self._remember(REPLICA_SETS, existing)
                return True
            status = dict(d.get("status") or {})
            status["collisionCount"] = int(status.get("collisionCount") or 0) + 1
            log.info(
                "ReplicaSet name %s is taken: Deployment %s/%s counts collision %d.",
                body["metadata"]["name"],
                namespace,
                d["metadata"]["name"],
                status["collisionCount"],
            )
            written = self.apps.replace_namespaced_deployment_status(
                d["metadata"]["name"], namespace, dict(d, status=status), _preload_content=False
            )
            self._remember(DEPLOYMENTS, _json(written))
            return False
        self._remember(REPLICA_SETS, created)
        return True

    def _delete(self, kind: str, namespace: str, name: str) -> None:
        try:
            if kind == PODS:
                answer = _json(
                    self.core.delete_namespaced_pod(name, namespace, _preload_content=False)
                )
                if answer["metadata"].get("deletionTimestamp"):
                    self._remember(PODS, answer)
                else:
                    with self._lock:  # removed at once (an unbound pod)
                        self._caches[PODS].remove(answer)
            elif kind == SERVICES:
                self.core.delete_namespaced_service(name, namespace, _preload_content=False)
            elif kind == REPLICA_SETS:
                self.apps.delete_namespaced_replica_set(name, namespace, _preload_content=False)
            elif kind == DEPLOYMENTS:
                self.apps.delete_namespaced_deployment(name, namespace, _preload_content=False)
            elif kind in self._custom_kinds:
                group, version, plural, namespaced = self._custom_kinds[kind]
                if namespaced:
                    self.custom.delete_namespaced_custom_object(
                        group, version, namespace, plural, name
                    )
                else:
                    self.custom.delete_cluster_custom_object(group, version, plural, name)
        except ApiException as e:
            if e.status != 404:
                raise

    def _remember(self, kind: str, obj: JsonObject) -> None:
        """Our own write, into the cache before its watch event arrives."""
        if obj.get("kind") == "Status":
            return
        with self._lock:
            changed = self._caches[kind].put(obj)
        if changed:
            self._changed(kind, "MODIFIED", obj)

    # the garbage collector

    def _collect_dependents(self, owner_uid: str) -> None:
        """Look at every cached object that names `owner_uid` among its owners."""
        with self._lock:
            due = [
                (kind, key)
                for kind, cache in self._caches.items()
                for key in sorted(cache.by_any_owner.get(owner_uid, ()))
            ]
        for kind, key in due:
            self._enqueue(f"gc-{kind}", key)

    def _collect(self, kind: str, key: Key) -> None:
        """Delete a dependent once every owner it names (each seen by this manager) is gone
        from the API; while some remain, drop its references to those gone, as upstream."""
        with self._lock:
            cache = self._caches.get(kind)
            dependent = cache.objects.get(key) if cache is not None else None
        if dependent is None or dependent["metadata"].get("deletionTimestamp"):
            return
        owners = _owner_uids(dependent)
        if not owners:
            return
        gone = set()
        for owner_uid in owners:
            seen = self._owners_seen.get(owner_uid)
            if seen is not None and not self._still_there(seen, owner_uid):
                gone.add(owner_uid)
        if gone == owners:
            log.info("The owners of %s %s/%s are gone: deleting it.", kind, *key)
            self._delete(kind, *key)
        elif gone:
            self._drop_references(kind, dependent, gone)

    def _drop_references(self, kind: str, dependent: JsonObject, gone: set[str]) -> None:
        """Remove the ownerReferences to `gone` owners (a JSON patch that fails, 409 or 422,
        if the object changed meanwhile; its next event brings it back here)."""
        meta = dependent["metadata"]
        references = meta.get("ownerReferences") or []
        kept = [r for r in references if str(r.get("uid")) not in gone]
        patch = [
            {"op": "test", "path": "/metadata/ownerReferences", "value": references},
            {"op": "replace", "path": "/metadata/ownerReferences", "value": kept},
        ]
        namespace, name = str(meta.get("namespace", "")), str(meta["name"])
        log.info(
            "Some owners of %s %s/%s are gone: removing its references to them.",
            kind,
            namespace,
            name,
        )
        options = {"_content_type": "application/json-patch+json", "_preload_content": False}
        if kind == PODS:
            answer = self.core.patch_namespaced_pod(name, namespace, patch, **options)
        elif kind == REPLICA_SETS:
            answer = self.apps.patch_namespaced_replica_set(name, namespace, patch, **options)
        elif kind == DEPLOYMENTS:
            answer = self.apps.patch_namespaced_deployment(name, namespace, patch, **options)
        elif kind in self._custom_kinds:
            group, version, plural, namespaced = self._custom_kinds[kind]
            answer = (
                self.custom.patch_namespaced_custom_object(
                    group, version, namespace, plural, name, patch, **options
                )
                if namespaced
                else self.custom.patch_cluster_custom_object(
                    group, version, plural, name, patch, **options
                )
            )
        else:
            return
        self._remember(kind, _json(answer))

    def _still_there(self, seen: tuple[str, Key], uid: str) -> bool:
        """Whether the API still has the owner with this uid (a live read)."""
        kind, (namespace, name) = seen
        try:
            if kind == DEPLOYMENTS:
                owner = self.apps.read_namespaced_deployment(
                    name, namespace, _preload_content=False
                )
            elif kind == REPLICA_SETS:
                owner = self.apps.read_namespaced_replica_set(
                    name, namespace, _preload_content=False
                )
            elif kind == PODS:
                owner = self.core.read_namespaced_pod(name, namespace, _preload_content=False)
            elif kind in self._custom_kinds:
                group, version, plural, namespaced = self._custom_kinds[kind]
                owner = (
                    self.custom.get_namespaced_custom_object(
                        group, version, namespace, plural, name, _preload_content=False
                    )
                    if namespaced
                    else self.custom.get_cluster_custom_object(
                        group, version, plural, name, _preload_content=False
                    )
                )
            else:
                return False  # its CRD is gone, and every object of it
        except ApiException as e:
            if e.status != 404:
                raise
            return False
        return bool(_json(owner)["metadata"].get("uid") == uid)


def _status_message(e: ApiException) -> str:
    try:
        return str(json.loads(e.body or "{}").get("message") or e.reason)
    except ValueError:
        return str(e.reason)
