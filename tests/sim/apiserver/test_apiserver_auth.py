"""TokenRequest and TokenReview: bound tokens authenticate only while everything still holds."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from kubernetes import client

from sim.apiserver import RunningApiServer
from tests.fixtures_sim import authentication_v1, core_v1, status_of

AUDIENCE = "tritonshare-agent"
API_AUDIENCE = "https://kubernetes.default.svc.cluster.local"


def _make_pod(v1: Any, name: str, service_account: str = "default", node: str = "") -> Any:
    pod = v1.create_namespaced_pod(
        "default",
        {
            "metadata": {"name": name},
            "spec": {
                "serviceAccountName": service_account,
                "containers": [{"name": "main", "image": "busybox"}],
            },
        },
    )
    if node:
        binding = {"metadata": {"name": name}, "target": {"kind": "Node", "name": node}}
        v1.create_namespaced_pod_binding(name, "default", binding, _preload_content=False)
    return pod


def _request_token(v1: Any, pod: Any, audiences: list[str], seconds: int = 3600) -> Any:
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": audiences,
            "expirationSeconds": seconds,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.metadata.name,
                "uid": pod.metadata.uid,
            },
        },
    }
    return v1.create_namespaced_service_account_token(
        pod.spec.service_account_name, "default", request
    )


def _review(auth: Any, token: str, audiences: list[str] | None = None) -> Any:
    spec: dict[str, Any] = {"token": token}
    if audiences is not None:
        spec["audiences"] = audiences
    review = auth.create_token_review({"apiVersion": "authentication.k8s.io/v1", "spec": spec})
    return review.status


def test_token_request_and_review_of_a_bound_pod_token(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    auth = authentication_v1(kube_api)
    v1.create_node({"metadata": {"name": "gpu-1"}})
    pod = _make_pod(v1, "model-pod", service_account="model", node="gpu-1")
    answer = _request_token(v1, pod, [AUDIENCE])
    assert answer.spec.audiences == [AUDIENCE]
    assert answer.status.expiration_timestamp is not None
    token = answer.status.token
    status = _review(auth, token, [AUDIENCE, "other"])
    assert status.authenticated is True
    assert status.audiences == [AUDIENCE]
    assert status.user.username == "system:serviceaccount:default:model"
    assert status.user.uid
    assert "system:serviceaccounts:default" in status.user.groups
    assert status.user.extra["authentication.kubernetes.io/pod-name"] == ["model-pod"]
    assert status.user.extra["authentication.kubernetes.io/pod-uid"] == [pod.metadata.uid]
    assert status.user.extra["authentication.kubernetes.io/node-name"] == ["gpu-1"]
    # JWT-shaped, with the claims a real projected token carries.
    claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    assert claims["aud"] == [AUDIENCE]
    assert claims["kubernetes.io"]["pod"] == {"name": "model-pod", "uid": pod.metadata.uid}


def test_review_refuses_wrong_audience_and_api_audience(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    auth = authentication_v1(kube_api)
    token = _request_token(v1, _make_pod(v1, "p"), [AUDIENCE]).status.token
    wrong = _review(auth, token, ["someone-else"])
    assert wrong.authenticated is not True and "audience" in wrong.error
    # No audiences in the review means the API server's own, which agent tokens do not carry.
    assert _review(auth, token).authenticated is not True


def test_review_refuses_forged_and_tampered_tokens(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    auth = authentication_v1(kube_api)
    token = _request_token(v1, _make_pod(v1, "p"), [AUDIENCE]).status.token
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims["kubernetes.io"]["namespace"] = "kube-system"
    forged_payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    for forged in (f"{header}.{forged_payload}.{signature}", token[:-2] + "xx", "", "garbage"):
        status = _review(auth, forged, [AUDIENCE])
        assert status.authenticated is not True, forged
        assert status.error


def test_review_refuses_expired_tokens(apiserver: RunningApiServer) -> None:
    with apiserver.api_client() as api:
        v1 = core_v1(api)
        auth = authentication_v1(api)
        _make_pod(v1, "p")
        token = apiserver.mint_token("default", "p", expiration_seconds=600)
        assert _review(auth, token, [AUDIENCE]).authenticated is True
        apiserver.clock.advance(601)
        status = _review(auth, token, [AUDIENCE])
        assert status.authenticated is not True and "expired" in status.error


def test_review_refuses_tokens_of_deleted_or_replaced_pods(
    apiserver: RunningApiServer, kube_api: client.ApiClient
) -> None:
    v1 = core_v1(kube_api)
    auth = authentication_v1(kube_api)
    _make_pod(v1, "p")
    token = apiserver.mint_token("default", "p")
    v1.delete_namespaced_pod("p", "default", grace_period_seconds=0)
    assert _review(auth, token, [AUDIENCE]).authenticated is not True
    # A new pod with the same name has a new uid: the old token stays invalid.
    _make_pod(v1, "p")
    assert _review(auth, token, [AUDIENCE]).authenticated is not True
    assert _review(auth, apiserver.mint_token("default", "p"), [AUDIENCE]).authenticated is True


def test_token_request_errors(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    pod = _make_pod(v1, "p")
    with pytest.raises(client.ApiException) as raised:
        _request_token(v1, pod, [AUDIENCE], seconds=60)
    assert raised.value.status == 422
    assert "less than 10 minutes" in status_of(raised.value)["message"]
    pod.metadata.uid = "stale-uid"
    with pytest.raises(client.ApiException) as raised:
        _request_token(v1, pod, [AUDIENCE])
    assert raised.value.status == 409
    pod.metadata.name = "ghost"
    with pytest.raises(client.ApiException) as raised:
        _request_token(v1, pod, [AUDIENCE])
    assert raised.value.status == 404
    other = _make_pod(v1, "q")
    other.spec.service_account_name = "not-the-pods-account"
    with pytest.raises(client.ApiException) as raised:
        _request_token(v1, other, [AUDIENCE])
    assert raised.value.status == 400


def test_mint_token_needs_the_pod(apiserver: RunningApiServer) -> None:
    with pytest.raises(LookupError, match="does not exist"):
        apiserver.mint_token("default", "ghost")


def _as(apiserver: RunningApiServer, token: str) -> client.ApiClient:
    configuration = client.Configuration()
    configuration.host = apiserver.url
    configuration.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(configuration)


def test_audit_names_the_service_account_of_a_bearer_token(
    apiserver: RunningApiServer, kube_api: client.ApiClient
) -> None:
    _make_pod(core_v1(kube_api), "p", service_account="agent")
    token = apiserver.mint_token("default", "p", audience=API_AUDIENCE)
    with _as(apiserver, token) as api:
        core_v1(api).list_node()
    last = apiserver.audit[-1]
    assert (last.verb, last.resource, last.user) == (
        "list",
        "nodes",
        "system:serviceaccount:default:agent",
    )


def test_credentials_the_api_server_does_not_accept_get_401(
    apiserver: RunningApiServer, kube_api: client.ApiClient
) -> None:
    """As upstream: a token for another audience (the agent's), an expired one, one whose pod is
    gone and one this server never minted are refused before anything else happens."""
    v1 = core_v1(kube_api)
    _make_pod(v1, "p", service_account="agent")
    for_the_agent = apiserver.mint_token("default", "p")
    bound_to_p = apiserver.mint_token("default", "p", audience=API_AUDIENCE)
    unbound = apiserver.service_account_token("default", "agent", expiration_seconds=600)
    for token in (for_the_agent, "not-a-token"):
        with _as(apiserver, token) as api, pytest.raises(client.ApiException) as raised:
            core_v1(api).list_node()
        assert raised.value.status == 401
        assert status_of(raised.value)["reason"] == "Unauthorized"
    assert apiserver.audit[-1].code == 401
    v1.delete_namespaced_pod("p", "default")
    with _as(apiserver, bound_to_p) as api, pytest.raises(client.ApiException) as raised:
        core_v1(api).list_node()
    assert raised.value.status == 401
    with _as(apiserver, unbound) as api:
        core_v1(api).list_node()
        apiserver.clock.advance(601)
        with pytest.raises(client.ApiException) as raised:
            core_v1(api).list_node()
    assert raised.value.status == 401


def test_kubeconfig_with_a_service_account_token_names_the_caller_in_the_audit(
    apiserver: RunningApiServer, tmp_path: Path
) -> None:
    token = apiserver.service_account_token("tritonshare-system", "tritonshare-binder")
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig", token=token)
    configuration = client.Configuration()
    kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig), client_configuration=configuration
    )
    with client.ApiClient(configuration) as api:
        core_v1(api).list_node()
        # The same token passes a TokenReview for the API server's own audience.
        assert _review(authentication_v1(api), token).authenticated is True
    users = {(r.verb, r.resource, r.user) for r in apiserver.audit}
    assert ("list", "nodes", "system:serviceaccount:tritonshare-system:tritonshare-binder") in users
