"""ModelMesh's example-onnx-mnist on the simulated cluster with the real processes (the binder,
the node's agent, Triton with its ONNX Runtime stand-in, the host's loader and proxy): KServe's
CRDs served, ModelMesh's `triton-2.x` runtime, a `storage-config` Secret in ModelMesh's format
for an S3 API server (moto, IAM authentication on), and InferenceServices whose storage is a key
and the path of one `.onnx` file. The host's loader lays the file out as Triton's model; one
without a schema gets its inputs and outputs from the model (Triton's auto-complete: batches of
up to 4), one with `schemaPath` takes the schema's (any batch, no batcher); each reads `Loaded`
and answers through `modelmesh-serving:8033` with ONNX Runtime's own numbers. One whose file is
missing reads `FailedToLoad` naming the storage key, the bucket and the path; one of a format the
node's Triton cannot serve (TensorFlow) reads `NoSupportingRuntime` within 10 s."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import numpy as np
import onnx
import onnxruntime
import pytest
import tritonclient.grpc as grpcclient
from numpy.typing import NDArray
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from sim.cluster import SimCluster
from sim.demo.scenario import NODES
from sim.processes import wait_until
from sim.service import ServiceProxy
from sim.triton import TritonInstall
from tests.binder.inferenceservices.test_inferenceservices import TRITON_2X
from tests.buckets import S3, s3_server
from tests.deploy.rendering import DEPLOY

NODE = NODES[0]
NAMESPACE = "modelmesh-serving"
BUCKET = "modelmesh-example-models"
KSERVE, ISVCS = "serving.kserve.io", "inferenceservices"
INPUT, OUTPUT = "Input3", "Plus214_Output_0"
SCHEMA = {
    "inputs": [{"name": INPUT, "datatype": "FP32", "shape": [-1, 1, 28, 28]}],
    "outputs": [{"name": OUTPUT, "datatype": "FP32", "shape": [-1, 10]}],
}


def _mnist() -> bytes:
    """A linear classifier of 28x28 images into 10 scores, with the tensor names of ModelMesh's
    onnx/mnist.onnx and a free batch dimension; seeded weights."""
    rng = np.random.default_rng(7)
    weights = rng.normal(0, 0.05, (784, 10)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", [INPUT], ["flat"], axis=1),
            helper.make_node("Gemm", ["flat", "w", "b"], [OUTPUT]),
        ],
        "mnist",
        [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["N", 1, 28, 28])],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["N", 10])],
        [
            numpy_helper.from_array(weights, "w"),
            numpy_helper.from_array(np.linspace(-1, 1, 10, dtype=np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    onnx.checker.check_model(model)
    return model.SerializeToString()


@pytest.fixture
def s3() -> Iterator[S3]:
    with s3_server(BUCKET) as server:
        yield server


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall, s3: S3) -> Iterator[SimCluster]:
    crds = (DEPLOY / "kserve-crds" / "kserve-crds.yaml",)
    # The simulated node is dedicated to tenant code: the team is let on it (its ONNX is not).
    tenants = (NAMESPACE,)
    with SimCluster(
        tmp_path / "cluster",
        [NODE],
        binders=1,
        webhook=True,
        crds=crds,
        tenant_code_namespaces=tenants,
    ) as running:
        assert running.missing == [], running.missing
        labels = {"modelmesh-enabled": "true"}
        running.core.create_namespace(
            {"metadata": {"name": NAMESPACE, "labels": labels}}, _preload_content=False
        )
        yield running


def set_up_namespace(core: Any, custom: Any, s3: S3, cluster_runtime: bool = False) -> None:
    """The namespace as ModelMesh's quickstart leaves it: a `storage-config` Secret whose key
    `localMinIO` reaches the S3 bucket, and ModelMesh's own `triton-2.x` runtime (a
    ClusterServingRuntime with `cluster_runtime`, as ModelMesh's installer applies it)."""
    entry = {
        "type": "s3",
        "access_key_id": s3.key_id,
        "secret_access_key": s3.secret,
        "endpoint_url": s3.url,
        "default_bucket": BUCKET,
        "region": "us-east-1",
    }
    core.create_namespaced_secret(
        NAMESPACE,
        {"metadata": {"name": "storage-config"}, "stringData": {"localMinIO": json.dumps(entry)}},
    )
    if cluster_runtime:
        runtime = {**TRITON_2X, "kind": "ClusterServingRuntime"}
        custom.create_cluster_custom_object(KSERVE, "v1alpha1", "clusterservingruntimes", runtime)
        return
    custom.create_namespaced_custom_object(
        KSERVE, "v1alpha1", NAMESPACE, "servingruntimes", TRITON_2X
    )


def _isvc(name: str, **storage: str) -> dict[str, Any]:
    model = {
        "modelFormat": {"name": "onnx"},
        "runtime": "triton-2.x",
        "storage": {"key": "localMinIO", "path": "onnx/mnist.onnx", **storage},
    }
    return {
        "apiVersion": f"{KSERVE}/v1beta1",
        "kind": "InferenceService",
        "metadata": {
            "name": name,
            "annotations": {"serving.kserve.io/deploymentMode": "ModelMesh"},
        },
        "spec": {"predictor": {"model": model}},
    }


def _loaded(custom: Any, name: str) -> dict[str, Any] | None:
    obj = custom.get_namespaced_custom_object(KSERVE, "v1beta1", NAMESPACE, ISVCS, name)
    status = obj.get("status") or {}
    states = (status.get("modelStatus") or {}).get("states") or {}
    return status if states.get("activeModelState") == "Loaded" else None


def _failed(custom: Any, name: str) -> dict[str, Any] | None:
    obj = custom.get_namespaced_custom_object(KSERVE, "v1beta1", NAMESPACE, ISVCS, name)
    model_status = (obj.get("status") or {}).get("modelStatus") or {}
    if (model_status.get("states") or {}).get("activeModelState") != "FailedToLoad":
        return None
    failure: dict[str, Any] = model_status.get("lastFailureInfo") or {}
    return failure


def _refused(custom: Any, name: str) -> dict[str, Any] | None:
    obj = custom.get_namespaced_custom_object(KSERVE, "v1beta1", NAMESPACE, ISVCS, name)
    failure = ((obj.get("status") or {}).get("modelStatus") or {}).get("lastFailureInfo") or {}
    return dict(failure) if failure.get("reason") == "NoSupportingRuntime" else None


def _said(custom: Any, name: str) -> str:
    """The InferenceService's and its TritonModel's status, for a wait that timed out."""
    isvc = custom.get_namespaced_custom_object(KSERVE, "v1beta1", NAMESPACE, ISVCS, name)
    model = custom.get_namespaced_custom_object(
        "tritonshare.io", "v1alpha1", NAMESPACE, "tritonmodels", name
    )
    return json.dumps({"isvc": isvc.get("status"), "model": model.get("status")}) + "\n"


def _listening(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


def _infer(url: str, model: str, images: NDArray[Any]) -> NDArray[Any]:
    with grpcclient.InferenceServerClient(url) as client:
        tensor = grpcclient.InferInput(INPUT, list(images.shape), "FP32")
        tensor.set_data_from_numpy(images)
        return np.asarray(client.infer(model, [tensor]).as_numpy(OUTPUT))


@pytest.mark.slow
@pytest.mark.triton
def test_a_single_onnx_file_at_a_storage_key_and_path_answers_as_onnx_runtime(
    cluster: SimCluster, s3: S3
) -> None:
    assert cluster.kube is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    mnist = _mnist()
    s3.put(BUCKET, "onnx/mnist.onnx", mnist)
    s3.put(BUCKET, "onnx/schema.json", json.dumps(SCHEMA).encode())
    set_up_namespace(core, custom, s3)
    missing = _isvc("missing", path="onnx/missing.onnx")
    for body in (
        _isvc("example-onnx-mnist"),
        _isvc("mnist-schema", schemaPath="onnx/schema.json"),
        missing,
    ):
        custom.create_namespaced_custom_object(KSERVE, "v1beta1", NAMESPACE, ISVCS, body)
    for name in ("example-onnx-mnist", "mnist-schema"):
        status = wait_until(
            f"{name} Loaded",
            partial(_loaded, custom, name),
            150,
            on_fail=lambda name=name: _said(custom, name) + cluster.log_tails(),  # type: ignore[misc]
        )
        assert status["url"] == f"grpc://modelmesh-serving.{NAMESPACE}:8033", status

    # A format the node's Triton cannot serve: refused within 10 s, saying what to do.
    tensorflow = _isvc("tf-mnist")
    tensorflow["spec"]["predictor"]["model"]["modelFormat"] = {"name": "tensorflow"}
    custom.create_namespaced_custom_object(KSERVE, "v1beta1", NAMESPACE, ISVCS, tensorflow)
    refused = wait_until(
        "tf-mnist NoSupportingRuntime",
        partial(_refused, custom, "tf-mnist"),
        10,
        on_fail=cluster.log_tails,
    )
    assert "tf2onnx" in refused["message"], refused

    # A fetch that finds nothing says which storage key, bucket and path.
    failure = wait_until("missing FailedToLoad", partial(_failed, custom, "missing"), 60)
    assert failure["reason"] == "ModelLoadFailed", failure
    said = failure["message"]
    assert "storage key localMinIO: " in said and f"s3://{BUCKET}/onnx/missing.onnx" in said, said

    session = onnxruntime.InferenceSession(mnist, providers=["CPUExecutionProvider"])
    images = np.random.default_rng(1).random((6, 1, 28, 28), dtype=np.float32)
    expected = np.asarray(session.run([OUTPUT], {INPUT: images})[0])
    services = ServiceProxy(cluster.kube, period=0.2)
    services.start()
    try:
        address = wait_until(
            "the modelmesh-serving Service",
            lambda: core.read_namespaced_service("modelmesh-serving", NAMESPACE).spec.cluster_ip,
            30,
        )
        wait_until("its gRPC port listening", lambda: _listening(address, 8033), 30)
        url = f"{address}:8033"

        def answers() -> list[NDArray[Any]] | None:
            try:
                return [_infer(url, "example-onnx-mnist", images[:2])]
            except InferenceServerException:
                return None  # the host has not read its routes yet

        [completed] = wait_until("example-onnx-mnist routed", answers, 60)
        np.testing.assert_allclose(completed, expected[:2], rtol=1e-5, atol=1e-6)
        # Completed by Triton from the model: batches of up to 4 (the backend's default).
        with pytest.raises(InferenceServerException, match="batch-size must be <= 4"):
            _infer(url, "example-onnx-mnist", images)
        # The schema's inputs and outputs: the whole batch is one free dimension.
        from_schema = _infer(url, "mnist-schema", images)
        np.testing.assert_allclose(from_schema, expected, rtol=1e-5, atol=1e-6)
    finally:
        services.stop()
