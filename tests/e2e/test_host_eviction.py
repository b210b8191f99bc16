"""A kubectl-drain-style eviction of model hosts on the simulated cluster with the real processes:
a TritonModel with two replicas on two nodes and `minAvailable: 1`, a client sending requests
through its Service. Evicting the host on one node (policy/v1 Eviction, through the official
client) is let through; evicting the other's is refused with 429 while the first is not back;
the client's requests all succeed meanwhile. Once the binder has made the first host again and
it serves its replica, the second eviction is let through too."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import pytest

from common.contract import Keys
from common.hosted import host_name, serves_label
from sim.cluster import NodeSpec, SimCluster
from sim.demo.rollout import SteadyClient
from sim.demo.scenario import MODELS_DIR
from sim.processes import wait_until
from sim.service import Endpoints
from sim.triton import TritonInstall

NODES = (NodeSpec("gpu-a", "1xT4", real=True), NodeSpec("gpu-b", "1xT4", real=True))
NAMESPACE = "team-a"
MODEL = "add-one"
GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"
KEYS = Keys()


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    with SimCluster(
        tmp_path / "cluster", NODES, binders=1, webhook=True, tenant_code_namespaces=(NAMESPACE,)
    ) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


def _ready(custom: Any) -> int:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, MODEL)
    return int((obj.get("status") or {}).get("readyReplicas") or 0)


def _evict(core: Any, node: str) -> int:
    """kubectl drain's request for the host on `node`: the HTTP status of the answer."""
    name = host_name(node)
    body = kubernetes.client.V1Eviction(
        metadata=kubernetes.client.V1ObjectMeta(name=name, namespace=NAMESPACE)
    )
    try:
        core.create_namespaced_pod_eviction(name, NAMESPACE, body)
    except kubernetes.client.ApiException as e:
        return int(e.status)
    return 201


@pytest.mark.slow
@pytest.mark.triton
def test_evicting_hosts_keeps_a_models_min_available_served(cluster: SimCluster) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    uri = cluster.model_store.publish(MODEL, MODELS_DIR / "add_one", release="evicted")
    spec = {"storageUri": uri, "gpuMemory": "1Gi", "replicas": 2, "minAvailable": 1}
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TritonModel"}
    custom.create_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, {**body, "metadata": {"name": MODEL}, "spec": spec}
    )
    wait_until("both replicas ready", lambda: _ready(custom) == 2, 150)
    first, second = (node.name for node in NODES)
    with Endpoints(cluster.kube, NAMESPACE, f"{serves_label(KEYS, MODEL)}=true") as service:
        client = SteadyClient(service, model=MODEL)
        client.start()
        try:
            wait_until("a first answer", partial(client.since, 0.0), 30)
            # The budget allows one eviction once both hosts are Ready and serve.
            assert wait_until("the first eviction", lambda: _evict(core, first) == 201, 30)
            assert _evict(core, second) == 429, "the second host is the model's last"
            wait_until("the first host gone", lambda: _ready(custom) == 1, 30)
            assert _evict(core, second) == 429, "still the model's last"
            wait_until("the first host made again", lambda: _ready(custom) == 2, 150)
            assert wait_until("the second eviction", lambda: _evict(core, second) == 201, 30)
            wait_until("both replicas ready again", lambda: _ready(custom) == 2, 150)
        finally:
            client.stop()
    assert client.answers, "the client got no answer at all"
    assert client.failures == [], (
        f"{len(client.failures)} of {len(client.failures) + len(client.answers)} requests "
        f"failed, the first: {client.failures[:3]}"
    )
