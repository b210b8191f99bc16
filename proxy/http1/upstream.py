"""Pooled keep-alive HTTP/1.1 connections to Triton for the REST relay.

An `Upstream` sends one request at a time and passes the response back to its `ResponseSink` (the
tenant connection) byte for byte as it arrives, reading only the response head and the body's
framing (Content-Length, chunked, or until close) to know when the response ends and the
connection can be reused. `UpstreamPool` keeps the idle ones, most recently used first, and the
parsed response heads Triton sends again and again (the same status, headers and body length);
each connection also remembers the last head it read, so a response that begins with the same
bytes is recognised without searching for the head's end or hashing it.
What it must not do: look into bodies (but the node gateway's own short answer that Triton lost a
request, whose words say why), or reuse a connection whose exchange did not end cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Final, Protocol

from proxy.http1.framing import (
    MAX_HEAD_BYTES,
    UNANSWERED,
    ChunkedFraming,
    ResponseHead,
    parse_response_head,
)
from proxy.policy.refusals import ProxyError, UpstreamError
from proxy.processflags import ProxyState
from proxy.sockets import local_address, nodelay

_RESPONSE_HEADS: Final = 256
"""Distinct response heads kept (each at most 4 KiB); past that the cache starts again."""
_KNOWN_HEAD_BYTES: Final = 4096
"""The largest response head a connection remembers as its last one."""
_MAX_WORDS: Final = 4096
"""The largest body of the node gateway's unanswered 502 read for its words."""
# `Upstream._remaining` below 0: no body length to count down.
_HEAD: Final = -1  # reading the head
_UNTIL_CLOSE: Final = -2  # the body ends when Triton closes the connection
_CHUNKED: Final = -4  # a chunked body (`ChunkedFraming` finds its end)


class ResponseSink(Protocol):
    """What an upstream connection reports to the tenant connection it serves."""

    def relay_response(self, data: bytes) -> None:
        """Bytes of the response, to pass on as they are."""

    def response_complete(self, upstream: Upstream, data: bytes, reusable: bool) -> None:
        """The response ended with `data` (its last bytes, to pass on as they are; often the whole
        response); `reusable` when the connection may serve another request."""

    def upstream_failed(self, upstream: Upstream, reason: str) -> None:
        """The connection broke before the response was complete."""

    def pause_reading(self) -> None:
        """Triton is not taking request bytes as fast as they come: stop reading them."""

    def resume_reading(self) -> None:
        """Triton takes request bytes again."""


class Upstream(asyncio.Protocol):
    """One keep-alive connection to Triton; relays one response at a time to its client."""

    __slots__ = (
        "_buffer",
        "_chunked",
        "_head_only",
        "_known",
        "_known_framing",
        "_pool",
        "_remaining",
        "_to_close",
        "client",
        "code",
        "keep_alive",
        "said",
        "transport",
    )

    def __init__(self, pool: UpstreamPool) -> None:
        self._pool = pool
        self.transport: asyncio.Transport | None = None
        self.client: ResponseSink | None = None
        self._buffer = b""
        self._chunked: ChunkedFraming | None = None
        self._remaining = _HEAD  # else the body's bytes still due, or a framing below 0
        self._head_only = False
        self._to_close = False
        self.keep_alive = True
        self.code = ""
        """The response's status code as text; empty until its head is read."""
        self.said = ""
        """The node gateway's words when it answered that Triton left the request unanswered
        ("" otherwise, or when they could not be read); the connection is not used again."""
        # The last final response head read on this connection, with its blank line, and what it
        # set: (code, keep_alive, _remaining) for a request other than HEAD.
        self._known = b""
        self._known_framing = ("", False, 0)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = nodelay(transport)

    def begin(self, client: ResponseSink, head_only: bool, data: bytes) -> None:
        """Attach to `client` for one exchange and send `data`, the request's first bytes (its
        head, or all of it). The framing fields are all set when the response head is read; a
        connection only comes back to the pool after a response that ended cleanly."""
        self.client = client
        self._remaining = _HEAD
        self._head_only = head_only
        self.code = ""
        assert self.transport is not None
        self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        client = self.client
        if client is None:  # Triton never speaks unasked; a stray byte means a broken exchange
            self.abort()
            return
        try:
            pos = 0
            if self._remaining == _HEAD:
                if self._buffer:
                    data = self._buffer + data
                    self._buffer = b""
                known = self._known
                if known and data.startswith(known) and not self._head_only:
                    # This connection's last final response head again (the same bytes up to
                    # and including the blank line, so it ends at the same place): as then.
                    pos = len(known)
                    self.code, self.keep_alive, self._remaining = self._known_framing
                    if self._remaining == _CHUNKED:
                        self._chunked = ChunkedFraming()
                else:
                    data, pos = self._read_head(client, data)
                    if pos < 0:
                        return
            remaining = self._remaining
            if remaining >= 0:  # Content-Length, the common framing: `_body_end`, inline
                if remaining <= len(data) - pos:
                    self._remaining = 0
                    end = pos + remaining
                else:
                    self._remaining = remaining - (len(data) - pos)
                    end = -1
            else:
                end = self._body_end(data, pos)
        except ProxyError as e:
            self.abort()
            client.upstream_failed(self, str(e))
            return
        if end == -1:
            client.relay_response(data)
            return
        self.client = None
        if end == len(data):
            client.response_complete(self, data, self.keep_alive)
        else:
            client.response_complete(self, data[:end], False)

    def _read_head(self, client: ResponseSink, data: bytes) -> tuple[bytes, int]:
        """Read the response head: (data, offset past the head), or offset -1 while incomplete.
        Interim 1xx heads (100 Continue) are relayed at once: the client may be waiting."""
        while True:
            head_end = data.find(b"\r\n\r\n")
            if head_end < 0:
                if len(data) > MAX_HEAD_BYTES:
                    raise UpstreamError("Triton's response head is too large")
                self._buffer = data
                return data, -1
            head = self._pool.response_head(data[:head_end])
            if 100 <= head.status < 200:
                client.relay_response(data[: head_end + 4])
                data = data[head_end + 4 :]
                continue
            if head.status == 502 and UNANSWERED in data[: head_end + 4]:
                # The node gateway's: Triton lost the request (it exited, or started again
                # without the model). As a connection lost before the answer: sent again if it
                # may be, else answered with the gateway's words once its short body is here.
                body, length = data[head_end + 4 :], head.content_length
                if length is not None and length <= _MAX_WORDS:
                    if len(body) < length:
                        self._buffer = data
                        return data, -1
                    self.said = _words(body[:length])
                raise UpstreamError("Triton exited with the request unanswered")
            self.code = str(head.status)
            self.keep_alive = head.keep_alive
            if self._head_only or head.status in (204, 304):
                self._remaining = 0
            elif head.chunked:
                self._chunked = ChunkedFraming()
                self._remaining = _CHUNKED
            elif head.content_length is not None:
                self._remaining = head.content_length
            else:
                self._remaining = _UNTIL_CLOSE  # the body ends when Triton closes the connection
                self.keep_alive = False
            if head_end <= _KNOWN_HEAD_BYTES and not self._head_only:
                self._known = data[: head_end + 4]
                self._known_framing = (self.code, self.keep_alive, self._remaining)
            return data, head_end + 4

    def _body_end(self, data: bytes, pos: int) -> int:
        """Offset just past the response's end in `data`, or -1 when it goes on."""
        if self._remaining >= 0:
            step = min(self._remaining, len(data) - pos)
            self._remaining -= step
            return pos + step if self._remaining == 0 else -1
        if self._chunked is not None:
            return self._chunked.feed(data, pos)
        return -1

    def connection_lost(self, exc: Exception | None) -> None:
        self._pool.forget(self)
        client = self.client
        self.client = None
        if client is None:
            return
        if self._remaining == _UNTIL_CLOSE:
            client.response_complete(self, b"", False)  # a close-delimited body ends here
        else:
            client.upstream_failed(self, "Triton closed the connection mid-response")

    def pause_writing(self) -> None:
        if self.client is not None:
            self.client.pause_reading()

    def resume_writing(self) -> None:
        if self.client is not None:
            self.client.resume_reading()

    def write(self, data: bytes) -> None:
        """Send request bytes to Triton."""
        assert self.transport is not None
        self.transport.write(data)

    def abort(self) -> None:
        """Drop the connection (cancels whatever Triton is doing for it)."""
        self.client = None
        if self.transport is not None:
            self.transport.abort()


def _words(body: bytes) -> str:
    """The message of a JSON error body (`{"error": "..."}`); "" when it is not one."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return ""
    return error if isinstance(error, str) else ""


class UpstreamPool:
    """Idle keep-alive connections to Triton, reused most-recent first."""

    def __init__(
        self, host: str, port: int, source_address: str = "", state: ProxyState | None = None
    ) -> None:
        self._host = host
        self._state = state
        """Where the pod's caller key is, sent first on each new connection; None: no key."""
        self._port = port
        self._local = local_address(source_address)
        self._idle: list[Upstream] = []
        self._all: set[Upstream] = set()
        self._heads: dict[bytes, ResponseHead] = {}

    def response_head(self, block: bytes) -> ResponseHead:
        """Triton's parsed response head for `block`; raises UpstreamError when malformed."""
        head = self._heads.get(block)
        if head is None:
            head = parse_response_head(block)
            if len(block) <= 4096:
                if len(self._heads) >= _RESPONSE_HEADS:
                    self._heads.clear()
                self._heads[block] = head
        return head

    def take(self) -> Upstream | None:
        """An idle connection, or None when a new one must be opened."""
        while self._idle:
            upstream = self._idle.pop()
            if upstream.transport is not None and not upstream.transport.is_closing():
                return upstream
        return None

    async def connect(self) -> Upstream:
        """Open a new connection to Triton."""
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(
            lambda: Upstream(self), self._host, self._port, local_addr=self._local
        )
        self._all.add(protocol)
        if self._state is not None and self._state.caller_key:
            protocol.write(self._state.caller_key)
        return protocol

    def put(self, upstream: Upstream) -> None:
        """Return a connection after a complete exchange."""
        self._idle.append(upstream)

    def forget(self, upstream: Upstream) -> None:
        """A connection closed."""
        self._all.discard(upstream)
        with contextlib.suppress(ValueError):
            self._idle.remove(upstream)

    def close(self) -> None:
        """Close every connection."""
        for upstream in list(self._all):
            if upstream.transport is not None:
                upstream.transport.close()
        self._idle.clear()
