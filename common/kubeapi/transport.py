"""The transport to the API server: every request of the agent and the binder (lists, watches,
leases, writes) goes through one `Transport`, chosen once at start-up by common.kubeapi.kubeconfig:

- `Direct`: a small HTTP/1.1 client on keep-alive connections (plain or TLS), one request at a
  time on each, answers framed by Content-Length, chunked encoding or the end of the connection;
  a watch streams its answer line by line, keeping its connection until it ends.
- `Proxied`: when a proxy is configured, urllib3's proxy manager (HTTP CONNECT, HTTPS and SOCKS
  proxies, `no_proxy`), as the official client builds it from the same configuration.

Why a client of our own: a pod costs the binder two writes, and through the official client and
urllib3 one write took about 0.28 ms of CPU on the calling thread (argument checks, header
objects, urllib3's retry and timeout objects, http.client's e-mail header parser); here it takes
about 0.04 ms. It knows nothing of Kubernetes: common.kubeapi.kubeconfig gives it the address
and the TLS context; common.kubeapi.session gives it the headers and turns its answers and errors
into ApiErrors. Both transports raise only OSError (WireError included) for a request that got no
answer.

A failure to connect, send or read is an OSError (WireError for an answer that is not HTTP), and
the connection it happened on is closed, never reused. A connection idle for more than
`idle_check_seconds` is checked before it is reused (a server closes idle connections after a
minute or more; checking every time would cost a system call per request).
"""

from __future__ import annotations

import contextlib
import math
import select
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol

import urllib3

MAX_LINE = 65536
MAX_HEADERS = 200


class WireError(OSError):
    """The server's answer is not readable HTTP/1.1."""


@dataclass(frozen=True)
class Answer:
    status: int
    reason: str
    headers: dict[str, str]
    """Header names in lower case; a repeated header keeps its last value."""
    body: bytes


class _Connection:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader: BinaryIO = sock.makefile("rb")
        self.timeout: float | None = sock.gettimeout()
        self.idle_since = 0.0

    def close(self) -> None:
        try:
            self.reader.close()
        finally:
            self.sock.close()


class Connections:
    """Keep-alive connections to one server, shared by threads (each request takes one); `tls`
    wraps each connection (None: plain TCP)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: ssl.SSLContext | None,
        server_hostname: str | None = None,
        connect_timeout: float = 10.0,
        keep: int = 32,
        idle_check_seconds: float = 1.0,
    ) -> None:
        self.host = host
        self.port = port
        self._tls = tls
        self._server_hostname = server_hostname or host
        self._connect_timeout = connect_timeout
        self._keep = keep
        self._idle_check = idle_check_seconds
        self._idle: deque[_Connection] = deque()
        self._lock = threading.Lock()
        self._closed = False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle = list(self._idle)
            self._idle.clear()
        for connection in idle:
            connection.close()

    def request(
        self, head: bytes, body: bytes, timeout: float, connect_timeout: float | None = None
    ) -> Answer:
        """Send `head` (request line and headers, ending with the blank line) and `body`; read
        the whole answer. `timeout` bounds each socket operation, in seconds (rounded up to a
        whole second, so a connection's timeout is set again only when it really changes)."""
        connection = self._take() or self._open(connect_timeout)
        timeout = float(math.ceil(timeout))
        try:
            if connection.timeout != timeout:
                connection.sock.settimeout(timeout)
                connection.timeout = timeout
            connection.sock.sendall(head + body if body else head)
            answer, keep = _read_answer(connection.reader)
        except BaseException:
            connection.close()
            raise
        if keep:
            self._give_back(connection)
        else:
            connection.close()
        return answer

    def _take(self) -> _Connection | None:
        while True:
            try:
                connection = self._idle.pop()
            except IndexError:
                return None
            if time.monotonic() - connection.idle_since < self._idle_check:
                return connection
            # Readable while idle means the server closed it (or sent what we did not ask for).
            readable, _, _ = select.select([connection.sock], [], [], 0)
            if not readable:
                return connection
            connection.close()

    def _give_back(self, connection: _Connection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._keep:
                connection.idle_since = time.monotonic()
                self._idle.append(connection)
                return
        connection.close()

    def stream(self, head: bytes, timeout: float, connect_timeout: float | None = None) -> Stream:
        """Send `head` (a request without a body) and read the answer's status and headers; its
        body is read through the returned Stream, which owns the connection from then on (it is
        closed with the stream, never pooled again). An idle pooled connection is taken first, as
        for any request and as the official client did: no new connection (and TLS handshake)
        per watch."""
        connection = self._take() or self._open(connect_timeout)
        try:
            connection.sock.settimeout(timeout)
            connection.timeout = timeout
            connection.sock.sendall(head)
            status, reason, _, headers = _read_head(connection.reader)
            while 100 <= status < 200:
                status, reason, _, headers = _read_head(connection.reader)
        except BaseException:
            connection.close()
            raise
        return _DirectStream(connection, status, reason, headers)

    def _open(self, connect_timeout: float | None = None) -> _Connection:
        timeout = self._connect_timeout if connect_timeout is None else connect_timeout
        sock = socket.create_connection((self.host, self.port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self._server_hostname)
        except BaseException:
            sock.close()
            raise
        return _Connection(sock)


class Stream(Protocol):
    """An answer whose body is read as it comes (a watch)."""

    status: int
    reason: str
    headers: dict[str, str]
    """Header names in lower case."""

    def lines(self) -> Iterator[bytes]:
        """The body, line by line, until the server ends it. OSError when it breaks."""
        ...

    def read(self) -> bytes:
        """The whole body (of an answer that is not a success)."""
        ...

    def shutdown(self) -> None:
        """End the stream now, from any thread: a blocked `lines()` ends or raises OSError."""
        ...

    def close(self) -> None: ...


class _DirectStream:
    def __init__(
        self, connection: _Connection, status: int, reason: str, headers: dict[str, str]
    ) -> None:
        self._connection = connection
        self.status = status
        self.reason = reason
        self.headers = headers

    def lines(self) -> Iterator[bytes]:
        reader = self._connection.reader
        if "chunked" not in self.headers.get("transfer-encoding", "").lower():
            yield from iter(reader.readline, b"")  # close-delimited or Content-Length
            return
        rest = b""
        for chunk in _chunks(reader):
            rest += chunk
            *complete, rest = rest.split(b"\n")
            for line in complete:
                yield line + b"\n"
        if rest:
            yield rest

    def read(self) -> bytes:
        return _read_body(self._connection.reader, self.status, self.headers)[0]

    def shutdown(self) -> None:
        # The plain socket's shutdown, not SSLSocket's, which would drop the TLS state under a
        # reader blocked in another thread.
        with contextlib.suppress(OSError):  # already closed
            socket.socket.shutdown(self._connection.sock, socket.SHUT_RDWR)

    def close(self) -> None:
        self._connection.close()


class Transport(Protocol):
    """One way to send requests to the API server. `path` starts with "/"; `headers` are the
    request's own (the transport adds Host, User-Agent and framing); `timeout` bounds each read."""

    def request(
        self,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
        timeout: float,
        connect_timeout: float,
    ) -> Answer: ...

    def stream(
        self,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]],
        timeout: float,
        connect_timeout: float,
    ) -> Stream: ...

    def close(self) -> None: ...


class Direct:
    """Requests on our own keep-alive connections to the server at `connections`; `prefix` is the
    server URL's path (an API server behind a path), `host` its Host header."""

    def __init__(self, connections: Connections, prefix: str, host: str, user_agent: str) -> None:
        self.connections = connections
        self._prefix = prefix
        self._fixed = f"Host: {host}\r\nUser-Agent: {user_agent}\r\n"

    def _head(
        self, method: str, path: str, headers: Sequence[tuple[str, str]], length: int | None
    ) -> bytes:
        lines = [f"{method} {self._prefix}{path} HTTP/1.1\r\n{self._fixed}"]
        lines.extend(f"{name}: {value}\r\n" for name, value in headers)
        if length is not None:
            lines.append(f"Content-Length: {length}\r\n")
        lines.append("\r\n")
        return "".join(lines).encode("latin-1")

    def request(
        self,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
        timeout: float,
        connect_timeout: float,
    ) -> Answer:
        head = self._head(method, path, headers, len(body) if body or method != "GET" else None)
        return self.connections.request(head, body, timeout, connect_timeout)

    def stream(
        self,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]],
        timeout: float,
        connect_timeout: float,
    ) -> Stream:
        return self.connections.stream(
            self._head(method, path, headers, None), timeout, connect_timeout
        )

    def close(self) -> None:
        self.connections.close()


_RETRY_ONCE = urllib3.Retry(total=1, connect=0, read=1, redirect=0, status=0)
"""Connection failures are retried by common.kubeapi.session's writes and the informers, with
backoff and a sentence in the log; urllib3's own three immediate retries would only add noise. One
immediate retry of a read stays, for a pooled connection the server closed while idle."""


class Proxied:
    """Requests through a proxy, on the urllib3 pool manager the official client builds for it
    (`base_url`: the server's URL, path included). urllib3's errors become WireErrors."""

    def __init__(self, pool: urllib3.PoolManager, base_url: str, user_agent: str) -> None:
        self._pool = pool
        self._base = base_url.rstrip("/")
        self._user_agent = user_agent

    def _send(
        self,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]],
        body: bytes | None,
        timeout: float,
        connect_timeout: float,
    ) -> Any:
        try:
            return self._pool.request(
                method,
                self._base + path,
                body=body,
                headers={"User-Agent": self._user_agent, **dict(headers)},
                timeout=urllib3.Timeout(connect=connect_timeout, read=timeout),
                retries=_RETRY_ONCE,
                preload_content=False,
            )
        except urllib3.exceptions.HTTPError as e:
            raise WireError(f"{type(e).__name__}: {e}") from e

    def request(
        self,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
        timeout: float,
        connect_timeout: float,
    ) -> Answer:
        response = self._send(
            method, path, headers, body if body or method != "GET" else None, timeout,
            connect_timeout,
        )  # fmt: skip
        try:
            data: bytes = response.read()
        except urllib3.exceptions.HTTPError as e:
            raise WireError(f"{type(e).__name__}: {e}") from e
        finally:
            response.release_conn()
        return Answer(response.status, str(response.reason or ""), _lower(response.headers), data)

    def stream(
        self,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]],
        timeout: float,
        connect_timeout: float,
    ) -> Stream:
        response = self._send(method, path, headers, None, timeout, connect_timeout)
        return _ProxiedStream(response)

    def close(self) -> None:
        self._pool.clear()


def _lower(headers: Any) -> dict[str, str]:
    return {str(name).lower(): str(value) for name, value in headers.items()}


class _ProxiedStream:
    def __init__(self, response: Any) -> None:
        self._response = response
        self.status: int = response.status
        self.reason = str(response.reason or "")
        self.headers = _lower(response.headers)

    def lines(self) -> Iterator[bytes]:
        try:
            yield from self._response
        except urllib3.exceptions.HTTPError as e:
            raise WireError(f"{type(e).__name__}: {e}") from e

    def read(self) -> bytes:
        try:
            data: bytes = self._response.read()
        except urllib3.exceptions.HTTPError as e:
            raise WireError(f"{type(e).__name__}: {e}") from e
        return data

    def shutdown(self) -> None:
        self._response.shutdown()

    def close(self) -> None:
        self._response.release_conn()


def _line(reader: BinaryIO) -> bytes:
    line = reader.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise WireError("the API server sent a line longer than 64 KiB")
    return line


def _read_head(reader: BinaryIO) -> tuple[int, str, str, dict[str, str]]:
    line = _line(reader)
    if not line:
        raise WireError("the API server closed the connection before answering")
    parts = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise WireError(f"the API server's status line is not HTTP: {line[:80]!r}")
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS):
        line = _line(reader)
        if line in (b"\r\n", b"\n"):
            return int(parts[1]), parts[2] if len(parts) > 2 else "", parts[0], headers
        if not line:
            raise WireError("the API server closed the connection in the middle of headers")
        name, colon, value = line.decode("latin-1").partition(":")
        if not colon:
            raise WireError(f"the API server sent a malformed header: {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    raise WireError(f"the API server sent more than {MAX_HEADERS} headers")


def _exactly(reader: BinaryIO, size: int) -> bytes:
    data = reader.read(size)
    if len(data) != size:
        raise WireError("the API server closed the connection in the middle of an answer")
    return data


def _chunks(reader: BinaryIO) -> Iterator[bytes]:
    while True:
        line = _line(reader)
        if not line:
            raise WireError("the API server closed the connection in the middle of an answer")
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise WireError(f"the API server sent a malformed chunk size: {line[:80]!r}") from None
        if size == 0:
            while _line(reader) not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return
        yield _exactly(reader, size)
        if _line(reader) not in (b"\r\n", b"\n"):
            raise WireError("the API server sent a chunk longer than its size")


def _read_answer(reader: BinaryIO) -> tuple[Answer, bool]:
    """The answer, and whether its connection may carry another request."""
    status, reason, version, headers = _read_head(reader)
    while 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
        status, reason, version, headers = _read_head(reader)
    connection = headers.get("connection", "").lower()
    keep = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
    body, framed = _read_body(reader, status, headers)
    return Answer(status, reason, headers, body), keep and framed


def _read_body(reader: BinaryIO, status: int, headers: dict[str, str]) -> tuple[bytes, bool]:
    """The whole body, and whether its end was framed (not the end of the connection)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return b"".join(_chunks(reader)), True
    if "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError:
            raise WireError("the API server sent a malformed Content-Length") from None
        return _exactly(reader, length), True
    if status in (204, 304):
        return b"", True
    return reader.read(), False
