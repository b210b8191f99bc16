"""A simulated cluster started with `admission_policies=True` runs the project's policies and
still places pods: the binder, calling with its service account's token, writes the GPU and the
proof of placement and binds a model pod that tolerates the GPU-node taint every simulated node
carries, while a tenant's pod created with spec.nodeName is refused at the API server and a model
pod without the toleration is not placed, with the reason."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from common.contract import Keys
from sim.cluster import NodeSpec, SimCluster
from sim.processes import wait_until
from tests.fixtures_sim import core_v1, status_of

TENANT = "team-a"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[SimCluster]:
    nodes = [NodeSpec("gpu-a", "1xT4")]
    # No tenant code (its pods load nothing): a cluster allowing some would dedicate its only
    # node to those namespaces, and TENANT's pods would go nowhere.
    with SimCluster(
        tmp_path / "cluster", nodes, binders=1, admission_policies=True, tenant_code_namespaces=()
    ) as running:
        assert running.missing == [], running.missing
        yield running


def _model_pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": {"tritonshare.io/model-id": name}},
        "spec": {
            "schedulerName": "tritonshare",
            "tolerations": [Keys().gpu_node_toleration()],
            "containers": [
                {
                    "name": "proxy",
                    "image": "tritonshare",
                    "resources": {"limits": {"tritonshare.io/gpu-mem": "1Gi"}},
                }
            ],
            **spec,
        },
    }


@pytest.mark.slow
def test_the_binder_places_pods_under_the_policies_and_tenants_cannot(cluster: SimCluster) -> None:
    assert cluster.apiserver is not None
    cluster.core.create_namespace({"metadata": {"name": TENANT}}, _preload_content=False)
    token = cluster.apiserver.service_account_token(TENANT, "default")
    configuration = kubernetes.client.Configuration()
    configuration.host = cluster.apiserver.url
    configuration.api_key = {"authorization": f"Bearer {token}"}
    with kubernetes.client.ApiClient(configuration) as api:
        tenant = core_v1(api)
        with pytest.raises(kubernetes.client.ApiException) as raised:
            tenant.create_namespaced_pod(TENANT, _model_pod("squat", nodeName="gpu-a"))
        assert raised.value.status == 422
        assert "may not be created with spec.nodeName" in status_of(raised.value)["message"]
        tenant.create_namespaced_pod(TENANT, _model_pod("m1"))

    def placed() -> dict[str, Any] | None:
        response = cluster.core.read_namespaced_pod("m1", TENANT, _preload_content=False)
        pod: dict[str, Any] = json.loads(response.data)
        bound = pod["spec"].get("nodeName") and "tritonshare.io/placement" in pod["metadata"].get(
            "annotations", {}
        )
        return pod if bound else None

    wait_until("the binder placing m1 under the admission policies", placed, 60)
    # A model pod that does not tolerate the GPU-node taint goes nowhere, and says why.
    bare = _model_pod("bare")
    del bare["spec"]["tolerations"]
    cluster.core.create_namespaced_pod(TENANT, bare, _preload_content=False)

    def unschedulable() -> str | None:
        conditions = cluster.core.read_namespaced_pod("bare", TENANT).status.conditions or []
        for condition in conditions:
            if condition.type == "PodScheduled" and condition.status == "False":
                return str(condition.message)
        return None

    message = wait_until("the binder reporting why bare is not placed", unschedulable, 60)
    assert "untolerated taint {tritonshare.io/gpu-node: true}" in message, message
    binder = "system:serviceaccount:tritonshare-system:tritonshare-binder"
    writes = {
        (r.verb, r.subresource, r.code)
        for r in cluster.apiserver.audit
        if r.user == binder and r.resource == "pods" and r.name == "m1"
    }
    assert writes == {("create", "binding", 201)}, writes  # the Binding carries the annotations
