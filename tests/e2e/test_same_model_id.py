"""Two teams name their models the same: `resnet50` in namespace team-a and another
`resnet50` in team-b, both written in the short form, are placed on the one node with a real
Triton, each loaded under its own pod's private name, and each pod's clients get that pod's
model's answers (REST, gRPC and a gRPC stream) naming only `resnet50`, never the private name.
Before private names the second was kept Pending ("node(s) already had model resnet50"). Both
hold on a network that keeps pods' addresses and on one that masquerades them as the node's."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from common.tritonname import private_triton_name
from sim.cluster import SimCluster
from sim.demo.rollout import new_release
from sim.demo.scenario import MODELS_DIR, NODES
from sim.processes import wait_until
from sim.triton import TritonInstall
from tests.e2e.test_short_form import _loaded, short_form

NODE = NODES[0]
MODEL = "resnet50"
TEAMS = {"team-a": [[2.0, 3.0, 4.0]], "team-b": [[101.0, 102.0, 103.0]]}
"""Each team's answer to [1, 2, 3]: team-a's model adds 1, team-b's other files add 100."""
DATA = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)


@pytest.fixture(params=[False, True], ids=["pod-addresses", "masquerading"])
def cluster(
    tmp_path: Path, triton_install: TritonInstall, request: pytest.FixtureRequest
) -> Iterator[SimCluster]:
    # The test's models are Python (tenant code): both teams are let run it. Masquerading, the
    # pods' connections reach the gateway from the node's address, named by their caller keys.
    with SimCluster(
        tmp_path / "cluster",
        [NODE],
        binders=1,
        webhook=True,
        tenant_code_namespaces=tuple(TEAMS),
        masquerade=request.param,
    ) as running:
        assert running.missing == [], running.missing
        for namespace in TEAMS:
            running.core.create_namespace({"metadata": {"name": namespace}}, _preload_content=False)
        yield running


def _ready(core: Any, namespace: str) -> Any:
    pod = core.read_namespaced_pod("model", namespace)
    ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
    return pod if ready else None


def _stream_answer(address: str) -> tuple[str, list[list[float]]]:
    """One request over a ModelStreamInfer stream through the pod's proxy: the answer's model
    name and output."""
    answers: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(f"{address}:9001") as grpc:
        grpc.start_stream(callback=lambda result, error: answers.put(error or result))
        tensor = grpcclient.InferInput("INPUT0", list(DATA.shape), "FP32")
        tensor.set_data_from_numpy(DATA)
        grpc.async_stream_infer(MODEL, [tensor])
        answer = answers.get(timeout=30)
        grpc.stop_stream()
    assert not isinstance(answer, Exception), answer
    response = answer.get_response()
    return response.model_name, answer.as_numpy("OUTPUT0").tolist()


@pytest.mark.slow
@pytest.mark.triton
def test_two_namespaces_run_their_own_model_of_one_name_on_one_node(
    cluster: SimCluster, tmp_path: Path
) -> None:
    assert cluster.model_store is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    sources = {
        "team-a": MODELS_DIR / "add_one",
        "team-b": new_release(MODELS_DIR / "add_one", tmp_path / "team-b-files"),
    }
    for namespace, source in sources.items():
        uri = cluster.model_store.publish(MODEL, source, release=namespace)
        core.create_namespaced_pod(namespace, short_form("model", uri, "1Gi"))

    pods = {
        namespace: wait_until(f"{namespace}'s pod Ready", partial(_ready, core, namespace), 150)
        for namespace in TEAMS
    }
    assert {pod.spec.node_name for pod in pods.values()} == {NODE.name}
    names = {
        namespace: private_triton_name(namespace, MODEL, pod.metadata.uid)
        for namespace, pod in pods.items()
    }
    assert len(set(names.values())) == 2 and set(names.values()) <= _loaded(cluster)
    assert MODEL not in _loaded(cluster), "no model has the public name in Triton"

    for namespace, expected in TEAMS.items():
        address = pods[namespace].status.pod_ip
        with httpclient.InferenceServerClient(f"{address}:9000") as http:
            tensor = httpclient.InferInput("INPUT0", list(DATA.shape), "FP32")
            tensor.set_data_from_numpy(DATA)
            result = http.infer(MODEL, [tensor])
            assert result.as_numpy("OUTPUT0").tolist() == expected, namespace
            assert result.get_response()["model_name"] == MODEL
            assert http.get_model_metadata(MODEL)["name"] == MODEL
        with grpcclient.InferenceServerClient(f"{address}:9001") as grpc:
            tensor = grpcclient.InferInput("INPUT0", list(DATA.shape), "FP32")
            tensor.set_data_from_numpy(DATA)
            result = grpc.infer(MODEL, [tensor])
            assert result.as_numpy("OUTPUT0").tolist() == expected, namespace
            assert result.get_response().model_name == MODEL
            assert grpc.get_model_config(MODEL).config.name == MODEL
        assert _stream_answer(address) == (MODEL, expected), namespace
        if cluster.masquerade:
            # Its connections came from the node's address: the gateway knew it by its key.
            log = cluster.kubelets[NODE.name].container_log(namespace, "model", "proxy")
            assert "knows this pod by its caller key" in log, namespace
