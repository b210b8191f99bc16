"""Strict HTTP/1.1 message framing for the REST relay: request and response heads, chunked bodies.

Pure functions and small state machines over bytes; no I/O. The relay forwards bodies verbatim,
so all it needs to know is where each message ends. Anything ambiguous is refused rather than
guessed, because a proxy and a server that disagree on where a request ends can be made to
forward a second, hidden request (request smuggling): both Content-Length and Transfer-Encoding,
repeated or malformed lengths, folded header lines, control characters in the request line or in
header values (every byte below 0x20 but HTAB, and DEL: RFC 9110 5.5), an HTTP/1.1 request
without exactly one valid Host (RFC 9112 3.2), and transfer codings other than `chunked` are all
answered 400 (or 501). The head is re-serialized from what was parsed, so Triton sees exactly
what the proxy checked. `tests/proxy/http1/test_framing_h11.py` holds this parser to h11's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from proxy.policy.refusals import (
    MalformedRequestError,
    UnsupportedEncodingError,
    UnsupportedError,
    UpstreamError,
)

MAX_HEAD_BYTES: Final = 64 * 1024
_MAX_CHUNK_LINE: Final = 4096
_TOKEN: Final = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
# The target is a URI (RFC 9112 3.2): visible ASCII only; other bytes must be percent-encoded.
_REQUEST_LINE: Final = re.compile(rb"(" + _TOKEN + rb") ([\x21-\x7e]+) (HTTP/1\.[01])")
# A field value is visible ASCII, SP, HTAB and obs-text (RFC 9110 5.5): no other control byte.
_HEADER: Final = re.compile(rb"(" + _TOKEN + rb"):[ \t]*([\t\x20-\x7e\x80-\xff]*?)[ \t]*")
# Host is uri-host [":" port] (RFC 9112 3.2, RFC 3986 3.2.2): a reg-name, IPv4 or IP-literal.
_HOST: Final = re.compile(
    rb"(?:[A-Za-z0-9\-._~!$&'()*+,;=%]*|\[[0-9A-Fa-f:.vV\-._~!$&'()*+,;=]+\])(?::[0-9]*)?"
)
_HEX: Final = re.compile(rb"[0-9A-Fa-f]{1,15}")
_STATUS_LINE: Final = re.compile(rb"HTTP/1\.([01]) ([0-9]{3})(?: [^\r\n]*)?")
# Headers that describe one connection, not the message: never forwarded as received.
_HOP_BY_HOP: Final = frozenset(
    (b"connection", b"keep-alive", b"proxy-connection", b"te", b"upgrade", b"trailer")
)


@dataclass(frozen=True, slots=True)
class RequestHead:
    """A parsed request head, with the headers to forward (shared: the relay caches heads)."""

    method: str
    target: str
    version: bytes
    headers: tuple[bytes, ...]
    """Forwarded header lines, `Name: value`, without hop-by-hop ones."""
    content_length: int | None
    chunked: bool
    keep_alive: bool
    encoding: int = 0
    """zlib window bits of the body's Content-Encoding (31 gzip, 15 deflate), 0 for none."""
    json_bytes: int = -1
    """How much of the body is JSON: the binary tensor extension's Inference-Header-Content-Length,
    or -1 (all of it; also when the value is not a plain decimal)."""

    def serialize(self, target: str, drop: bytes = b"") -> bytes:
        """The head to send upstream, for `target`; without the header `drop` (lowercase)."""
        headers = self.headers
        if drop:
            headers = tuple(h for h in headers if h.split(b":", 1)[0].lower() != drop)
        lines = [f"{self.method} {target} ".encode() + self.version, *headers]
        return b"\r\n".join(lines) + b"\r\n\r\n"


def _length(value: bytes, current: int | None) -> int:
    if not value.isdigit() or len(value) > 18:
        raise MalformedRequestError(f"Content-Length {value[:20]!r} is not a number of bytes")
    if current is not None:
        raise MalformedRequestError("the request has Content-Length more than once; send it once")
    return int(value)


def parse_request_head(block: bytes) -> RequestHead:
    """Parse a request head (everything before the blank line), or raise a refusal (400, 501)."""
    lines = block.split(b"\r\n")
    match = _REQUEST_LINE.fullmatch(lines[0])
    if match is None:
        raise MalformedRequestError("the request line is not `METHOD target HTTP/1.x`")
    method, target, version = match.groups()
    headers: list[bytes] = []
    content_length: int | None = None
    chunked = False
    connection = b""
    hosts = 0
    encoding = -1
    json_bytes = -2  # Inference-Header-Content-Length not seen
    for line in lines[1:]:
        header = _HEADER.fullmatch(line)
        if header is None:
            raise MalformedRequestError(
                "a header line is malformed (folded, without a colon, or with control bytes)"
            )
        name = header[1].lower()
        if name == b"host":
            hosts += 1
            if hosts > 1:
                raise MalformedRequestError("the request has Host more than once; send it once")
            if _HOST.fullmatch(header[2]) is None:
                raise MalformedRequestError(f"Host {header[2][:60]!r} is not host[:port]")
            headers.append(line)
        elif name == b"content-length":
            content_length = _length(header[2], content_length)
        elif name == b"transfer-encoding":
            if header[2].lower() != b"chunked" or chunked:
                raise UnsupportedError("only `Transfer-Encoding: chunked` is supported")
            chunked = True
        elif name == b"connection":
            connection = header[2].lower()
        elif name == b"content-encoding":
            if encoding >= 0:
                raise MalformedRequestError(
                    "the request has Content-Encoding more than once; send it once"
                )
            encoding = _content_coding(header[2])
            headers.append(line)
        elif name == b"inference-header-content-length":
            if json_bytes != -2:
                raise MalformedRequestError(
                    "the request has Inference-Header-Content-Length more than once; send it once"
                )
            value = header[2].strip(b" \t")
            json_bytes = int(value) if value.isdigit() and len(value) <= 18 else -1
            headers.append(line)
        elif name not in _HOP_BY_HOP:
            headers.append(line)  # framing headers are re-added once, below
    if chunked and content_length is not None:
        raise MalformedRequestError("the request has both Content-Length and Transfer-Encoding")
    if not hosts and version == b"HTTP/1.1":
        raise MalformedRequestError("an HTTP/1.1 request must carry a Host header")
    if chunked:
        headers.append(b"Transfer-Encoding: chunked")
    elif content_length is not None:
        headers.append(b"Content-Length: " + str(content_length).encode())
    if version == b"HTTP/1.1":
        keep_alive = b"close" not in connection
    else:
        keep_alive = b"keep-alive" in connection
    return RequestHead(
        method.decode(),
        target.decode("latin-1"),
        version,
        tuple(headers),
        content_length,
        chunked,
        keep_alive,
        max(encoding, 0),
        max(json_bytes, -1),
    )


def _content_coding(value: bytes) -> int:
    """The zlib window bits for a Content-Encoding Triton inflates, 0 for none; refuses the rest
    (Triton's own answer to them is a refusal too, but only after reading the whole body)."""
    coding = value.strip(b" \t").lower()
    if coding in (b"", b"identity"):
        return 0
    if coding == b"gzip":
        return 31
    if coding == b"deflate":
        return 15
    raise UnsupportedEncodingError(
        f"Content-Encoding {value[:40].decode('latin-1')!r} is not one Triton reads; send gzip, "
        f"deflate, or an uncompressed body"
    )


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """What the relay needs from a response head to find the response's end."""

    status: int
    content_length: int | None
    chunked: bool
    keep_alive: bool


def parse_response_head(block: bytes) -> ResponseHead:
    """Parse Triton's response head, or raise a `policy.refusals` error (answered 502)."""
    lines = block.split(b"\r\n")
    match = _STATUS_LINE.fullmatch(lines[0])
    if match is None:
        raise UpstreamError("Triton sent a malformed status line")
    keep_alive = match[1] == b"1"
    content_length: int | None = None
    chunked = False
    for line in lines[1:]:
        header = _HEADER.fullmatch(line)
        if header is None:
            raise UpstreamError("Triton sent a malformed header line")
        name = header[1].lower()
        if name == b"content-length":
            try:
                content_length = _length(header[2], content_length)
            except MalformedRequestError as e:
                raise UpstreamError(f"Triton's response is ambiguous: {e}") from e
        elif name == b"transfer-encoding":
            chunked = header[2].lower().endswith(b"chunked")
        elif name == b"connection":
            value = header[2].lower()
            keep_alive = b"close" not in value if keep_alive else b"keep-alive" in value
    return ResponseHead(int(match[2]), content_length, chunked, keep_alive)


class ChunkedFraming:
    """Follows a chunked body passing through verbatim, to find where it ends.

    `feed(data, start)` returns the offset just past the body's end within `data`, or -1 when
    all of `data[start:]` belongs to the body. `payload` counts the body's data bytes.
    """

    __slots__ = ("_line", "_remaining", "_state", "payload")

    # One assignment each: compiled (mypyc), a class body may only assign names.
    _SIZE: Final = 0
    _DATA: Final = 1
    _DATA_END: Final = 2
    _TRAILER: Final = 3

    def __init__(self) -> None:
        self._state = self._SIZE
        self._remaining = 0
        self._line = b""
        self.payload = 0

    def _take_line(self, data: bytes, pos: int) -> tuple[bytes | None, int]:
        end = data.find(b"\n", pos)
        if end < 0:
            self._line += data[pos:]
            if len(self._line) > _MAX_CHUNK_LINE:
                raise MalformedRequestError("a chunk-size or trailer line is too long")
            return None, len(data)
        line = self._line + data[pos:end]
        self._line = b""
        if not line.endswith(b"\r"):
            raise MalformedRequestError("a chunked body line does not end with CRLF")
        return line[:-1], end + 1

    def feed(
        self, data: bytes, start: int = 0, payload: Callable[[bytes, int, int], None] | None = None
    ) -> int:
        """Advance over `data[start:]`; see the class docstring. `payload`, if given, is called
        with each run of the body's data bytes (`data`, start, end)."""
        pos = start
        end = len(data)
        while pos < end:
            if self._state == self._DATA:
                step = min(self._remaining, end - pos)
                if payload is not None and step:
                    payload(data, pos, pos + step)
                pos += step
                self._remaining -= step
                if self._remaining == 0:
                    self._state = self._DATA_END
                continue
            line, pos = self._take_line(data, pos)
            if line is None:
                return -1
            if self._state == self._SIZE:
                size_text = line.split(b";", 1)[0].rstrip(b" \t")
                if _HEX.fullmatch(size_text) is None:
                    raise MalformedRequestError(f"chunk size {size_text[:20]!r} is not plain hex")
                size = int(size_text, 16)
                self.payload += size
                if size == 0:
                    self._state = self._TRAILER
                else:
                    self._remaining = size
                    self._state = self._DATA
            elif self._state == self._DATA_END:
                if line:
                    raise MalformedRequestError("a chunk's data is longer than its size says")
                self._state = self._SIZE
            elif not line:  # the blank line after the trailers ends the body
                return pos
        return -1


_REASONS: Final = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Payload Too Large",
    415: "Unsupported Media Type",
    431: "Request Header Fields Too Large",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


UNANSWERED: Final = b"\r\nTritonshare-Unanswered: 1\r\n"
"""The header of the relay's 502 for a request its connection to Triton lost before Triton
answered (`answer_bytes`): the pod's proxy in front sends an idempotent model's request again
on it (`upstream.Upstream`)."""


def answer_bytes(
    status: int,
    content_type: str,
    body: bytes,
    close: bool,
    retry_after: int = 0,
    unanswered: bool = False,
) -> bytes:
    """A whole response the relay gives itself (Triton's answers pass through untouched); with
    `retry_after` (seconds, more than 0), a `Retry-After` header; with `unanswered`, the
    `UNANSWERED` one."""
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
    )
    if retry_after > 0:
        head += f"Retry-After: {retry_after}\r\n"
    if unanswered:
        head += UNANSWERED[2:].decode()
    if close:
        head += "Connection: close\r\n"
    return head.encode() + b"\r\n" + body
