"""The example model's ONNX file (deploy/example/model/1/model.onnx), built from nothing but the
protobuf wire format: a graph of one Add node, OUTPUT0 = INPUT0 + 1 in FP32, with the batch and
the length dynamic. It has the inputs, outputs and answers of tests/models/add_one (the Python
model the simulated cluster's CPU Triton runs), in the ONNX Runtime backend that GPU nodes run
by default.

`python -m tests.deploy.example_model` writes the file; tests/deploy/test_example.py checks the
committed one is what this builds.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

MODEL_FILE = (
    Path(__file__).resolve().parents[2] / "deploy" / "example" / "model" / "1" / "model.onnx"
)
IR_VERSION = 8
"""ONNX IR version 8 (ONNX 1.10): what the ONNX Runtime of every Triton since 22.x reads."""
OPSET = 13
FLOAT = 1
"""TensorProto.DataType.FLOAT."""
_VARINT, _LENGTH = 0, 2


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _int(field: int, value: int) -> bytes:
    return _varint(field << 3 | _VARINT) + _varint(value)


def _bytes(field: int, value: bytes) -> bytes:
    return _varint(field << 3 | _LENGTH) + _varint(len(value)) + value


def _text(field: int, value: str) -> bytes:
    return _bytes(field, value.encode())


def _value_info(name: str) -> bytes:
    """ValueInfoProto: an FP32 tensor of shape [batch, n]."""
    dims = b"".join(_bytes(1, _text(2, param)) for param in ("batch", "n"))
    tensor_type = _int(1, FLOAT) + _bytes(2, dims)
    return _text(1, name) + _bytes(2, _bytes(1, tensor_type))


def build() -> bytes:
    """The model's bytes: ModelProto { graph { Add(INPUT0, one) -> OUTPUT0 } }."""
    node = _text(1, "INPUT0") + _text(1, "one") + _text(2, "OUTPUT0") + _text(3, "add")
    node += _text(4, "Add")
    one = _int(1, 1) + _int(2, FLOAT) + _text(8, "one") + _bytes(9, struct.pack("<f", 1.0))
    graph = _bytes(1, node) + _text(2, "add_one") + _bytes(5, one)
    graph += _bytes(11, _value_info("INPUT0")) + _bytes(12, _value_info("OUTPUT0"))
    opset = _text(1, "") + _int(2, OPSET)
    return _int(1, IR_VERSION) + _text(2, "tritonshare") + _bytes(7, graph) + _bytes(8, opset)


if __name__ == "__main__":
    MODEL_FILE.write_bytes(build())
    sys.stdout.write(f"wrote {MODEL_FILE}\n")
