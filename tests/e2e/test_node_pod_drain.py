"""A node pod replaced as a DaemonSet update replaces it, one node at a time, under a TritonModel
with two replicas on two nodes, and under a Deployment of two model pods on two nodes: clients
that keep their connections through the model's Service (REST keep-alive and a gRPC channel, as
the churn benchmark's do) get every request answered.

The replaced node pod's agent (SIGTERM) first takes the node's hosts out of their Services while
its Triton and gateway still answer: each replica there reads NodePodStopping, the binder removes
its host's `serves-` label, and the host's loader lists the model leaving, so its proxy closes
each client's connection after its next answer and the client reconnects to the other node. A
neighbour with one replica keeps its host in its Service until a stand-in replica of it on the
other node serves (the agent waits for that, up to --stop-drain-seconds), so its clients too get
every request answered.
A model pod whose Deployment has a pod Ready on another node leaves too: the gateway answers its
readiness not ready, its proxy closes each client's connection after its answer, and the kubelet
marks it unready.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from functools import partial
from typing import Any, cast

import kubernetes.client
import pytest

from common.hosted import host_name, loaded_prefix, serves_label
from sim.cluster import SimCluster
from sim.demo.rollout import deployment_manifest
from sim.demo.scenario import MODELS_DIR
from sim.processes import wait_until
from sim.service import ServiceProxy
from tests.e2e.callers import Client, Request
from tests.e2e.test_host_eviction import (
    GROUP,
    KEYS,
    MODEL,
    NAMESPACE,
    NODES,
    PLURAL,
    VERSION,
    cluster,
)

__all__ = ["cluster"]  # two real nodes and the namespace, as the eviction test's
SOLO = "solo"
HOSTNAME = "kubernetes.io/hostname"


def _ready(custom: Any, model: str = MODEL) -> int:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, model)
    return int((obj.get("status") or {}).get("readyReplicas") or 0)


def _settled(custom: Any, model: str) -> bool:
    """Whether the model has one replica, served (a stand-in, if it had one, drained)."""
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, model)
    status = obj.get("status") or {}
    return bool(status.get("replicas") == 1 and status.get("readyReplicas") == 1)


def _host_view(core: Any, node: str) -> tuple[dict[str, str], dict[str, str]]:
    """The host on `node`: each model's loaded condition reason, and each model's serves label."""
    host = core.read_namespaced_pod(host_name(node), NAMESPACE)
    prefix = loaded_prefix(KEYS)
    reasons = {
        str(c.type)[len(prefix) :].rpartition("_")[0]: str(c.reason)
        for c in host.status.conditions or []
        if str(c.type).startswith(prefix)
    }
    labels = {m: (host.metadata.labels or {}).get(serves_label(KEYS, m), "") for m in reasons}
    return reasons, labels


def _create(custom: Any, uri: str, name: str, replicas: int) -> None:
    spec = {"storageUri": uri, "gpuMemory": "1Gi", "replicas": replicas}
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TritonModel"}
    custom.create_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, {**body, "metadata": {"name": name}, "spec": spec}
    )


def _more_than(requests: list[Request], count: int) -> bool:
    return len(requests) > count


def _start(clients: list[Client]) -> None:
    """Start each client and wait for its first answer."""
    for client in clients:
        client.start()
    for client in clients:
        wait_until(f"a first {client.protocol} answer", client.answered.is_set, 60)


def _all_answered(requests: list[Request]) -> None:
    failed = [r for r in requests if not r.ok]
    assert failed == [], f"{len(failed)} of {len(requests)} failed, the first: {failed[:3]}"
    assert sum(r.ok for r in requests) > 100


def _listening(address: str) -> bool:
    try:
        socket.create_connection((address, 9000), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.triton
def test_replacing_node_pods_one_at_a_time_fails_no_request_of_a_two_replica_model(
    cluster: SimCluster,
) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    uri = cluster.model_store.publish(MODEL, MODELS_DIR / "add_one", release="drained")
    _create(custom, uri, MODEL, 2)
    # A neighbour with one replica: its host answers for it until a stand-in serves elsewhere.
    _create(custom, cluster.model_store.publish(SOLO, MODELS_DIR / "add_one"), SOLO, 1)
    wait_until("both replicas ready", lambda: _ready(custom) == 2, 150)
    wait_until(
        "the neighbour ready",
        lambda: _ready(custom, SOLO) == 1,
        150,
        lambda: str(custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, SOLO)),
    )
    address = core.read_namespaced_service(MODEL, NAMESPACE).spec.cluster_ip
    alone = core.read_namespaced_service(SOLO, NAMESPACE).spec.cluster_ip
    services = ServiceProxy(cluster.kube, period=0.2)
    services.start()
    wait_until("the Services listening", lambda: _listening(address) and _listening(alone), 30)
    requests: list[Request] = []
    solo_requests: list[Request] = []
    clients = [Client(MODEL, protocol, address, requests) for protocol in ("rest", "grpc")]
    clients += [Client(SOLO, protocol, alone, solo_requests) for protocol in ("rest", "grpc")]
    # While a node's replicas read NodePodStopping: (its serves labels of MODEL and SOLO).
    stopping: list[tuple[str, str]] = []
    try:
        _start(clients)
        for node in NODES:
            seen = threading.Event()

            def watch(node: str = node.name, seen: threading.Event = seen) -> None:
                while not seen.wait(0.05):
                    with contextlib.suppress(kubernetes.client.ApiException):
                        reasons, labels = _host_view(core, node)
                        if reasons.get(MODEL) == "NodePodStopping":
                            stopping.append((labels[MODEL], labels.get(SOLO, "-")))

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            cluster.replace_node_pod(node.name)
            seen.set()
            watcher.join(5)
            wait_until(f"both replicas ready after {node.name}", lambda: _ready(custom) == 2, 150)
            wait_until(
                f"the neighbour back to one replica after {node.name} (its stand-in gone)",
                lambda: _settled(custom, SOLO),
                150,
            )
            wait_until("answers after it", partial(_more_than, requests, len(requests) + 20), 30)
    finally:
        for client in clients:
            client.stop()
        services.stop()
    _all_answered(requests)
    _all_answered(solo_requests)
    # Each replaced node's replica read NodePodStopping, and its host left MODEL's Service; on
    # the neighbour's node its host left SOLO's too, once the stand-in served.
    assert any(model == "" for model, _ in stopping), stopping
    assert ("", "") in stopping, f"the neighbour's node: {stopping}"


def _loaded_reasons(core: Any, app: str) -> set[str]:
    """The reasons of the Deployment's pods' ModelLoaded conditions now."""
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=f"app={app}").items
    return {
        str(c.reason)
        for p in pods
        for c in p.status.conditions or []
        if c.type == KEYS.model_loaded
    }


def _ready_pods(core: Any, app: str) -> dict[str, str]:
    """The Deployment's pods Ready now, by name: each one's node."""
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=f"app={app}").items
    return {
        p.metadata.name: p.spec.node_name
        for p in pods
        if not p.metadata.deletion_timestamp
        and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
    }


@pytest.mark.slow
@pytest.mark.triton
def test_replacing_node_pods_one_at_a_time_fails_no_request_of_a_two_pod_deployment(
    cluster: SimCluster,
) -> None:
    """A Deployment of two model pods, one a node: the replaced node pod's agent has the gateway
    answer its pod's readiness not ready, so the pod's proxy closes each client's connection
    after its answer and the pod leaves the Service before its node's Triton and gateway go; a
    Deployment of one pod would keep it there (nothing else would answer)."""
    assert cluster.model_store is not None and cluster.kube is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    apps = cast(Any, kubernetes.client.AppsV1Api(cluster.kube))
    name = "pods"
    manifest = deployment_manifest(
        cluster.model_store.publish(name, MODELS_DIR / "add_one"), replicas=2, name=name
    )
    manifest["spec"]["template"]["spec"]["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": name}}, "topologyKey": HOSTNAME}
            ]
        }
    }
    apps.create_namespaced_deployment(NAMESPACE, manifest)
    ports = [
        {"name": "http", "port": 9000, "targetPort": "http"},
        {"name": "grpc", "port": 9001, "targetPort": "grpc"},
    ]
    service = {"metadata": {"name": name}, "spec": {"selector": {"app": name}, "ports": ports}}
    core.create_namespaced_service(NAMESPACE, service)
    wait_until(
        "both pods Ready on two nodes",
        lambda: len(set(_ready_pods(core, name).values())) == 2,
        180,
        lambda: str(core.list_namespaced_pod(NAMESPACE, label_selector=f"app={name}")),
    )
    address = core.read_namespaced_service(name, NAMESPACE).spec.cluster_ip
    services = ServiceProxy(cluster.kube, period=0.2)
    services.start()
    wait_until("the Service listening", lambda: _listening(address), 30)
    requests: list[Request] = []
    clients = [Client(name, protocol, address, requests) for protocol in ("rest", "grpc")]
    # The pods seen Ready while each node pod was replaced, by node.
    seen_ready: list[set[str]] = []
    reasons: set[str] = set()
    try:
        _start(clients)
        for node in NODES:
            done = threading.Event()

            def watch(done: threading.Event = done) -> None:
                while not done.wait(0.1):
                    with contextlib.suppress(kubernetes.client.ApiException):
                        seen_ready.append(set(_ready_pods(core, name).values()))
                        reasons.update(_loaded_reasons(core, name))

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            cluster.replace_node_pod(node.name)
            done.set()
            watcher.join(5)
            wait_until(
                f"both pods Ready after {node.name}",
                lambda: len(set(_ready_pods(core, name).values())) == 2,
                150,
            )
            wait_until("answers after it", partial(_more_than, requests, len(requests) + 20), 30)
    finally:
        for client in clients:
            client.stop()
        services.stop()
    _all_answered(requests)
    # Each replaced node's pod left the Service while its node pod stopped: the other alone
    # was Ready for a while, for each node.
    for node in NODES:
        others = {n.name for n in NODES} - {node.name}
        assert others in seen_ready, f"{node.name}'s pod never left the Service: {seen_ready}"
    # And each said why while it left.
    assert "NodePodStopping" in reasons, reasons
