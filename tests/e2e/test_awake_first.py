"""Awake first, end to end on two real nodes of the simulated cluster (each its own Triton,
agent, gateway and kubelet): an on-demand TritonModel with a replica on each node, both asleep,
has both hosts behind its Service; once one is woken, the other, still asleep, leaves the
Service (`serves-<model>: asleep`), so requests sent through the Service all go to the awake
one and none wakes the sleeping one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import pytest

from common.contract import Keys
from common.hosted import loaded_condition, serves_label
from sim.cluster import NodeSpec, SimCluster
from sim.demo.scenario import MODELS_DIR
from sim.processes import wait_until
from sim.service import Endpoints
from sim.triton import TritonInstall
from tests.e2e.test_on_demand import _count, _state
from tests.e2e.test_scale_to_zero import infer
from tests.e2e.test_tritonmodel_hosts import GROUP, PLURAL, VERSION

NODES = (NodeSpec("gpu-a", "1xT4", real=True), NodeSpec("gpu-b", "1xT4", real=True))
NAMESPACE = "team-a"
MODEL = "add-one"
KEYS = Keys()
SERVES = serves_label(KEYS, MODEL)
# The agent's loaded condition of any replica of the model on a host.
LOADED = loaded_condition(KEYS, MODEL, 0).removesuffix("0")


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    with SimCluster(
        tmp_path / "cluster", NODES, binders=1, webhook=True, tenant_code_namespaces=(NAMESPACE,)
    ) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


def _hosts(core: Any) -> dict[str, Any]:
    """The namespace's hosts by address."""
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=f"{KEYS.prefix}model-host=true")
    return {p.status.pod_ip: p for p in pods.items if p.status.pod_ip}


def _asleep(host: Any) -> bool:
    return any(
        c.type.startswith(LOADED) and c.reason == "ModelSleeping"
        for c in host.status.conditions or []
    )


@pytest.mark.slow
@pytest.mark.triton
def test_requests_avoid_a_sleeping_replica_while_an_awake_one_serves(cluster: SimCluster) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    uri = cluster.model_store.publish(MODEL, MODELS_DIR / "add_one")
    spec = {"storageUri": uri, "gpuMemory": "1Gi", "replicas": 2, "residency": "on-demand"}
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TritonModel"}
    custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        NAMESPACE,
        PLURAL,
        body | {"metadata": {"name": MODEL}, "spec": spec | {"idleSeconds": 3}},
    )
    with Endpoints(cluster.kube, NAMESPACE, f"{SERVES}=true") as service:
        # Both asleep: both behind the Service (a request may wake either).
        wait_until(
            "both replicas asleep",
            lambda: len(hosts := _hosts(core)) == 2 and all(map(_asleep, hosts.values())),
            240,
        )
        wait_until("both in the Service", lambda: len(service.addresses()) == 2, 30)
        awake, asleep = sorted(_hosts(core))

        # One woken (and kept busy): the other leaves the Service while it sleeps.
        def only_the_awake_one() -> bool:
            assert infer(awake) == [2.0, 3.0, 4.0]
            return _hosts(core)[asleep].metadata.labels.get(
                SERVES
            ) == "asleep" and service.addresses() == [awake]

        wait_until("the sleeping one out of the Service", only_the_awake_one, 60)
        for _ in range(20):
            address = service.pick()
            assert address == awake
            assert infer(address) == [2.0, 3.0, 4.0]
        assert _state(asleep) == "idle-unloaded"
        assert _count(asleep, "tritonshare_proxy_model_wakes", "ok") == 0, "never woken"
