"""On the simulated node (a real Triton, ONNX Runtime's stand-in), the agent refuses to install an
ONNX model newer than the node's Triton release reads, saying which export it reads, and keeps
nothing; the same model exported within the bounds installs, loads and answers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import kubernetes.client
import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from common.tritonrelease import PINNED
from protos import agent_pb2
from sim.apiserver import RunningApiServer
from sim.triton import TritonInstall, TritonServer
from tests.agent.conftest import RunningAgent, bearer, install_dir, make_pod, name_in_triton
from tests.agent.test_attacks import entries, refused

pytestmark = pytest.mark.triton

CONFIG = """\
backend: "onnxruntime"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


@pytest.fixture
def triton(triton_install: TritonInstall, model_repository: Path) -> Iterator[TritonServer]:
    """The simulated node's Triton, which serves ONNX models (`running` starts its agent on it)."""
    server = TritonServer(model_repository, onnx_standin=True)
    server.start()
    try:
        yield server
    finally:
        server.discard()


def doubling(directory: Path, **versions: int) -> Path:
    """OUT = IN * 2, built with onnx.helper.make_model's defaults or the versions given."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["IN", "IN"], ["OUT"])],
        "doubling",
        [helper.make_tensor_value_info("IN", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, ["n"])],
    )
    if "opset" in versions:
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", versions["opset"])])
    else:
        model = helper.make_model(graph)
    if "ir_version" in versions:
        model.ir_version = versions["ir_version"]
    (directory / "1").mkdir(parents=True, exist_ok=True)
    (directory / "config.pbtxt").write_text(CONFIG)
    (directory / "1" / "model.onnx").write_bytes(model.SerializeToString())
    return directory


async def test_a_model_newer_than_the_node_s_onnx_runtime_is_refused_with_the_export_to_make(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    model_repository: Path,
    tmp_path: Path,
) -> None:
    make_pod(kube_api, "p", "m", gpu_uuid=running.mock.gpus[0].uuid)
    token = apiserver.mint_token("default", "p")
    source = doubling(tmp_path / "m")  # this onnx's defaults: IR 14 (or newer), opset 28...
    error = await refused(install_dir(running.stub, token, source, "m"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    details = error.details() or ""
    assert (
        f"is newer than this node's ONNX Runtime 1.19 reads (<= {PINNED.onnx_max_ir}): "
        f"export with ir_version={PINNED.onnx_max_ir}"
    ) in details, details
    assert f"(<= {PINNED.onnx_max_opset}): export with opset_version=" in details, details
    assert entries(model_repository) == []

    doubling(source, ir_version=PINNED.onnx_max_ir, opset=PINNED.onnx_max_opset + 1)
    error = await refused(install_dir(running.stub, token, source, "m"))
    details = error.details() or ""
    assert f"opset {PINNED.onnx_max_opset + 1} is newer" in details and "IR" not in details

    doubling(source, ir_version=PINNED.onnx_max_ir, opset=PINNED.onnx_max_opset)
    await install_dir(running.stub, token, source, "m")
    status = await running.stub.LoadModel(
        agent_pb2.LoadModelRequest(model_id="m"), metadata=bearer(token)
    )
    assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
    with httpclient.InferenceServerClient(triton.http_url) as client:
        tensor = httpclient.InferInput("IN", [3], "FP32")
        tensor.set_data_from_numpy(np.array([1, 2, 3], dtype=np.float32))
        answer = client.infer(name_in_triton(kube_api, "p", "m"), [tensor]).as_numpy("OUT")
    np.testing.assert_array_equal(answer, [2, 4, 6])
