"""A kubelet's node heartbeat: its node's Lease in `kube-node-lease`, and its Ready condition.

As the kubelet's node lease controller does, `NodeHeartbeat` renews a Lease named for each of its
nodes in `kube-node-lease` (coordination.k8s.io/v1: `holderIdentity` the node,
`leaseDurationSeconds` 40, owned by the Node) every `renew_seconds` (the kubelet's: a quarter of
the duration, 10 s); and as its node status loop does, it writes the Node's `Ready=True`
condition (`KubeletReady`, a new `lastHeartbeatTime`) when it starts, whenever the condition is
not True (a node lifecycle controller marked it Unknown while it was away), and every
`report_seconds` besides (the kubelet's --node-status-report-frequency, 5 minutes). A node whose
heartbeat stops (its kubelet stopped: `stop`) is one the node lifecycle controller
(`sim.controllers.nodelifecycle`) takes for unreachable after its grace period.

API errors are logged and tried again at the next beat, as the kubelet retries; the namespace
`kube-node-lease` is created if the API server lacks it (kube-apiserver creates it at start).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sim.apiserver.clock import rfc3339, rfc3339_micro

log = logging.getLogger(__name__)

NODE_LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40
"""The kubelet's node lease duration (its --node-lease-duration-seconds)."""
RENEW_SECONDS = 10.0
"""How often the kubelet renews its lease: a quarter of its duration."""
REPORT_SECONDS = 300.0
"""The kubelet's --node-status-report-frequency: a Ready condition unchanged is written again
this often."""


class NodeHeartbeat:
    """Renews the Leases and Ready conditions of `nodes` from a thread of its own; start(), stop().

    `clock` stamps the Lease's `renewTime` and the condition's times (the API server's clock in
    the simulated cluster)."""

    def __init__(
        self,
        api_client: client.ApiClient,
        nodes: Iterable[str],
        *,
        renew_seconds: float = RENEW_SECONDS,
        report_seconds: float = REPORT_SECONDS,
        lease_seconds: int = LEASE_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if renew_seconds <= 0 or report_seconds <= 0 or lease_seconds <= 0:
            raise ValueError("a node heartbeat's periods must be positive")
        self.core = cast(Any, client.CoreV1Api(api_client))
        self.leases = cast(Any, client.CoordinationV1Api(api_client))
        self.nodes = tuple(nodes)
        self.renew_seconds = renew_seconds
        self.report_seconds = report_seconds
        self.lease_seconds = lease_seconds
        self.clock = clock
        self._reported: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="node-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """No more beats: the node's kubelet is gone."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(15)

    def beat(self) -> None:
        """One beat of every node: its Lease renewed, its Ready condition written when due."""
        for node in self.nodes:
            try:
                uid = self._report(node)
                self._renew(node, uid)
            except ApiException as e:
                log.warning("Node %s: its heartbeat failed (%s); trying again.", node, e.reason)
            except Exception as e:  # the API server unreachable: the next beat tries again
                log.warning("Node %s: its heartbeat failed (%s); trying again.", node, e)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.beat()
            self._stop.wait(self.renew_seconds)

    def _report(self, node: str) -> str:
        """Write the Node's Ready=True when due; its uid."""
        current = json.loads(self.core.read_node(node, _preload_content=False).data)
        conditions = current.get("status", {}).get("conditions") or []
        ready = next((c for c in conditions if c.get("type") == "Ready"), None)
        now = self.clock()
        due = now - self._reported.get(node, float("-inf")) >= self.report_seconds
        if ready is None or ready.get("status") != "True" or due:
            stamp = rfc3339(now)
            changed = ready is None or ready.get("status") != "True"
            condition = {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp
                if changed or ready is None
                else ready.get("lastTransitionTime", stamp),
            }
            kept = [c for c in conditions if c.get("type") != "Ready"]
            self.core.patch_node_status(
                node,
                {"status": {"conditions": [*kept, condition]}},
                _preload_content=False,
            )
            self._reported[node] = now
        return str(current["metadata"].get("uid", ""))

    def _renew(self, node: str, uid: str) -> None:
        spec = {
            "holderIdentity": node,
            "leaseDurationSeconds": self.lease_seconds,
            "renewTime": rfc3339_micro(self.clock()),
        }
        try:
            self.leases.patch_namespaced_lease(
                node, NODE_LEASE_NAMESPACE, {"spec": spec}, _preload_content=False
            )
            return
        except ApiException as e:
            if e.status != 404:
                raise
        self._ensure_namespace()
        owner = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": node, "ownerReferences": [owner]},
            "spec": spec,
        }
        self.leases.create_namespaced_lease(NODE_LEASE_NAMESPACE, body, _preload_content=False)

    def _ensure_namespace(self) -> None:
        try:
            self.core.create_namespace(
                {"metadata": {"name": NODE_LEASE_NAMESPACE}}, _preload_content=False
            )
        except ApiException as e:
            if e.status != 409:
                raise
