"""The simulated cluster's ONNX model with real compute, built with `onnx`'s helpers.

`conv` is a small convolutional network of about 1.7 MB (four 3x3 convolutions with ReLU, a global
average pool and a fully connected layer: 3x32x32 images in, 100 scores out, about 11 million
multiply-adds an image) with deterministic weights from a seeded generator, for the ONNX Runtime
backend (`backend: "onnxruntime"`, batches of up to 8). `make sim-up` publishes it beside the
example's add_one; the benchmarks and tests write it where they need it. It is built when asked,
never committed: the same seed gives the same bytes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

CONV_NAME = "conv"
CONV_INPUT, CONV_OUTPUT = "IMAGE", "SCORES"
CONV_IMAGE = (3, 32, 32)
CONV_CLASSES = 100
CONV_CHANNELS = (32, 64, 128, 256)
"""Output channels of the four convolutions; all but the first halve the image's side."""
IR_VERSION = 8
"""ONNX IR version 8 and opset 13 (ONNX 1.10): what the ONNX Runtime of every Triton since 22.x
reads, so the same file runs on a real GPU node."""
OPSET = 13
CONV_CONFIG = f"""\
name: "{CONV_NAME}"
backend: "onnxruntime"
max_batch_size: 8
input [
  {{ name: "{CONV_INPUT}" data_type: TYPE_FP32 dims: [ {", ".join(map(str, CONV_IMAGE))} ] }}
]
output [
  {{ name: "{CONV_OUTPUT}" data_type: TYPE_FP32 dims: [ {CONV_CLASSES} ] }}
]
dynamic_batching {{ }}
"""


def _weights(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> TensorProto:
    """He-initialised FP32 weights: the activations keep their scale through the layers."""
    fan_in = int(np.prod(shape[1:]))
    values = rng.normal(0.0, np.sqrt(2.0 / fan_in), shape).astype(np.float32)
    return numpy_helper.from_array(values, name)


def conv_model(seed: int = 0) -> bytes:
    """The network's ONNX file."""
    rng = np.random.default_rng(seed)
    nodes, initializers = [], []
    current, channels = CONV_INPUT, CONV_IMAGE[0]
    for layer, width in enumerate(CONV_CHANNELS):
        weight, bias = f"conv{layer}.weight", f"conv{layer}.bias"
        initializers.append(_weights(rng, weight, (width, channels, 3, 3)))
        initializers.append(numpy_helper.from_array(np.zeros(width, np.float32), bias))
        stride = 1 if layer == 0 else 2
        nodes.append(
            helper.make_node(
                "Conv",
                [current, weight, bias],
                [f"conv{layer}"],
                kernel_shape=[3, 3],
                pads=[1, 1, 1, 1],
                strides=[stride, stride],
            )
        )
        nodes.append(helper.make_node("Relu", [f"conv{layer}"], [f"relu{layer}"]))
        current, channels = f"relu{layer}", width
    nodes.append(helper.make_node("GlobalAveragePool", [current], ["pooled"]))
    nodes.append(helper.make_node("Flatten", ["pooled"], ["features"], axis=1))
    initializers.append(_weights(rng, "fc.weight", (CONV_CLASSES, channels)))
    initializers.append(numpy_helper.from_array(np.zeros(CONV_CLASSES, np.float32), "fc.bias"))
    nodes.append(
        helper.make_node("Gemm", ["features", "fc.weight", "fc.bias"], [CONV_OUTPUT], transB=1)
    )
    graph = helper.make_graph(
        nodes,
        CONV_NAME,
        [helper.make_tensor_value_info(CONV_INPUT, TensorProto.FLOAT, ["batch", *CONV_IMAGE])],
        [helper.make_tensor_value_info(CONV_OUTPUT, TensorProto.FLOAT, ["batch", CONV_CLASSES])],
        initializers,
    )
    model = helper.make_model(
        graph,
        producer_name="tritonshare",
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
    )
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


def write_conv_model(directory: Path, seed: int = 0) -> Path:
    """Write the model's directory (`config.pbtxt`, `1/model.onnx`) at `directory`; return it."""
    (directory / "1").mkdir(parents=True, exist_ok=True)
    (directory / "config.pbtxt").write_text(CONV_CONFIG)
    (directory / "1" / "model.onnx").write_bytes(conv_model(seed))
    return directory
