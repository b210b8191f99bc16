"""A TritonModel on two real nodes of the simulated cluster (each its own Triton, agent, gateway
and kubelet, on its own address): served through its Service with one replica; scaled to 2
through the `scale` subresource, as an HPA does, it gets a host on each node and both hosts in
its Service; scaled back to 1 while clients keep sending requests through the Service (until
the other node's replica is unloaded, and after), not one request fails."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import numpy as np
import pytest
import tritonclient.http as httpclient

from common.contract import Keys
from common.hosted import serves_label
from sim.cluster import NodeSpec, SimCluster
from sim.demo.scenario import MODELS_DIR
from sim.processes import wait_until
from sim.service import Endpoints
from sim.triton import TritonInstall, TritonServer

NODES = (NodeSpec("gpu-a", "1xT4", real=True), NodeSpec("gpu-b", "1xT4", real=True))
NAMESPACE = "team-a"
MODEL = "add-one"
DATA = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
ANSWER = [[2.0, 3.0, 4.0]]
GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"
KEYS = Keys()


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    # The test's model is Python (tenant code): the team is let run it.
    with SimCluster(
        tmp_path / "cluster", NODES, binders=1, webhook=True, tenant_code_namespaces=(NAMESPACE,)
    ) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


def _ready_replicas(custom: Any) -> int:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, MODEL)
    return int((obj.get("status") or {}).get("readyReplicas") or 0)


def _hosts(core: Any) -> list[Any]:
    selector = f"{KEYS.prefix}model-host=true"
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def _loaded(triton: TritonServer) -> set[str]:
    """The models loaded in a node's Triton (read with the agent's admin header)."""
    request = urllib.request.Request(
        f"http://{triton.http_url}/v2/repository/index",
        data=b"{}",
        headers={"tritonshare-admin-key": "local"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        return {m["name"] for m in json.loads(answer.read()) if m.get("state") == "READY"}


def _infer(address: str) -> list[list[float]]:
    with httpclient.InferenceServerClient(f"{address}:9000", network_timeout=30) as http:
        tensor = httpclient.InferInput("INPUT0", list(DATA.shape), "FP32")
        tensor.set_data_from_numpy(DATA)
        return cast(list[list[float]], http.infer(MODEL, [tensor]).as_numpy("OUTPUT0").tolist())


@dataclass
class Clients:
    """Requests sent one after another through the Service (each to the endpoint kube-proxy
    picks) until stopped: how many were answered right, and every failure."""

    service: Endpoints
    answered: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            address = self.service.pick()
            if address is None:
                self.failures.append("no endpoint")
                self.stop.wait(0.05)
                continue
            try:
                answer = _infer(address)
            except Exception as e:  # a failed request, whatever its kind
                self.failures.append(f"{address}: {e}")
                continue
            if answer != ANSWER:
                self.failures.append(f"{address}: answered {answer}")
            else:
                self.answered[address] = self.answered.get(address, 0) + 1


@pytest.mark.slow
@pytest.mark.triton
def test_a_tritonmodel_scales_over_two_real_nodes_and_back_without_a_failed_request(
    cluster: SimCluster,
) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    # Each real node on its own address, its agent and gateway on the same ports as the other's.
    assert [cluster.node_addresses[n.name] for n in NODES] == ["127.0.0.1", "127.0.0.2"]
    assert {g.address for g in cluster.gateways.values()} == {"127.0.0.1", "127.0.0.2"}
    assert len({(g.http, g.grpc) for g in cluster.gateways.values()}) == 1

    uri = cluster.model_store.publish(MODEL, MODELS_DIR / "add_one")
    spec = {"storageUri": uri, "gpuMemory": "1Gi", "replicas": 1, "maxConcurrency": 4}
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TritonModel",
        "metadata": {"name": MODEL},
        "spec": spec,
    }
    custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)
    with Endpoints(cluster.kube, NAMESPACE, f"{serves_label(KEYS, MODEL)}=true") as service:
        wait_until("the replica ready", lambda: _ready_replicas(custom) == 1, 150)
        address = wait_until("the Service's endpoint", service.pick, 30)
        assert _infer(address) == ANSWER

        # Scaled to 2 through the scale subresource, as an HPA does: a host on each node.
        custom.patch_namespaced_custom_object_scale(
            GROUP, VERSION, NAMESPACE, PLURAL, MODEL, {"spec": {"replicas": 2}}
        )
        wait_until("2 replicas ready", lambda: _ready_replicas(custom) == 2, 120)
        hosts = wait_until(
            "a host on each node", lambda: len(_hosts(core)) == 2 and _hosts(core), 30
        )
        assert {h.spec.node_name for h in hosts} == {n.name for n in NODES}
        assert {h.status.host_ip for h in hosts} == {"127.0.0.1", "127.0.0.2"}
        pod_ips = {h.status.pod_ip for h in hosts}
        assert len(pod_ips) == 2, pod_ips
        wait_until("both hosts in the Service", lambda: set(service.addresses()) == pod_ips, 30)
        for pod_ip in pod_ips:
            assert _infer(pod_ip) == ANSWER, pod_ip

        # Scaled back to 1 with requests sent through the Service throughout.
        clients = Clients(service)
        sender = threading.Thread(target=clients.run, name="clients")
        sender.start()
        try:
            wait_until("requests to both hosts", lambda: len(clients.answered) == 2, 30)
            custom.patch_namespaced_custom_object_scale(
                GROUP, VERSION, NAMESPACE, PLURAL, MODEL, {"spec": {"replicas": 1}}
            )
            wait_until("one host left", lambda: len(_hosts(core)) == 1, 90)
            wait_until("one host in the Service", lambda: len(service.addresses()) == 1, 30)
            [kept] = service.addresses()
            [left] = [h.spec.node_name for h in hosts if h.status.pod_ip != kept]
            wait_until("the replica unloaded", lambda: not _loaded(cluster.tritons[left]), 90)
            after = clients.answered[kept]
            wait_until("requests after the unload", lambda: clients.answered[kept] > after, 30)
        finally:
            clients.stop.set()
            sender.join(60)
        assert clients.failures == [], clients.failures[:5]
        assert _ready_replicas(custom) == 1
