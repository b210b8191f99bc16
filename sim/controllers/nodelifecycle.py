"""The node lifecycle controller and its taint eviction, as kube-controller-manager runs them.

Every `period` (its --node-monitor-period, 5 s) `NodeLifecycleController` reads the Nodes, their
Leases in `kube-node-lease` and the pods, through the API:

- a node's heartbeat is its Lease's `renewTime` and its Ready condition's `lastHeartbeatTime`;
  when either changes, the controller notes its own time (upstream's probe timestamp, so no two
  clocks are compared; after a pass missed, as while the API server is away, every node's
  afresh). A node whose heartbeat has not changed for `grace` seconds (its
  --node-monitor-grace-period: 40 s before 1.32, 50 s since) gets every condition `Unknown`
  (`NodeStatusUnknown`, "Kubelet stopped posting node status."), and its pods Ready=False
  (upstream's MarkPodsNotReady: the endpoints drop them);
- a node whose Ready is Unknown gets the taints `node.kubernetes.io/unreachable:NoSchedule` and
  `:NoExecute` (with `timeAdded`), one whose Ready is False the `not-ready` ones; a node Ready
  again (its kubelet back: `sim.node.heartbeat`) loses them;
- the taint eviction controller: a pod bound to a node with NoExecute taints, not terminated nor
  being deleted, is deleted (a graceful delete, an Event `TaintManagerEviction`) at once if it
  does not tolerate one of them, else once the shortest `tolerationSeconds` of the tolerations
  used has passed since the controller first saw it so (a toleration without one: never). Its
  node's kubelet is gone, so the pod stays Terminating, as upstream; its controller replaces it.

Writes are merge patches (nodes, pods' status) and deletions with a uid precondition (pods); a
failed one is tried again at the next pass. `clock` is the controller's own (monotonic by
default); `stamp`, the times written (the API server's clock in the simulated cluster).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sim.apiserver.clock import rfc3339
from sim.node.heartbeat import NODE_LEASE_NAMESPACE

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]
GRACE_SECONDS = 40.0
PERIOD_SECONDS = 5.0
UNREACHABLE = "node.kubernetes.io/unreachable"
NOT_READY = "node.kubernetes.io/not-ready"
NODE_CONDITIONS = ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure")
_TERMINAL = frozenset({"Succeeded", "Failed"})


def tolerates(toleration: JsonObject, taint: JsonObject) -> bool:
    """core/v1 Toleration.ToleratesTaint: an empty effect or key is a wildcard."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("key") and toleration["key"] != taint.get("key"):
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return str(toleration.get("value") or "") == str(taint.get("value") or "")


def eviction_delay(pod: JsonObject, taints: Sequence[JsonObject]) -> float | None:
    """Seconds after which a pod on a node with these NoExecute `taints` is evicted: 0 if one is
    not tolerated, None if every one is tolerated for ever, else the shortest tolerationSeconds
    of the tolerations used (upstream's getMinTolerationTime)."""
    tolerations = pod.get("spec", {}).get("tolerations") or []
    shortest: float | None = None
    for taint in taints:
        used = [t for t in tolerations if tolerates(t, taint)]
        if not used:
            return 0.0
        for toleration in used:
            seconds = toleration.get("tolerationSeconds")
            if seconds is not None:
                seconds = max(0.0, float(seconds))
                shortest = seconds if shortest is None else min(shortest, seconds)
    return shortest


class NodeLifecycleController:
    """Start with start(), stop with stop(); `sync` is one pass (tests call it directly)."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        grace: float = GRACE_SECONDS,
        period: float = PERIOD_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        stamp: Callable[[], float] = time.time,
    ) -> None:
        if grace <= 0 or period <= 0:
            raise ValueError("the node monitor's grace and period must be positive")
        self.core = cast(Any, client.CoreV1Api(api_client))
        self.leases = cast(Any, client.CoordinationV1Api(api_client))
        self.grace = grace
        self.period = period
        self.clock = clock
        self.stamp = stamp
        self._probes: dict[str, tuple[tuple[str, str], float]] = {}
        """node -> (its heartbeat as last read, when this controller saw it change)."""
        self._tainted_since: dict[str, float] = {}
        """pod uid -> when this controller first saw it on a node with NoExecute taints."""
        self._last_pass: float | None = None
        """When the last pass read the nodes: after a gap (the API server away or slow), every
        heartbeat counts as seen afresh, so a kubelet gets a whole grace to reach it again."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-lifecycle", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.sync()
            except Exception as e:  # the API server away: the next pass tries again
                log.warning("The node lifecycle controller's pass failed: %s", e)

    def _list(self, method: Callable[..., Any], *args: Any) -> list[JsonObject]:
        items: list[JsonObject] = json.loads(method(*args, _preload_content=False).data)["items"]
        return items

    def sync(self) -> None:
        """One pass: heartbeats judged, taints set, pods evicted when due."""
        nodes = self._list(self.core.list_node)
        leases = {
            lease["metadata"]["name"]: lease
            for lease in self._list(self.leases.list_namespaced_lease, NODE_LEASE_NAMESPACE)
        }
        pods = self._list(self.core.list_pod_for_all_namespaces)
        now = self.clock()
        if self._last_pass is not None and now - self._last_pass > 2 * self.period + 1:
            self._probes = {name: (beat, now) for name, (beat, _) in self._probes.items()}
        self._last_pass = now
        for node in nodes:
            name = node["metadata"]["name"]
            conditions = node.get("status", {}).get("conditions") or []
            ready = next((c for c in conditions if c.get("type") == "Ready"), None)
            renewed = str((leases.get(name, {}).get("spec") or {}).get("renewTime") or "")
            beat = (renewed, str((ready or {}).get("lastHeartbeatTime") or ""))
            seen = self._probes.get(name)
            if seen is None or seen[0] != beat:
                self._probes[name] = seen = (beat, now)
            status = str((ready or {}).get("status") or "Unknown")
            if now - seen[1] > self.grace and status != "Unknown":
                self._mark_unknown(node, [p for p in pods if _on(p, name)])
                status = "Unknown"
            self._taint(node, status)
        self._evict(nodes, pods, now)

    def _mark_unknown(self, node: JsonObject, pods: list[JsonObject]) -> None:
        name = node["metadata"]["name"]
        stamp = rfc3339(self.stamp())
        conditions = []
        for condition in node.get("status", {}).get("conditions") or []:
            if condition.get("type") in NODE_CONDITIONS:
                condition = {
                    **condition,
                    "status": "Unknown",
                    "reason": "NodeStatusUnknown",
                    "message": "Kubelet stopped posting node status.",
                    "lastTransitionTime": stamp,
                }
            conditions.append(condition)
        self.core.patch_node_status(
            name, {"status": {"conditions": conditions}}, _preload_content=False
        )
        log.warning("Node %s stopped posting its status: Ready=Unknown.", name)
        for pod in pods:
            self._mark_pod_not_ready(pod, stamp)

    def _mark_pod_not_ready(self, pod: JsonObject, stamp: str) -> None:
        meta = pod["metadata"]
        conditions = [
            {**c, "status": "False", "lastTransitionTime": stamp}
            if c.get("type") == "Ready" and c.get("status") != "False"
            else c
            for c in pod.get("status", {}).get("conditions") or []
        ]
        try:
            self.core.patch_namespaced_pod_status(
                meta["name"],
                meta["namespace"],
                {"status": {"conditions": conditions}},
                _preload_content=False,
            )
        except ApiException as e:
            if e.status != 404:
                log.warning("Pod %s/%s not marked NotReady: %s", meta["namespace"], meta["name"], e)

    def _taint(self, node: JsonObject, status: str) -> None:
        key = {"Unknown": UNREACHABLE, "False": NOT_READY}.get(status)
        taints = list(node.get("spec", {}).get("taints") or [])
        kept = [t for t in taints if t.get("key") not in (UNREACHABLE, NOT_READY)]
        wanted = []
        if key is not None:
            held = {t.get("effect"): t for t in taints if t.get("key") == key}
            stamp = rfc3339(self.stamp())
            wanted = [
                held.get("NoSchedule") or {"key": key, "effect": "NoSchedule"},
                held.get("NoExecute") or {"key": key, "effect": "NoExecute", "timeAdded": stamp},
            ]
        if [*kept, *wanted] == taints:
            return
        patch = {"spec": {"taints": [*kept, *wanted]}}
        self.core.patch_node(node["metadata"]["name"], patch, _preload_content=False)
        what = f"tainted {key}" if key else "no longer tainted unreachable or not-ready"
        log.warning("Node %s is %s.", node["metadata"]["name"], what)

    def _evict(self, nodes: list[JsonObject], pods: list[JsonObject], now: float) -> None:
        no_execute = {
            n["metadata"]["name"]: [
                t for t in n.get("spec", {}).get("taints") or [] if t.get("effect") == "NoExecute"
            ]
            for n in nodes
        }
        seen: set[str] = set()
        for pod in pods:
            meta = pod["metadata"]
            taints = no_execute.get(str(pod.get("spec", {}).get("nodeName") or ""))
            if (
                not taints
                or meta.get("deletionTimestamp")
                or pod.get("status", {}).get("phase") in _TERMINAL
            ):
                continue
            delay = eviction_delay(pod, taints)
            if delay is None:
                continue
            uid = str(meta.get("uid", ""))
            seen.add(uid)
            since = self._tainted_since.setdefault(uid, now)
            if now - since >= delay:
                self._delete(pod)
        for uid in set(self._tainted_since) - seen:
            del self._tainted_since[uid]

    def _delete(self, pod: JsonObject) -> None:
        meta = pod["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        try:
            self.core.delete_namespaced_pod(
                name,
                namespace,
                body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=meta["uid"])),
                _preload_content=False,
            )
        except ApiException as e:
            if e.status not in (404, 409):
                log.warning("Pod %s/%s could not be evicted: %s", namespace, name, e.reason)
            return
        log.warning("Pod %s/%s evicted from its node's NoExecute taint.", namespace, name)
        stamp = rfc3339(self.stamp())
        event = {
            "metadata": {"generateName": f"{name}."},
            "involvedObject": {
                "kind": "Pod",
                "namespace": namespace,
                "name": name,
                "uid": meta["uid"],
                "apiVersion": "v1",
            },
            "reason": "TaintManagerEviction",
            "message": f"Marking for deletion Pod {namespace}/{name}",
            "type": "Normal",
            "source": {"component": "taint-eviction-controller"},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            self.core.create_namespaced_event(namespace, event, _preload_content=False)
        except ApiException as e:
            log.warning("No Event for the eviction of %s/%s: %s", namespace, name, e.reason)


def _on(pod: JsonObject, node: str) -> bool:
    return pod.get("spec", {}).get("nodeName") == node and (
        pod.get("status", {}).get("phase") not in _TERMINAL
    )
