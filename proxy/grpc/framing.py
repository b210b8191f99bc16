"""gRPC over HTTP/2 (the gRPC "PROTOCOL-HTTP2" document): the length prefix of a message, status
codes by name and number, and the head and trailers of the answers the relay gives tenants on its
own (Trailers-Only errors, small OK responses, in-stream error messages), as HTTP/2 frames from
`proxy.http2.frames`. Their header blocks use only literal representations, so they never touch
the tenant's HPACK dynamic table (see `frames.header_block`).

What it must not do: hold connection state, or decide anything about isolation.
"""

from __future__ import annotations

from typing import Final

import grpc

from proxy.http2.frames import header_block, headers_frames

CODE_NAMES: Final = {code.value[0]: code.name for code in grpc.StatusCode}
CODE_NUMBERS: Final = {code.name: code.value[0] for code in grpc.StatusCode}


def grpc_message(message: bytes) -> bytes:
    """A length-prefixed, uncompressed gRPC message."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


def _percent_encode(text: str) -> bytes:
    """grpc-message encoding: printable ASCII except '%' as is, every other byte as %XX."""
    out = bytearray()
    for byte in text.encode():
        if 0x20 <= byte <= 0x7E and byte != 0x25:
            out.append(byte)
        else:
            out += b"%%%02X" % byte
    return bytes(out)


READY: Final = b"\x08\x01"
"""A ServerReady or ModelReady response message saying ready (field 1, true); an empty one says
not ready."""
_RESPONSE_HEAD: Final = [(b":status", b"200"), (b"content-type", b"application/grpc")]


def status_fields(code: str, details: str) -> list[tuple[bytes, bytes]]:
    """The grpc-status and grpc-message trailer fields for status `code` (a StatusCode name)."""
    fields = [(b"grpc-status", str(CODE_NUMBERS[code]).encode())]
    if details:
        fields.append((b"grpc-message", _percent_encode(details)))
    return fields


def local_head(stream_id: int) -> bytes:
    """The response head of an answer the relay gives itself after all (it carries a message)."""
    return headers_frames(stream_id, header_block(_RESPONSE_HEAD), end_stream=False)


def retry_fields(seconds: int) -> list[tuple[bytes, bytes]]:
    """The trailer fields of a refusal to retry after `seconds` (REST's Retry-After):
    `retry-after` for the application, and gRPC's own server pushback
    (`grpc-retry-pushback-ms`), which a channel with a retry policy for the code waits."""
    if seconds <= 0:
        return []
    return [
        (b"retry-after", str(seconds).encode()),
        (b"grpc-retry-pushback-ms", b"%d" % (seconds * 1000)),
    ]


UNANSWERED: Final = (b"tritonshare-unanswered", b"1")
"""The trailer field of the relay's UNAVAILABLE for a call its connection to Triton lost before
Triton answered: the pod's proxy in front sends an idempotent model's call again on it."""


def local_trailers(
    stream_id: int,
    code: str,
    details: str,
    head: bool,
    retry_after: int = 0,
    unanswered: bool = False,
) -> bytes:
    """The trailers of the relay's own answer (with `retry_fields` when `retry_after`, and
    `UNANSWERED` when `unanswered`); with `head` (nothing sent on the stream yet) the one
    Trailers-Only block of a bare error."""
    fields = status_fields(code, details) + retry_fields(retry_after)
    if unanswered:
        fields.append(UNANSWERED)
    return headers_frames(
        stream_id, header_block(_RESPONSE_HEAD + fields if head else fields), True
    )
