"""An on-demand TritonModel end to end on the simulated cluster with the real processes: its
replica is loaded on the namespace's model host; idle for its `idleSeconds`, the host's proxy has
the agent unload it (files kept; the agent reports it ModelSleeping on the host) while the host
stays behind the model's Service and the model counts as ready; its next request, through the
Service's endpoint, wakes it and is answered."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import pytest

from common.contract import Keys
from common.hosted import (
    decode_hosted,
    hosted_models_annotation,
    loaded_condition,
    serves_label,
)
from common.tritonname import private_triton_name
from sim.cluster import SimCluster
from sim.demo.scenario import MODELS_DIR, NODES
from sim.processes import wait_until
from sim.service import Endpoints
from sim.triton import TritonInstall
from tests.e2e.test_on_demand import _count, _state
from tests.e2e.test_short_form import _loaded
from tests.e2e.test_tritonmodel_hosts import GROUP, PLURAL, VERSION, _answers, _host

NAMESPACE = "team-a"
MODEL = "add-one"
KEYS = Keys()


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    with SimCluster(
        tmp_path / "cluster",
        [NODES[0]],
        binders=1,
        webhook=True,
        tenant_code_namespaces=(NAMESPACE,),
    ) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


def _model(custom: Any) -> dict[str, Any]:
    return cast(
        dict[str, Any],
        custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, MODEL),
    )


def _loaded_reason(core: Any) -> str:
    host = _host(core, NAMESPACE)
    for condition in (host.status.conditions or []) if host is not None else []:
        if condition.type == loaded_condition(KEYS, MODEL, 0):
            return str(condition.reason)
    return ""


@pytest.mark.slow
@pytest.mark.triton
def test_an_on_demand_tritonmodel_sleeps_on_its_host_and_wakes_through_its_service(
    cluster: SimCluster,
) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    kube = cluster.kube
    core = cast(Any, kubernetes.client.CoreV1Api(kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    uri = cluster.model_store.publish(MODEL, MODELS_DIR / "add_one")
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TritonModel",
        "metadata": {"name": MODEL},
        "spec": {
            "storageUri": uri,
            "gpuMemory": "1Gi",
            "replicas": 1,
            "residency": "on-demand",
            "idleSeconds": 2,
        },
    }
    custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)

    def ready() -> int:
        return int((_model(custom).get("status") or {}).get("readyReplicas") or 0)

    wait_until("the replica ready", ready, 150)
    host = _host(core, NAMESPACE)
    [replica] = decode_hosted(host.metadata.annotations[hosted_models_annotation(KEYS)])
    private = private_triton_name(NAMESPACE, MODEL, replica.replica_uid)
    with Endpoints(kube, NAMESPACE, f"{serves_label(KEYS, MODEL)}=true") as service:
        address = wait_until("the Service's endpoint", service.pick, 30)
    assert address == host.status.pod_ip

    # Idle for two seconds: asleep on the node, files kept, still behind its Service.
    wait_until("the replica asleep", lambda: _state(address) == "idle-unloaded", 60)
    assert private not in _loaded(cluster)
    wait_until("the agent reports it sleeping", lambda: _loaded_reason(core) == "ModelSleeping", 30)
    host = _host(core, NAMESPACE)
    assert host.metadata.labels[serves_label(KEYS, MODEL)] == "true"
    assert ready() == 1
    with Endpoints(kube, NAMESPACE, f"{serves_label(KEYS, MODEL)}=true") as service:
        assert wait_until("the endpoint, asleep", service.pick, 30) == address

    # Its next request wakes it (one load) and is answered, REST and then gRPC.
    assert _answers(address) == ([[2.0, 3.0, 4.0]], [[2.0, 3.0, 4.0]])
    assert _count(address, "tritonshare_proxy_model_wakes", "ok") >= 1
