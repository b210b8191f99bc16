"""The webhook as the chart deploys it, end to end: `python -m webhook` runs with the arguments of
the chart's Deployment, the simulated API server calls it through the chart's
MutatingWebhookConfiguration (its rules, selectors and failure policy; only the address and CA
are this test's), and pods created with the official client come back complete, or are refused
with the webhook's message."""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml

from common import modelpod
from sim import admission_webhook
from sim.apiserver import RunningApiServer
from sim.controllers.manager import ControllerManager
from sim.processes import wait_until
from sim.triton import free_port
from tests.deploy.rendering import render_chart
from tests.webhook.test_server import make_certificate

ROOT = Path(__file__).resolve().parents[2]
CHART_VALUES = {"webhook": {"enabled": True}}


def _chart_objects() -> dict[str, Any]:
    wanted = {("Deployment", "tritonshare-webhook"), ("MutatingWebhookConfiguration", None)}
    return {
        o["kind"]: o
        for o in render_chart(CHART_VALUES)
        if (o["kind"], o["metadata"]["name"]) in wanted or (o["kind"], None) in wanted
    }


@pytest.fixture(scope="module")
def webhook_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, bytes]]:
    """`python -m webhook` with the chart's arguments, on a free port; its URL and CA. One for
    the module: it keeps nothing between admission requests, and each test has an API server of
    its own."""
    directory = tmp_path_factory.mktemp("webhook")
    cert, key = make_certificate(directory)
    [container] = _chart_objects()["Deployment"]["spec"]["template"]["spec"]["containers"]
    port = free_port()
    args = []
    for arg in container["args"]:
        flag = arg.partition("=")[0]
        replacement = {
            "--listen": f"--listen=127.0.0.1:{port}",
            "--tls-cert": f"--tls-cert={cert}",
            "--tls-key": f"--tls-key={key}",
        }
        args.append(replacement.get(flag, arg))
    log_path = directory / "webhook.log"
    with log_path.open("wb") as log:  # a file: a pipe nobody reads would fill up and block it
        process = subprocess.Popen([sys.executable, "-m", "webhook", *args], cwd=ROOT, stderr=log)
    try:
        context = ssl.create_default_context(cafile=str(cert))
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(
                    f"https://127.0.0.1:{port}/healthz", context=context, timeout=2
                ) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                assert process.poll() is None, log_path.read_text(errors="replace")
                assert time.monotonic() < deadline, "the webhook did not start"
                time.sleep(0.1)
        yield f"https://127.0.0.1:{port}/mutate-pods", cert.read_bytes()
    finally:
        process.terminate()
        process.wait(timeout=30)
        assert process.returncode == 0, log_path.read_text(errors="replace")


@pytest.fixture
def configured(kube_api: kubernetes.client.ApiClient, webhook_url: tuple[str, bytes]) -> Any:
    url, ca = webhook_url
    configuration = _chart_objects()["MutatingWebhookConfiguration"]
    [hook] = configuration["webhooks"]
    # No cluster DNS here: the address and the CA are this test's; the rest is the chart's.
    hook["clientConfig"] = {"url": url, "caBundle": base64.b64encode(ca).decode()}
    admission = kubernetes.client.AdmissionregistrationV1Api(kube_api)
    admission.create_mutating_webhook_configuration(configuration)
    core: Any = kubernetes.client.CoreV1Api(kube_api)
    # The example's namespace as shipped: restricted Pod Security, which completed pods pass.
    core.create_namespace(yaml.safe_load((ROOT / "deploy/example/namespace.yaml").read_text()))
    return core


def _restricted(pod: dict[str, Any]) -> dict[str, Any]:
    """`pod` with the securityContexts its restricted namespace asks of a pod nobody completes."""
    pod["spec"]["securityContext"] = dict(modelpod.POD_SECURITY)
    for container in pod["spec"]["containers"]:
        container["securityContext"] = dict(modelpod.LOCKED_DOWN)
    return pod


def _pod(name: str, labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    # A Deployment's pod template must name a container; the webhook keeps unrelated ones.
    return {
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"containers": []},
    }


MODEL = {"tritonshare.io/role": "model"}
ASKS = {"tritonshare.io/model-uri": "s3://models/triton/bert", "tritonshare.io/gpu-mem": "3Gi"}


def test_an_annotated_pod_is_created_complete(configured: Any) -> None:
    core = configured
    core.create_namespaced_pod("models", _pod("bert-0", MODEL, ASKS))
    pod = core.read_namespaced_pod("bert-0", "models")
    assert pod.spec.scheduler_name == "tritonshare"
    assert pod.metadata.annotations["tritonshare.io/model-id"] == "bert"
    assert [c.name for c in pod.spec.init_containers] == ["storage-initializer", "loader"]
    assert pod.spec.init_containers[0].args == ["s3://models/triton/bert", "/mnt/models"]
    [proxy] = pod.spec.containers
    assert proxy.name == "proxy" and proxy.resources.limits["tritonshare.io/gpu-mem"] == "3Gi"
    assert "--agent-address=$(HOST_IP):8100" in proxy.args
    assert proxy.image == "ghcr.io/tritonshare/tritonshare:0.1.0"
    token = next(v for v in pod.spec.volumes if v.name == "agent-token")
    assert token.projected.sources[0].service_account_token.audience == "tritonshare-agent"
    # As a Deployment's template must: a placeholder proxy container, filled in.
    placeholder = _pod("bert-1", MODEL, ASKS)
    placeholder["spec"]["containers"] = [{"name": "proxy", "image": "registry.example.com/ts:2"}]
    core.create_namespaced_pod("models", placeholder)
    [proxy] = core.read_namespaced_pod("bert-1", "models").spec.containers
    assert proxy.image == "registry.example.com/ts:2" and proxy.command == ["python", "-m", "proxy"]
    assert proxy.resources.limits["tritonshare.io/gpu-mem"] == "3Gi"


def test_a_malformed_pod_is_refused_with_what_to_write(configured: Any) -> None:
    core = configured
    with pytest.raises(kubernetes.client.ApiException) as e:
        core.create_namespaced_pod(
            "models", _pod("bad", MODEL, {"tritonshare.io/model-uri": "ftp://x/y"})
        )
    assert e.value.status == 400
    message = json.loads(e.value.body or "{}")["message"]
    assert message.startswith(
        'admission webhook "model-pods.tritonshare.io" denied the request: annotation '
        "tritonshare.io/model-uri='ftp://x/y' is not a model URI; write gs://BUCKET/PATH"
    ), message


def test_a_model_pod_without_a_model_uri_is_refused_saying_what_to_add(configured: Any) -> None:
    """The model label and a GPU-memory annotation say "complete me": without the URI the webhook
    refuses, naming the annotation to add, rather than letting the pod through for the API server
    to answer `spec.containers: Required value`."""
    core = configured
    for name, written in [
        ("half", {"tritonshare.io/gpu-mem": "3Gi"}),
        ("bare", {"tritonshare.io/model-id": "bert"}),  # and no containers at all
    ]:
        with pytest.raises(kubernetes.client.ApiException) as e:
            core.create_namespaced_pod("models", _pod(name, MODEL, written))
        assert e.value.status == 400, e.value.body
        message = json.loads(e.value.body or "{}")["message"]
        assert message.startswith(
            'admission webhook "model-pods.tritonshare.io" denied the request: pod '
            f"{name} is labelled tritonshare.io/role=model"
        ), message
        assert "add the annotation tritonshare.io/model-uri" in message, message
    # A complete model pod written by hand (deploy/example) carries the label and no URI: kept.
    complete = _pod("by-hand", MODEL, {"tritonshare.io/model-id": "bert"})
    complete["spec"]["containers"] = [{"name": "proxy", "image": "busybox"}]
    core.create_namespaced_pod("models", _restricted(complete))
    assert core.read_namespaced_pod("by-hand", "models").spec.scheduler_name == "default-scheduler"


def _kserve_pod() -> dict[str, Any]:
    """The predictor pod KServe makes (RawDeployment) from deploy/example/kserve: the
    InferenceService predictor's labels, annotations and pod fields, and the ServingRuntime's
    container as `kserve-container`."""
    example = ROOT / "deploy" / "example" / "kserve"
    runtime = yaml.safe_load((example / "serving-runtime.yaml").read_text())
    service = yaml.safe_load((example / "inference-service.yaml").read_text())
    predictor = service["spec"]["predictor"]
    [container] = runtime["spec"]["containers"]
    assert predictor["model"]["runtime"] == runtime["metadata"]["name"]
    return {
        "metadata": {
            "name": "add-one-predictor-5d8f7-x2x4q",
            "labels": {
                **predictor["labels"],
                "serving.kserve.io/inferenceservice": service["metadata"]["name"],
                "component": "predictor",
            },
            "annotations": dict(predictor["annotations"]),
        },
        "spec": {
            "serviceAccountName": predictor["serviceAccountName"],
            "nodeSelector": predictor["nodeSelector"],
            "containers": [container],
        },
    }


def test_a_kserve_predictor_pod_becomes_a_model_pod(configured: Any) -> None:
    """KServe's runtime container is the proxy's placeholder: filled in, not doubled."""
    core = configured
    core.create_namespaced_pod("models", _kserve_pod())
    pod = core.read_namespaced_pod("add-one-predictor-5d8f7-x2x4q", "models")
    assert pod.spec.scheduler_name == "tritonshare"
    assert [c.name for c in pod.spec.init_containers] == ["storage-initializer", "loader"]
    assert pod.spec.init_containers[0].args == ["gs://my-models/triton/add_one", "/mnt/models"]
    [proxy] = pod.spec.containers
    assert proxy.name == "kserve-container" and proxy.command == ["python", "-m", "proxy"]
    assert proxy.image == "ghcr.io/tritonshare/tritonshare:0.1.0"
    assert "--container-concurrency=4" in proxy.args
    assert proxy.resources.limits == {"memory": "512Mi", "tritonshare.io/gpu-mem": "1Gi"}
    assert [(p.name, p.container_port) for p in proxy.ports] == [
        ("http", 9000), ("grpc", 9001), ("metrics", 9002),
    ]  # fmt: skip
    assert pod.spec.node_selector == {"nvidia.com/gpu.present": "true"}


def test_only_labelled_pods_outside_the_system_namespace_are_sent(configured: Any) -> None:
    core = configured
    placeholder = {"name": "c", "image": "busybox"}
    unlabelled = _pod("web", {"app": "web"}, ASKS)
    unlabelled["spec"]["containers"] = [placeholder]
    core.create_namespaced_pod("models", _restricted(unlabelled))
    assert core.read_namespaced_pod("web", "models").spec.scheduler_name == "default-scheduler"
    system = _pod("sys", MODEL, ASKS)
    system["spec"]["containers"] = [placeholder]
    core.create_namespaced_pod("tritonshare-system", system)
    pod = core.read_namespaced_pod("sys", "tritonshare-system")
    assert pod.spec.scheduler_name == "default-scheduler" and not pod.spec.init_containers


def test_the_simulated_cluster_runs_the_webhook_as_the_chart_does(tmp_path: Path) -> None:
    """SimCluster(webhook=True) registers the chart's configuration and passes the chart's
    arguments; only the address, the certificate, the node's ports, the idle floor and the log
    format are the simulation's."""
    chart = _chart_objects()
    url, ca = "https://127.0.0.1:1/mutate-pods", b"CA"
    ours = admission_webhook.configuration(url, ca)
    theirs = chart["MutatingWebhookConfiguration"]
    assert ours["metadata"]["name"] == theirs["metadata"]["name"]
    [hook], [expected] = ours["webhooks"], theirs["webhooks"]
    assert hook.pop("clientConfig") == {"url": url, "caBundle": base64.b64encode(ca).decode()}
    assert expected.pop("clientConfig")["service"]["path"] == admission_webhook.PATH
    assert hook == expected
    ports = admission_webhook.NodePorts(agent=31000, gateway_http=31001, gateway_grpc=31002)
    sim_args = admission_webhook.arguments(4443, tmp_path / "c", tmp_path / "k", ports)
    [container] = chart["Deployment"]["spec"]["template"]["spec"]["containers"]
    own = {
        "--listen": "127.0.0.1:4443",
        "--tls-cert": str(tmp_path / "c"),
        "--tls-key": str(tmp_path / "k"),
        "--agent-port": "31000",
        "--triton-http-port": "31001",
        "--triton-grpc-port": "31002",
        # Idle times of seconds, for tests, benchmarks and the demo.
        "--min-idle-seconds": "1",
        # Text, as every other part of the simulation logs, for people reading logs/.
        "--log-format": "text",
    }
    chart_args = [a.partition("=") for a in container["args"]]
    assert sim_args == [f"{f}={own.get(f, value)}" for f, _, value in chart_args]
    chart_images = {
        e["name"]: e.get("value") for e in container.get("env", []) if "IMAGE" in e["name"]
    }
    assert admission_webhook.environment() == chart_images


def _deployment(uri: str, annotations: dict[str, str]) -> dict[str, Any]:
    """The Deployment of docs/concepts.md's example: the webhook completes its pods."""
    return {
        "metadata": {"name": "add-one"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "add-one"}},
            "template": {
                "metadata": {
                    "labels": {"app": "add-one", **MODEL},
                    "annotations": {
                        "tritonshare.io/model-uri": uri,
                        "tritonshare.io/gpu-mem": "1Gi",
                        **annotations,
                    },
                },
                "spec": {"containers": [{"name": "proxy", "image": "busybox"}]},
            },
        },
    }


def test_a_deployments_pods_keep_one_model_id_across_a_rollout(
    configured: Any, kube_api: kubernetes.client.ApiClient, apiserver: RunningApiServer
) -> None:
    """Rolled to a file of another name, a Deployment's pods keep the id its clients call; one
    without `model-id` gets no pod, and its ReplicaSet says why."""
    core = configured
    apps: Any = kubernetes.client.AppsV1Api(kube_api)
    api = apiserver.api_client()
    manager = ControllerManager(api, clock=apiserver.clock.now)
    manager.start()
    try:
        assert manager.wait_synced(10)
        apps.create_namespaced_deployment(
            "models", _deployment("https://models.example.com/add_one.tar.gz", {})
        )

        def refusal() -> str:
            for replica_set in apps.list_namespaced_replica_set("models").items:
                for condition in replica_set.status.conditions or []:
                    if condition.type == "ReplicaFailure":
                        return str(condition.message)
            return ""

        said = wait_until("the ReplicaSet's ReplicaFailure", refusal, 30)
        assert "sets no tritonshare.io/model-id" in said and "('add_one' now)" in said, said
        assert core.list_namespaced_pod("models").items == []
        apps.delete_namespaced_deployment("add-one", "models")
        wait_until(
            "the old ReplicaSets gone",
            lambda: not apps.list_namespaced_replica_set("models").items,
            30,
        )

        named = {"tritonshare.io/model-id": "add_one"}
        apps.create_namespaced_deployment(
            "models", _deployment("https://models.example.com/add_one.tar.gz", named)
        )
        wait_until("a pod", lambda: core.list_namespaced_pod("models").items, 30)
        apps.patch_namespaced_deployment(
            "add-one",
            "models",
            _deployment("https://models.example.com/addone-noname.tar.gz", named),
        )

        def rolled() -> list[Any]:
            pods = core.list_namespaced_pod("models").items
            uris = {p.metadata.annotations["tritonshare.io/model-uri"] for p in pods}
            return pods if any(u.endswith("addone-noname.tar.gz") for u in uris) else []

        pods = wait_until("a pod of the new file", rolled, 30)
        assert {p.metadata.annotations["tritonshare.io/model-id"] for p in pods} == {"add_one"}
    finally:
        manager.stop()
        api.close()  # type: ignore[no-untyped-call]
