"""A model host's loader fetches s3:// and gs:// models from real bucket servers (moto's S3 API
server with IAM authentication, the GCS emulator): a model folder or one archive, with the
credential its storage Secret mounts and the TritonModel's s3-* settings. A wrong credential, an
empty path, a listing over the size bound and object names escaping the model directory are
refused with a sentence, and the refusal never quotes the credential."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from loader import buckets
from loader.credentials import storage_credential
from loader.errors import FetchError
from loader.fetch import fetch
from tests.buckets import S3, Gcs, archive, gcs_server, s3_server
from tests.conftest import MODELS_DIR as MODELS

MIB = 1 << 20


@pytest.fixture(scope="module")
def s3() -> Iterator[S3]:
    with s3_server() as running:
        running.put_model("models", "triton/add_one", MODELS / "add_one")
        running.put("models", "archives/add_one.tar.gz", archive(MODELS / "add_one"))
        yield running


@pytest.fixture(scope="module")
def gcs() -> Iterator[Gcs]:
    with gcs_server() as running:
        running.put_model("models", "triton/add_one", MODELS / "add_one")
        running.put("models", "archives/add_one.tar.gz", archive(MODELS / "add_one"))
        yield running


@pytest.fixture
def emulated(gcs: Gcs, monkeypatch: pytest.MonkeyPatch) -> Gcs:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.host)
    return gcs


def _secret(root: Path, name: str, **keys: str) -> Path:
    """A storage Secret as the binder mounts it in a host's loader: root/<name>/<key>."""
    (root / name).mkdir(parents=True)
    for key, value in keys.items():
        (root / name / key).write_text(value)
    return root


def _s3_fetch(s3: S3, uri: str, target: Path, key_id: str, secret: str, **kw: int) -> str:
    secrets = _secret(
        target.parent / "secrets" / target.name,
        "creds",
        AWS_ACCESS_KEY_ID=key_id,
        AWS_SECRET_ACCESS_KEY=secret,
    )
    options = {"s3-endpoint": s3.endpoint, "s3-usehttps": "0"}
    credential = storage_credential(secrets, "creds", uri, options)
    return fetch(uri, target, bucket=credential.bucket, max_bytes=kw.get("max_bytes", 64 * MIB))


def _files(directory: Path) -> list[str]:
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())


def test_an_s3_folder_and_an_s3_archive_are_fetched_with_the_secrets_keys(
    s3: S3, tmp_path: Path
) -> None:
    said = _s3_fetch(s3, "s3://models/triton/add_one", tmp_path / "a", s3.key_id, s3.secret)
    assert said.startswith("downloaded 2 files of s3://models/triton/add_one")
    assert _files(tmp_path / "a") == ["1/model.py", "config.pbtxt"]
    assert (tmp_path / "a" / "config.pbtxt").read_bytes() == (
        MODELS / "add_one" / "config.pbtxt"
    ).read_bytes()
    uri = "s3://models/archives/add_one.tar.gz"
    said = _s3_fetch(s3, uri, tmp_path / "b", s3.key_id, s3.secret)
    assert "unpacked it" in said
    assert _files(tmp_path / "b") == ["1/model.py", "config.pbtxt"], "the archive is gone"


def test_a_wrong_s3_credential_is_refused_without_quoting_it(s3: S3, tmp_path: Path) -> None:
    with pytest.raises(FetchError) as refused:
        _s3_fetch(s3, "s3://models/triton/add_one", tmp_path / "a", s3.key_id, "n0t-the-s3cret")
    message = str(refused.value)
    assert "S3 refused the credential of Secret creds (SignatureDoesNotMatch)" in message
    assert "AWS_SECRET_ACCESS_KEY" in message
    assert "n0t-the-s3cret" not in message and s3.key_id not in message
    with pytest.raises(FetchError, match=r"InvalidAccessKeyId"):
        _s3_fetch(s3, "s3://models/triton/add_one", tmp_path / "b", "AKIAUNKNOWN", s3.secret)
    assert not (tmp_path / "b").exists() or _files(tmp_path / "b") == []


def test_a_missing_key_or_secret_says_what_to_write(s3: S3, tmp_path: Path) -> None:
    uri = "s3://models/triton/add_one"
    secrets = _secret(tmp_path / "s", "partial", AWS_ACCESS_KEY_ID=s3.key_id)
    with pytest.raises(FetchError, match="Secret partial has no key AWS_SECRET_ACCESS_KEY; give"):
        storage_credential(secrets, "partial", uri, {})
    with pytest.raises(FetchError, match="Secret absent is not in this model host"):
        storage_credential(secrets, "absent", uri, {})
    with pytest.raises(FetchError, match=r"has no key gcloud-application-credentials\.json"):
        storage_credential(secrets, "partial", "gs://models/triton/add_one", {})


def test_what_a_bucket_lists_is_checked_before_anything_is_downloaded(
    s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = "s3://models/triton/add_one"
    with pytest.raises(FetchError, match="unpacks to more than 100 bytes; slim the model"):
        _s3_fetch(s3, uri, tmp_path / "small", s3.key_id, s3.secret, max_bytes=100)
    assert _files(tmp_path / "small") == [], "nothing downloaded"
    s3.put("models", "evil/../../outside.txt", b"hi")
    with pytest.raises(FetchError, match="outside the model directory"):
        _s3_fetch(s3, "s3://models/evil", tmp_path / "evil", s3.key_id, s3.secret)
    assert not (tmp_path / "outside.txt").exists()
    monkeypatch.setattr(buckets, "MAX_OBJECTS", 1)
    with pytest.raises(FetchError, match="holds more than 1 objects; a model has at most 1 files"):
        _s3_fetch(s3, uri, tmp_path / "many", s3.key_id, s3.secret)
    monkeypatch.undo()
    # A path is a folder or one object, never a prefix of another name.
    with pytest.raises(FetchError, match="holds no object; check the bucket and the path"):
        _s3_fetch(s3, "s3://models/triton/add", tmp_path / "prefix", s3.key_id, s3.secret)
    with pytest.raises(FetchError, match="bucket absent does not exist"):
        _s3_fetch(s3, "s3://absent/add_one", tmp_path / "none", s3.key_id, s3.secret)


def test_a_gcs_folder_and_a_gcs_archive_are_fetched(emulated: Gcs, tmp_path: Path) -> None:
    uri = "gs://models/triton/add_one"
    credential = storage_credential(tmp_path, "", uri, {})
    said = fetch(uri, tmp_path / "a", bucket=credential.bucket, max_bytes=64 * MIB)
    assert said.startswith("downloaded 2 files of gs://models/triton/add_one")
    assert _files(tmp_path / "a") == ["1/model.py", "config.pbtxt"]
    said = fetch("gs://models/archives/add_one.tar.gz", tmp_path / "b", max_bytes=64 * MIB)
    assert "unpacked it" in said
    assert _files(tmp_path / "b") == ["1/model.py", "config.pbtxt"]
    with pytest.raises(FetchError, match="unpacks to more than 100 bytes; slim the model"):
        fetch("gs://models/archives/add_one.tar.gz", tmp_path / "c", max_bytes=100)


def test_a_gcs_key_that_is_no_service_account_key_is_refused(emulated: Gcs, tmp_path: Path) -> None:
    uri = "gs://models/triton/add_one"
    key = json.dumps({"type": "service_account", "private_key": "s3cr3t-pem"})
    secrets = _secret(tmp_path / "s", "gcs", **{"gcloud-application-credentials.json": key})
    credential = storage_credential(secrets, "gcs", uri, {})
    with pytest.raises(FetchError) as refused:
        fetch(uri, tmp_path / "a", bucket=credential.bucket, max_bytes=64 * MIB)
    message = str(refused.value)
    assert "Secret gcs: key gcloud-application-credentials.json is not a Google service" in message
    assert "s3cr3t" not in message
