"""A TritonModel on two real nodes of the simulated cluster (each its own Triton, agent, gateway
and kubelet, on its own address), with a client sending requests through its Service: served with
one replica; under load, the HPA of its KEDA ScaledObject (the concurrency of its hosts' proxies,
scraped by a real Prometheus) scales it to 2 through the `scale` subresource, and it gets a host
on each node and both hosts in its Service; idle, the HPA scales it back to 1 and the other
node's replica unloads; rolled to new files, a surge replica on the free node serves them before
the old one drains. Not one request fails, and the answers move to the new files'."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import numpy as np
import pytest
import tritonclient.http as httpclient

from common.contract import Keys
from common.hosted import serves_label
from sim.cluster import NodeSpec, SimCluster
from sim.controllers.hpa import USER_AGENT, Autoscalers, Prometheus
from sim.demo import autoscale
from sim.demo.rollout import SteadyClient, new_release
from sim.demo.scenario import MODELS_DIR
from sim.processes import wait_until
from sim.service import Endpoints
from sim.triton import TritonInstall, TritonServer
from tests.conftest import require_executable

NODES = (NodeSpec("gpu-a", "1xT4", real=True), NodeSpec("gpu-b", "1xT4", real=True))
NAMESPACE = "team-a"
MODEL = "add-one"
DATA = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
OLD, NEW = [[2.0, 3.0, 4.0]], [[101.0, 102.0, 103.0]]
"""The answers to [1, 2, 3] of the first files (add 1) and of the new ones (add 100)."""
GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"
KEYS = Keys()
HPA = f"keda-hpa-{MODEL}"
REQUEST_SECONDS = 0.1
"""Each request keeps the model busy this long, so three back-to-back callers hold about three
requests at the proxies (the HPA asks for 2, its maximum), and the steady client, one request
every 0.2 s, about a third of one (the HPA asks for 1)."""


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    # The test's model is Python (tenant code): the team is let run it.
    with SimCluster(
        tmp_path / "cluster", NODES, binders=1, webhook=True, tenant_code_namespaces=(NAMESPACE,)
    ) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


def _status(custom: Any) -> dict[str, Any]:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, MODEL)
    found: dict[str, Any] = obj.get("status") or {}
    return found


def _rolled(custom: Any, generation: int) -> bool:
    status = _status(custom)
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    return (
        status.get("observedGeneration") == generation
        and (conditions.get("Progressing") or {}).get("reason") == "NewFilesServed"
        and status.get("readyReplicas") == 1
    )


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


def _served(client: SteadyClient) -> set[str]:
    """The addresses that have answered the client."""
    return {address for _, address, _ in list(client.answers)}


def _rescaled(core: Any) -> list[str]:
    """The messages of the HPA's SuccessfulRescale Events (in no particular order)."""
    events = core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={HPA}")
    return [e.message for e in events.items if e.reason == "SuccessfulRescale"]


@pytest.mark.slow
@pytest.mark.triton
def test_a_tritonmodel_autoscales_over_two_real_nodes_and_rolls_without_a_failed_request(
    cluster: SimCluster, tmp_path: Path
) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    assert cluster.apiserver is not None
    prometheus = require_executable("prometheus")
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    # Each real node on its own address, its agent and gateway on the same ports as the other's.
    assert [cluster.node_addresses[n.name] for n in NODES] == ["127.0.0.1", "127.0.0.2"]
    assert {g.address for g in cluster.gateways.values()} == {"127.0.0.1", "127.0.0.2"}
    assert len({(g.http, g.grpc) for g in cluster.gateways.values()}) == 1

    slow = autoscale.slow_model(MODELS_DIR / "add_one", tmp_path / "v1", REQUEST_SECONDS)
    uri = cluster.model_store.publish(MODEL, slow)
    spec = {"storageUri": uri, "gpuMemory": "1Gi", "replicas": 1, "maxConcurrency": 4}
    body: dict[str, Any] = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TritonModel"}
    body |= {"metadata": {"name": MODEL}, "spec": spec}
    custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)
    with Endpoints(cluster.kube, NAMESPACE, f"{serves_label(KEYS, MODEL)}=true") as service:
        wait_until("the replica ready", lambda: _status(custom).get("readyReplicas") == 1, 150)
        address = wait_until("the Service's endpoint", service.pick, 30)
        assert _infer(address) == OLD

        targets = tmp_path / "targets.json"
        client = SteadyClient(service, model=MODEL, interval=0.2)
        client.start()
        try:
            with (
                # Prometheus scrapes the namespace's hosts as a PodMonitor would.
                autoscale.ReplicaWatch(cluster.kube, NAMESPACE, MODEL, targets) as hosts_watch,
                autoscale.prometheus(prometheus, tmp_path, targets, "1s") as listen,
                contextlib.closing(cluster.apiserver.api_client()) as hpa_api,
                Autoscalers(hpa_api, Prometheus(listen), cluster.apiserver.clock.now, 1.0),
            ):
                scaled_object = autoscale.scaled_object(
                    NAMESPACE, 2, 1, "irate", name=MODEL, ref=autoscale.TRITONMODEL_REF
                )
                custom.create_namespaced_custom_object(
                    "keda.sh", "v1alpha1", NAMESPACE, "scaledobjects", scaled_object
                )
                load = autoscale.Load(service, hosts_watch, clients=3, model=MODEL)
                load.start()
                try:
                    # Under load, the HPA scales it to 2: a host on each node, both in the Service.
                    wait_until(
                        "2 replicas ready", lambda: _status(custom).get("readyReplicas") == 2, 120
                    )
                    hosts = wait_until(
                        "a host on each node", lambda: len(_hosts(core)) == 2 and _hosts(core), 30
                    )
                    assert {h.spec.node_name for h in hosts} == {n.name for n in NODES}
                    assert {h.status.host_ip for h in hosts} == {"127.0.0.1", "127.0.0.2"}
                    pod_ips = {h.status.pod_ip for h in hosts}
                    assert len(pod_ips) == 2, pod_ips
                    wait_until(
                        "both hosts in the Service", lambda: set(service.addresses()) == pod_ips, 30
                    )
                    wait_until("answers from both hosts", lambda: _served(client) == pod_ips, 30)
                finally:
                    load.stop()
                up = _rescaled(core)
                assert any(m.startswith("New size: 2;") and "above target" in m for m in up), up
                # Idle, the HPA scales it back to 1: the other node's replica leaves and unloads.
                wait_until("one host left", lambda: len(_hosts(core)) == 1, 90)
                wait_until("one host in the Service", lambda: len(service.addresses()) == 1, 30)
                down = _rescaled(core)
                assert "New size: 1; reason: All metrics below target" in down, down
            # Only the HPA scaled it, through the scale subresource.
            writes = [r for r in cluster.apiserver.audit.writes() if r.resource == PLURAL]
            scales = [r for r in writes if r.subresource == "scale"]
            assert len(scales) >= 2 and {r.user_agent for r in scales} == {USER_AGENT}, writes
            assert load.failures == [] and len(load.latencies) > 0, load.failures[:5]
            [kept] = service.addresses()
            [left] = [h.spec.node_name for h in hosts if h.status.pod_ip != kept]
            wait_until("the replica unloaded", lambda: not _loaded(cluster.tritons[left]), 90)
            unloaded = time.monotonic()
            wait_until("answers after the unload", lambda: client.since(unloaded), 30)

            # Rolled to new files: a surge replica on the free node, then the old one drains.
            rolled_at = time.monotonic()
            new_uri = cluster.model_store.publish(
                MODEL, new_release(MODELS_DIR / "add_one", tmp_path / "v2"), release="v2"
            )
            patched = custom.patch_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, PLURAL, MODEL, {"spec": {"storageUri": new_uri}}
            )
            generation = patched["metadata"]["generation"]
            wait_until("the roll complete", lambda: _rolled(custom, generation), 120)
            done = time.monotonic()
            wait_until("a new answer", lambda: NEW in client.since(done), 30)
        finally:
            client.stop()
    before_roll = [f for f in client.failures if f[0] < rolled_at]
    assert before_roll == [], before_roll[:5]
    answers = [answer for _, _, answer in client.answers]
    assert set(map(str, answers)) == {str(OLD), str(NEW)}
    assert answers[0] == OLD and answers[-1] == NEW
    assert OLD not in client.since(done), "the old files are gone once rolled"
    status = _status(custom)
    assert [p["storageUri"] for p in status["placements"]] == [new_uri]
    [host] = wait_until("the old host gone", lambda: len(_hosts(core)) == 1 and _hosts(core), 60)
    assert host.spec.node_name == left, "the surge replica took the free node"
    events = core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={MODEL}")
    reasons = [e.reason for e in events.items]
    assert "RollingWithoutSurge" not in reasons and "NewFilesNotServed" not in reasons, reasons
    # The old replica drains only once the surge's new host is Ready (its endpoint ready).
    during_roll = [f for f in client.failures if f[0] >= rolled_at]
    assert during_roll == [], during_roll[:5]
