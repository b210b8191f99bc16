"""A TritonModel of three replicas on a one-node, four-GPU cluster (a real Triton, agent, gateway,
kubelet and binder), with a client sending requests through its Service: the three replicas
share the node's one host, each loaded in Triton under a private name of its own, and the
Service reaches the host. Rolled to new files, a surge replica joins them on the same node before
an old one drains, one at a time; not one request fails, and the answers move to the new files'.
Two replicas on the node both serve: the gateway spreads the host's requests over them, as
Triton's own statistics of each private name show.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import pytest

from common.hosted import serves_label
from sim.cluster import NodeSpec, SimCluster
from sim.demo.rollout import SteadyClient, new_release
from sim.demo.scenario import MODELS_DIR
from sim.processes import wait_until
from sim.service import Endpoints
from sim.triton import TritonInstall, TritonServer
from tests.e2e.test_tritonmodel_two_nodes import (
    GROUP,
    KEYS,
    MODEL,
    NEW,
    OLD,
    PLURAL,
    VERSION,
    _infer,
)

NODE = NodeSpec("gpu-a", "4xT4", real=True)
NAMESPACE = "team-a"


@pytest.fixture
def cluster(
    tmp_path: Path, triton_install: TritonInstall, request: pytest.FixtureRequest
) -> Iterator[SimCluster]:
    # The test's model is Python (tenant code): the team is let run it. A test may ask for a
    # masquerading network (its pods' connections to the node arrive from the node's address).
    with SimCluster(
        tmp_path / "cluster",
        (NODE,),
        binders=1,
        webhook=True,
        tenant_code_namespaces=(NAMESPACE,),
        masquerade=getattr(request, "param", False),
    ) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


def _status(custom: Any) -> dict[str, Any]:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, MODEL)
    found: dict[str, Any] = obj.get("status") or {}
    return found


def _loaded(triton: TritonServer) -> set[str]:
    """The models loaded in the node's Triton (read with the agent's admin header)."""
    request = urllib.request.Request(
        f"http://{triton.http_url}/v2/repository/index",
        data=b"{}",
        headers={"tritonshare-admin-key": "local"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        return {m["name"] for m in json.loads(answer.read()) if m.get("state") == "READY"}


def _successes(triton: TritonServer, name: str) -> int:
    """Triton's count of the model's successful inferences (read with the agent's admin
    header)."""
    request = urllib.request.Request(
        f"http://{triton.http_url}/v2/models/{name}/stats",
        headers={"tritonshare-admin-key": "local"},
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        [stats] = json.loads(answer.read())["model_stats"]
    return int(stats["inference_stats"]["success"]["count"])


@pytest.mark.slow
@pytest.mark.triton
@pytest.mark.parametrize(
    "cluster", [False, True], ids=["pod-addresses", "masquerading"], indirect=True
)
def test_two_replicas_on_one_node_both_serve_the_services_requests(cluster: SimCluster) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    uri = cluster.model_store.publish(MODEL, MODELS_DIR / "add_one")
    spec = {"storageUri": uri, "gpuMemory": "1Gi", "replicas": 2}
    body: dict[str, Any] = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TritonModel"}
    body |= {"metadata": {"name": MODEL}, "spec": spec}
    custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)
    triton = cluster.tritons[NODE.name]
    with Endpoints(cluster.kube, NAMESPACE, f"{serves_label(KEYS, MODEL)}=true") as service:
        wait_until("2 replicas ready", lambda: _status(custom).get("readyReplicas") == 2, 180)
        assert len({p["host"] for p in _status(custom)["placements"]}) == 1, "one host"
        private = sorted(n for n in _loaded(triton) if n.startswith(f"{MODEL}-"))
        assert len(private) == 2, private
        wait_until("the Service's endpoint", service.pick, 30)
        before = {name: _successes(triton, name) for name in private}
        served: dict[str, int] = {}

        def both_served() -> bool:
            for _ in range(10):
                address = service.pick()
                assert address is not None
                assert _infer(address) == OLD
            served.update({name: _successes(triton, name) - before[name] for name in private})
            return all(served.values())

        # Through the one host, one request at a time: each replica answers its share.
        wait_until("requests at both replicas", both_served, 60)

        def counted() -> bool:
            # Triton counts an inference once it has answered it: the last may lag its answer.
            served.update({name: _successes(triton, name) - before[name] for name in private})
            return sum(served.values()) >= 10

        wait_until("Triton's statistics counting every request", counted, 10)
    if cluster.masquerade:
        # The host's connections came from the node's address: the gateway knew it by its key.
        [log] = cluster.workdir.rglob(f"{NAMESPACE}_*/logs/proxy.log")
        assert "knows this pod by its caller key" in log.read_text()


@pytest.mark.slow
@pytest.mark.triton
def test_three_replicas_on_one_node_serve_and_roll_in_place_without_a_failed_request(
    cluster: SimCluster, tmp_path: Path
) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    uri = cluster.model_store.publish(MODEL, MODELS_DIR / "add_one")
    spec = {"storageUri": uri, "gpuMemory": "1Gi", "replicas": 3}
    body: dict[str, Any] = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TritonModel"}
    body |= {"metadata": {"name": MODEL}, "spec": spec}
    custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)
    with Endpoints(cluster.kube, NAMESPACE, f"{serves_label(KEYS, MODEL)}=true") as service:
        wait_until("3 replicas ready", lambda: _status(custom).get("readyReplicas") == 3, 180)
        placements = _status(custom)["placements"]
        assert {p["node"] for p in placements} == {NODE.name}
        assert len({p["host"] for p in placements}) == 1, "one host serves the three"
        private = _loaded(cluster.tritons[NODE.name])
        assert len([n for n in private if n.startswith(f"{MODEL}-")]) == 3, private
        wait_until("the Service's endpoint", service.pick, 30)

        client = SteadyClient(service, model=MODEL, interval=0.1)
        client.start()
        try:
            wait_until("answers", lambda: OLD in client.since(time.monotonic() - 60), 30)
            rolled_at = time.monotonic()
            new_uri = cluster.model_store.publish(
                MODEL, new_release(MODELS_DIR / "add_one", tmp_path / "v2"), release="v2"
            )
            custom.patch_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, PLURAL, MODEL, {"spec": {"storageUri": new_uri}}
            )

            def rolled() -> bool:
                status = _status(custom)
                reasons = {c["type"]: c.get("reason") for c in status.get("conditions") or []}
                return (
                    reasons.get("Progressing") == "NewFilesServed"
                    and status.get("readyReplicas") == 3
                    and [p["storageUri"] for p in status["placements"]] == [new_uri] * 3
                )

            wait_until("the roll complete", rolled, 240)
            done = time.monotonic()
            wait_until("a new answer", lambda: NEW in client.since(done), 30)
        finally:
            client.stop()
    assert [f for f in client.failures if f[0] >= rolled_at] == [], client.failures[:5]
    assert client.failures == [], client.failures[:5]
    events = core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={MODEL}")
    reasons = [e.reason for e in events.items]
    assert "RollingWithoutSurge" not in reasons and "NewFilesNotServed" not in reasons, reasons
