"""A model host's files: one `.onnx` file fetched is laid out as Triton's model, with the inputs
and outputs of the schema its `schema-path` option names (fetched from the same bucket, with the
same credential, within the schema's own bound); the files are kept while the URI and the schema
stay the same and fetched again when either changes; a schema path naming more than one file is
refused with the URI."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from common.modelconfig import parse_model_config
from loader.agentclient import Hosted, ModelState, ModelStatus
from loader.credentials import StorageCredential
from loader.errors import FetchError
from loader.hostfiles import HostFiles
from loader.layout import MAX_SCHEMA_BYTES

SCHEMA = {
    "inputs": [{"name": "Input3", "datatype": "FP32", "shape": [-1, 1, 28, 28]}],
    "outputs": [{"name": "Plus214_Output_0", "datatype": "FP32", "shape": [-1, 10]}],
}


class Bucket:
    """Stands in for the bucket: what each URI lists, and the fetches asked of it."""

    def __init__(self, objects: dict[str, dict[str, bytes]]) -> None:
        self.objects = objects
        self.fetched: list[tuple[str, int]] = []

    async def __call__(
        self,
        uri: str,
        directory: Path,
        max_bytes: int,
        stop: threading.Event,
        credential: StorageCredential,
        seconds: float,
    ) -> str:
        self.fetched.append((uri, max_bytes))
        await asyncio.to_thread(self._write, uri, directory)
        return f"downloaded {uri}"

    def _write(self, uri: str, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for name, body in self.objects[uri].items():
            (directory / name).write_bytes(body)


def _replica(uri: str, schema: str = "") -> Hosted:
    options = (("schema-path", schema),) if schema else ()
    status = ModelStatus(model_id="mnist", state=ModelState.ABSENT)
    return Hosted("mnist", 0, uri, "always", False, 0, 0, status, storage_options=options)


def _files(tmp_path: Path, bucket: Bucket) -> HostFiles:
    return HostFiles(
        tmp_path / "models",
        secret_dir=tmp_path / "no-secrets",
        max_bytes=1 << 30,
        fetch_seconds=10.0,
        fetcher=bucket,
        stop=threading.Event(),
    )


def test_one_onnx_file_and_its_schema_make_triton_s_model(tmp_path: Path) -> None:
    uri, schema_uri = "s3://b/onnx/mnist.onnx", "s3://b/onnx/schema.json"
    bucket = Bucket(
        {
            uri: {"mnist.onnx": b"graph"},
            schema_uri: {"schema.json": json.dumps(SCHEMA).encode()},
            "s3://b/onnx/other.json": {"other.json": json.dumps(SCHEMA).encode()},
        }
    )
    files = _files(tmp_path, bucket)
    directory = asyncio.run(files.fetched("mnist.0", _replica(uri, "onnx/schema.json")))
    assert (directory / "1" / "model.onnx").read_bytes() == b"graph"
    config = parse_model_config((directory / "config.pbtxt").read_text(), "mnist")
    assert config.backend == "onnxruntime" and [i.name for i in config.input] == ["Input3"]
    assert bucket.fetched == [(uri, 1 << 30), (schema_uri, MAX_SCHEMA_BYTES)]
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [
        ".fetching",
        ".sources",
        "mnist.0",
    ]
    assert not list((tmp_path / "models" / ".fetching").iterdir())

    asyncio.run(files.fetched("mnist.0", _replica(uri, "onnx/schema.json")))
    assert len(bucket.fetched) == 2, "the same files and schema are kept"
    asyncio.run(files.fetched("mnist.0", _replica(uri, "onnx/other.json")))
    assert len(bucket.fetched) == 4, "another schema fetches again"
    asyncio.run(files.fetched("mnist.0", _replica(uri)))
    assert len(bucket.fetched) == 5, "no schema: the model's own config again"
    config = parse_model_config((directory / "config.pbtxt").read_text(), "mnist")
    assert not config.input


def test_a_schema_path_naming_a_folder_is_refused_with_its_uri(tmp_path: Path) -> None:
    uri = "s3://b/onnx/mnist.onnx"
    bucket = Bucket(
        {uri: {"mnist.onnx": b"x"}, "s3://b/schemas": {"a.json": b"{}", "b.json": b"{}"}}
    )
    with pytest.raises(FetchError, match=r"s3://b/schemas, the model's schema, names 2 files"):
        asyncio.run(_files(tmp_path, bucket).fetched("mnist.0", _replica(uri, "schemas")))
