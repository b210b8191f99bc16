"""The kubelet's admission of a pod bound to its node, as a real kubelet's predicate admit handler
judges it: no NoExecute taint of the node left untolerated (the only taints a kubelet checks, so
a pod created with spec.nodeName skips the others), the pod's effective requests, plus those of
every pod it admitted before that has not terminated, within the node's `status.allocatable`
(one more pod within `pods`), and no host port in use. A refused pod is never run: it is marked
Failed with kubelet's reason (`TaintToleration`, `OutOfcpu`, `OutOfmemory`,
`OutOfephemeral-storage`, `OutOfpods`, `OutOf<resource>`, or `NodePorts`) and message. As the
kubelet does, an extended resource the node does not list in allocatable is left out of the
pod's requests (a scheduler extender manages it), so the GPU-memory resource of a node that does
not advertise it never refuses a pod.

Pure bookkeeping, one instance per node; the kubelets read the Node and write the status.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from common.podresources import (
    CPU,
    EPHEMERAL,
    MEMORY,
    PODS,
    HostPort,
    Resources,
    host_ports,
    node_allocatable,
    pod_requests,
    ports_conflict,
)
from common.quantity import QuantityError

Obj = Mapping[str, Any]
NATIVE_ORDER = (CPU, MEMORY, EPHEMERAL)


@dataclass(frozen=True)
class Refusal:
    reason: str
    message: str


def _extended(resource: str) -> bool:
    """An extended resource: a domain-prefixed name outside kubernetes.io (v1helper's
    IsExtendedResourceName, without the `requests.` quota names a pod never carries)."""
    prefix, slash, _ = resource.partition("/")
    return bool(slash) and prefix != "kubernetes.io" and not prefix.endswith(".kubernetes.io")


@dataclass
class NodeAdmission:
    """What one node's kubelet has admitted."""

    allocatable: Resources | None = None
    """None while the node publishes no allocatable (a Node object a test wrote by hand): then
    nothing is refused."""
    admitted: dict[str, tuple[Resources, tuple[HostPort, ...]]] = field(default_factory=dict)
    no_execute: tuple[Mapping[str, Any], ...] = ()
    """The node's NoExecute taints."""

    def set_node(self, node: Mapping[str, Any]) -> None:
        status = node.get("status") or {}
        self.allocatable = node_allocatable(status) if status.get("allocatable") else None
        taints = (node.get("spec") or {}).get("taints") or []
        self.no_execute = tuple(t for t in taints if t.get("effect") == "NoExecute")

    def forget(self, uid: str) -> None:
        """The pod terminated or is gone: its requests and ports are free again."""
        self.admitted.pop(uid, None)

    def admit(self, pod: Obj) -> Refusal | None:
        """Admit the pod (counting it from now on), or say why the kubelet refuses it."""
        uid = str(pod.get("metadata", {}).get("uid", ""))
        if uid in self.admitted:
            return None
        spec = pod.get("spec") or {}
        tolerations = spec.get("tolerations") or []
        if any(not any(_tolerates(t, taint) for t in tolerations) for taint in self.no_execute):
            return Refusal("TaintToleration", "Pod was rejected: Predicate TaintToleration failed")
        try:
            wanted = pod_requests(spec)
        except QuantityError as e:
            return Refusal("UnexpectedAdmissionError", f"Pod was rejected: {e}")
        allocatable = self.allocatable
        ports = host_ports(spec)
        if allocatable is None:
            self.admitted[uid] = (wanted, ports)
            return None
        wanted = {r: v for r, v in wanted.items() if not _extended(r) or r in allocatable}
        refusal = self._refusal(allocatable, wanted, ports)
        if refusal is None:
            self.admitted[uid] = (wanted, ports)
        return refusal

    def _refusal(
        self, allocatable: Resources, wanted: Resources, ports: tuple[HostPort, ...]
    ) -> Refusal | None:
        used: dict[str, int] = {}
        for requests, _ in self.admitted.values():
            for resource, value in requests.items():
                used[resource] = used.get(resource, 0) + value
        capacity = allocatable.get(PODS, 0)
        if len(self.admitted) + 1 > capacity:
            return _insufficient(PODS, 1, len(self.admitted), capacity)
        scalars = sorted(r for r in wanted if r not in NATIVE_ORDER)
        for resource in (*NATIVE_ORDER, *scalars):
            want = wanted.get(resource, 0)
            have = allocatable.get(resource, 0)
            if want > 0 and want > have - used.get(resource, 0):
                return _insufficient(resource, want, used.get(resource, 0), have)
        for _, taken in self.admitted.values():
            if any(ports_conflict(p, t) for p in ports for t in taken):
                return Refusal("NodePorts", "Pod was rejected: Predicate NodePorts failed")
        return None


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """core/v1 Toleration.ToleratesTaint: an empty effect or key matches any."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("key") and toleration["key"] != taint.get("key"):
        return False
    if toleration.get("operator", "Equal") == "Equal":
        return bool(toleration.get("value", "") == taint.get("value", ""))
    return bool(toleration.get("operator") == "Exists")


def _insufficient(resource: str, requested: int, used: int, capacity: int) -> Refusal:
    return Refusal(
        f"OutOf{resource}",
        f"Pod was rejected: Node didn't have enough resource: {resource}, requested: "
        f"{requested}, used: {used}, capacity: {capacity}",
    )


def rejected_status(pod: Obj, refusal: Refusal, stamp: str) -> Obj:
    """The status a kubelet writes for a pod it refuses."""
    return {
        **(pod.get("status") or {}),
        "phase": "Failed",
        "reason": refusal.reason,
        "message": refusal.message,
        "startTime": stamp,
    }
