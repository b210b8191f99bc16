"""The simulated API server refuses at create what a real one refuses in a pod's resources: a
malformed quantity (at decoding, 400) and extended resources that are not whole numbers, have a
request without a limit, or a request that differs from the limit (at validation, 422)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from tests.fixtures_sim import core_v1, status_of

MEM = "tritonshare.io/gpu-mem"


def _pod(name: str, resources: dict[str, Any]) -> dict[str, Any]:
    container = {"name": "proxy", "image": "tritonshare", "resources": resources}
    return {"metadata": {"name": name}, "spec": {"containers": [container]}}


def _refused(api: client.ApiClient, resources: dict[str, Any]) -> tuple[int, str]:
    with pytest.raises(client.ApiException) as error:
        core_v1(api).create_namespaced_pod("default", _pod("p", resources))
    return int(error.value.status), str(status_of(error.value).get("message", ""))


@pytest.mark.parametrize("value", ["lots", "2Gb", "1.5.5Gi", "--1"])
def test_a_malformed_quantity_is_refused_at_decoding(
    kube_api: client.ApiClient, value: str
) -> None:
    status, message = _refused(kube_api, {"limits": {MEM: value}})
    assert status == 400
    assert message.startswith('Pod in version "v1" cannot be handled as a Pod: quantities must')


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        ({"limits": {MEM: "1500m"}}, 'limits[tritonshare.io/gpu-mem]: Invalid value: "1500m": '
         "must be an integer"),
        ({"limits": {MEM: "-1Gi"}}, "must be greater than or equal to 0"),
        ({"requests": {MEM: "1Gi"}}, "Limit must be set for non overcommitable resources"),
        ({"limits": {MEM: "1Gi"}, "requests": {MEM: "2Gi"}},
         'requests: Invalid value: "2Gi": must be equal to tritonshare.io/gpu-mem limit of 1Gi'),
    ],
    ids=["fraction", "negative", "request-without-limit", "request-differs"],
)  # fmt: skip
def test_extended_resources_are_validated_as_kube_apiserver_does(
    kube_api: client.ApiClient, resources: dict[str, Any], message: str
) -> None:
    status, text = _refused(kube_api, resources)
    assert status == 422
    assert message in text


def test_what_a_real_server_accepts_is_accepted(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    v1.create_namespaced_pod("default", _pod("limit-only", {"limits": {MEM: "2Gi"}}))
    equal = {"limits": {MEM: "1500Mi"}, "requests": {MEM: "1500Mi"}}
    v1.create_namespaced_pod("default", _pod("equal", equal))
    # Native resources may be overcommitted and fractional.
    native = {"limits": {"cpu": "1500m", "memory": "2Gi"}, "requests": {"cpu": "250m"}}
    v1.create_namespaced_pod("default", _pod("native", native))
    assert {p.metadata.name for p in v1.list_namespaced_pod("default").items} == {
        "limit-only",
        "equal",
        "native",
    }
