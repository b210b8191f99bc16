"""HTTP/2 frame and header-block encoding (RFC 9113, RFC 7541).

Builds the frames the relay writes: HEADERS (their blocks come from `http2.headers`), DATA headers,
SETTINGS, WINDOW_UPDATE, RST_STREAM and GOAWAY. The header blocks it encodes itself
(`header_block`) use only "literal without indexing" representations with literal names, so they
never touch the peer's HPACK dynamic table: they can go out at any moment, and the peer's decoder
stays where the relay's encoder for that peer believes it is. The gRPC answers built on them live
in `proxy.grpc.framing`.

What it must not do: hold connection state, or decide anything about isolation.
"""

from __future__ import annotations

from typing import Final

DATA: Final = 0
HEADERS: Final = 1
PRIORITY: Final = 2
RST_STREAM: Final = 3
SETTINGS: Final = 4
PUSH_PROMISE: Final = 5
PING: Final = 6
GOAWAY: Final = 7
WINDOW_UPDATE: Final = 8
CONTINUATION: Final = 9

END_STREAM: Final = 0x1
ACK: Final = 0x1
END_HEADERS: Final = 0x4
PADDED: Final = 0x8
PRIORITY_FLAG: Final = 0x20

SETTINGS_HEADER_TABLE_SIZE: Final = 1
SETTINGS_ENABLE_PUSH: Final = 2
SETTINGS_MAX_CONCURRENT_STREAMS: Final = 3
SETTINGS_INITIAL_WINDOW_SIZE: Final = 4
SETTINGS_MAX_FRAME_SIZE: Final = 5
DEFAULT_MAX_FRAME: Final = 16384
DEFAULT_WINDOW: Final = 65535
MAX_WINDOW: Final = 2**31 - 1

NO_ERROR: Final = 0
PROTOCOL_ERROR: Final = 1
INTERNAL_ERROR: Final = 2
FLOW_CONTROL_ERROR: Final = 3
STREAM_CLOSED: Final = 5
FRAME_SIZE_ERROR: Final = 6
REFUSED_STREAM: Final = 7
CANCEL: Final = 8
COMPRESSION_ERROR: Final = 9
ENHANCE_YOUR_CALM: Final = 11

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _header(length: int, kind: int, flags: int, stream_id: int) -> bytes:
    """A 9-byte frame header (length, type, flags, stream id), as one 72-bit integer's bytes:
    compiled (mypyc), half the cost of `struct.pack` with its boxed arguments (the pure
    interpreter pays more for it than for `struct`; the image runs compiled)."""
    return ((length << 16 | kind << 8 | flags) << 32 | stream_id).to_bytes(9, "big")


def u31(data: bytes, pos: int = 0) -> int:
    """The 31-bit value of the 4 bytes at `pos` (a stream id or a window increment), the
    reserved top bit cleared. Read by index: compiled (mypyc), `int.from_bytes` is a call by name
    on `int` (about 1,000 instructions; Triton sends a WINDOW_UPDATE on every call)."""
    return (data[pos] & 0x7F) << 24 | data[pos + 1] << 16 | data[pos + 2] << 8 | data[pos + 3]


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame: the 9-byte header and `payload`."""
    return _header(len(payload), kind, flags, stream_id) + payload


def _integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def header_block(headers: list[tuple[bytes, bytes]]) -> bytes:
    """A header block of literal-without-indexing fields: no dynamic table on either side."""
    out = bytearray()
    for name, value in headers:
        out += b"\x00" + _integer(len(name), 7) + name + _integer(len(value), 7) + value
    return bytes(out)


def headers_frames(
    stream_id: int, block: bytes, end_stream: bool, max_frame: int = DEFAULT_MAX_FRAME
) -> bytes:
    """HEADERS (and CONTINUATION frames when `block` is larger than one frame)."""
    length = len(block)
    if length <= max_frame:  # the common case, on every call: built in one expression
        flags = END_HEADERS | END_STREAM if end_stream else END_HEADERS
        return _header(length, HEADERS, flags, stream_id) + block
    flags = END_STREAM if end_stream else 0
    out = [frame(HEADERS, flags, stream_id, block[:max_frame])]
    pos = max_frame
    while pos < len(block):
        chunk = block[pos : pos + max_frame]
        pos += max_frame
        out.append(frame(CONTINUATION, END_HEADERS if pos >= len(block) else 0, stream_id, chunk))
    return b"".join(out)


def settings(values: dict[int, int]) -> bytes:
    """A SETTINGS frame with `values`."""
    payload = b"".join(
        key.to_bytes(2, "big") + value.to_bytes(4, "big") for key, value in values.items()
    )
    return frame(SETTINGS, 0, 0, payload)


def data_header(length: int, end_stream: bool, stream_id: int) -> bytes:
    """The 9-byte header of one DATA frame of `length` bytes."""
    return _header(length, DATA, end_stream, stream_id)


def rst_stream(stream_id: int, error: int) -> bytes:
    """RST_STREAM with `error`."""
    return frame(RST_STREAM, 0, stream_id, error.to_bytes(4, "big"))


def window_update(stream_id: int, increment: int) -> bytes:
    """WINDOW_UPDATE of `increment` bytes (stream 0: the connection)."""
    return frame(WINDOW_UPDATE, 0, stream_id, increment.to_bytes(4, "big"))


def goaway(last_stream_id: int, error: int = NO_ERROR) -> bytes:
    """GOAWAY: streams above `last_stream_id` are not processed."""
    return frame(GOAWAY, 0, 0, last_stream_id.to_bytes(4, "big") + error.to_bytes(4, "big"))


def settings_values(payload: bytes) -> dict[int, int]:
    """The identifier/value pairs of a SETTINGS payload."""
    return {
        int.from_bytes(payload[pos : pos + 2], "big"): int.from_bytes(payload[pos + 2 : pos + 6])
        for pos in range(0, len(payload) - 5, 6)
    }
