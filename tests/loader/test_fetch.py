"""A model host's loader fetches a replica's files over real HTTPS from the simulated model store,
trusting only the CA store: archives are unpacked at the target's root, and what an archive from
the network may try (paths escaping the directory, links, devices, too many bytes) is refused
with the reason, as are the storage schemes a host cannot fetch."""

from __future__ import annotations

import http.server
import io
import re
import ssl
import tarfile
import threading
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from loader.errors import FetchError
from loader.fetch import check_uri, fetch
from sim.modelstore import ModelStore
from sim.tls import self_signed
from tests.conftest import MODELS_DIR as MODELS


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModelStore, Path]]:
    base = tmp_path_factory.mktemp("store")
    cert, key = self_signed(base / "tls")
    running = ModelStore(base / "files", cert, key)
    running.start()
    try:
        yield running, cert
    finally:
        running.stop()


@pytest.fixture
def trusted(store: tuple[ModelStore, Path], monkeypatch: pytest.MonkeyPatch) -> ModelStore:
    """The store, its CA trusted as a pod's SSL_CERT_FILE would make it."""
    models, cert = store
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    return models


def _tar(store: ModelStore, name: str, add: Callable[[tarfile.TarFile], None]) -> str:
    path = store.directory / "triton" / f"{name}.tar.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as archive:
        add(archive)
    return store.url(name)


def _file(archive: tarfile.TarFile, name: str, data: bytes = b"hi") -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def _link(name: str, target: str, kind: bytes) -> Callable[[tarfile.TarFile], None]:
    def add(archive: tarfile.TarFile) -> None:
        _file(archive, "config.pbtxt")
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, target
        archive.addfile(info)

    return add


def test_an_archive_over_https_is_unpacked_at_the_root(trusted: ModelStore, tmp_path: Path) -> None:
    url = trusted.publish("doubler", MODELS / "add_one")
    target = tmp_path / "m"
    said = fetch(url, target, max_bytes=1 << 20)
    assert said == f"downloaded {url} and unpacked it into {target}"
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*")) == [
        "1",
        "1/model.py",
        "config.pbtxt",
    ]
    assert (target / "config.pbtxt").read_text().startswith('name: "doubler"\n')


def test_the_store_is_trusted_only_through_the_ca_store(
    store: tuple[ModelStore, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    url = store[0].publish("add_one", MODELS / "add_one")
    with pytest.raises(FetchError, match=r"could not be downloaded.*CERTIFICATE_VERIFY_FAILED"):
        fetch(url, tmp_path / "m", max_bytes=1 << 20)


@pytest.mark.parametrize(
    ("add", "message"),
    [
        (lambda a: _file(a, "../outside.txt"), "'../outside.txt', outside the model directory"),
        (lambda a: _file(a, "/etc/outside.txt"), "outside the model directory"),
        (_link("1/model.py", "/etc/passwd", tarfile.SYMTYPE), "'1/model.py', a link"),
        (_link("1/model.py", "config.pbtxt", tarfile.LNKTYPE), "'1/model.py', a link"),
        (_link("1/fifo", "", tarfile.FIFOTYPE), "'1/fifo', a special file"),
    ],
    ids=["dot-dot", "absolute", "symlink", "hardlink", "fifo"],
)
def test_a_tar_member_that_is_no_plain_file_inside_is_refused(
    trusted: ModelStore, tmp_path: Path, add: Callable[[tarfile.TarFile], None], message: str
) -> None:
    url = _tar(trusted, "evil", add)
    target = tmp_path / "deep" / "m"
    with pytest.raises(FetchError, match=message):
        fetch(url, target, max_bytes=1 << 20)
    assert not (tmp_path / "deep" / "outside.txt").exists()
    assert not (target / "config.pbtxt").exists(), "nothing is unpacked once one member fails"


@pytest.mark.parametrize(
    ("name", "mode", "message"),
    [("../outside.txt", 0o100644, "outside the model directory"), ("1/m", 0o120777, "a link")],
    ids=["dot-dot", "symlink"],
)
def test_a_zip_member_that_is_no_plain_file_inside_is_refused(
    trusted: ModelStore, tmp_path: Path, name: str, mode: int, message: str
) -> None:
    path = trusted.directory / "triton" / "evil.zip"
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("config.pbtxt", b"name: 'm'")
        info = zipfile.ZipInfo(name)
        info.external_attr = mode << 16
        archive.writestr(info, b"/etc/passwd")
    with pytest.raises(FetchError, match=message):
        fetch(f"{trusted.base_url}/triton/evil.zip", tmp_path / "deep" / "m", max_bytes=1 << 20)
    assert not (tmp_path / "deep" / "outside.txt").exists()


def test_a_zip_archive_is_unpacked(trusted: ModelStore, tmp_path: Path) -> None:
    path = trusted.directory / "triton" / "zipped.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("config.pbtxt", b"name: 'zipped'")
        archive.writestr("1/model.py", b"pass")
    fetch(f"{trusted.base_url}/triton/zipped.zip", tmp_path / "m", max_bytes=1 << 20)
    assert (tmp_path / "m" / "1" / "model.py").read_bytes() == b"pass"
    assert not (tmp_path / "m" / "zipped.zip").exists(), "the archive is removed once unpacked"


def test_the_size_bound_holds_for_the_download_and_what_it_unpacks_to(
    trusted: ModelStore, tmp_path: Path
) -> None:
    big = _tar(trusted, "big", lambda a: _file(a, "1/weights", bytes(64 * 1024)))
    packed = (trusted.directory / "triton" / "big.tar.gz").stat().st_size
    assert 100 < packed < 4096
    with pytest.raises(FetchError, match=r"unpacks to more than 32Ki.*raise --max-model-bytes"):
        fetch(big, tmp_path / "a", max_bytes=32 * 1024)
    with pytest.raises(FetchError, match=r"is over 100 bytes .*raise --max-model-bytes"):
        fetch(big, tmp_path / "b", max_bytes=100)
    fetch(big, tmp_path / "c", max_bytes=64 * 1024)
    assert (tmp_path / "c" / "1" / "weights").stat().st_size == 64 * 1024


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("pvc://claim/add_one", "cannot read a PersistentVolumeClaim .*serve this model as a mod"),
        ("ftp://host/add_one.tar.gz", "no URI a model host can fetch; use s3://BUCKET/PATH"),
        ("s3:///add_one", "no URI a model host can fetch"),
        ("/mnt/models", "no URI a model host can fetch"),
    ],
)
def test_a_scheme_a_host_cannot_fetch_is_refused_with_the_way_out(uri: str, message: str) -> None:
    with pytest.raises(FetchError, match=message):
        check_uri(uri)


def test_what_cannot_be_downloaded_says_why(trusted: ModelStore, tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="answered HTTP 404"):
        fetch(trusted.url("absent"), tmp_path / "a", max_bytes=1 << 20)
    with pytest.raises(FetchError, match="names no file"):
        fetch(f"{trusted.base_url}/triton/", tmp_path / "b", max_bytes=1 << 20)


def test_a_store_that_is_down_answers_503_until_it_serves_again(
    trusted: ModelStore, tmp_path: Path
) -> None:
    uri = trusted.publish("add_one", MODELS / "add_one")
    trusted.refuse()
    try:
        with pytest.raises(FetchError, match="answered HTTP 503"):
            fetch(uri, tmp_path / "down", max_bytes=1 << 20)
    finally:
        trusted.refuse(False)
    fetch(uri, tmp_path / "up", max_bytes=1 << 20)
    assert (tmp_path / "up" / "config.pbtxt").exists()


class _Redirects(http.server.BaseHTTPRequestHandler):
    """Answers every path with a redirect to the `Location` the path names after /to/."""

    def do_GET(self) -> None:
        self.send_response(302)
        self.send_header("Location", self.path.removeprefix("/to/"))
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def redirector(store: tuple[ModelStore, Path]) -> Iterator[tuple[str, str]]:
    """(http://, https://) base URLs of servers that redirect where the path says; the HTTPS one
    has the model store's certificate."""
    cert = store[1]
    key = cert.with_name("tls.key")
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Redirects) for _ in range(2)]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    servers[1].socket = context.wrap_socket(servers[1].socket, server_side=True)
    threads = [
        threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}) for s in servers
    ]
    for thread in threads:
        thread.start()
    try:
        ports = [s.server_address[1] for s in servers]
        yield f"http://127.0.0.1:{ports[0]}/to/", f"https://127.0.0.1:{ports[1]}/to/"
    finally:
        for server, thread in zip(servers, threads, strict=True):
            server.shutdown()
            thread.join(10)
            server.server_close()


def test_a_redirect_may_not_leave_https_nor_http(
    trusted: ModelStore, redirector: tuple[str, str], tmp_path: Path
) -> None:
    plain, secure = redirector
    url = trusted.publish("add_one", MODELS / "add_one")
    fetch(plain + url, tmp_path / "a", max_bytes=1 << 20)
    assert (tmp_path / "a" / "config.pbtxt").is_file(), "http:// to https:// is followed"
    with pytest.raises(
        FetchError, match=re.escape("redirects to ftp://h/m.tar.gz, which the loader does")
    ):
        fetch(plain + "ftp://h/m.tar.gz", tmp_path / "b", max_bytes=1 << 20)
    downgrade = "http://127.0.0.1:1/m.tar.gz"
    with pytest.raises(
        FetchError, match=re.escape(f"redirects to {downgrade}, which the loader does not")
    ):
        fetch(secure + downgrade, tmp_path / "c", max_bytes=1 << 20)
