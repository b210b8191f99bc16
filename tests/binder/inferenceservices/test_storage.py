"""A TritonModel's files from an InferenceService's storage: a storageUri as it is, or a key of
ModelMesh's storage-config Secret and a path, with its S3 settings and its credential in
KServe's keys."""

from __future__ import annotations

import json
import re

import pytest

from binder.inferenceservices.predictor import InvalidSpecError, Storage
from binder.inferenceservices.storage import entry_of, files_of

MINIO = {
    "type": "s3",
    "access_key_id": "AKIA",
    "secret_access_key": "SECRET",
    "endpoint_url": "http://minio:9000",
    "default_bucket": "modelmesh-example-models",
    "region": "us-south",
}


def test_a_key_and_path_become_bucket_path_settings_and_credential() -> None:
    files = files_of(Storage(key="localMinIO", path="/onnx/mnist.onnx"), MINIO, "localMinIO")
    assert files.uri == "s3://modelmesh-example-models/onnx/mnist.onnx"
    assert files.s3 == (
        ("s3-endpoint", "minio:9000"),
        ("s3-usehttps", "0"),
        ("s3-region", "us-south"),
    )
    assert files.credential == {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "SECRET"}
    name = files.secret_name()
    assert name.startswith("modelmesh-storage-localminio-")
    rotated = files_of(
        Storage(key="localMinIO", path="m"), {**MINIO, "secret_access_key": "NEW"}, "localMinIO"
    )
    assert rotated.secret_name() != name, "a new credential is a new Secret"


def test_the_bucket_parameter_wins_and_no_credential_uses_the_clouds_chain() -> None:
    entry = {"type": "s3", "bucket": "theirs"}
    files = files_of(Storage(key="k", path="m", parameters=(("bucket", "mine"),)), entry, "k")
    assert (files.uri, files.s3, dict(files.credential)) == ("s3://mine/m", (), {})


def test_a_storage_uri_takes_the_keys_settings_and_credential() -> None:
    files = files_of(Storage(uri="s3://b/m", key="localMinIO"), MINIO, "localMinIO")
    assert files.uri == "s3://b/m" and files.credential
    assert files_of(Storage(uri="s3://b/m"), None, None).uri == "s3://b/m"


def test_gcs_and_https_entries() -> None:
    assert (
        files_of(Storage(key="g", path="m"), {"type": "gcs", "bucket": "b"}, "g").uri == "gs://b/m"
    )
    with pytest.raises(InvalidSpecError, match=r"gcloud-application-credentials\.json"):
        files_of(
            Storage(key="g", path="m"), {"type": "gcs", "bucket": "b", "private_key": "x"}, "g"
        )
    web = {
        "type": "https",
        "url": "https://models.example.com/",
        "headers": {"Authorization": "Bearer t"},
    }
    files = files_of(Storage(key="w", path="mnist"), web, "w")
    assert files.uri == "https://models.example.com/mnist"
    assert files.credential == {
        "https-host": "models.example.com",
        "headers": json.dumps({"Authorization": "Bearer t"}),
    }


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"type": "s3"}, "names no bucket"),
        ({"type": "azure", "bucket": "b"}, "does not fetch"),
        ({"type": "http", "url": "http://plain"}, "HTTPS only"),
        ({"type": "s3", "bucket": "b", "access_key_id": "a"}, "only one of"),
        ({"type": "s3", "bucket": "b", "endpoint_url": "ftp://x"}, "is not http(s)"),
    ],
)
def test_what_a_storage_key_lacks_is_said(entry: dict[str, str], words: str) -> None:
    with pytest.raises(InvalidSpecError, match=re.escape(words)):
        files_of(Storage(key="k", path="m"), entry, "k")


def test_the_storage_config_entries() -> None:
    data = {"localMinIO": json.dumps(MINIO), "default": json.dumps({"type": "s3"}), "bad": "{"}
    assert entry_of(data, "localMinIO") == MINIO
    assert entry_of(data, None) == {"type": "s3"}, "no key: ModelMesh's default key"
    assert entry_of({}, None) is None and entry_of(None, None) is None
    with pytest.raises(InvalidSpecError, match="not in the namespace's storage-config"):
        entry_of(data, "missing")
    with pytest.raises(InvalidSpecError, match="not JSON"):
        entry_of(data, "bad")
    with pytest.raises(InvalidSpecError, match="needs a storage key"):
        files_of(Storage(path="m"), None, None)


def test_with_a_secret_of_its_own_the_keys_credential_is_not_read() -> None:
    files = files_of(Storage(key="k", path="m"), MINIO | {"bucket": "b"}, "k", credential=False)
    assert (files.uri, dict(files.credential)) == ("s3://b/m", {})
    assert files.s3, "the endpoint and region still apply"
    gcs = {"type": "gcs", "bucket": "b", "private_key": "x"}
    assert files_of(Storage(key="g", path="m"), gcs, "g", credential=False).uri == "gs://b/m"


def test_the_schema_path_is_in_the_store_of_the_files() -> None:
    """In the bucket for s3 and gcs (a leading / dropped); under the entry's url path for https;
    in the bucket of a storageUri."""
    schema = "/onnx/schema.json"
    files = files_of(Storage(key="k", path="onnx/mnist.onnx", schema_path=schema), MINIO, "k")
    assert files.schema_path == "onnx/schema.json"
    https = {"type": "https", "url": "https://models.example.com/team"}
    files = files_of(Storage(key="h", path="m.onnx", schema_path=schema), https, "h")
    assert files.uri == "https://models.example.com/team/m.onnx"
    assert files.schema_path == "team/onnx/schema.json"
    assert files_of(Storage(uri="gs://b/m", schema_path=schema), None, None).schema_path == (
        "onnx/schema.json"
    )
    assert files_of(Storage(key="k", path="m"), MINIO, "k").schema_path == ""
