"""common.kubeapi.transport against a raw socket server that answers as scripted: Content-Length,
chunked and close-delimited bodies, an interim 100, an idle connection the server closed, garbage;
and binder.api.kube's writes through it over TLS, configured from a kubeconfig (CA, token, path
prefix)."""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from binder.api.kube import Kube
from binder.api.listwatch import PODS
from common.kubeapi.errors import UnavailableError
from common.kubeapi.session import RetryPolicy
from common.kubeapi.transport import Connections, WireError
from tests.conftest import require_executable

HEAD = b"PATCH /x HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n"


class Server:
    """Accepts connections; for each request read, sends the next scripted answer. An answer
    of None closes the connection instead; one starting with "!" is sent (without the "!"), then
    the connection is closed without a word, as a server closes an idle keep-alive connection."""

    def __init__(self, answers: list[bytes | None], tls: ssl.SSLContext | None = None) -> None:
        self.answers = answers
        self.tls = tls
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.requests: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while self.answers:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            if self.tls is not None:
                try:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                except OSError:  # the client refused our certificate
                    conn.close()
                    continue
            with conn:
                while self.answers:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    if not data:
                        break
                    head, _, rest = data.partition(b"\r\n\r\n")
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.lower() == b"content-length":
                            length = int(value)
                    while len(rest) < length:
                        rest += conn.recv(65536)
                    self.requests.append(head + b"\r\n\r\n" + rest)
                    answer = self.answers.pop(0)
                    if answer is None:
                        break
                    conn.sendall(answer.removeprefix(b"!"))
                    if b"Connection: close" in answer or answer.startswith(b"!"):
                        break

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept()
        self.listener.close()
        self._thread.join(5)
        assert not self._thread.is_alive()


@pytest.fixture
def serve() -> Iterator[type[Server]]:
    servers: list[Server] = []

    class Tracked(Server):
        def __init__(self, answers: list[bytes | None], tls: ssl.SSLContext | None = None) -> None:
            super().__init__(answers, tls)
            servers.append(self)

    yield Tracked
    for server in servers:
        server.close()


def test_answers_of_every_framing_are_read_whole_on_one_kept_connection(
    serve: type[Server],
) -> None:
    server = serve(
        [
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nT: 1\r\n\r\n",
            b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 3\r\nContent-Length: 0\r\n\r\n",
        ]
    )
    wire = Connections("127.0.0.1", server.port, tls=None)
    first = wire.request(HEAD, b"{}", 5)
    second = wire.request(HEAD, b"{}", 5)
    third = wire.request(HEAD, b"{}", 5)
    assert (first.status, first.body) == (200, b"hello")
    assert (second.status, second.reason, second.body) == (201, "Created", b"abcde")
    assert (third.status, third.headers["retry-after"]) == (429, "3")
    assert server.connections == 1
    assert server.requests[0].endswith(b"\r\n\r\n{}")
    wire.close()


def test_a_close_delimited_answer_is_read_to_the_end_and_its_connection_not_reused(
    serve: type[Server],
) -> None:
    server = serve(
        [
            b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        ]
    )
    wire = Connections("127.0.0.1", server.port, tls=None)
    assert wire.request(HEAD, b"{}", 5).body == b"all of it"
    assert wire.request(HEAD, b"{}", 5).body == b"ok"
    assert server.connections == 2
    wire.close()


def test_an_idle_connection_the_server_closed_is_replaced_not_used(serve: type[Server]) -> None:
    server = serve(
        [
            b"!HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nb",
            None,
        ]
    )
    wire = Connections("127.0.0.1", server.port, tls=None, idle_check_seconds=0)
    assert wire.request(HEAD, b"{}", 5).body == b"a"
    deadline = time.monotonic() + 5
    while server.connections == 1 and len(server.answers) == 2 and time.monotonic() < deadline:
        # Wait until the server has hung up: its end of the first connection is closed.
        if select.select([wire._idle[0].sock], [], [], 0.05)[0]:
            break
    assert wire.request(HEAD, b"{}", 5).body == b"b"  # on a new connection, not the dead one
    assert server.connections == 2
    # A server that hangs up on a request in flight: an error, and the connection is dropped.
    with pytest.raises(OSError):
        wire.request(HEAD, b"{}", 5)
    assert not wire._idle
    wire.close()


def test_garbage_and_a_cut_answer_are_wire_errors(serve: type[Server]) -> None:
    server = serve([b"SSH-2.0-nope\r\n\r\n"])
    with pytest.raises(WireError, match="not HTTP"):
        Connections("127.0.0.1", server.port, tls=None).request(HEAD, b"{}", 5)
    server = serve([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\nshort"])
    with pytest.raises(WireError, match="middle of an answer"):
        Connections("127.0.0.1", server.port, tls=None).request(HEAD, b"{}", 5)


def test_a_refused_connection_is_an_os_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(OSError):
        Connections("127.0.0.1", port, tls=None, connect_timeout=2).request(HEAD, b"{}", 5)


def kubeconfig(path: Path, server: str, ca: Path | None) -> Path:
    cluster = f"server: {server}" + (f", certificate-authority: {ca}" if ca else "")
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        f"clusters: [{{name: c, cluster: {{{cluster}}}}}]\n"
        "users: [{name: u, user: {token: secret-token}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
    )
    return path


def test_kube_writes_go_over_tls_with_the_kubeconfig_ca_token_and_path_prefix(
    serve: type[Server], tmp_path: Path
) -> None:
    openssl = require_executable("openssl")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=apiserver", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
    server = serve([ok, ok], tls)  # the second is never asked for
    url = f"https://127.0.0.1:{server.port}/prefix"
    kube = Kube(str(kubeconfig(tmp_path / "trusting", url, cert)), retry=RetryPolicy())
    kube.patch_pod_annotations("models", "p", {"a": "b"})
    request = server.requests[0].decode()
    assert request.startswith("PATCH /prefix/api/v1/namespaces/models/pods/p HTTP/1.1\r\n")
    assert "authorization: Bearer secret-token\r\n" in request
    assert "Content-Type: application/strategic-merge-patch+json\r\n" in request
    assert request.endswith('{"metadata":{"annotations":{"a":"b"}}}')
    kube.close()
    # A client that does not trust the server's certificate never sends the request.
    untrusting = Kube(
        str(kubeconfig(tmp_path / "untrusting", url, None)), retry=RetryPolicy(budget_seconds=0.1)
    )
    with pytest.raises(UnavailableError, match="CERTIFICATE_VERIFY_FAILED"):
        untrusting.patch_pod_annotations("models", "p", {"a": "c"})
    untrusting.close()
    assert len(server.requests) == 1


def test_kube_writes_read_a_refreshed_token_within_a_second_not_on_every_write(
    serve: type[Server], tmp_path: Path
) -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
    server = serve([ok] * 4)
    now = [1000.0]
    kube = Kube(
        str(kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{server.port}", None)),
        retry=RetryPolicy(),
        monotonic=lambda: now[0],
    )
    configuration = kube.session._configuration
    hook = configuration.refresh_api_key_hook
    calls = 0

    def refresh(c: object) -> None:  # as the in-cluster loader re-reads an expired token file
        nonlocal calls
        calls += 1
        hook(c)  # re-applies the kubeconfig, and itself as the hook
        c.refresh_api_key_hook = refresh  # type: ignore[attr-defined]
        c.api_key["BearerToken"] = f"Bearer token-{calls}"  # type: ignore[attr-defined]

    configuration.refresh_api_key_hook = refresh
    for _ in range(3):
        kube.patch_pod_annotations("models", "p", {"a": "b"})
    now[0] += 1.0
    kube.patch_pod_annotations("models", "p", {"a": "b"})
    kube.close()
    assert calls == 2, "the hook re-applies the whole kubeconfig: once a second, not per write"
    tokens = [r.split(b"authorization: ")[1].split(b"\r\n")[0] for r in server.requests]
    assert tokens == [b"Bearer token-1"] * 3 + [b"Bearer token-2"]


def chunked(*chunks: bytes) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks)
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n"


EVENTS = (
    b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"7"}}}\n',
    b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"8"}}}\n',
)


def test_kube_watches_stream_events_split_across_chunks_with_the_token_and_prefix(
    serve: type[Server], tmp_path: Path
) -> None:
    first, second = EVENTS
    # One event cut in three chunks, the next sharing a chunk with the end of the first.
    server = serve([chunked(first[:10], first[10:30], first[30:] + second[:5], second[5:])])
    url = f"http://127.0.0.1:{server.port}/prefix"
    kube = Kube(str(kubeconfig(tmp_path / "kubeconfig", url, None)), retry=RetryPolicy())
    opened: list[bool] = []
    events = list(kube.watch(PODS, "6", lambda: opened.append(True)))
    kube.close()
    assert opened == [True]
    assert [(kind, obj["metadata"]["resourceVersion"]) for kind, obj in events] == [
        ("ADDED", "7"),
        ("BOOKMARK", "8"),
    ]
    request = server.requests[0].decode()
    assert request.startswith(
        "GET /prefix/api/v1/pods?watch=true&resourceVersion=6&allowWatchBookmarks=true"
        "&timeoutSeconds=300 HTTP/1.1\r\n"
    )
    assert "authorization: Bearer secret-token\r\n" in request


def test_with_a_proxy_url_lists_writes_and_watches_all_go_through_the_proxy(
    serve: type[Server], tmp_path: Path
) -> None:
    """The proxy here answers as the API server would: what it sees are absolute-form requests
    for the API server, which is never reached directly (its name does not resolve)."""
    listing = b'{"metadata":{"resourceVersion":"6"},"items":[{"metadata":{"name":"a"}}]}'
    proxy = serve(
        [
            b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(listing), listing),
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
            chunked(EVENTS[0]),
        ]
    )
    server = "http://apiserver.invalid:6443/prefix"
    path = kubeconfig(tmp_path / "kubeconfig", server, None)
    path.write_text(
        path.read_text().replace(
            f"server: {server}", f"server: {server}, proxy-url: http://127.0.0.1:{proxy.port}"
        )
    )
    kube = Kube(str(path), retry=RetryPolicy())
    items, version = kube.list_all(PODS)
    kube.patch_pod_annotations("models", "p", {"a": "b"})
    events = list(kube.watch(PODS, version))
    kube.close()
    assert (items, version) == ([{"metadata": {"name": "a"}}], "6")
    assert [kind for kind, _ in events] == ["ADDED"]
    lines = [r.decode().split("\r\n", 1)[0] for r in proxy.requests]
    assert lines == [
        f"GET {server}/api/v1/pods?limit=500 HTTP/1.1",
        f"PATCH {server}/api/v1/namespaces/models/pods/p HTTP/1.1",
        f"GET {server}/api/v1/pods?watch=true&resourceVersion=6&allowWatchBookmarks=true"
        "&timeoutSeconds=300 HTTP/1.1",
    ]
    assert all(b"authorization: Bearer secret-token\r\n" in r for r in proxy.requests)
