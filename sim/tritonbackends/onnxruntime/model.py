"""A stand-in for Triton's ONNX Runtime backend, for the simulated cluster's CPU Triton.

The nvidia-pytriton wheel ships Triton with the Python backend only; this Python-based backend
(Triton runs `<backend-directory>/onnxruntime/model.py` for models whose config says
`backend: "onnxruntime"`) evaluates small ONNX graphs of element-wise arithmetic on FP32
tensors (Add, Sub, Mul, Div, Identity, with FP32 initializers), enough for deploy/example's
add_one. A graph with any other operator fails to load with a message that names it. It reads
the ONNX protobuf wire format itself: no onnx or onnxruntime package exists for this machine.
"""

import json
import struct
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

OPERATORS = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": np.divide,
}
FLOAT = 1


def _varint(data, at):
    value, shift = 0, 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _fields(data):
    """(field number, value) of one protobuf message: ints for varints, bytes otherwise."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
        elif wire == 2:
            length, at = _varint(data, at)
            value, at = data[at : at + length], at + length
        elif wire == 5:
            value, at = data[at : at + 4], at + 4
        elif wire == 1:
            value, at = data[at : at + 8], at + 8
        else:
            raise ValueError(f"protobuf wire type {wire} is not supported")
        yield number, value


def _tensor(data):
    name, dims, kind, raw, floats = "", [], None, None, []
    for number, value in _fields(data):
        if number == 1:
            dims.append(value) if isinstance(value, int) else dims.extend(_packed_ints(value))
        elif number == 2:
            kind = value
        elif number == 4:
            floats.extend(struct.unpack(f"<{len(value) // 4}f", value))
        elif number == 8:
            name = value.decode()
        elif number == 9:
            raw = value
    if kind != FLOAT:
        raise ValueError(f"initializer {name!r} is not FP32 (data type {kind})")
    array = np.frombuffer(raw, "<f4") if raw is not None else np.array(floats, np.float32)
    return name, array.reshape(dims).astype(np.float32)


def _packed_ints(data):
    at, out = 0, []
    while at < len(data):
        value, at = _varint(data, at)
        out.append(value)
    return out


def parse(model_bytes):
    """The graph's nodes [(op, inputs, outputs)] and initializers {name: array}."""
    graph = next((v for n, v in _fields(model_bytes) if n == 7), None)
    if graph is None:
        raise ValueError("the file holds no ONNX graph")
    nodes, constants = [], {}
    for number, value in _fields(graph):
        if number == 1:
            inputs, outputs, op = [], [], ""
            for field, item in _fields(value):
                if field == 1:
                    inputs.append(item.decode())
                elif field == 2:
                    outputs.append(item.decode())
                elif field == 4:
                    op = item.decode()
            if op not in OPERATORS and op != "Identity":
                raise ValueError(
                    f"operator {op!r} is not one the simulated cluster's ONNX stand-in runs "
                    f"({', '.join([*OPERATORS, 'Identity'])}); run this model on a real GPU node"
                )
            nodes.append((op, inputs, outputs))
        elif number == 5:
            name, array = _tensor(value)
            constants[name] = array
    return nodes, constants


class TritonPythonModel:
    def initialize(self, args):
        path = Path(args["model_repository"]) / args["model_version"] / "model.onnx"
        try:
            self.nodes, self.constants = parse(path.read_bytes())
        except (ValueError, IndexError, struct.error) as e:
            raise pb_utils.TritonModelException(f"{path}: {e}") from e
        config = json.loads(args["model_config"])
        self.inputs = [i["name"] for i in config["input"]]
        self.outputs = [o["name"] for o in config["output"]]

    def execute(self, requests):
        responses = []
        for request in requests:
            values = dict(self.constants)
            for name in self.inputs:
                values[name] = pb_utils.get_input_tensor_by_name(request, name).as_numpy()
            for op, inputs, outputs in self.nodes:
                args = [values[name] for name in inputs]
                values[outputs[0]] = args[0] if op == "Identity" else OPERATORS[op](*args)
            tensors = [
                pb_utils.Tensor(name, np.asarray(values[name], np.float32)) for name in self.outputs
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
