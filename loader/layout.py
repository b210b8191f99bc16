"""Completing fetched files into Triton's model layout, as ModelMesh's Triton adapter does, so a
model given as one file (`onnx/mnist.onnx`) or as a folder without `config.pbtxt` is served:

- with `config.pbtxt`: the folder is Triton's model already and is kept as it is;
- without it, with numbered version folders: kept, and a config written for the model file of
  the newest version;
- without either: every file moves into version `1/`, the one model file renamed as its backend
  looks for it (`*.onnx` -> `model.onnx`, `*.plan` -> `model.plan`, `*.pt` -> `model.pt`; files
  beside it, such as ONNX external data, keep their names next to it), and a config written.

The config written says the model's `name` and `backend` only: Triton completes the rest from the
model file, as it does under ModelMesh's `--strict-model-config=false` (auto-complete, on unless
`--disable-auto-complete-config`; the ONNX Runtime and TensorRT backends read the inputs, the
outputs and whether the model batches). A schema (KServe's v2 model schema JSON, `{"inputs":
[{"name", "datatype", "shape"}], "outputs": [...]}`) replaces the inputs and outputs, of a written
config or of the model's own: `datatype` as `TYPE_<datatype>` (`BYTES` as `TYPE_STRING`), `shape`
as `dims` of the whole tensor (-1 free), and `max_batch_size` 0.

Owns the layout of one fetched folder; it must not fetch (fetch.py) or check what it wrote
(validate.py does). Each failure raises InvalidModelError saying what to fix. Blocking: call it
off the event loop.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common.modelconfig import (
    ModelConfig,
    ModelConfigError,
    model_config_text,
    parse_model_config,
)
from loader.errors import InvalidModelError
from loader.validate import CONFIG_FILE, is_version_name

MODEL_FILES = {
    ".onnx": ("model.onnx", "onnxruntime"),
    ".plan": ("model.plan", "tensorrt"),
    ".pt": ("model.pt", "pytorch"),
}
"""A model file's suffix: the name its Triton backend opens in a version folder, and the backend."""
MAX_SCHEMA_BYTES = 1 << 20
"""A schema larger than this is no list of tensors."""
DATATYPES: tuple[str, ...] = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16")
DATATYPES += ("INT32", "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16")
"""KServe v2's tensor data types."""


def lay_out(directory: Path, model_id: str, schema: bytes | None = None) -> str:
    """Make `directory` Triton's model `model_id`; a sentence of what was done ("" when it was
    Triton's model already and no schema was given). InvalidModelError says what to fix."""
    config_path = directory / CONFIG_FILE
    done: list[str] = []
    if config_path.is_file() and schema is None:
        return ""
    if config_path.is_file():
        config = _parsed(config_path.read_text(encoding="utf-8", errors="replace"), model_id)
    else:
        backend = _versioned(directory, done)
        config = _parsed(f'backend: "{backend}"', model_id)
        config.name = model_id
        done.append(f"wrote {CONFIG_FILE} for backend {backend} (Triton completes it)")
    if schema is not None:
        _apply_schema(config, schema)
        done.append("took the inputs and outputs of the schema")
    config_path.write_text(model_config_text(config), encoding="utf-8")
    return "; ".join(done)


def _versioned(directory: Path, done: list[str]) -> str:
    """Move a folder without version folders into `1/`; the backend of the newest version's
    model file."""
    entries = sorted(directory.iterdir()) if directory.is_dir() else []
    versions = [e for e in entries if e.is_dir() and is_version_name(e.name)]
    if not versions:
        models = [e for e in entries if e.is_file() and e.suffix.lower() in MODEL_FILES]
        if len(models) != 1:
            raise InvalidModelError(_no_model(entries, len(models)))
        version = directory / "1"
        staging = directory / ".version"
        staging.mkdir()
        for entry in entries:
            entry.rename(staging / entry.name)
        staging.rename(version)
        name, _ = MODEL_FILES[models[0].suffix.lower()]
        if models[0].name != name:
            (version / models[0].name).rename(version / name)
        done.append(f"laid out {models[0].name} as {version.name}/{name}")
        versions = [version]
    newest = max(versions, key=lambda v: int(v.name))
    for name, backend in MODEL_FILES.values():
        if (newest / name).exists():
            return backend
    names = ", ".join(name for name, _ in MODEL_FILES.values())
    raise InvalidModelError(
        f"the model has no {CONFIG_FILE} and its version {newest.name} holds none of {names}: "
        f"add a {CONFIG_FILE} that names the backend (see Triton's model configuration)"
    )


def _no_model(entries: list[Path], found: int) -> str:
    suffixes = ", ".join(sorted(MODEL_FILES))
    if found:
        return (
            f"the model has no {CONFIG_FILE} and {found} model files ({suffixes}): give one "
            f"model file, or lay the folder out as Triton's model with a {CONFIG_FILE}"
        )
    listed = ", ".join(e.name for e in entries[:10]) or "nothing"
    return (
        f"the model has no {CONFIG_FILE} and no model file Triton recognises ({suffixes}; found "
        f"{listed}): point the storage at the model file, or add a {CONFIG_FILE}"
    )


def _parsed(text: str, model_id: str) -> ModelConfig:
    try:
        return parse_model_config(text, model_id)
    except ModelConfigError as e:
        raise InvalidModelError(
            e.advised(wrong_name=f'set name: "{model_id}" or remove it', invalid="fix it")
        ) from e


def _apply_schema(config: ModelConfig, schema: bytes) -> None:
    if len(schema) > MAX_SCHEMA_BYTES:
        raise InvalidModelError(
            f"the model's schema is over {MAX_SCHEMA_BYTES >> 20} MiB: point schemaPath at "
            "KServe's v2 schema JSON of its inputs and outputs"
        )
    try:
        data = json.loads(schema)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidModelError(f"the model's schema is not JSON: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("inputs"), list):
        raise InvalidModelError(
            'the model\'s schema is not KServe\'s v2 schema: write {"inputs": [{"name", '
            '"datatype", "shape"}], "outputs": [...]}'
        )
    config.max_batch_size = 0
    for key, field in (("inputs", config.input), ("outputs", config.output)):
        tensors = data.get(key) or []
        if not isinstance(tensors, list):
            raise InvalidModelError(f"the model's schema: {key} is not a list of tensors")
        del field[:]
        for number, tensor in enumerate(tensors, 1):
            _add_tensor(field, _tensor(tensor, f"{key}[{number}]"))


def _tensor(tensor: Any, where: str) -> tuple[str, str, list[int]]:
    if not isinstance(tensor, dict):
        raise InvalidModelError(f"the model's schema: {where} is not an object")
    name, datatype, shape = tensor.get("name"), tensor.get("datatype"), tensor.get("shape")
    if not isinstance(name, str) or not name:
        raise InvalidModelError(f"the model's schema: {where} has no name")
    if datatype not in DATATYPES:
        raise InvalidModelError(
            f"the model's schema: {where} ({name}) has datatype {datatype!r}, not one of "
            f"KServe v2's ({', '.join(DATATYPES)})"
        )
    if (
        not isinstance(shape, list)
        or not shape
        or any(isinstance(d, bool) or not isinstance(d, int) or d < -1 or d == 0 for d in shape)
    ):
        raise InvalidModelError(
            f"the model's schema: {where} ({name}) has shape {shape!r}: write a list of sizes "
            "above 0, -1 for a free one"
        )
    return name, "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}", shape


def _add_tensor(field: Any, tensor: tuple[str, str, list[int]]) -> None:
    name, data_type, dims = tensor
    entry = field.add()
    entry.name = name
    types = entry.DESCRIPTOR.fields_by_name["data_type"].enum_type.values_by_name
    entry.data_type = types[data_type].number
    entry.dims.extend(dims)
