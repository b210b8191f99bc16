"""The node gateway's process killed with calls in flight, on the simulated cluster with the real
processes (one real node; its gateway run by its keeper, which starts it again at once): the
calls of a TritonModel marked `idempotent` are answered, over REST and gRPC, sent again by its
host's proxy; those of a neighbour on the same host without it fail once (502, UNAVAILABLE), as
Triton may have run them. Both models are `sleepy` (Python: tenant code, which the namespace is
let run), so the calls are still at Triton when the gateway goes."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from common.hosted import host_name
from sim.cluster import SimCluster
from sim.processes import wait_until
from tests.e2e.test_node_pod_drain import _listening, _ready
from tests.e2e.test_tritonmodel_one_node import NAMESPACE, NODE, cluster
from tests.e2e.test_tritonmodel_two_nodes import GROUP, PLURAL, VERSION

__all__ = ["cluster"]  # one real node of four T4s and the namespace, as the one-node test's
SLEEPY = Path(__file__).resolve().parents[1] / "proxy" / "models" / "sleepy"
DELAY_MS = 4000
"""Each call's time at Triton: both calls of a model are at the gateway for that long."""


def _files(root: Path, name: str) -> Path:
    """The sleepy model's files under the model id `name`."""
    directory = root / name
    shutil.copytree(SLEEPY, directory)
    config = directory / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "sleepy"', f'name: "{name}"'))
    return directory


def _rest(address: str, model: str) -> str:
    connection = http.client.HTTPConnection(address, 9000, timeout=60)
    body = {"inputs": [{"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [DELAY_MS]}]}
    try:
        connection.request("POST", f"/v2/models/{model}/infer", json.dumps(body).encode())
        answer = connection.getresponse()
        answer.read()
        return str(answer.status)
    finally:
        connection.close()


def _grpc(address: str, model: str) -> str:
    client = grpcclient.InferenceServerClient(f"{address}:9001")
    tensor = grpcclient.InferInput("DELAY_MS", [1], "INT32")
    tensor.set_data_from_numpy(np.array([DELAY_MS], dtype=np.int32))
    try:
        client.infer(model, [tensor], client_timeout=60)
        return "OK"
    except grpcclient.InferenceServerException as e:
        return str(e.status())
    finally:
        client.close()


def _at_gateway(url: str) -> dict[str, float]:
    """The requests the gateway holds now (at Triton or queued for a slot there), by model."""
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    held: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            named = sample.name in (
                "tritonshare_gateway_requests_in_flight",
                "tritonshare_gateway_requests_queued",
            )
            if named and "pod" in sample.labels:
                model = sample.labels["model"]
                held[model] = held.get(model, 0.0) + sample.value
    return held


@pytest.mark.slow
@pytest.mark.triton
def test_an_idempotent_models_calls_are_answered_through_a_gateway_exit(
    cluster: SimCluster, tmp_path: Path
) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    for name, idempotent in (("idem", True), ("plain", False)):
        uri = cluster.model_store.publish(name, _files(tmp_path, name))
        spec = {"storageUri": uri, "gpuMemory": "1Gi", "replicas": 1, "maxConcurrency": 4}
        spec["idempotent"] = idempotent
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TritonModel"}
        custom.create_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, {**body, "metadata": {"name": name}, "spec": spec}
        )
    wait_until("both ready", lambda: _ready(custom, "idem") == _ready(custom, "plain") == 1, 180)
    address = core.read_namespaced_pod(host_name(NODE.name), NAMESPACE).status.pod_ip
    wait_until("the host listening", lambda: _listening(address), 30)
    gateway = cluster.gateways[NODE.name]
    metrics = f"http://{gateway.address}:{gateway.metrics}/metrics"

    with ThreadPoolExecutor(4) as pool:
        calls = {
            (model, protocol): pool.submit(call, address, model)
            for model in ("idem", "plain")
            for protocol, call in (("rest", _rest), ("grpc", _grpc))
        }
        seen: list[dict[str, float]] = []

        def held() -> bool:
            seen.append(_at_gateway(metrics))
            return seen[-1] == {"idem": 2.0, "plain": 2.0}

        wait_until("every call at the gateway", held, 30, lambda: f"the gateway held {seen}")
        killed = gateway.serving_pid()
        assert killed is not None
        os.kill(killed, signal.SIGKILL)
        outcomes = {key: call.result(90) for key, call in calls.items()}

    assert outcomes == {
        ("idem", "rest"): "200",
        ("idem", "grpc"): "OK",
        ("plain", "rest"): "502",
        ("plain", "grpc"): "StatusCode.UNAVAILABLE",
    }
    # The gateway was started again in place, and serves both.
    wait_until("a new gateway process", lambda: gateway.serving_pid() not in (None, killed), 30)
    assert _rest(address, "plain") == "200" and _grpc(address, "idem") == "OK"
