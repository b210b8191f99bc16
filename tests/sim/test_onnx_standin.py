"""The simulated node's ONNX Runtime backend serves ONNX models through a real Triton as ONNX
Runtime itself runs them: the convolutional model in batches and in requests Triton batches
together, models with dynamic dimensions in FP32 and INT64; a file ONNX Runtime cannot open, or a
config that does not describe the model, fails to load with Triton's error and leaves Triton
serving."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from numpy.typing import NDArray
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from common.tritonrelease import PINNED
from sim.onnxmodels import (
    CONV_IMAGE,
    CONV_INPUT,
    CONV_NAME,
    CONV_OUTPUT,
    conv_model,
    write_conv_model,
)
from sim.triton import TritonInstall, TritonServer
from tests.deploy.example_model import MODEL_FILE

pytestmark = pytest.mark.triton
EXAMPLE = MODEL_FILE.parents[1]


@pytest.fixture
def triton(triton_install: TritonInstall, model_repository: Path) -> Iterator[TritonServer]:
    server = TritonServer(model_repository, onnx_standin=True)
    server.start()
    try:
        yield server
    finally:
        server.discard()


@pytest.fixture
def http(triton: TritonServer) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(triton.http_url, concurrency=8)
    try:
        yield client
    finally:
        client.close()


def _reference(model: Path, name: str, data: NDArray[Any]) -> NDArray[Any]:
    """ONNX Runtime's own answer for the model file."""
    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    [output] = session.run(None, {name: data})
    return np.asarray(output)


def _infer(
    client: httpclient.InferenceServerClient, model: str, name: str, data: NDArray[Any], output: str
) -> NDArray[Any]:
    tensor = httpclient.InferInput(name, list(data.shape), _datatype(data))
    tensor.set_data_from_numpy(data)
    return np.asarray(client.infer(model, [tensor]).as_numpy(output))


def _datatype(data: NDArray[Any]) -> str:
    return {np.float32: "FP32", np.int64: "INT64"}[data.dtype.type]


def _images(count: int, seed: int) -> NDArray[Any]:
    return np.random.default_rng(seed).random((count, *CONV_IMAGE), dtype=np.float32)


def test_the_conv_model_answers_as_onnxruntime_does_in_batches(
    triton: TritonServer, http: httpclient.InferenceServerClient, model_repository: Path
) -> None:
    model = write_conv_model(model_repository / CONV_NAME) / "1" / "model.onnx"
    http.load_model(CONV_NAME)
    images = _images(3, seed=1)
    answer = _infer(http, CONV_NAME, CONV_INPUT, images, CONV_OUTPUT)
    assert answer.shape == (3, 100)
    np.testing.assert_allclose(answer, _reference(model, CONV_INPUT, images), rtol=1e-4, atol=1e-5)
    with grpcclient.InferenceServerClient(triton.grpc_url) as grpc:
        tensor = grpcclient.InferInput(CONV_INPUT, [1, *CONV_IMAGE], "FP32")
        tensor.set_data_from_numpy(images[:1])
        single = grpc.infer(CONV_NAME, [tensor]).as_numpy(CONV_OUTPUT)
    np.testing.assert_allclose(single, answer[:1], rtol=1e-4, atol=1e-5)


def test_requests_triton_batches_together_each_get_their_own_answer(
    http: httpclient.InferenceServerClient, model_repository: Path
) -> None:
    """The config's dynamic batcher hands the backend several requests at once; the backend runs
    them as one batch and splits the answer by each request's batch size."""
    model = write_conv_model(model_repository / CONV_NAME) / "1" / "model.onnx"
    http.load_model(CONV_NAME)
    batches = [_images(1 + k % 3, seed=k) for k in range(16)]
    sent = []
    for batch in batches:
        tensor = httpclient.InferInput(CONV_INPUT, list(batch.shape), "FP32")
        tensor.set_data_from_numpy(batch)
        sent.append(http.async_infer(CONV_NAME, [tensor]))
    for batch, request in zip(batches, sent, strict=True):
        answer = request.get_result().as_numpy(CONV_OUTPUT)
        expected = _reference(model, CONV_INPUT, batch)
        np.testing.assert_allclose(answer, expected, rtol=1e-4, atol=1e-5)


def _doubling_model(path: Path) -> None:
    """OUT = IN * 2 in INT64, every dimension dynamic and no batch dimension."""
    two = helper.make_tensor("two", TensorProto.INT64, [], [2])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["IN", "two"], ["OUT"])],
        "doubling",
        [helper.make_tensor_value_info("IN", TensorProto.INT64, ["rows", "columns"])],
        [helper.make_tensor_value_info("OUT", TensorProto.INT64, ["rows", "columns"])],
        [two],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    path.mkdir(parents=True)
    onnx.save_model(model, str(path / "model.onnx"))


DOUBLING_CONFIG = """\
name: "doubling"
backend: "onnxruntime"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT64 dims: [ -1, -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT64 dims: [ -1, -1 ] } ]
"""


def test_dynamic_dimensions_take_any_size(
    http: httpclient.InferenceServerClient, model_repository: Path
) -> None:
    """deploy/example's add_one (FP32, batch and length dynamic) and an INT64 model of two
    dynamic dimensions without batching answer for several shapes."""
    shutil.copytree(EXAMPLE, model_repository / "add_one")
    config = model_repository / "add_one" / "config.pbtxt"  # on the CPU, as the agent pins it
    config.write_text(config.read_text().replace("KIND_GPU", "KIND_CPU"))
    _doubling_model(model_repository / "doubling" / "1")
    (model_repository / "doubling" / "config.pbtxt").write_text(DOUBLING_CONFIG)
    http.load_model("add_one")
    http.load_model("doubling")
    for shape in ((1, 3), (4, 7)):
        data = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        np.testing.assert_array_equal(_infer(http, "add_one", "INPUT0", data, "OUTPUT0"), data + 1)
        ints = np.arange(np.prod(shape), dtype=np.int64).reshape(shape) - 5
        np.testing.assert_array_equal(_infer(http, "doubling", "IN", ints, "OUT"), ints * 2)


def _replaced(old: str, new: str) -> Callable[[Path], object]:
    def change(model: Path) -> object:
        config = model / "config.pbtxt"
        return config.write_text(config.read_text().replace(old, new, 1))

    return change


BROKEN: dict[str, tuple[Callable[[Path], object], str]] = {
    "not_onnx": (lambda d: (d / "1" / "model.onnx").write_bytes(b"no model"), "cannot open"),
    "wrong_dims": (_replaced("dims: [ 100 ]", "dims: [ 10 ]"), "dims [10] in config"),
    "wrong_type": (_replaced("TYPE_FP32", "TYPE_FP16"), "TYPE_FP32 in the model but TYPE_FP16"),
}


def test_a_model_it_cannot_run_fails_to_load_and_triton_serves_on(
    triton: TritonServer, model_repository: Path
) -> None:
    """Loaded at once beside a good model, as Triton's load threads take them."""
    for name, (change, _) in BROKEN.items():
        broken = write_conv_model(model_repository / name)
        change(broken)
        config = broken / "config.pbtxt"
        config.write_text(config.read_text().replace(f'"{CONV_NAME}"', f'"{name}"', 1))
    write_conv_model(model_repository / CONV_NAME)

    def load(name: str) -> str:
        try:
            grpc.load_model(name)
        except InferenceServerException as e:
            return str(e)
        return ""

    with (
        grpcclient.InferenceServerClient(triton.grpc_url) as grpc,
        ThreadPoolExecutor(len(BROKEN) + 1) as pool,
    ):
        names = [*BROKEN, CONV_NAME]
        failures = dict(zip(names, pool.map(load, names), strict=True))
        assert grpc.is_server_live()
        assert grpc.is_model_ready(CONV_NAME), failures[CONV_NAME]
    for name, (_, said) in BROKEN.items():
        assert "load failed" in failures[name] and said in failures[name], failures[name]


def _doubling_at(path: Path, **versions: int) -> None:
    """The doubling model with onnx.helper.make_model's defaults, or the `ir_version`, `opset` and
    `ml_opset` given."""
    _doubling_model(path / "1")
    model = onnx.load(str(path / "1" / "model.onnx"))
    fresh = helper.make_model(model.graph)  # this onnx's own IR and opset
    if "ir_version" in versions:
        fresh.ir_version = versions["ir_version"]
    if "opset" in versions:
        fresh.opset_import[0].version = versions["opset"]
    if "ml_opset" in versions:
        fresh.opset_import.append(helper.make_opsetid("ai.onnx.ml", versions["ml_opset"]))
    (path / "1" / "model.onnx").write_bytes(fresh.SerializeToString())
    (path / "config.pbtxt").write_text(DOUBLING_CONFIG.replace('"doubling"', f'"{path.name}"'))


def test_the_pinned_release_s_onnx_runtime_bounds_hold(
    http: httpclient.InferenceServerClient, model_repository: Path
) -> None:
    """The simulated node follows the node's Triton (`common.tritonrelease.PINNED`), not the
    onnxruntime package it runs on: a model of onnx's defaults (an IR and opset newer than ONNX
    Runtime 1.19 reads) fails to load with ONNX Runtime's error, as on a real node; one at the
    bounds loads and answers."""
    assert PINNED.onnx_max_ir < onnx.IR_VERSION  # else the defaults prove nothing
    _doubling_at(model_repository / "defaults")
    _doubling_at(model_repository / "new_opset", ir_version=PINNED.onnx_max_ir)
    bounds = {"ir_version": PINNED.onnx_max_ir, "opset": PINNED.onnx_max_opset}
    _doubling_at(model_repository / "new_ml", **bounds, ml_opset=PINNED.onnx_max_ml_opset + 1)
    _doubling_at(model_repository / "bounds", **bounds, ml_opset=PINNED.onnx_max_ml_opset)
    with pytest.raises(InferenceServerException) as refused:
        http.load_model("defaults")
    said = str(refused.value)
    assert "load failed" in said and "Unsupported model IR version" in said, said
    assert f"max supported IR version: {PINNED.onnx_max_ir}" in said, said
    with pytest.raises(InferenceServerException) as refused:
        http.load_model("new_opset")
    said = str(refused.value)
    expected = f"Current official support for domain ai.onnx is till opset {PINNED.onnx_max_opset}"
    assert expected in said, said
    with pytest.raises(InferenceServerException) as refused:
        http.load_model("new_ml")
    expected = f"support for domain ai.onnx.ml is till opset {PINNED.onnx_max_ml_opset}"
    assert expected in str(refused.value), str(refused.value)
    http.load_model("bounds")
    ints = np.arange(6, dtype=np.int64).reshape(2, 3)
    np.testing.assert_array_equal(_infer(http, "bounds", "IN", ints, "OUT"), ints * 2)


def test_a_config_without_inputs_and_outputs_is_completed_from_the_model(
    http: httpclient.InferenceServerClient, model_repository: Path
) -> None:
    """As Triton's ONNX Runtime backend under auto-complete: the conv model (batch dimension
    free) gets batches of up to 4 with the dynamic batcher and its dims after the batch, and so
    does the doubling model (every dimension free) without config.pbtxt at all (Triton finds
    the backend by its file); one of fixed shape is not batched; each answers as ONNX Runtime
    does."""
    model = write_conv_model(model_repository / CONV_NAME) / "1" / "model.onnx"
    (model_repository / CONV_NAME / "config.pbtxt").write_text('backend: "onnxruntime"\n')
    _doubling_model(model_repository / "doubling" / "1")
    http.load_model(CONV_NAME)
    http.load_model("doubling")
    config = http.get_model_config(CONV_NAME)
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config, config
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        (CONV_INPUT, "TYPE_FP32", list(CONV_IMAGE))
    ]
    assert [(o["name"], o["dims"]) for o in config["output"]] == [(CONV_OUTPUT, [100])]
    images = _images(2, seed=3)
    answer = _infer(http, CONV_NAME, CONV_INPUT, images, CONV_OUTPUT)
    np.testing.assert_allclose(answer, _reference(model, CONV_INPUT, images), rtol=1e-4, atol=1e-5)
    doubling = http.get_model_config("doubling")
    assert doubling["max_batch_size"] == 4, doubling
    assert [(i["name"], i["data_type"], i["dims"]) for i in doubling["input"]] == [
        ("IN", "TYPE_INT64", [-1])
    ]
    ints = np.arange(6, dtype=np.int64).reshape(3, 2)
    np.testing.assert_array_equal(_infer(http, "doubling", "IN", ints, "OUT"), ints * 2)
    fixed = onnx.load_from_string(conv_model())  # a batch of exactly 1 instead of a free one
    for tensor in (*fixed.graph.input, *fixed.graph.output):
        tensor.type.tensor_type.shape.dim[0].dim_value = 1
    (model_repository / "fixed" / "1").mkdir(parents=True)
    onnx.save_model(fixed, str(model_repository / "fixed" / "1" / "model.onnx"))
    (model_repository / "fixed" / "config.pbtxt").write_text('backend: "onnxruntime"\n')
    http.load_model("fixed")
    config = http.get_model_config("fixed")
    assert config["max_batch_size"] == 0 and "dynamic_batching" not in config, config
    assert [i["dims"] for i in config["input"]] == [[1, *CONV_IMAGE]]
    answer = _infer(http, "fixed", CONV_INPUT, images[:1], CONV_OUTPUT)
    np.testing.assert_allclose(
        answer, _reference(model, CONV_INPUT, images[:1]), rtol=1e-4, atol=1e-5
    )
