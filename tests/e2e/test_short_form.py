"""A model pod written in the short form (a label and two annotations) runs end to end: created
with the official client through the simulated API server, completed by tritonshare's webhook
(`python -m webhook`, registered as the chart registers it), placed by the binder, its model
fetched from an HTTPS model store by the storage initializer's stand-in, loaded by the agent
into the real Triton, and served through its proxy and the node's gateway; refused another
pod's model; unloaded when it is deleted."""

from __future__ import annotations

import json
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from common.contract import Keys
from common.tritonname import private_triton_name
from sim.cluster import SimCluster
from sim.demo.scenario import MODELS_DIR, NODES
from sim.processes import wait_until
from sim.triton import TritonInstall
from tests.conftest import require_executable

KEYS = Keys()
NAMESPACE = "models"
NODE = NODES[0]


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    with SimCluster(tmp_path / "cluster", [NODE], binders=1, webhook=True) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


def short_form(name: str, uri: str, gpu_mem: str) -> kubernetes.client.V1Pod:
    """The pod as a team writes it: the model's URI and GPU memory, nothing else of ours."""
    return kubernetes.client.V1Pod(
        metadata=kubernetes.client.V1ObjectMeta(
            name=name,
            labels={"tritonshare.io/role": "model"},
            annotations={"tritonshare.io/model-uri": uri, "tritonshare.io/gpu-mem": gpu_mem},
        ),
        spec=kubernetes.client.V1PodSpec(containers=[]),
    )


def _ready(core: Any, name: str) -> Any:
    pod = core.read_namespaced_pod(name, NAMESPACE)
    for c in pod.status.conditions or []:
        if c.type == "Ready" and c.status == "True":
            return pod
    for status in pod.status.init_container_statuses or []:
        terminated = (status.last_state and status.last_state.terminated) or None
        assert terminated is None, f"{name}'s {status.name} failed: {terminated.message}"
    return None


def _loaded(cluster: SimCluster) -> set[str]:
    assert cluster.triton is not None
    request = urllib.request.Request(
        f"http://{cluster.triton.http_url}/v2/repository/index",
        data=b"{}",
        headers={"tritonshare-admin-key": "local"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        return {m["name"] for m in json.loads(answer.read()) if m.get("state") == "READY"}


def _knock(source: str, gateway: str, model: str) -> str:
    """The first line of the gateway's answer to `source` asking whether `model` is ready."""
    host, _, port = gateway.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), 10, (source, 0)) as sock:
            sock.sendall(f"GET /v2/models/{model}/ready HTTP/1.1\r\nHost: t\r\n\r\n".encode())
            return sock.recv(200).split(b"\r\n", 1)[0].decode() or "closed"
    except OSError as e:
        return f"refused ({e})"


def _gateway_requests(cluster: SimCluster, pod: str) -> dict[str, float]:
    """The gateway's inference counts of `pod`, by protocol."""
    assert cluster.gateway is not None
    url = f"http://127.0.0.1:{cluster.gateway.metrics}/metrics"
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name == "tritonshare_gateway_requests_total"
                and labels.get("pod", "").endswith(pod)
                and labels.get("route") in ("infer", "ModelInfer")
            ):
                counts[labels["protocol"]] = counts.get(labels["protocol"], 0.0) + sample.value
    return counts


@pytest.mark.slow
@pytest.mark.triton
def test_a_model_pod_in_the_short_form_is_completed_placed_loaded_and_served(
    cluster: SimCluster,
) -> None:
    assert cluster.model_store is not None and cluster.gateway is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    add_one = cluster.model_store.publish("add_one", MODELS_DIR / "add_one")
    echo = cluster.model_store.publish("echo", MODELS_DIR / "identity")
    assert add_one.startswith("https://127.0.0.1:") and add_one.endswith("/add_one.tar.gz")
    core.create_namespaced_pod(NAMESPACE, short_form("add-one", add_one, "2Gi"))
    core.create_namespaced_pod(NAMESPACE, short_form("echo", echo, "1Gi"))

    # Completed by the webhook, with nothing of the simulation in it.
    pod = core.read_namespaced_pod("add-one", NAMESPACE)
    assert pod.spec.scheduler_name == "tritonshare"
    assert pod.metadata.annotations[KEYS.model_id] == "add_one"
    initializer, loader = pod.spec.init_containers
    assert (initializer.name, loader.name) == ("storage-initializer", "loader")
    assert initializer.image.startswith("kserve/storage-initializer:")
    assert initializer.command is None and initializer.args == [add_one, "/mnt/models"]
    [proxy] = pod.spec.containers
    assert "--listen-http=0.0.0.0:9000" in proxy.args
    assert not any("source-address" in a for a in proxy.args)
    assert proxy.resources.limits[KEYS.gpu_mem] == "2Gi"

    # Placed by the binder, fetched, loaded by the agent, Ready.
    pods = {
        name: wait_until(f"pod {name} Ready", partial(_ready, core, name), 150)
        for name in ("add-one", "echo")
    }
    for name, ready in pods.items():
        assert ready.spec.node_name == NODE.name, name
        assert ready.metadata.annotations[KEYS.gpu].startswith("GPU-"), name
    # Each in Triton under its pod's private name (its clients still send the model id).
    names = {
        private_triton_name(NAMESPACE, model, pods[pod].metadata.uid)
        for pod, model in (("add-one", "add_one"), ("echo", "echo"))
    }
    assert names <= _loaded(cluster)

    # Both proxies listen on port 9000, each on its own pod's address.
    address = pods["add-one"].status.pod_ip
    assert address != pods["echo"].status.pod_ip and "127.0.0.1" not in (
        address,
        pods["echo"].status.pod_ip,
    )
    data = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    with httpclient.InferenceServerClient(f"{address}:9000") as http:
        tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        assert http.infer("add_one", [tensor]).as_numpy("OUTPUT0").tolist() == [[2.0, 3.0, 4.0]]
        # Another pod's model is refused, as a model Triton does not have.
        with pytest.raises(InferenceServerException, match="echo"):
            http.get_model_metadata("echo")
    with grpcclient.InferenceServerClient(f"{address}:9001") as grpc:
        tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        assert grpc.infer("add_one", [tensor]).as_numpy("OUTPUT0").tolist() == [[2.0, 3.0, 4.0]]
    with httpclient.InferenceServerClient(f"{pods['echo'].status.pod_ip}:9000") as http:
        tensor = httpclient.InferInput("INPUT_FP32", [3], "FP32")
        tensor.set_data_from_numpy(data[0])
        assert http.infer("echo", [tensor]).as_numpy("OUTPUT_FP32").tolist() == [1.0, 2.0, 3.0]

    # The inferences went through the node's gateway, which knew the pod by its address.
    assert _gateway_requests(cluster, "add-one") == {"http": 1.0, "grpc": 1.0}
    gateway = f"127.0.0.1:{cluster.gateway.http}"
    assert _knock(address, gateway, "add_one").startswith("HTTP/1.1 200")
    assert _knock(address, gateway, "echo").startswith("HTTP/1.1 400"), "another pod's model"
    assert _knock("127.0.0.1", gateway, "add_one").startswith(("refused", "closed"))

    # Deleted: each proxy drains and has the agent unload its model.
    for name in pods:
        core.delete_namespaced_pod(name, NAMESPACE)

    def gone() -> bool:
        return not core.list_namespaced_pod(NAMESPACE).items

    wait_until("the short-form pods to be gone", gone, 90)
    assert not {"add_one", "echo"} & _loaded(cluster)


def _events(core: Any, pod: str) -> dict[str, str]:
    """The pod's Events' messages, by reason."""
    events = core.list_namespaced_event(
        NAMESPACE, field_selector=f"involvedObject.name={pod}", _preload_content=False
    )
    return {e["reason"]: e["message"] for e in json.loads(events.data)["items"]}


@pytest.mark.slow
@pytest.mark.triton
def test_a_model_uri_with_a_typo_says_why_in_an_event_the_status_and_the_logs(
    cluster: SimCluster, tmp_path: Path
) -> None:
    """As `kubectl describe pod` and `kubectl logs` show it: the storage initializer's reason
    (HTTP 404) is its termination message, the kubelet backs off restarting it, and the agent
    says why in an Event of its own."""
    assert cluster.model_store is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    uri = cluster.model_store.publish("add_one", MODELS_DIR / "add_one")
    typo = uri.replace("add_one.tar.gz", "add_on.tar.gz")
    core.create_namespaced_pod(NAMESPACE, short_form("typo", typo, "1Gi"))

    def told() -> dict[str, str] | None:
        events = _events(core, "typo")
        return events if {"InitContainerFailed", "BackOff"} <= set(events) else None

    events = wait_until("the typo's Events", told, 120)
    assert events["InitContainerFailed"].startswith("init container storage-initializer failed:")
    assert f"{typo} answered HTTP 404" in events["InitContainerFailed"]
    assert events["BackOff"].startswith(
        "Back-off restarting failed container storage-initializer in pod typo_models("
    )
    [initializer, _] = core.read_namespaced_pod("typo", NAMESPACE).status.init_container_statuses
    ended = (initializer.last_state and initializer.last_state.terminated) or (
        initializer.state.terminated
    )
    assert ended.exit_code == 1 and "HTTP 404" in ended.message
    assert cluster.apiserver is not None
    config = cluster.apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    kubectl = [require_executable("kubectl"), "--kubeconfig", str(config), "-n", NAMESPACE]

    def logged() -> str | None:
        # The container restarts: its run now may have just begun (empty so far), so the reason
        # is in this run's log or, once another run started, in the previous one's.
        for previous in ([], ["--previous"]):
            logs = subprocess.run(
                [*kubectl, "logs", "typo", "-c", "storage-initializer", *previous],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            if logs.returncode == 0 and "answered HTTP 404" in logs.stdout:
                return logs.stdout
        return None

    wait_until("the storage initializer's reason in its logs", logged, 60)
