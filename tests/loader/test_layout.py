"""A fetched model laid out as Triton's: one file, a folder without config.pbtxt, a folder of
version folders; the config written names the backend and leaves the rest to Triton, or takes a
KServe v2 schema's inputs and outputs; what cannot be laid out says what to fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from common.modelconfig import parse_model_config
from loader.errors import InvalidModelError
from loader.layout import lay_out
from loader.validate import validate_model_directory

SCHEMA = {
    "inputs": [{"name": "Input3", "datatype": "FP32", "shape": [1, 1, 28, 28]}],
    "outputs": [{"name": "Plus214_Output_0", "datatype": "FP32", "shape": [-1, 10]}],
}


def _config(directory: Path) -> Any:
    return parse_model_config((directory / "config.pbtxt").read_text(), "mnist")


def test_a_single_onnx_file_becomes_version_1_with_a_config_for_onnx_runtime(
    tmp_path: Path,
) -> None:
    (tmp_path / "mnist.onnx").write_bytes(b"onnx bytes")
    said = lay_out(tmp_path, "mnist")
    assert "mnist.onnx as 1/model.onnx" in said and "onnxruntime" in said
    assert (tmp_path / "1" / "model.onnx").read_bytes() == b"onnx bytes"
    config = _config(tmp_path)
    assert (config.name, config.backend, config.max_batch_size) == ("mnist", "onnxruntime", 0)
    assert not config.input and not config.output  # Triton's backend completes them
    checked = validate_model_directory(tmp_path, "mnist", 1 << 20)
    assert checked.versions == (1,) and checked.backend == "onnxruntime"


def test_a_folder_without_config_keeps_the_files_beside_its_model(tmp_path: Path) -> None:
    """ONNX external data is read relative to the model file: it moves with it."""
    (tmp_path / "net.onnx").write_bytes(b"graph")
    (tmp_path / "weights.bin").write_bytes(b"data")
    lay_out(tmp_path, "mnist")
    assert sorted(p.name for p in (tmp_path / "1").iterdir()) == ["model.onnx", "weights.bin"]


@pytest.mark.parametrize(("name", "backend"), [("model.plan", "tensorrt"), ("model.pt", "pytorch")])
def test_version_folders_are_kept_and_the_newest_names_the_backend(
    tmp_path: Path, name: str, backend: str
) -> None:
    for version in ("1", "3"):
        (tmp_path / version).mkdir()
        (tmp_path / version / name).write_bytes(b"x")
    lay_out(tmp_path, "mnist")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "3", "config.pbtxt"]
    assert _config(tmp_path).backend == backend


def test_a_triton_folder_is_left_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "config.pbtxt").write_text('backend: "python"\n')
    assert lay_out(tmp_path, "mnist") == ""
    assert (tmp_path / "config.pbtxt").read_text() == 'backend: "python"\n'


def test_a_schema_gives_the_inputs_and_outputs(tmp_path: Path) -> None:
    (tmp_path / "mnist.onnx").write_bytes(b"x")
    said = lay_out(tmp_path, "mnist", json.dumps(SCHEMA).encode())
    assert "schema" in said
    config = _config(tmp_path)
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("Input3", 11, [1, 1, 28, 28])  # TYPE_FP32
    ]
    assert [(o.name, list(o.dims)) for o in config.output] == [("Plus214_Output_0", [-1, 10])]
    assert config.max_batch_size == 0


def test_a_schema_replaces_those_of_the_model_s_own_config(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "config.pbtxt").write_text(
        'backend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "old" data_type: TYPE_INT8 dims: [ 2 ] } ]\n'
        'parameters { key: "p" value { string_value: "kept" } }\n'
    )
    schema = {**SCHEMA, "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}]}
    lay_out(tmp_path, "mnist", json.dumps(schema).encode())
    config = _config(tmp_path)
    assert [(i.name, i.data_type) for i in config.input] == [("text", 13)]  # TYPE_STRING
    assert config.max_batch_size == 0 and config.parameters["p"].string_value == "kept"


@pytest.mark.parametrize(
    ("files", "said"),
    [
        ({"readme.txt": b"x"}, "no model file Triton recognises"),
        ({"a.onnx": b"x", "b.onnx": b"x"}, "2 model files"),
        ({"1/notes.txt": b"x"}, "holds none of model.onnx, model.plan, model.pt"),
    ],
)
def test_what_cannot_be_laid_out_says_what_to_do(
    tmp_path: Path, files: dict[str, bytes], said: str
) -> None:
    for name, body in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(body)
    with pytest.raises(InvalidModelError, match=said):
        lay_out(tmp_path, "mnist")


@pytest.mark.parametrize(
    ("schema", "said"),
    [
        (b"{", "not JSON"),
        (b"[]", "not KServe's v2 schema"),
        (json.dumps({"inputs": [{"name": "x", "datatype": "FLOAT", "shape": [1]}]}), "FLOAT"),
        (json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [0]}]}), "shape"),
        (json.dumps({"inputs": [{"datatype": "FP32", "shape": [1]}]}), "has no name"),
    ],
)
def test_a_bad_schema_is_refused_with_the_reason(
    tmp_path: Path, schema: bytes | str, said: str
) -> None:
    (tmp_path / "mnist.onnx").write_bytes(b"x")
    body = schema.encode() if isinstance(schema, str) else schema
    with pytest.raises(InvalidModelError, match=said):
        lay_out(tmp_path, "mnist", body)
