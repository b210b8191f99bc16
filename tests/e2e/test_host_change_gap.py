"""A host change on the simulated cluster with the real processes: a steady TritonModel answers
every request through its Service while a TritonModel whose files need a `storageSecret` its
namespace's host does not mount joins the namespace on the same node: the new model gets a host
of its own, which alone mounts the Secret, and the steady model's host is never replaced.

The client sends one request every 50 ms through the Service's ready endpoints, as a client of
the model does, from before the new TritonModel is applied until it is served; every failure
(no ready endpoint, a refused connection, an error answer) is counted. The bar is a Deployment's
rolling update with `maxUnavailable: 0`: none."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import pytest

from common.contract import Keys
from common.hosted import host_name, serves_label
from sim.cluster import SimCluster
from sim.demo.rollout import SteadyClient
from sim.demo.scenario import MODELS_DIR, NODES
from sim.processes import wait_until
from sim.service import Endpoints
from sim.triton import TritonInstall

NODE = NODES[0]
NAMESPACE = "team-a"
STEADY, PRIVATE = "add-one", "private-one"
GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"
TOKEN = "team-a-only"
KEYS = Keys()


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    with SimCluster(
        tmp_path / "cluster", [NODE], binders=1, webhook=True, tenant_code_namespaces=(NAMESPACE,)
    ) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


def _model(name: str, uri: str, secret: str = "") -> dict[str, Any]:
    spec = {"storageUri": uri, "gpuMemory": "1Gi", "replicas": 1, "maxConcurrency": 4}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TritonModel",
        "metadata": {"name": name},
        "spec": {**spec, **({"storageSecret": secret} if secret else {})},
    }


def _ready_replicas(custom: Any, name: str) -> int:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
    return int((obj.get("status") or {}).get("readyReplicas") or 0)


def _hosts(core: Any) -> list[Any]:
    selector = f"{KEYS.prefix}model-host=true"
    return list(core.list_namespaced_pod(NAMESPACE, label_selector=selector).items)


def _secrets(host: Any) -> list[str]:
    """The storage Secrets the host mounts."""
    return [
        source.secret.name
        for volume in host.spec.volumes
        if volume.projected is not None
        for source in volume.projected.sources
        if source.secret is not None
    ]


@pytest.mark.slow
@pytest.mark.triton
def test_a_model_answers_every_request_while_a_model_with_a_storage_secret_joins_its_host(
    cluster: SimCluster,
) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    store = cluster.model_store
    steady = store.publish(STEADY, MODELS_DIR / "add_one", release="steady")
    custom.create_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, _model(STEADY, steady)
    )
    wait_until("the steady model ready", partial(_ready_replicas, custom, STEADY), 150)
    [steady_host] = _hosts(core)

    store.protect("private", TOKEN)
    private = store.publish(PRIVATE, MODELS_DIR / "add_one", release="private")
    headers = json.dumps({"Authorization": f"Bearer {TOKEN}"})
    credential = {"https-host": "127.0.0.1", "headers": headers}
    core.create_namespaced_secret(
        NAMESPACE, {"metadata": {"name": "creds"}, "stringData": credential}
    )
    with Endpoints(cluster.kube, NAMESPACE, f"{serves_label(KEYS, STEADY)}=true") as service:
        client = SteadyClient(service, model=STEADY)
        client.start()
        try:
            wait_until("a first answer", partial(client.since, 0.0), 30)
            custom.create_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, PLURAL, _model(PRIVATE, private, secret="creds")
            )
            wait_until(
                "the model with a storageSecret served",
                partial(_ready_replicas, custom, PRIVATE),
                150,
            )
            # Requests go on a little past it: a host that leaves late fails them then.
            done = time.monotonic()
            wait_until("answers after it", lambda: client.since(done + 2.0), 30)
        finally:
            client.stop()
    # The steady model's host was never replaced: the new model has a host of its own, which
    # alone mounts the Secret.
    hosts = {h.metadata.uid: h for h in _hosts(core)}
    assert steady_host.metadata.uid in hosts, "the steady model's host was replaced"
    [other] = [h for uid, h in hosts.items() if uid != steady_host.metadata.uid]
    assert other.metadata.name == host_name(NODE.name, "creds")
    assert _secrets(other) == ["creds"] and _secrets(hosts[steady_host.metadata.uid]) == []
    assert client.answers, "the client got no answer at all"
    assert client.failures == [], (
        f"{len(client.failures)} of {len(client.failures) + len(client.answers)} requests "
        f"failed, the first: {client.failures[:3]}"
    )
