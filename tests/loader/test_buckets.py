"""A model host's loader fetches s3:// and gs:// models from real bucket servers (moto's S3 API
server with IAM authentication, the GCS emulator): a model folder or one archive, with the
credential its storage Secret mounts and the TritonModel's s3-* settings. A wrong credential, an
empty path, a listing over the size bound and object names escaping the model directory are
refused with a sentence, and the refusal never quotes the credential. A bucket that lists or sends
without end (a stand-in S3 server) is cut at the listing's bounds or at the fetch's deadline."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loader import buckets
from loader.credentials import storage_credential
from loader.errors import FetchError
from loader.fetch import fetch
from tests.buckets import S3, Gcs, HostileS3, archive, gcs_server, hostile_s3, s3_server
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


def test_every_key_a_listing_returns_counts_toward_its_bound(
    s3: S3, emulated: Gcs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys beside the folder that only share its prefix, and folder markers, are skipped but
    counted: a bucket cannot make the loader walk a listing without end by naming them."""
    for store in (s3, emulated):
        store.put_model("models", "crowd/add_one", MODELS / "add_one")
        store.put("models", "crowd/add_one/1/", b"")  # a folder marker
        for n in range(5):
            store.put("models", f"crowd/add_one_{n}/model.py", b"x")
    monkeypatch.setattr(buckets, "MAX_LISTED", 7)
    refusal = (
        r"s3://models/crowd/add_one lists more than 7 keys \(files, folder markers and names "
        r"beside the folder that share its prefix\); point storageUri at the model's own folder"
    )
    with pytest.raises(FetchError, match=refusal):
        _s3_fetch(s3, "s3://models/crowd/add_one", tmp_path / "s3", s3.key_id, s3.secret)
    with pytest.raises(FetchError, match=refusal.replace("s3:", "gs:")):
        fetch("gs://models/crowd/add_one", tmp_path / "gs", max_bytes=64 * MIB)
    monkeypatch.setattr(buckets, "MAX_LISTED", 8)  # 2 files, 1 marker, 5 beside
    _s3_fetch(s3, "s3://models/crowd/add_one", tmp_path / "s3-ok", s3.key_id, s3.secret)
    fetch("gs://models/crowd/add_one", tmp_path / "gs-ok", max_bytes=64 * MIB)
    assert _files(tmp_path / "s3-ok") == ["1/model.py", "config.pbtxt"]
    assert _files(tmp_path / "gs-ok") == ["1/model.py", "config.pbtxt"]


def _hostile_fetch(
    hostile: HostileS3, uri: str, target: Path, deadline_seconds: float = 60.0
) -> tuple[str, float]:
    """What fetching `uri` from `hostile` fails with, and how long it took."""
    secrets = _secret(
        target.parent / "secrets" / target.name,
        "creds",
        AWS_ACCESS_KEY_ID="stand-in",
        AWS_SECRET_ACCESS_KEY="stand-in",
    )
    options = {"s3-endpoint": hostile.endpoint, "s3-usehttps": "0"}
    credential = storage_credential(secrets, "creds", uri, options)
    started = time.monotonic()
    with pytest.raises(FetchError) as failed:
        fetch(
            uri,
            target,
            bucket=credential.bucket,
            max_bytes=64 * MIB,
            deadline_seconds=deadline_seconds,
        )
    return str(failed.value), time.monotonic() - started


def test_an_endless_listing_ends_at_its_bounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages without end of keys beside the folder, or of no key at all: the listing stops at
    its bound on keys or on pages, whichever comes first, and says so."""
    monkeypatch.setattr(buckets, "MAX_LISTED", 2500)
    monkeypatch.setattr(buckets, "MAX_PAGES", 20)
    with hostile_s3() as hostile:
        hostile.listing = "beside"
        said, _ = _hostile_fetch(hostile, "s3://models/m", tmp_path / "beside")
        assert said.startswith("s3://models/m lists more than 2500 keys (files, folder"), said
        assert hostile.pages == 3
        hostile.listing, hostile.pages = "empty", 0
        said, _ = _hostile_fetch(hostile, "s3://models/m", tmp_path / "empty")
        assert said.startswith("s3://models/m lists more than 20 pages; point storageUri"), said
        assert hostile.pages == 21


def test_a_slow_bucket_fails_at_the_fetch_deadline(tmp_path: Path) -> None:
    """A listing whose pages come slowly, and a download that trickles, each fail once the
    fetch's deadline has passed, saying so, however little the bucket sends at a time."""
    deadline = (
        r"^s3://models/(m|slow/model\.tar\.gz) was not fetched within 1 s \(--fetch-timeout\): "
        r"the storage answers too slowly or without end; check that the storage URI names "
        r"the model's own folder or archive, and the storage's health"
    )
    # Without the deadline either fetch runs without end; the bound leaves a loaded machine's
    # scheduling (a fetch's thread, the stand-in's) room beyond the 1 s.
    within = 4.0
    with hostile_s3() as hostile:
        hostile.listing, hostile.page_delay = "empty", 0.1
        said, took = _hostile_fetch(hostile, "s3://models/m", tmp_path / "pages", 1.0)
        assert re.match(deadline, said), said
        assert 1.0 <= took < within, took
        hostile.listing, hostile.page_delay = "one", 0.0
        uri = "s3://models/slow/model.tar.gz"
        said, took = _hostile_fetch(hostile, uri, tmp_path / "trickle", 1.0)
        assert re.match(deadline, said), said
        assert 1.0 <= took < within, took
        ends = time.monotonic() + 2.0  # the stand-in sees the close at its next write
        while hostile.reading and time.monotonic() < ends:
            time.sleep(0.01)
        assert hostile.reading == 0, "the download's connection is closed"
