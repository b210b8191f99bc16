"""A stand-in node gateway for the proxy's tests: a TCP forwarder in front of the real Triton
that passes every connection on byte for byte, counts the requests that went through it whole,
and can cut every connection it holds while it goes on listening, as the node gateway's
process ending does while its keeper holds the listening socket. Told to `hold`, it passes
nothing of Triton's back on the connections opened until the cut, so that a request is still
unanswered at the cut however slowly the test runs."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_END_STREAM = 0x1
_DATA, _HEADERS = 0x0, 0x1


class Forwarder(socketserver.ThreadingTCPServer):
    """Every connection to it, passed on to `target` byte for byte."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int, target: str) -> None:
        host, _, target_port = target.rpartition(":")
        self.target = (host, int(target_port))
        self.sent = 0
        """Requests passed on whole: gRPC calls whose END_STREAM went, REST POSTs whose body
        went to its last byte (not the proxy's readiness checks), since the last cut."""
        self.holding = False
        """Connections opened now get nothing back from Triton (`hold`), until the cut."""
        self.begun = 0
        """REST POSTs whose head went through, since the last `hold`."""
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        super().__init__(("127.0.0.1", port), Splice)

    def hold(self) -> None:
        """Pass nothing back from Triton on the connections opened from now until the cut, and
        count the requests passed on from now."""
        with self._lock:
            self.holding = True
            self.sent = 0
            self.begun = 0

    def cut(self, hold_next: bool = False) -> int:
        """Close every connection held, both ways, at once (the process that held them ended);
        the forwarder goes on listening, and passes answers again (unless `hold_next`: not on
        the connections opened until the next cut either). The number cut."""
        with self._lock:
            held, self._open = self._open, set()
            self.sent = 0
            self.holding = hold_next
        for sock in held:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        return len(held) // 2

    def _held(self, *sockets: socket.socket) -> None:
        with self._lock:
            self._open.update(sockets)

    def _count(self) -> None:
        with self._lock:
            self.sent += 1


class _Requests:
    """Counts the requests whole in one direction of a connection (see `Forwarder.sent`)."""

    def __init__(self, forwarder: Forwarder) -> None:
        self._forwarder = forwarder
        self._seen = b""
        self._http2: bool | None = None
        self._body_left = -1  # REST: body bytes still to come; -1 reading a head
        self._counted = False  # REST: the request read is an inference (a POST), counted

    def feed(self, data: bytes) -> None:
        self._seen += data
        if self._http2 is None:
            if len(self._seen) < len(PREFACE):
                return
            self._http2 = self._seen.startswith(PREFACE)
            if self._http2:
                self._seen = self._seen[len(PREFACE) :]
        if self._http2:
            self._frames()
        else:
            self._rest()

    def _frames(self) -> None:
        while len(self._seen) >= 9:
            length = int.from_bytes(self._seen[:3], "big")
            if len(self._seen) < 9 + length:
                return
            kind, flags = self._seen[3], self._seen[4]
            self._seen = self._seen[9 + length :]
            if kind in (_DATA, _HEADERS) and flags & _END_STREAM:
                self._forwarder._count()

    def _rest(self) -> None:
        while True:
            if self._body_left < 0:
                end = self._seen.find(b"\r\n\r\n")
                if end < 0:
                    return
                head, self._seen = self._seen[:end].lower(), self._seen[end + 4 :]
                length = 0
                for line in head.split(b"\r\n"):
                    if line.startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                self._body_left = length
                self._counted = head.startswith(b"post ")
                if self._counted:
                    self._forwarder.begun += 1
            taken = min(self._body_left, len(self._seen))
            self._seen = self._seen[taken:]
            self._body_left -= taken
            if self._body_left:
                return
            self._body_left = -1
            if self._counted:
                self._forwarder._count()


class Splice(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        assert isinstance(self.server, Forwarder)
        forwarder = self.server
        tenant = self.request
        holding = forwarder.holding
        with socket.create_connection(forwarder.target) as upstream:
            forwarder._held(tenant, upstream)
            requests = _Requests(forwarder)

            def pump(source: socket.socket, sink: socket.socket, count: bool) -> None:
                try:
                    while data := source.recv(65536):
                        if not count and holding:
                            continue  # Triton's bytes on a held connection: never passed back
                        sink.sendall(data)
                        if count:
                            requests.feed(data)
                except OSError:
                    pass
                finally:
                    with contextlib.suppress(OSError):
                        sink.shutdown(socket.SHUT_WR)

            back = threading.Thread(target=pump, args=(upstream, tenant, False))
            back.start()
            pump(tenant, upstream, True)
            back.join()
