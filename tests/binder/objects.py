"""API-shaped pods, nodes and leases for the binder's tests and benchmarks (camelCase, as the API
serves them)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from common.contract import DEFAULT_SYSTEM_NAMESPACE, Keys, agent_lease_name
from common.proofs import Claim, KeyRing
from common.quantity import parse_quantity

GI = 1024**3
KEYS = Keys()


def gpus_annotation(sizes: list[int], node: str, *, healthy: list[bool] | None = None) -> str:
    return json.dumps(
        [
            {
                "uuid": f"GPU-{node}-{i}",
                "index": i,
                "product": "Tesla T4",
                "memory": size,
                "healthy": True if healthy is None else healthy[i],
            }
            for i, size in enumerate(sizes)
        ]
    )


def node_obj(
    name: str,
    gpus: list[int] | None = None,
    *,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
    healthy: list[bool] | None = None,
    allocatable: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """`allocatable`: the node's status.allocatable (none: NodeResourcesFit does not judge it);
    `annotations`: more than the agent's GPU annotations (its Triton's version)."""
    annotations = dict(annotations or {})
    if gpus is not None:
        annotations[KEYS.gpus] = gpus_annotation(gpus, name, healthy=healthy)
        annotations[KEYS.gpu_mem_total] = str(sum(gpus))
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            "annotations": annotations,
        },
        "spec": spec,
    }
    if allocatable is not None:
        obj["status"] = {"allocatable": allocatable, "capacity": allocatable}
    return obj


def pod_obj(
    name: str,
    *,
    mem: str | None = "1Gi",
    model: str | None = "",
    namespace: str = "models",
    node: str = "",
    gpu: str = "",
    phase: str = "Pending",
    scheduler: str = "tritonshare",
    uid: str | None = None,
    spec_extra: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    annotations = dict(annotations or {})
    if model is not None:  # "" means "named after the pod", None means no annotation
        annotations[KEYS.model_id] = model or name
    if gpu:
        annotations[KEYS.gpu] = gpu
    container: dict[str, Any] = {"name": "proxy", "image": "tritonshare/proxy"}
    if mem is not None:
        container["resources"] = {"limits": {KEYS.gpu_mem: mem}}
    spec: dict[str, Any] = {"schedulerName": scheduler, "containers": [container]}
    if node:
        spec["nodeName"] = node
    spec.update(spec_extra or {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{namespace}-{name}",
            "annotations": annotations,
            "creationTimestamp": "2026-01-01T00:00:00Z",
            **({"labels": labels} if labels else {}),
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def signed(obj: dict[str, Any], ring: KeyRing) -> dict[str, Any]:
    """A bound `pod_obj` with the proof of placement the binder would have written for it."""
    meta, annotations = obj["metadata"], obj["metadata"]["annotations"]
    limit = obj["spec"]["containers"][0]["resources"]["limits"][KEYS.gpu_mem]
    claim = Claim(
        meta["uid"],
        meta["namespace"],
        meta["name"],
        obj["spec"]["nodeName"],
        annotations.get(KEYS.gpu, ""),
        annotations.get(KEYS.model_id, ""),
        parse_quantity(limit),
        annotations.get(KEYS.residency, "always"),
    )
    annotations[KEYS.placement] = ring.sign(claim)
    return obj


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_obj(node: str, renewed: float, duration: int = 40) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": agent_lease_name(node), "namespace": DEFAULT_SYSTEM_NAMESPACE},
        "spec": {
            "holderIdentity": f"agent-{node}",
            "leaseDurationSeconds": duration,
            "renewTime": rfc3339(renewed),
        },
    }
