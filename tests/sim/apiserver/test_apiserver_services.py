"""What `kubectl apply -k deploy/example` creates besides the workload: ConfigMaps, Services,
NetworkPolicies and ServiceAccounts are stored as written (a ServiceAccount's token still works
for any account name), a Service gets a cluster IP from 127.2.0.0/16 on create and keeps it, and
`/openapi/v2` answers with a document without schemas."""

from __future__ import annotations

import json
import urllib.request
from typing import Any, cast

import pytest
from kubernetes import client

from sim.apiserver import RunningApiServer
from tests.fixtures_sim import core_v1, status_of


def _service(name: str, **spec: Any) -> dict[str, Any]:
    ports = [{"name": "http", "port": 9000, "targetPort": "http"}]
    return {"metadata": {"name": name}, "spec": {"selector": {"app": name}, "ports": ports, **spec}}


def test_services_get_cluster_ips_in_turn_and_keep_them(kube_api: client.ApiClient) -> None:
    core = core_v1(kube_api)
    first = json.loads(
        core.create_namespaced_service("default", _service("a"), _preload_content=False).data
    )
    second = json.loads(
        core.create_namespaced_service("default", _service("b"), _preload_content=False).data
    )
    assert (first["spec"]["clusterIP"], second["spec"]["clusterIP"]) == ("127.2.0.1", "127.2.0.2")
    assert first["spec"]["type"] == "ClusterIP"
    assert first["spec"]["ports"][0]["protocol"] == "TCP"
    core.patch_namespaced_service("a", "default", {"metadata": {"labels": {"x": "y"}}})
    again = json.loads(core.read_namespaced_service("a", "default", _preload_content=False).data)
    assert again["spec"]["clusterIP"] == "127.2.0.1"
    core.delete_namespaced_service("a", "default", _preload_content=False)
    third = json.loads(
        core.create_namespaced_service("default", _service("c"), _preload_content=False).data
    )
    assert third["spec"]["clusterIP"] == "127.2.0.1"  # freed by the delete
    headless = core.create_namespaced_service("default", _service("h", clusterIP="None"))
    assert headless.spec.cluster_ip == "None"


def test_config_maps_network_policies_and_service_accounts_are_stored(
    kube_api: client.ApiClient,
) -> None:
    core = core_v1(kube_api)
    data = {"config.pbtxt": "name: 'm'"}
    core.create_namespaced_config_map("default", {"metadata": {"name": "m"}, "data": data})
    assert core.read_namespaced_config_map("m", "default").data == data
    networking = cast(Any, client.NetworkingV1Api(kube_api))
    policy = {"metadata": {"name": "p"}, "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}
    networking.create_namespaced_network_policy("default", policy)
    assert networking.read_namespaced_network_policy("p", "default").spec.policy_types == [
        "Ingress"
    ]
    core.create_namespaced_service_account("default", {"metadata": {"name": "sa"}})
    assert [a.metadata.name for a in core.list_namespaced_service_account("default").items] == [
        "sa"
    ]
    with pytest.raises(client.ApiException) as error:
        core.create_namespaced_service_account("default", {"metadata": {"name": "sa"}})
    assert error.value.status == 409, status_of(error.value)
    request = {"spec": {"audiences": ["x"], "expirationSeconds": 600}}
    for account in ("sa", "never-created"):
        token = core.create_namespaced_service_account_token(account, "default", request)
        assert token.status.token


def test_openapi_v2_has_no_schemas(apiserver: RunningApiServer) -> None:
    protobuf = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
    with urllib.request.urlopen(
        urllib.request.Request(f"{apiserver.url}/openapi/v2", headers={"Accept": protobuf})
    ) as response:
        assert response.read() == b""  # protobuf's empty Document
    with urllib.request.urlopen(f"{apiserver.url}/openapi/v2") as response:
        assert json.loads(response.read())["paths"] == {}
