"""What `kubectl apply -k deploy/example` creates besides the workload: ConfigMaps, Services,
NetworkPolicies and ServiceAccounts are stored as written (a ServiceAccount's token still works
for any account name), a Service gets a cluster IP from 127.2.0.0/16 on create (one no other
simulated cluster of the machine holds) and keeps it, and
`/openapi/v2` answers with a document without schemas."""

from __future__ import annotations

import ipaddress
import json
import secrets
import socket
import urllib.request
from typing import Any, cast

import pytest
from kubernetes import client

from sim.apiserver import RunningApiServer, start_in_thread
from sim.apiserver.services import SERVICE_RANGE
from tests.fixtures_sim import core_v1, status_of


def _service(name: str, **spec: Any) -> dict[str, Any]:
    ports = [{"name": "http", "port": 9000, "targetPort": "http"}]
    return {"metadata": {"name": name}, "spec": {"selector": {"app": name}, "ports": ports, **spec}}


def _address(obj: Any) -> ipaddress.IPv4Address:
    """A Service's cluster IP, of its JSON or of the client's object."""
    found = obj["spec"]["clusterIP"] if isinstance(obj, dict) else obj.spec.cluster_ip
    return ipaddress.IPv4Address(found)


def test_services_get_cluster_ips_of_their_own_and_keep_them(kube_api: client.ApiClient) -> None:
    core = core_v1(kube_api)
    first = json.loads(
        core.create_namespaced_service("default", _service("a"), _preload_content=False).data
    )
    second = json.loads(
        core.create_namespaced_service("default", _service("b"), _preload_content=False).data
    )
    # From a random start in the range, each its own.
    assert _address(first) in SERVICE_RANGE and _address(second) in SERVICE_RANGE
    assert first["spec"]["clusterIP"] != second["spec"]["clusterIP"]
    assert first["spec"]["type"] == "ClusterIP"
    assert first["spec"]["ports"][0]["protocol"] == "TCP"
    core.patch_namespaced_service("a", "default", {"metadata": {"labels": {"x": "y"}}})
    again = json.loads(core.read_namespaced_service("a", "default", _preload_content=False).data)
    assert again["spec"]["clusterIP"] == first["spec"]["clusterIP"]
    core.delete_namespaced_service("a", "default", _preload_content=False)
    third = json.loads(
        core.create_namespaced_service("default", _service("c"), _preload_content=False).data
    )
    assert _address(third) in SERVICE_RANGE
    assert third["spec"]["clusterIP"] != second["spec"]["clusterIP"]
    headless = core.create_namespaced_service("default", _service("h", clusterIP="None"))
    assert headless.spec.cluster_ip == "None"


def test_two_clusters_of_one_machine_never_share_a_service_address(
    kube_api: client.ApiClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another simulated cluster runs beside this one (as the tests' workers run them): its
    Services get addresses of their own, never one where a process listens on their port."""
    other = start_in_thread()
    try:
        other_api = other.api_client()
        try:
            mine = [
                core_v1(kube_api).create_namespaced_service("default", _service(f"s{i}"))
                for i in range(20)
            ]
            theirs = [
                core_v1(other_api).create_namespaced_service("default", _service(f"s{i}"))
                for i in range(20)
            ]
            assert len({s.spec.cluster_ip for s in mine + theirs}) == 40
            # A process listening on port 9000 where the next Service's address would be: it
            # is given another.
            start = 40_000 + secrets.randbelow(20_000)
            monkeypatch.setattr(secrets, "randbelow", lambda _: start)
            blocked = str(SERVICE_RANGE.network_address + 1 + start)
            with socket.create_server((blocked, 9000)):
                more = core_v1(other_api).create_namespaced_service("default", _service("more"))
            monkeypatch.undo()
            assert more.spec.cluster_ip != blocked
            assert _address(more) in SERVICE_RANGE
        finally:
            other_api.close()  # type: ignore[no-untyped-call]
    finally:
        other.stop()


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
