"""A small HTTP/1.1 client for the binder's API writes: keep-alive connections (plain or TLS), one
request at a time on each, answers framed by Content-Length, chunked encoding or the end of the
connection.

Why: a pod costs the binder two writes, and through the official client and urllib3 one write
took about 0.28 ms of CPU on the calling thread (argument checks, header objects, urllib3's
retry and timeout objects, http.client's e-mail header parser); here it takes about 0.04 ms. It
knows nothing of Kubernetes: binder.kube gives it the address, the TLS context and the headers,
and turns its answers and errors into ApiErrors.

A failure to connect, send or read is an OSError (WireError for an answer that is not HTTP), and
the connection it happened on is closed, never reused. A connection idle for more than
`idle_check_seconds` is checked before it is reused (a server closes idle connections after a
minute or more; checking every time would cost a system call per request).
"""

from __future__ import annotations

import math
import select
import socket
import ssl
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import BinaryIO

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
    """Keep-alive connections to one server, shared by threads (each request takes one)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: ssl.SSLContext | None = None,
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

    def request(self, head: bytes, body: bytes, timeout: float) -> Answer:
        """Send `head` (request line and headers, ending with the blank line) and `body`; read
        the whole answer. `timeout` bounds each socket operation, in seconds (rounded up to a
        whole second, so a connection's timeout is set again only when it really changes)."""
        connection = self._take() or self._open()
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

    def _open(self) -> _Connection:
        sock = socket.create_connection((self.host, self.port), timeout=self._connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self._server_hostname)
        except BaseException:
            sock.close()
            raise
        return _Connection(sock)


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


def _chunked(reader: BinaryIO) -> bytes:
    parts: list[bytes] = []
    while True:
        line = _line(reader)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise WireError(f"the API server sent a malformed chunk size: {line[:80]!r}") from None
        if size == 0:
            while _line(reader) not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return b"".join(parts)
        parts.append(_exactly(reader, size))
        if _line(reader) not in (b"\r\n", b"\n"):
            raise WireError("the API server sent a chunk longer than its size")


def _read_answer(reader: BinaryIO) -> tuple[Answer, bool]:
    """The answer, and whether its connection may carry another request."""
    status, reason, version, headers = _read_head(reader)
    while 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
        status, reason, version, headers = _read_head(reader)
    connection = headers.get("connection", "").lower()
    keep = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = _chunked(reader)
    elif "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError:
            raise WireError("the API server sent a malformed Content-Length") from None
        body = _exactly(reader, length)
    elif status in (204, 304):
        body = b""
    else:
        body = reader.read()
        keep = False
    return Answer(status, reason, headers, body), keep
