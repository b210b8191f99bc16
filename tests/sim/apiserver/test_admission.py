"""The simulated API server runs mutating admission webhooks as kube-apiserver does: over HTTPS
trusting only the caBundle, for the rules, namespaceSelector and objectSelector that match, with
the JSONPatch applied before validation, refusals in upstream's words, and failurePolicy deciding
what an unreachable webhook means. Driven through the official client; the webhook here is a
small recording HTTPS server."""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from sim.apiserver.server import RunningApiServer
from sim.triton import free_port
from tests.webhook.test_server import make_certificate

Respond = Callable[[dict[str, Any]], dict[str, Any]]


class RecordingWebhook:
    """An HTTPS AdmissionReview endpoint that records requests and answers with `respond`."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.reviews: list[dict[str, Any]] = []
        self.respond: Respond = lambda request: {"allowed": True}
        webhook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                webhook.reviews.append(review)
                answer = {"uid": review["request"]["uid"], **webhook.respond(review["request"])}
                body = json.dumps(
                    {
                        "apiVersion": "admission.k8s.io/v1",
                        "kind": "AdmissionReview",
                        "response": answer,
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/mutate"
        self.ca_bundle = base64.b64encode(cert.read_bytes()).decode()
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)


@pytest.fixture
def webhook(tmp_path: Path) -> Iterator[RecordingWebhook]:
    cert, key = make_certificate(tmp_path)
    running = RecordingWebhook(cert, key)
    try:
        yield running
    finally:
        running.close()


@pytest.fixture
def admission(kube_api: kubernetes.client.ApiClient) -> Any:
    return kubernetes.client.AdmissionregistrationV1Api(kube_api)


@pytest.fixture
def core(kube_api: kubernetes.client.ApiClient) -> Any:
    return kubernetes.client.CoreV1Api(kube_api)


def configuration(
    webhook: RecordingWebhook, *, url: str | None = None, ca_bundle: str | None = None, **extra: Any
) -> dict[str, Any]:
    hook = {
        "name": "pods.example.com",
        "clientConfig": {"url": url or webhook.url, "caBundle": ca_bundle or webhook.ca_bundle},
        "rules": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
            }
        ],
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 5,
        **extra,
    }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "test"},
        "webhooks": [hook],
    }


def _pod(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


def _label_patch(request: dict[str, Any]) -> dict[str, Any]:
    operations = [{"op": "add", "path": "/metadata/labels/mutated", "value": "yes"}]
    return {
        "allowed": True,
        "patchType": "JSONPatch",
        "patch": base64.b64encode(json.dumps(operations).encode()).decode(),
    }


def test_a_matching_webhook_mutates_the_pod_it_is_sent(
    webhook: RecordingWebhook, admission: Any, core: Any
) -> None:
    webhook.respond = _label_patch
    admission.create_mutating_webhook_configuration(configuration(webhook))
    created = core.create_namespaced_pod("default", _pod("p"))
    assert created.metadata.labels == {"mutated": "yes"}
    assert core.read_namespaced_pod("p", "default").metadata.labels == {"mutated": "yes"}
    [review] = webhook.reviews
    request = review["request"]
    assert review["apiVersion"] == "admission.k8s.io/v1" and request["operation"] == "CREATE"
    assert request["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert request["namespace"] == "default" and request["name"] == "p"
    # The caller, here without credentials: the cluster admin.
    assert request["userInfo"] == {
        "username": "kubernetes-admin",
        "groups": ["system:masters", "system:authenticated"],
    }
    # The webhook sees the defaulted object, as upstream's mutating admission does.
    assert request["object"]["spec"]["schedulerName"] == "default-scheduler"
    # Other kinds and operations are not sent.
    core.create_namespace({"metadata": {"name": "other"}})
    core.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"a": "b"}}})
    assert len(webhook.reviews) == 1


def test_selectors_choose_which_pods_are_sent(
    webhook: RecordingWebhook, admission: Any, core: Any
) -> None:
    admission.create_mutating_webhook_configuration(
        configuration(
            webhook,
            namespaceSelector={"matchLabels": {"team": "a"}},
            objectSelector={
                "matchExpressions": [{"key": "role", "operator": "In", "values": ["model"]}]
            },
        )
    )
    core.create_namespace({"metadata": {"name": "team-a", "labels": {"team": "a"}}})
    core.create_namespace({"metadata": {"name": "team-b", "labels": {"team": "b"}}})
    core.create_namespaced_pod("team-a", _pod("sent", {"role": "model"}))
    core.create_namespaced_pod("team-a", _pod("not-a-model", {"role": "web"}))
    core.create_namespaced_pod("team-b", _pod("other-team", {"role": "model"}))
    assert [r["request"]["name"] for r in webhook.reviews] == ["sent"]


def test_a_refusal_fails_the_create_in_upstreams_words(
    webhook: RecordingWebhook, admission: Any, core: Any
) -> None:
    webhook.respond = lambda request: {
        "allowed": False,
        "status": {"code": 400, "message": "annotation x is missing; write x: 1Gi"},
    }
    admission.create_mutating_webhook_configuration(configuration(webhook))
    with pytest.raises(kubernetes.client.ApiException) as e:
        core.create_namespaced_pod("default", _pod("refused"))
    assert e.value.status == 400
    status = json.loads(e.value.body or "{}")
    assert status["message"] == (
        'admission webhook "pods.example.com" denied the request: annotation x is missing; '
        "write x: 1Gi"
    )
    assert core.list_namespaced_pod("default").items == []


@pytest.mark.parametrize("policy", ["Fail", "Ignore"])
def test_failure_policy_decides_when_the_webhook_cannot_be_called(
    webhook: RecordingWebhook, admission: Any, core: Any, tmp_path: Path, policy: str
) -> None:
    dead = f"https://127.0.0.1:{free_port()}/mutate"
    (tmp_path / "other").mkdir()
    other_ca, _ = make_certificate(tmp_path / "other")
    untrusted = base64.b64encode(other_ca.read_bytes()).decode()
    for name, config in [
        ("unreachable", configuration(webhook, url=dead, failurePolicy=policy)),
        ("untrusted", configuration(webhook, ca_bundle=untrusted, failurePolicy=policy)),
    ]:
        admission.create_mutating_webhook_configuration(config)
        try:
            if policy == "Ignore":
                assert core.create_namespaced_pod("default", _pod(name)).metadata.name == name
            else:
                with pytest.raises(kubernetes.client.ApiException) as e:
                    core.create_namespaced_pod("default", _pod(name))
                assert e.value.status == 500
                message = json.loads(e.value.body or "{}")["message"]
                assert message.startswith(
                    'Internal error occurred: failed calling webhook "pods.example.com": '
                    "failed to call webhook: Post"
                ), message
        finally:
            admission.delete_mutating_webhook_configuration("test")
    # The untrusted call reached the webhook's port, but TLS refused it before any review.
    assert webhook.reviews == []


def test_the_configuration_is_served_like_any_cluster_scoped_kind(
    webhook: RecordingWebhook, admission: Any, apiserver: RunningApiServer
) -> None:
    admission.create_mutating_webhook_configuration(configuration(webhook))
    listed = admission.list_mutating_webhook_configuration()
    assert [c.metadata.name for c in listed.items] == ["test"]
    assert listed.items[0].webhooks[0].client_config.url == webhook.url


def test_a_dry_run_is_sent_as_one_to_webhooks_without_side_effects(
    webhook: RecordingWebhook, admission: Any, core: Any
) -> None:
    """A dry-run create reaches a webhook with `dryRun: true` and its patch shows in the answer,
    nothing is stored; a webhook whose sideEffects are not None fails the dry run (400)."""
    webhook.respond = _label_patch
    admission.create_mutating_webhook_configuration(configuration(webhook))
    answered = core.create_namespaced_pod("default", _pod("p"), dry_run="All")
    assert answered.metadata.labels == {"mutated": "yes"}
    assert core.list_namespaced_pod("default").items == []
    core.create_namespaced_pod("default", _pod("q"))
    assert [review["request"]["dryRun"] for review in webhook.reviews] == [True, False]
    admission.delete_mutating_webhook_configuration("test")
    admission.create_mutating_webhook_configuration(configuration(webhook, sideEffects="Some"))
    with pytest.raises(kubernetes.client.ApiException) as raised:
        core.create_namespaced_pod("default", _pod("r"), dry_run="All")
    assert raised.value.status == 400
    assert json.loads(raised.value.body or "{}")["message"] == (
        'admission webhook "pods.example.com" does not support dry run'
    )
