"""A TritonModel's model name end to end on the simulated cluster with the real processes: the
TritonModel `resnet-50` (a Kubernetes name) declares `modelName: resnet_50` (the name it was
packaged with, which no Kubernetes name can hold); the binder places it under that id, its host's
loader loads it, and clients call `/v2/models/resnet_50/infer` through the Service `resnet-50`
(REST and gRPC), the answers naming `resnet_50`. A call for `resnet-50` gets Triton's 404 naming
the id the host serves. A second TritonModel of the namespace with the same modelName is refused
(both would answer to one id on the host), saying which TritonModel has it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from common.contract import Keys
from common.hosted import decode_hosted, hosted_models_annotation, serves_label
from sim.cluster import SimCluster
from sim.demo.scenario import MODELS_DIR, NODES
from sim.processes import wait_until
from sim.service import Endpoints
from sim.triton import TritonInstall

NODE = NODES[0]
TEAM = "team-a"
NAME, MODEL_NAME = "resnet-50", "resnet_50"
DATA = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"
KEYS = Keys()


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    # The test's model is Python (tenant code): the team is let run it.
    with SimCluster(
        tmp_path / "cluster", [NODE], binders=1, webhook=True, tenant_code_namespaces=(TEAM,)
    ) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": TEAM}}, _preload_content=False)
        yield running


def _model(name: str, uri: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TritonModel",
        "metadata": {"name": name},
        "spec": {"storageUri": uri, "modelName": MODEL_NAME, "gpuMemory": "1Gi"},
    }


def _status(custom: Any, name: str) -> dict[str, Any]:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, TEAM, PLURAL, name)
    found: dict[str, Any] = obj.get("status") or {}
    return found


@pytest.mark.slow
@pytest.mark.triton
def test_a_tritonmodel_is_called_by_its_model_name_through_its_service(
    cluster: SimCluster,
) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    # Packaged as resnet_50: its config.pbtxt names it so.
    uri = cluster.model_store.publish(MODEL_NAME, MODELS_DIR / "add_one")
    custom.create_namespaced_custom_object(GROUP, VERSION, TEAM, PLURAL, _model(NAME, uri))
    wait_until("the replica ready", lambda: _status(custom, NAME).get("readyReplicas"), 150)
    # Created second with the same model name: refused, saying which model has the id.
    custom.create_namespaced_custom_object(GROUP, VERSION, TEAM, PLURAL, _model("copy", uri))

    def refused() -> str:
        events = core.list_namespaced_event(TEAM, field_selector="involvedObject.name=copy")
        return next((e.message for e in events.items if e.reason == "FailedScheduling"), "")

    said = wait_until("the copy refused", refused, 60)
    assert f'model id "{MODEL_NAME}" is already served by tritonmodel "{NAME}"' in said, said
    assert not _status(custom, "copy").get("placements")

    [host] = core.list_namespaced_pod(TEAM, label_selector=f"{KEYS.prefix}model-host=true").items
    [entry] = decode_hosted(host.metadata.annotations[hosted_models_annotation(KEYS)])
    assert (entry.model, entry.model_id) == (NAME, MODEL_NAME)
    with Endpoints(cluster.kube, TEAM, f"{serves_label(KEYS, NAME)}=true") as service:
        address = wait_until("the Service's endpoint", service.pick, 30)
    with httpclient.InferenceServerClient(f"{address}:9000") as http:
        tensor = httpclient.InferInput("INPUT0", list(DATA.shape), "FP32")
        tensor.set_data_from_numpy(DATA)
        result = http.infer(MODEL_NAME, [tensor])
        assert result.get_response()["model_name"] == MODEL_NAME
        assert result.as_numpy("OUTPUT0").tolist() == [[2.0, 3.0, 4.0]]
        with pytest.raises(InferenceServerException) as rest_404:
            http.infer(NAME, [tensor])
    with grpcclient.InferenceServerClient(f"{address}:9001") as grpc:
        tensor = grpcclient.InferInput("INPUT0", list(DATA.shape), "FP32")
        tensor.set_data_from_numpy(DATA)
        answer = grpc.infer(MODEL_NAME, [tensor])
        assert answer.get_response().model_name == MODEL_NAME
        with pytest.raises(InferenceServerException) as grpc_404:
            grpc.infer(NAME, [tensor])
    served = f"Request for unknown model: '{NAME}' is not found; this host serves '{MODEL_NAME}'"
    assert served in str(rest_404.value), rest_404.value
    assert served in str(grpc_404.value), grpc_404.value
