"""A private model store over real HTTPS that answers only with the credential a TritonModel's
storage Secret holds (KServe's keys `https-host` and `headers`, mounted as the kubelet mounts a
Secret volume): the host's loader fetches with it, sends it to its `https-host` only and over
HTTPS only, never along a redirect, and says what is wrong with a Secret that is not mounted,
missing, for another host or malformed, without quoting it."""

from __future__ import annotations

import functools
import http.server
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loader.credentials import storage_headers
from loader.errors import FetchError
from loader.fetch import fetch
from sim.modelstore import ModelStore
from sim.tls import self_signed
from tests.conftest import MODELS_DIR
from tests.loader.test_host import StandInAgent, agent, following, ready, until

__all__ = ["agent"]  # the stand-in agent fixture, used below

TOKEN = "Bearer s3cr3t-t0ken"


class _Private(http.server.SimpleHTTPRequestHandler):
    """/private/<file> with the token only (401 otherwise); /open/<file> to anyone; /to/<url>
    redirects there. Every request's Authorization header is noted in `seen`."""

    seen: list[tuple[str, str | None]]

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        if self.path.startswith("/to/"):
            self.send_response(302)
            self.send_header("Location", self.path.removeprefix("/to/"))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path.startswith("/private/") and self.headers.get("Authorization") != TOKEN:
            self.send_error(401, "credential required")
            return
        self.path = "/" + self.path.split("/", 2)[2]
        super().do_GET()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, list[Any]]]:
    """(base URL on 127.0.0.1, the CA file, the requests seen) of the private store, serving
    add_one.tar.gz."""
    base = tmp_path_factory.mktemp("private")
    cert, key = self_signed(base / "tls")
    packer = ModelStore(base / "files", cert, key)  # packs the archive; never started
    packer.publish("add_one", MODELS_DIR / "add_one")
    packer.stop()
    seen: list[Any] = []
    handler = type("Handler", (_Private,), {"seen": seen})
    bound = functools.partial(handler, directory=str(base / "files" / "triton"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), bound)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", cert, seen
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()


@pytest.fixture
def store(
    private: tuple[str, Path, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> tuple[str, list[Any]]:
    base, cert, seen = private
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    seen.clear()
    return base, seen


def mount(directory: Path, secret: str, **keys: str) -> Path:
    """The Secret's keys as files, as the kubelet projects them into the host's volume (a
    Secret that does not exist, optional, leaves no directory)."""
    folder = directory / secret
    folder.mkdir(parents=True)
    for key, value in keys.items():
        (folder / key.replace("_", "-")).write_text(value)
    return directory


def creds(tmp_path: Path, host: str = "127.0.0.1") -> Path:
    headers = json.dumps({"Authorization": TOKEN})
    return mount(tmp_path / "secrets", "creds", https_host=host, headers=headers)


def test_a_private_archive_is_fetched_with_the_secret_headers_only(
    store: tuple[str, list[Any]], tmp_path: Path
) -> None:
    base, seen = store
    uri = f"{base}/private/add_one.tar.gz"
    with pytest.raises(FetchError, match="answered HTTP 401"):
        fetch(uri, tmp_path / "a", max_bytes=1 << 20)
    headers = storage_headers(creds(tmp_path), "creds", uri)
    assert headers == {"Authorization": TOKEN}
    fetch(uri, tmp_path / "b", max_bytes=1 << 20, headers=headers)
    assert (tmp_path / "b" / "config.pbtxt").is_file()
    assert seen == [("/private/add_one.tar.gz", None), ("/private/add_one.tar.gz", TOKEN)]


def test_the_credential_never_follows_a_redirect(
    store: tuple[str, list[Any]], tmp_path: Path
) -> None:
    """A pre-signed URL elsewhere is followed without the credential: to another host, and
    to the same one."""
    base, seen = store
    elsewhere = base.replace("127.0.0.1", "localhost") + "/open/add_one.tar.gz"
    uri = f"{base}/to/{elsewhere}"
    fetch(
        uri,
        tmp_path / "a",
        max_bytes=1 << 20,
        headers=storage_headers(creds(tmp_path), "creds", uri),
    )
    assert (tmp_path / "a" / "config.pbtxt").is_file()
    assert seen == [(f"/to/{elsewhere}", TOKEN), ("/open/add_one.tar.gz", None)]
    seen.clear()
    same = f"{base}/to/{base}/private/add_one.tar.gz"
    with pytest.raises(FetchError, match="answered HTTP 401"):
        fetch(same, tmp_path / "b", max_bytes=1 << 20, headers={"Authorization": TOKEN})
    assert seen[1] == ("/private/add_one.tar.gz", None)


def test_a_secret_that_cannot_be_used_says_why_without_quoting_it(
    store: tuple[str, list[Any]], tmp_path: Path
) -> None:
    base, seen = store
    uri = f"{base}/private/add_one.tar.gz"
    secrets = tmp_path / "secrets"
    with pytest.raises(
        FetchError, match="Secret creds is not in this model host: it does not exist in the model"
    ):
        storage_headers(secrets, "creds", uri)
    mount(secrets, "partial", headers='{"A": "b"}')
    with pytest.raises(FetchError, match="Secret partial has no key https-host; give it keys"):
        storage_headers(secrets, "partial", uri)
    mount(secrets, "other", https_host="models.example.com", headers='{"A": "b"}')
    with pytest.raises(FetchError, match=r"is for host 'models\.example\.com', but storageUri"):
        storage_headers(secrets, "other", uri)
    mount(secrets, "broken", https_host="127.0.0.1", headers="{s3cr3t")
    with pytest.raises(FetchError, match="key headers is not JSON") as raised:
        storage_headers(secrets, "broken", uri)
    assert "s3cr3t" not in str(raised.value)
    mount(secrets, "split", https_host="127.0.0.1", headers='{"A": "x\\r\\nHost: evil"}')
    with pytest.raises(FetchError, match="holds a line break"):
        storage_headers(secrets, "split", uri)
    with pytest.raises(FetchError, match="not https://: the credential is never sent in clear"):
        storage_headers(creds(tmp_path), "creds", uri.replace("https:", "http:"))
    with pytest.raises(FetchError, match="over https:// only"):
        fetch("http://127.0.0.1:1/m.tar.gz", tmp_path / "m", max_bytes=1, headers={"A": "b"})
    with pytest.raises(FetchError, match="is not a Secret name"):
        storage_headers(secrets, "../other-namespace", uri)
    assert seen == [], "nothing was sent"
    assert storage_headers(secrets, "", uri) == {}


async def test_a_host_fetches_a_replica_with_its_storage_secret(
    agent: tuple[StandInAgent, str], store: tuple[str, list[Any]], tmp_path: Path
) -> None:
    servicer, address = agent
    base, seen = store
    servicer.host("add_one", f"{base}/private/add_one.tar.gz")
    servicer.replicas["add_one"].storage_secret = "creds"
    async with following(address, tmp_path, secret_dir=creds(tmp_path)):
        # Listed ready: fetched and loaded (a replica is listed held as soon as its load starts).
        await until(lambda: ready(tmp_path) == ["add_one"], "add_one listed ready")
    assert seen == [("/private/add_one.tar.gz", TOKEN)]
