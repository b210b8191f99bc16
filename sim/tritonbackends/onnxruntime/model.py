"""Triton's ONNX Runtime backend for the simulated cluster's CPU Triton, on `onnxruntime`.

The nvidia-pytriton wheel ships Triton with the Python backend only. Triton runs
`<backend-directory>/onnxruntime/model.py` for models whose config says `backend: "onnxruntime"`,
so this file serves them: each instance opens the version's model file (`model.onnx`, or the
config's `default_model_filename`) in an `onnxruntime.InferenceSession` on the CPU and runs it, any
operator and data type ONNX Runtime runs. As the real backend does, a load fails with Triton's error
when the file is no model ONNX Runtime opens, or when config.pbtxt's inputs and outputs do not
match the model's names, data types and ranks (the batch dimension first when `max_batch_size` is
above 0; -1 and the model's named dimensions are free). A batch of requests that agree on every
dimension but the first runs as one call. Like the node's ONNX Runtime (of the release that
`release.json` beside this file names, written by `sim.triton`), it refuses a model whose IR version
or `ai.onnx` opset is newer than that runtime reads, with that runtime's error. As the real backend
does under Triton's auto-complete (on unless `--disable-auto-complete-config`), a config without
inputs or without outputs gets them from the model (`auto_complete_config`): its names and data
types, -1 for a dimension the model leaves free, and, when every input and output has a free first
dimension and the config asks no `max_batch_size`, batches of up to `DEFAULT_MAX_BATCH_SIZE` with
the dynamic batcher.
Each instance uses one thread unless the config's `intra_op_thread_count` parameter asks for more,
so many models share the CPU without spinning on it.
"""

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

ONNX_TYPES = {
    "tensor(bool)": "TYPE_BOOL",
    "tensor(uint8)": "TYPE_UINT8",
    "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32",
    "tensor(uint64)": "TYPE_UINT64",
    "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16",
    "tensor(int32)": "TYPE_INT32",
    "tensor(int64)": "TYPE_INT64",
    "tensor(float16)": "TYPE_FP16",
    "tensor(float)": "TYPE_FP32",
    "tensor(double)": "TYPE_FP64",
    "tensor(string)": "TYPE_STRING",
}
"""ONNX Runtime's type of a tensor, as config.pbtxt names it."""


def _varint(data, at):
    value, shift = 0, 0
    while at < len(data) and shift < 70:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
    raise ValueError("truncated")


def _fields(data):
    """(field number, value or payload bytes) of each field of a protobuf message."""
    at = 0
    while at < len(data):
        tag, at = _varint(data, at)
        wire = tag & 7
        if wire == 0:
            value, at = _varint(data, at)
        elif wire == 2:
            size, at = _varint(data, at)
            value, at = data[at : at + size], at + size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, at = data[at : at + size], at + size
        else:
            raise ValueError(f"wire type {wire}")
        yield tag >> 3, value


def release_problem(path, release_file):
    """ONNX Runtime's own error for a model newer than the release's ONNX Runtime reads ("" when
    it reads it, or when the file is no model: ONNX Runtime then says why)."""
    if not release_file.exists():
        return ""
    release = json.loads(release_file.read_text())
    ir_version, opsets = 0, {}
    try:
        for number, value in _fields(path.read_bytes()):
            if number == 1 and isinstance(value, int):
                ir_version = value
            elif number == 8 and isinstance(value, bytes):
                entry = dict(_fields(value))
                domain = {b"": "ai.onnx"}.get(entry.get(1, b""), entry.get(1, b"").decode())
                if isinstance(entry.get(2), int):
                    opsets[domain] = max(opsets.get(domain, 0), entry[2])
    except (ValueError, OSError, UnicodeDecodeError):
        return ""
    if ir_version > release["onnx_max_ir"]:
        return (
            f"Unsupported model IR version: {ir_version}, max supported IR version: "
            f"{release['onnx_max_ir']}"
        )
    for domain, key in (("ai.onnx", "onnx_max_opset"), ("ai.onnx.ml", "onnx_max_ml_opset")):
        if opsets.get(domain, 0) > release[key]:
            return (
                "ONNX Runtime only *guarantees* support for models stamped with official "
                f"released onnx opset versions. Opset {opsets[domain]} is under development and "
                "support for this is limited. The operator schemas and or other functionality "
                "may change before next ONNX release and in this case ONNX Runtime will not "
                "guarantee backward compatibility. Current official support for domain "
                f"{domain} is till opset {release[key]}."
            )
    return ""


DEFAULT_MAX_BATCH_SIZE = 4
"""Triton's `--backend-config=default-max-batch-size` when not set: what auto-complete gives a
model that can batch."""


def _dims(shape):
    """ONNX Runtime's shape of a tensor as config dims: -1 for a free (named or unknown) one."""
    if not isinstance(shape, list):
        return None
    return [d if isinstance(d, int) and d > 0 else -1 for d in shape]


def completed(config, model_inputs, model_outputs, default_max_batch_size):
    """`config` (a dict, changed in place) completed from the model's inputs and outputs (ONNX
    Runtime's NodeArgs) as the real backend completes it: nothing when the config lists both
    inputs and outputs; else max_batch_size, then what is missing of each."""
    if config.get("input") and config.get("output"):
        return config
    tensors = [*model_inputs, *model_outputs]
    shapes = [_dims(t.shape) for t in tensors]
    batching = all(s and s[0] == -1 for s in shapes)
    if batching and not config.get("max_batch_size"):
        config["max_batch_size"] = max(default_max_batch_size, 0)
        if config["max_batch_size"] > 1 and "sequence_batching" not in config:
            config.setdefault("dynamic_batching", {})
    first = 1 if config.get("max_batch_size", 0) > 0 else 0
    for key, found in (("input", model_inputs), ("output", model_outputs)):
        if config.get(key):
            continue
        config[key] = []
        for tensor in found:
            dims = (_dims(tensor.shape) or [])[first:]
            entry = {"name": tensor.name, "data_type": ONNX_TYPES.get(tensor.type, tensor.type)}
            if dims:
                entry["dims"] = dims
            else:  # a scalar: Triton's tensors have a dimension at least
                entry["dims"], entry["reshape"] = [1], {"shape": []}
            config[key].append(entry)
    return config


def _session(path, config):
    """An ONNX Runtime session of the model file on the CPU, or TritonModelException saying why."""
    problem = release_problem(path, Path(__file__).with_name("release.json"))
    if problem:
        raise pb_utils.TritonModelException(
            f"onnx runtime error 1: Load model from {path} failed:{problem}"
        )
    try:
        import onnxruntime
    except ImportError as e:
        raise pb_utils.TritonModelException(
            "the onnxruntime package is not installed beside the Python backend's stub "
            "(pip install 'tritonshare[test]')"
        ) from e
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = _parameter(config, "intra_op_thread_count", 1)
    options.inter_op_num_threads = _parameter(config, "inter_op_thread_count", 1)
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    try:
        return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise pb_utils.TritonModelException(f"ONNX Runtime cannot open {path}: {e}") from e


def _parameter(config, name, default):
    value = config.get("parameters", {}).get(name, {}).get("string_value", "")
    return int(value) if value.strip() else default


def mismatch(kind, declared, found, batching):
    """Why config.pbtxt's `declared` input or output does not describe the model's `found` one
    ("" when it does)."""
    want = ONNX_TYPES.get(found.type, found.type)
    if declared["data_type"] != want:
        return f"{kind} {found.name!r} is {want} in the model but {declared['data_type']} in config"
    dims = [int(d) for d in declared.get("dims", [])]
    if "reshape" in declared or not isinstance(found.shape, list):
        return ""
    shape = list(found.shape[1:] if batching else found.shape)
    if batching and not found.shape:
        return f"{kind} {found.name!r} has no batch dimension, yet max_batch_size is above 0"
    if len(shape) != len(dims):
        return (
            f"{kind} {found.name!r} has shape {found.shape} in the model: config.pbtxt's dims "
            f"{dims} {'after the batch dimension ' if batching else ''}do not match its rank"
        )
    for have, said in zip(shape, dims, strict=True):
        if isinstance(have, int) and have > 0 and said not in (-1, have):
            return (
                f"{kind} {found.name!r} has shape {found.shape} in the model, dims {dims} in config"
            )
    return ""


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        config = auto_complete_model_config.as_dict()  # the object's own dict: changed in place
        if config.get("input") and config.get("output"):
            return auto_complete_model_config
        name = config.get("default_model_filename") or "model.onnx"
        path = Path(pb_utils.get_model_dir()) / name
        session = _session(path, config)
        completed(config, session.get_inputs(), session.get_outputs(), DEFAULT_MAX_BATCH_SIZE)
        return auto_complete_model_config

    def initialize(self, args):
        config = json.loads(args["model_config"])
        name = config.get("default_model_filename") or "model.onnx"
        path = Path(args["model_repository"]) / args["model_version"] / name
        self.session = _session(path, config)
        self.batching = int(config.get("max_batch_size", 0)) > 0
        self.inputs = [i["name"] for i in config.get("input", [])]
        self.outputs = [o["name"] for o in config.get("output", [])]
        model_inputs = {i.name: i for i in self.session.get_inputs()}
        model_outputs = {o.name: o for o in self.session.get_outputs()}
        problems = [
            f"the model has no input {n!r}" for n in self.inputs if n not in model_inputs
        ] + [f"the model has no output {n!r}" for n in self.outputs if n not in model_outputs]
        problems += [
            f"the model's input {n!r} is not in config.pbtxt"
            for n in model_inputs
            if n not in self.inputs
        ]
        for kind, declared, found in [
            *(("input", i, model_inputs.get(i["name"])) for i in config.get("input", [])),
            *(("output", o, model_outputs.get(o["name"])) for o in config.get("output", [])),
        ]:
            if found is not None:
                problems.append(mismatch(kind, declared, found, self.batching))
        problems = [p for p in problems if p]
        if problems:
            raise pb_utils.TritonModelException(f"{path}: {'; '.join(problems)}")
        self.reshapes = {
            d["name"]: [int(x) for x in d["reshape"].get("shape", [])]
            for d in [*config.get("input", []), *config.get("output", [])]
            if "reshape" in d
        }

    def _feed(self, request):
        feed = {}
        for name in self.inputs:
            array = pb_utils.get_input_tensor_by_name(request, name).as_numpy()
            if array.dtype == np.object_:
                array = np.vectorize(
                    lambda x: x.decode() if isinstance(x, bytes) else x, otypes=[object]
                )(array)
            if name in self.reshapes:
                lead = array.shape[:1] if self.batching else ()
                array = array.reshape([*lead, *self.reshapes[name]])
            feed[name] = array
        return feed

    def _answer(self, values):
        tensors = []
        for name, value in zip(self.outputs, values, strict=True):
            if name in self.reshapes:
                lead = value.shape[:1] if self.batching else ()
                value = value.reshape([*lead, *self.reshapes[name]])
            tensors.append(pb_utils.Tensor(name, np.ascontiguousarray(value)))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _run(self, feed):
        return self.session.run(self.outputs, feed)

    def _run_together(self, feeds, responses):
        """Run the requests' `feeds` as one batch and fill `responses`; False when the batch
        fails (one bad request must not fail the others: each then runs alone)."""
        sizes = [len(feed[self.inputs[0]]) for _, feed in feeds]
        joined = {n: np.concatenate([feed[n] for _, feed in feeds]) for n in self.inputs}
        try:
            values = self._run(joined)
        except Exception:
            return False
        parts = [np.split(value, np.cumsum(sizes)[:-1]) for value in values]
        for k, (at, _) in enumerate(feeds):
            responses[at] = self._answer([part[k] for part in parts])
        return True

    def execute(self, requests):
        feeds, responses = [], [None] * len(requests)
        for at, request in enumerate(requests):
            try:
                feeds.append((at, self._feed(request)))
            except Exception as e:
                responses[at] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e)))
        same = self.batching and bool(self.inputs) and len(feeds) > 1
        same = same and all(
            all(f[n].shape[1:] == feeds[0][1][n].shape[1:] for n in self.inputs) for _, f in feeds
        )
        if same and self._run_together(feeds, responses):
            return responses
        for at, feed in feeds:
            try:
                responses[at] = self._answer(self._run(feed))
            except Exception as e:
                responses[at] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e)))
        return responses
