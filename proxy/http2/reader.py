"""Bytes become checked HTTP/2 frames (RFC 9113 sections 4 to 6), for both sides of the relay.

One `FrameReader` per direction of a connection: the tenant's frames (`grpc.relay`) and Triton's
(`grpc.channel`) go through the same checks. It splits the bytes into frames, checks each frame's
length, stream id and fields as its type requires, joins a header block's HEADERS and CONTINUATION
frames, strips padding and priority fields, and hands what is left to its `FrameSink` (the
connection). A frame that breaks a rule of the connection raises `ConnectionBrokenError` with the
error code the RFC names (the caller answers with GOAWAY and closes); one that breaks a rule of
one stream goes to `FrameSink.on_stream_error` (the caller resets that stream with RST_STREAM and
goes on reading). Unknown frame types and unknown flags are ignored, as the RFC requires, except
inside a header block.

What a frame means for a stream or a window (its state, flow control) is for the caller and
`http2.flow`; this module knows no stream and no window. The fast path (DATA without padding and
HEADERS that are one whole block) costs a length check and a comparison or two.

What it must not do: hold more than one partial frame and one header block, or let a frame it has
not checked reach the caller.
"""

from __future__ import annotations

from typing import Final

from proxy.http2 import frames

MAX_FRAME_LIMIT: Final = (1 << 24) - 1
_FIXED_LENGTH: Final = {
    frames.PRIORITY: 5,
    frames.RST_STREAM: 4,
    frames.PING: 8,
    frames.WINDOW_UPDATE: 4,
}
_STREAM_ZERO_ONLY: Final = frozenset((frames.SETTINGS, frames.PING, frames.GOAWAY))
_ON_A_STREAM: Final = frozenset(
    (
        frames.DATA,
        frames.HEADERS,
        frames.PRIORITY,
        frames.RST_STREAM,
        frames.PUSH_PROMISE,
        frames.CONTINUATION,
    )
)
_NAMES: Final = {
    frames.DATA: "DATA",
    frames.HEADERS: "HEADERS",
    frames.PRIORITY: "PRIORITY",
    frames.RST_STREAM: "RST_STREAM",
    frames.SETTINGS: "SETTINGS",
    frames.PUSH_PROMISE: "PUSH_PROMISE",
    frames.PING: "PING",
    frames.GOAWAY: "GOAWAY",
    frames.WINDOW_UPDATE: "WINDOW_UPDATE",
    frames.CONTINUATION: "CONTINUATION",
}
_PLAIN_BLOCK: Final = frames.END_HEADERS | frames.PADDED | frames.PRIORITY_FLAG
# Module constants for the loop in `feed`: each one `Final`, so compiled (mypyc) they are inlined
# rather than looked up in the module's dict on every frame.
_DATA: Final = frames.DATA
_HEADERS: Final = frames.HEADERS
_PADDED: Final = frames.PADDED
_END_HEADERS: Final = frames.END_HEADERS


class ConnectionBrokenError(Exception):
    """The peer broke a rule of the connection: GOAWAY with `code`, then close."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


def check_settings(values: dict[int, int], from_server: bool) -> None:
    """Raise ConnectionBrokenError when a SETTINGS value is out of its range (RFC 9113 6.5.2)."""
    push = values.get(frames.SETTINGS_ENABLE_PUSH)
    if push is not None and (push > 1 or (from_server and push)):
        raise ConnectionBrokenError(frames.PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {push}")
    window = values.get(frames.SETTINGS_INITIAL_WINDOW_SIZE)
    if window is not None and window > frames.MAX_WINDOW:
        raise ConnectionBrokenError(
            frames.FLOW_CONTROL_ERROR, f"SETTINGS_INITIAL_WINDOW_SIZE {window}, over 2^31-1"
        )
    size = values.get(frames.SETTINGS_MAX_FRAME_SIZE)
    if size is not None and not frames.DEFAULT_MAX_FRAME <= size <= MAX_FRAME_LIMIT:
        raise ConnectionBrokenError(
            frames.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {size}, outside 2^14 to 2^24-1"
        )


def _unpad(payload: bytes, kind: int) -> bytes:
    """The payload of a PADDED frame without its Pad Length field and padding."""
    if not payload:
        raise ConnectionBrokenError(
            frames.FRAME_SIZE_ERROR, f"a PADDED {_NAMES[kind]} frame without its Pad Length field"
        )
    pad = payload[0]
    if pad >= len(payload):
        raise ConnectionBrokenError(
            frames.PROTOCOL_ERROR,
            f"{_NAMES[kind]} padding of {pad} bytes in a {len(payload)}-byte payload",
        )
    return payload[1 : len(payload) - pad]


class FrameSink:
    """Where a `FrameReader` delivers checked frames: the connection reading them (the relay's
    two, through their base classes `grpc.replies.ReplyHooks` and `grpc.stream.Channel`). A base
    class rather than a Protocol: compiled (mypyc), the reader's call to a Protocol's method is
    a Python call of a bound method, its ints boxed and its arguments parsed again (about 300
    instructions a frame, five frames a gRPC call), where a compiled base class's is a C call."""

    def on_data(self, body: bytes, flags: int, sid: int, length: int) -> None:
        """DATA: `body` without padding; `length` bytes (padding included) count on windows."""
        raise NotImplementedError

    def on_headers(self, sid: int, flags: int, block: bytes) -> None:
        """A whole header block (CONTINUATIONs joined), with its HEADERS frame's flags."""
        raise NotImplementedError

    def on_frame(self, payload: bytes, kind: int, flags: int, sid: int) -> None:
        """RST_STREAM, SETTINGS, PING, GOAWAY or WINDOW_UPDATE (a valid PRIORITY is dropped)."""
        raise NotImplementedError

    def on_stream_error(self, sid: int, code: int, reason: str) -> None:
        """Stream `sid` broke a rule: reset it with `code`."""
        raise NotImplementedError


class FrameReader:
    """Checked frames from one peer's bytes, for `sink` (see the module docstring).

    `from_server` is True when the peer is a server (Triton): then PUSH_PROMISE is refused (the
    relay disables push) and SETTINGS_ENABLE_PUSH must be 0. `max_frame` is our
    SETTINGS_MAX_FRAME_SIZE; `max_block` bounds one header block (a CONTINUATION flood ends the
    connection).
    """

    __slots__ = ("_block", "_in", "_max_block", "_sink", "from_server", "max_frame")

    def __init__(
        self,
        sink: FrameSink,
        from_server: bool,
        max_block: int,
        max_frame: int = frames.DEFAULT_MAX_FRAME,
    ) -> None:
        self._sink = sink
        self.from_server = from_server
        self.max_frame = max_frame
        self._max_block = max_block
        self._in = b""
        self._block: tuple[int, int, bytearray] | None = None  # sid, flags, block so far

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame held until the rest arrives."""
        return len(self._in)

    def feed(self, data: bytes) -> None:
        """Hand every whole frame in what has arrived to the sink, checked; the rest waits for
        the next call. Raises ConnectionBrokenError (after which the reader must not be used
        again), and lets whatever the sink raises through."""
        if self._in:
            data = self._in + data
            self._in = b""
        pos = 0
        end = len(data)
        max_frame = self.max_frame
        sink = self._sink
        in_block = self._block is not None  # only _headers and _continuation change it
        while end - pos >= 9:
            # The 9-byte header read byte by byte: compiled (mypyc), an index of bytes is a native
            # int, where `struct` builds a tuple of five objects per frame.
            length = data[pos] << 16 | data[pos + 1] << 8 | data[pos + 2]
            kind = data[pos + 3]
            flags = data[pos + 4]
            sid = data[pos + 5] << 24 | data[pos + 6] << 16 | data[pos + 7] << 8 | data[pos + 8]
            if length > max_frame:
                name = _NAMES.get(kind, f"type-{kind}")
                raise ConnectionBrokenError(
                    frames.FRAME_SIZE_ERROR, f"a {length}-byte {name} frame, over {max_frame}"
                )
            stop = pos + 9 + length
            if stop > end:
                break
            if sid > 0x7FFFFFFF:  # the reserved bit, ignored (RFC 9113 4.1); mostly clear, and
                sid &= 0x7FFFFFFF  # a compare costs less than an and in CPython 3.11
            payload = data[pos + 9 : stop]
            pos = stop
            # The fast paths first: nothing to check beyond the length and the stream id.
            if in_block:
                self._continuation(kind, flags, sid, payload)
                in_block = self._block is not None
            elif kind == _DATA and sid and not flags & _PADDED:
                sink.on_data(payload, flags, sid, length)
            elif kind == _HEADERS and sid and flags & _PLAIN_BLOCK == _END_HEADERS:
                sink.on_headers(sid, flags, payload)
            else:
                self._checked(kind, flags, sid, payload)
                in_block = self._block is not None
        if pos < end:
            self._in = data[pos:]

    def _checked(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        """The rules of every frame type but the fast paths'."""
        length = len(payload)
        if kind > frames.CONTINUATION:
            return  # an unknown type: ignored (RFC 9113 4.1, 5.5)
        name = _NAMES[kind]
        if sid == 0 and kind in _ON_A_STREAM:
            raise ConnectionBrokenError(frames.PROTOCOL_ERROR, f"{name} on stream 0")
        if sid and kind in _STREAM_ZERO_ONLY:
            raise ConnectionBrokenError(frames.PROTOCOL_ERROR, f"{name} on stream {sid}, not 0")
        fixed = _FIXED_LENGTH.get(kind)
        if fixed is not None and length != fixed:
            if kind == frames.PRIORITY:  # a stream error: PRIORITY changes no connection state
                self._sink.on_stream_error(
                    sid, frames.FRAME_SIZE_ERROR, "a PRIORITY frame not 5 bytes"
                )
                return
            raise ConnectionBrokenError(
                frames.FRAME_SIZE_ERROR, f"a {length}-byte {name} frame, not {fixed} bytes"
            )
        if kind == frames.DATA:
            self._sink.on_data(_unpad(payload, kind), flags, sid, length)
        elif kind == frames.HEADERS:
            self._headers(flags, sid, payload)
        elif kind == frames.PRIORITY:
            if frames.u31(payload) == sid:
                self._sink.on_stream_error(
                    sid, frames.PROTOCOL_ERROR, "a stream depending on itself"
                )
            # otherwise nothing to do: priorities are advice the relay does not take
        elif kind == frames.SETTINGS:
            if flags & frames.ACK:
                if length:
                    raise ConnectionBrokenError(
                        frames.FRAME_SIZE_ERROR, f"a {length}-byte SETTINGS ACK"
                    )
            elif length % 6:
                raise ConnectionBrokenError(
                    frames.FRAME_SIZE_ERROR, f"a {length}-byte SETTINGS frame, not a multiple of 6"
                )
            else:
                check_settings(frames.settings_values(payload), self.from_server)
            self._sink.on_frame(payload, kind, flags, sid)
        elif kind == frames.GOAWAY:
            if length < 8:
                raise ConnectionBrokenError(
                    frames.FRAME_SIZE_ERROR, f"a {length}-byte GOAWAY frame"
                )
            self._sink.on_frame(payload, kind, flags, sid)
        elif kind == frames.WINDOW_UPDATE:
            if frames.u31(payload) == 0:
                if sid == 0:
                    raise ConnectionBrokenError(
                        frames.PROTOCOL_ERROR, "a connection WINDOW_UPDATE of 0"
                    )
                self._sink.on_stream_error(sid, frames.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
                return
            self._sink.on_frame(payload, kind, flags, sid)
        elif kind == frames.PUSH_PROMISE:
            reason = "although push is disabled" if self.from_server else "from a client"
            raise ConnectionBrokenError(frames.PROTOCOL_ERROR, f"PUSH_PROMISE {reason}")
        elif kind == frames.CONTINUATION:
            raise ConnectionBrokenError(
                frames.PROTOCOL_ERROR, f"CONTINUATION on stream {sid} without an open header block"
            )
        else:  # RST_STREAM, PING
            self._sink.on_frame(payload, kind, flags, sid)

    def _headers(self, flags: int, sid: int, payload: bytes) -> None:
        if flags & frames.PADDED:
            payload = _unpad(payload, frames.HEADERS)
        self_dependent = False
        if flags & frames.PRIORITY_FLAG:
            if len(payload) < 5:
                raise ConnectionBrokenError(
                    frames.FRAME_SIZE_ERROR, "a HEADERS frame too short for its priority fields"
                )
            self_dependent = frames.u31(payload) == sid
            payload = payload[5:]
        if self_dependent:
            # The block is still decoded (the caller's HPACK table must follow it), after which
            # the stream is reset.
            self._sink.on_stream_error(sid, frames.PROTOCOL_ERROR, "a stream depending on itself")
        if flags & frames.END_HEADERS:
            self._sink.on_headers(sid, flags, payload)
            return
        self._block = (sid, flags, bytearray(payload))

    def _continuation(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        assert self._block is not None
        first_sid, first_flags, block = self._block
        if kind != frames.CONTINUATION or sid != first_sid:
            name = _NAMES.get(kind, f"a frame of type {kind}")
            raise ConnectionBrokenError(
                frames.PROTOCOL_ERROR,
                f"{name} on stream {sid} inside stream {first_sid}'s unfinished header block",
            )
        block += payload
        if len(block) > self._max_block:
            raise ConnectionBrokenError(
                frames.PROTOCOL_ERROR, f"a header block over {self._max_block} bytes"
            )
        if flags & frames.END_HEADERS:
            self._block = None
            self._sink.on_headers(sid, first_flags, bytes(block))
