"""The stand-in for KServe's storage initializer fetches a model archive from the simulated model
store over HTTPS (trusting only the process's CA store) and unpacks it where KServe's would: the
model directory's files at the target's root; an s3:// model comes from a real S3 API server with
the environment the webhook writes. It refuses what it cannot fetch, saying why."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.storage import StorageAccess
from sim.modelstore import ModelStore
from sim.tls import self_signed
from sim.triton import free_port
from tests.buckets import REGION, s3_server
from webhook import storage

ROOT = Path(__file__).resolve().parents[3]
MODELS = ROOT / "tests" / "models"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[ModelStore, Path]]:
    cert, key = self_signed(tmp_path / "tls")
    running = ModelStore(tmp_path / "store", cert, key)
    running.start()
    try:
        yield running, cert
    finally:
        running.stop()


def initialize(source: str, target: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "SSL_CERT_FILE"}
    return subprocess.run(
        [sys.executable, "-m", "sim.node.storage_initializer", source, str(target)],
        env={**base, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_published_archive_is_unpacked_into_the_model_directory(
    store: tuple[ModelStore, Path], tmp_path: Path
) -> None:
    models, cert = store
    url = models.publish("doubler", MODELS / "add_one")
    assert url == f"{models.base_url}/triton/doubler.tar.gz"
    target = tmp_path / "mnt-models"
    done = initialize(url, target, SSL_CERT_FILE=str(cert))
    assert done.returncode == 0, done.stderr
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*")) == [
        "1",
        "1/model.py",
        "config.pbtxt",
    ], "the archive is gone and the model's files are at the root"
    config = (target / "config.pbtxt").read_text()
    assert config.startswith('name: "doubler"\n')
    assert (
        config.split("\n", 1)[1]
        == (MODELS / "add_one" / "config.pbtxt").read_text().split("\n", 1)[1]
    )


def test_the_store_is_trusted_only_through_the_ca_store(
    store: tuple[ModelStore, Path], tmp_path: Path
) -> None:
    models, _ = store
    done = initialize(models.publish("add_one", MODELS / "add_one"), tmp_path / "m")
    assert done.returncode == 1
    assert "CERTIFICATE_VERIFY_FAILED" in done.stderr


def test_what_cannot_be_fetched_is_refused_with_the_reason(
    store: tuple[ModelStore, Path], tmp_path: Path
) -> None:
    models, cert = store
    missing = initialize(models.url("absent"), tmp_path / "a", SSL_CERT_FILE=str(cert))
    assert missing.returncode == 1 and "answered HTTP 404" in missing.stderr
    listing = initialize(f"{models.base_url}/triton/", tmp_path / "b", SSL_CERT_FILE=str(cert))
    assert listing.returncode == 1 and "names no file" in listing.stderr
    claim = initialize("pvc://claim/add_one", tmp_path / "c")
    assert claim.returncode == 1 and "a pvc:// claim once mounted" in claim.stderr
    down = initialize(f"http://127.0.0.1:{free_port()}/m.tar.gz", tmp_path / "d")
    assert down.returncode == 1 and "could not be downloaded" in down.stderr


def test_an_s3_model_is_fetched_with_the_environment_the_webhook_writes(tmp_path: Path) -> None:
    """The webhook's environment for s3:// (KServe's names) reaches the same fetcher a model
    host runs: the Secret's keys and the s3-* annotations."""
    access = StorageAccess("s3", "creds")
    with s3_server() as s3:
        uri = s3.put_model("models", "triton/add_one", MODELS / "add_one")
        options = (("s3-endpoint", s3.endpoint), ("s3-usehttps", "0"), ("s3-region", REGION))
        env = {
            e["name"]: e["value"] for e in storage.environment(StorageAccess("s3", None, options))
        }
        keys = {"AWS_ACCESS_KEY_ID": s3.key_id, "AWS_SECRET_ACCESS_KEY": s3.secret}
        done = initialize(uri, tmp_path / "m", **env, **keys)
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "m" / "config.pbtxt").is_file()
        assert (tmp_path / "m" / "1" / "model.py").is_file()
        wrong = initialize(uri, tmp_path / "w", **env, **{**keys, "AWS_SECRET_ACCESS_KEY": "x"})
    assert wrong.returncode == 1
    assert "S3 refused the credential of the pod's storage Secret" in wrong.stderr
    assert [e["name"] for e in storage.environment(access)][:2] == [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    ], "the keys the initializer is given come from the Secret"


def test_an_archive_escaping_the_model_directory_is_refused(
    store: tuple[ModelStore, Path], tmp_path: Path
) -> None:
    models, cert = store
    evil = models.directory / "triton" / "evil.tar.gz"
    evil.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(evil, "w:gz") as archive:
        info = tarfile.TarInfo("../outside.txt")
        info.size = 2
        archive.addfile(info, io.BytesIO(b"hi"))
    done = initialize(models.url("evil"), tmp_path / "m", SSL_CERT_FILE=str(cert))
    assert done.returncode == 1
    assert not (tmp_path / "outside.txt").exists()


def test_a_local_directory_is_copied(tmp_path: Path) -> None:
    done = initialize(str(MODELS / "identity"), tmp_path / "m")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "m" / "1" / "model.py").read_text() == (
        MODELS / "identity" / "1" / "model.py"
    ).read_text()
