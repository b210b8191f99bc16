"""Model hosts for the agent's tests, written as the binder writes them
(`binder.tritonmodels.controller`): a pod named as its node's host, labelled, annotated with its
replicas, each with a proof signed with the tests' key for the claim the binder signs
(`binder.cluster.chargedpods.sign` of `ModelInfo.replica`)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import kubernetes.client

from agent.kube.client import JsonObject
from common.contract import RESIDENCY_ALWAYS
from common.hosted import (
    HostedReplica,
    encode_hosted,
    host_name,
    replica_name,
    replica_uid,
)
from common.proofs import Claim, KeyRing
from common.tritonname import private_triton_name
from tests.agent.conftest import NODE, SCHEDULER
from tests.fixtures_sim import TEST_RING, core_v1

KEYS_PREFIX = "tritonshare.io/"
HOSTED = f"{KEYS_PREFIX}hosted-models"
MODEL_UIDS: dict[tuple[str, str], str] = {}
"""(namespace, model) -> the uid its TritonModel would have (one per test process is enough)."""


def model_uid(namespace: str, model: str) -> str:
    return MODEL_UIDS.setdefault((namespace, model), str(uuid.uuid4()))


def replica(
    namespace: str,
    model: str,
    gpu: str,
    *,
    ordinal: int = 0,
    node: str = NODE,
    request: int = 1024**3,
    residency: str = RESIDENCY_ALWAYS,
    ring: KeyRing = TEST_RING,
    **fields: Any,
) -> HostedReplica:
    """An entry of a host on `node` in `namespace`, signed as the binder signs a replica."""
    uid = model_uid(namespace, model)
    claim = Claim(
        replica_uid(uid, ordinal),
        namespace,
        replica_name(model, ordinal),
        node,
        gpu,
        model,
        request,
        residency,
    )
    entry = HostedReplica(model, uid, ordinal, gpu, residency, ring.sign(claim))
    return replace(entry, **fields)


def make_host(
    api: kubernetes.client.ApiClient,
    namespace: str,
    replicas: list[HostedReplica],
    *,
    node: str = NODE,
    name: str | None = None,
    phase: str | None = "Running",
    label: bool = True,
    pod_ip: str = "",
    secret: str = "",
) -> dict[str, Any]:
    """The host pod of `namespace` on `node` (as the binder creates it: spec.nodeName, the
    tritonshare scheduler; of the storage Secret `secret`, when given), with `phase` and
    `pod_ip` set as the kubelet would."""
    core = core_v1(api)
    labels = {f"{KEYS_PREFIX}model-host": "true"} if label else {}
    annotations = {HOSTED: encode_hosted(replicas)}
    if secret:
        annotations[f"{KEYS_PREFIX}host-secret"] = secret
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name or host_name(node, secret),
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "nodeName": node,
            "schedulerName": SCHEDULER,
            "containers": [{"name": "proxy", "image": "tritonshare/proxy"}],
        },
    }
    created = core.create_namespaced_pod(namespace, body)
    status: dict[str, Any] = {}
    if phase is not None:
        status["phase"] = phase
    if pod_ip:
        status["podIP"] = pod_ip
        status["hostIP"] = "10.0.0.1"
    if status:
        core.patch_namespaced_pod_status(created.metadata.name, namespace, {"status": status})
    read = core.read_namespaced_pod(created.metadata.name, namespace)
    pod: dict[str, Any] = api.sanitize_for_serialization(read)  # type: ignore[no-untyped-call]
    return pod


def set_hosted(
    api: kubernetes.client.ApiClient,
    namespace: str,
    replicas: list[HostedReplica],
    node: str = NODE,
) -> None:
    """Rewrite the host's annotation, as the binder does when its replicas change."""
    body = {"metadata": {"annotations": {HOSTED: encode_hosted(replicas)}}}
    core_v1(api).patch_namespaced_pod(host_name(node), namespace, body)


def replica_triton_name(entry: HostedReplica, namespace: str) -> str:
    """The replica's private name in Triton."""
    return private_triton_name(namespace, entry.model, entry.replica_uid)


def unwatched(namespace: str, name: str) -> JsonObject | None:
    """No pod watch (`NodePods.watched_host`): every model host is read fresh."""
    return None
