"""The frame layer both sides of the gRPC relay read through (`proxy.http2.reader`), on its own.

Each rule of RFC 9113 the reader checks is a case below with the error the RFC names for it, and
a property test holds it to `hyperframe` (the frame parser of python-hyper's h2) as an oracle:
whatever frame hyperframe refuses, the reader refuses too, and whatever both take, they read
alike. The cases marked "a gap" were answered wrongly before the reader existed (an
uncaught IndexError, a short PING echoed, a short SETTINGS acknowledged, a WINDOW_UPDATE of 0
ignored).
"""

from __future__ import annotations

import pytest
from hyperframe.exceptions import HyperframeError
from hyperframe.frame import DataFrame, Frame, HeadersFrame
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.http2 import frames as f
from proxy.http2.reader import ConnectionBrokenError, FrameReader, FrameSink

STREAM_ERROR = -1
Read = tuple[int, int, int, bytes, int]
"""What the reader handed on: (type, flags, stream id, payload, flow-controlled length); a stream
error as (STREAM_ERROR, code, stream id, reason, 0)."""


class Collected(FrameSink):
    """A `FrameSink` that keeps what it is handed, in order."""

    def __init__(self) -> None:
        self.frames: list[Read] = []

    def on_data(self, body: bytes, flags: int, sid: int, length: int) -> None:
        self.frames.append((f.DATA, flags, sid, body, length))

    def on_headers(self, sid: int, flags: int, block: bytes) -> None:
        self.frames.append((f.HEADERS, flags, sid, block, len(block)))

    def on_frame(self, payload: bytes, kind: int, flags: int, sid: int) -> None:
        self.frames.append((kind, flags, sid, payload, len(payload)))

    def on_stream_error(self, sid: int, code: int, reason: str) -> None:
        self.frames.append((STREAM_ERROR, code, sid, reason.encode(), 0))


def read(data: bytes, from_server: bool = False) -> list[Read]:
    sink = Collected()
    FrameReader(sink, from_server=from_server, max_block=1024).feed(data)
    return sink.frames


def outcome(data: bytes, from_server: bool = False) -> tuple[str, int]:
    """("connection", code) when the reader raises, ("stream", code) for a stream error, else
    ("ok", number of frames)."""
    try:
        frames = read(data, from_server)
    except ConnectionBrokenError as e:
        return "connection", e.code
    errors = [flags for kind, flags, _, _, _ in frames if kind == STREAM_ERROR]
    if errors:
        return "stream", errors[0]
    return "ok", len(frames)


def settings_payload(values: dict[int, int]) -> bytes:
    return b"".join(k.to_bytes(2, "big") + v.to_bytes(4, "big") for k, v in values.items())


CASES: dict[str, tuple[bytes, tuple[str, int]]] = {
    # -- the gaps an earlier relay had ------------------------------------------------------------
    "empty PADDED DATA (gap: was an IndexError)": (
        f.frame(f.DATA, f.PADDED, 1),
        ("connection", f.FRAME_SIZE_ERROR),
    ),
    "3-byte PING (gap: was echoed)": (f.frame(f.PING, 0, 0, b"abc"), ("connection", 6)),
    "5-byte SETTINGS (gap: was acknowledged)": (
        f.frame(f.SETTINGS, 0, 0, b"abcde"),
        ("connection", f.FRAME_SIZE_ERROR),
    ),
    "WINDOW_UPDATE of 0 on a stream (gap: was ignored)": (
        f.window_update(1, 0),
        ("stream", f.PROTOCOL_ERROR),
    ),
    "WINDOW_UPDATE of 0 on the connection": (
        f.window_update(0, 0),
        ("connection", f.PROTOCOL_ERROR),
    ),
    # The reserved bit is not part of the increment (RFC 9113 6.9): set alone, it is an increment
    # of 0, not of 2^31 (the increment is read by index, `frames.u31`, not `int.from_bytes`).
    "WINDOW_UPDATE of only the reserved bit on a stream": (
        f.frame(f.WINDOW_UPDATE, 0, 1, b"\x80\x00\x00\x00"),
        ("stream", f.PROTOCOL_ERROR),
    ),
    "WINDOW_UPDATE of only the reserved bit on the connection": (
        f.frame(f.WINDOW_UPDATE, 0, 0, b"\x80\x00\x00\x00"),
        ("connection", f.PROTOCOL_ERROR),
    ),
    # -- lengths (RFC 9113 4.2 and each type's section) ------------------------------------------
    "a frame over SETTINGS_MAX_FRAME_SIZE": (
        f.frame(f.DATA, 0, 1, b"x" * (f.DEFAULT_MAX_FRAME + 1)),
        ("connection", f.FRAME_SIZE_ERROR),
    ),
    "DATA padding as long as the payload": (
        f.frame(f.DATA, f.PADDED, 1, b"\x04abc"),
        ("connection", f.PROTOCOL_ERROR),
    ),
    "HEADERS padding past the payload": (
        f.frame(f.HEADERS, f.PADDED | f.END_HEADERS, 1, b"\x09ab"),
        ("connection", f.PROTOCOL_ERROR),
    ),
    "HEADERS too short for its priority fields": (
        f.frame(f.HEADERS, f.PRIORITY_FLAG | f.END_HEADERS, 1, b"\x00\x00"),
        ("connection", f.FRAME_SIZE_ERROR),
    ),
    "a 4-byte PRIORITY": (f.frame(f.PRIORITY, 0, 1, b"\x00" * 4), ("stream", 6)),
    "a 3-byte RST_STREAM": (f.frame(f.RST_STREAM, 0, 1, b"\x00" * 3), ("connection", 6)),
    "a 3-byte WINDOW_UPDATE": (f.frame(f.WINDOW_UPDATE, 0, 0, b"\x00\x00\x01"), ("connection", 6)),
    "a SETTINGS ACK with a payload": (
        f.frame(f.SETTINGS, f.ACK, 0, b"\x00" * 6),
        ("connection", f.FRAME_SIZE_ERROR),
    ),
    "a 7-byte GOAWAY": (f.frame(f.GOAWAY, 0, 0, b"\x00" * 7), ("connection", 6)),
    # -- stream ids --------------------------------------------------------------------------------
    "DATA on stream 0": (f.frame(f.DATA, 0, 0, b"x"), ("connection", f.PROTOCOL_ERROR)),
    "HEADERS on stream 0": (
        f.frame(f.HEADERS, f.END_HEADERS, 0, b"\x82"),
        ("connection", f.PROTOCOL_ERROR),
    ),
    "PRIORITY on stream 0": (f.frame(f.PRIORITY, 0, 0, b"\x00" * 5), ("connection", 1)),
    "RST_STREAM on stream 0": (f.rst_stream(0, f.CANCEL), ("connection", f.PROTOCOL_ERROR)),
    "SETTINGS on stream 1": (f.frame(f.SETTINGS, 0, 1), ("connection", f.PROTOCOL_ERROR)),
    "PING on stream 1": (f.frame(f.PING, 0, 1, b"\x00" * 8), ("connection", 1)),
    "GOAWAY on stream 1": (f.frame(f.GOAWAY, 0, 1, b"\x00" * 8), ("connection", 1)),
    "CONTINUATION on stream 0": (
        f.frame(f.CONTINUATION, f.END_HEADERS, 0),
        ("connection", f.PROTOCOL_ERROR),
    ),
    # -- SETTINGS values (6.5.2) ---------------------------------------------------------------
    "SETTINGS_ENABLE_PUSH 2": (
        f.frame(f.SETTINGS, 0, 0, settings_payload({f.SETTINGS_ENABLE_PUSH: 2})),
        ("connection", f.PROTOCOL_ERROR),
    ),
    "SETTINGS_INITIAL_WINDOW_SIZE 2^31": (
        f.frame(f.SETTINGS, 0, 0, settings_payload({f.SETTINGS_INITIAL_WINDOW_SIZE: 2**31})),
        ("connection", f.FLOW_CONTROL_ERROR),
    ),
    "SETTINGS_MAX_FRAME_SIZE 16383": (
        f.frame(f.SETTINGS, 0, 0, settings_payload({f.SETTINGS_MAX_FRAME_SIZE: 16383})),
        ("connection", f.PROTOCOL_ERROR),
    ),
    "SETTINGS_MAX_FRAME_SIZE 2^24": (
        f.frame(f.SETTINGS, 0, 0, settings_payload({f.SETTINGS_MAX_FRAME_SIZE: 2**24})),
        ("connection", f.PROTOCOL_ERROR),
    ),
    "an unknown SETTINGS identifier": (
        f.frame(f.SETTINGS, 0, 0, settings_payload({0xFF: 7})),
        ("ok", 1),
    ),
    # -- priorities, push, header blocks, unknown types --------------------------------------------
    "PRIORITY depending on its own stream": (
        f.frame(f.PRIORITY, 0, 3, b"\x00\x00\x00\x03\x10"),
        ("stream", f.PROTOCOL_ERROR),
    ),
    "PRIORITY depending on its own stream, exclusively (the E bit set)": (
        f.frame(f.PRIORITY, 0, 3, b"\x80\x00\x00\x03\x10"),
        ("stream", f.PROTOCOL_ERROR),
    ),
    "HEADERS depending on their own stream": (
        f.frame(f.HEADERS, f.PRIORITY_FLAG | f.END_HEADERS, 3, b"\x00\x00\x00\x03\x10\x82"),
        ("stream", f.PROTOCOL_ERROR),
    ),
    "PUSH_PROMISE from a client": (
        f.frame(f.PUSH_PROMISE, f.END_HEADERS, 1, b"\x00\x00\x00\x02"),
        ("connection", f.PROTOCOL_ERROR),
    ),
    "CONTINUATION without HEADERS": (
        f.frame(f.CONTINUATION, f.END_HEADERS, 1, b"\x82"),
        ("connection", f.PROTOCOL_ERROR),
    ),
    "a frame inside a header block": (
        f.frame(f.HEADERS, 0, 1, b"\x82") + f.frame(f.PING, 0, 0, b"\x00" * 8),
        ("connection", f.PROTOCOL_ERROR),
    ),
    "an unknown type inside a header block": (
        f.frame(f.HEADERS, 0, 1, b"\x82") + f.frame(0x20, 0, 1, b"x"),
        ("connection", f.PROTOCOL_ERROR),
    ),
    "CONTINUATION of another stream's block": (
        f.frame(f.HEADERS, 0, 1, b"\x82") + f.frame(f.CONTINUATION, f.END_HEADERS, 3, b"\x84"),
        ("connection", f.PROTOCOL_ERROR),
    ),
    "an unknown frame type is ignored": (f.frame(0x20, 0xFF, 0, b"extension"), ("ok", 0)),
    "unknown flags are ignored": (f.frame(f.PING, 0xFE, 0, b"\x00" * 8), ("ok", 1)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_rule_gets_the_error_the_rfc_names(case: str) -> None:
    data, expected = CASES[case]
    assert outcome(data) == expected


def test_a_server_may_not_push_or_offer_push() -> None:
    push = f.frame(f.PUSH_PROMISE, f.END_HEADERS, 1, b"\x00\x00\x00\x02")
    offer = f.frame(f.SETTINGS, 0, 0, settings_payload({f.SETTINGS_ENABLE_PUSH: 1}))
    assert outcome(push, from_server=True) == ("connection", f.PROTOCOL_ERROR)
    assert outcome(offer, from_server=True) == ("connection", f.PROTOCOL_ERROR)
    assert outcome(offer, from_server=False) == ("ok", 1)  # a client may ask for push


def test_padding_and_priority_are_stripped_and_continuations_joined() -> None:
    padded = bytes([3]) + b"\x00\x00\x00\x01\x10" + b"abc" + b"\x00\x00\x00"  # pad 3, priority
    flags = f.PADDED | f.PRIORITY_FLAG | f.END_STREAM
    data = (
        f.frame(f.HEADERS, flags, 5, padded)
        + f.frame(f.CONTINUATION, 0, 5, b"def")
        + f.frame(f.CONTINUATION, f.END_HEADERS, 5, b"ghi")
        + f.frame(f.DATA, f.PADDED | f.END_STREAM, 5, b"\x02hi\x00\x00")
    )
    assert read(data) == [
        (f.HEADERS, flags, 5, b"abcdefghi", 9),
        (f.DATA, f.PADDED | f.END_STREAM, 5, b"hi", 5),  # 5 bytes count on the windows
    ]


def test_a_header_block_may_not_grow_past_its_limit() -> None:
    data = f.frame(f.HEADERS, 0, 1, b"a" * 1000) + f.frame(f.CONTINUATION, 0, 1, b"b" * 100)
    with pytest.raises(ConnectionBrokenError, match="over 1024 bytes"):
        read(data)


def test_frames_split_anywhere_across_reads_read_the_same() -> None:
    data = (
        f.frame(f.HEADERS, 0, 1, b"\x82\x86")
        + f.frame(f.CONTINUATION, f.END_HEADERS, 1, b"\x84")
        + f.frame(f.DATA, f.END_STREAM, 1, b"body")
        + f.frame(f.PING, 0, 0, b"12345678")
    )
    whole = read(data)
    for cut in range(1, len(data)):
        sink = Collected()
        reader = FrameReader(sink, from_server=False, max_block=1024)
        reader.feed(data[:cut])
        reader.feed(data[cut:])
        assert sink.frames == whole
        assert reader.buffered == 0


@given(data=st.binary(min_size=4, max_size=12), pos=st.integers(0, 8))
def test_u31_reads_four_bytes_without_the_reserved_bit(data: bytes, pos: int) -> None:
    pos = min(pos, len(data) - 4)
    assert f.u31(data, pos) == int.from_bytes(data[pos : pos + 4], "big") & 0x7FFFFFFF


# -- hyperframe as an oracle --------------------------------------------------------------------

KINDS = st.one_of(st.integers(0, 9), st.just(0x20))
PAYLOADS = st.one_of(
    st.binary(max_size=24),
    st.sampled_from([b"\x00\x00\x00\x00", b"\x00\x00\x00\x01", b"\x7f\xff\xff\xff", b"\x00" * 8]),
)


def _hyperframe(data: bytes) -> Frame | None:
    """hyperframe's reading of one frame, or None when it refuses it."""
    try:
        frame, length = Frame.parse_frame_header(memoryview(data[:9]))
        frame.parse_body(memoryview(data[9 : 9 + length]))
    except HyperframeError:
        return None
    return frame


@settings(max_examples=400, deadline=None)
@given(kind=KINDS, flags=st.integers(0, 255), sid=st.sampled_from([0, 1, 2, 3]), payload=PAYLOADS)
def test_whatever_hyperframe_refuses_the_reader_refuses_and_both_read_data_alike(
    kind: int, flags: int, sid: int, payload: bytes
) -> None:
    data = f.frame(kind, flags, sid, payload)
    if kind == f.WINDOW_UPDATE and len(payload) == 4 and payload[0] & 0x80:
        # hyperframe refuses the reserved bit, which RFC 9113 6.9 says a receiver ignores.
        payload = bytes([payload[0] & 0x7F]) + payload[1:]
        data = f.frame(kind, flags, sid, payload)
    theirs = _hyperframe(data)
    ours = outcome(data)
    if theirs is None:
        assert ours[0] in ("connection", "stream"), f"hyperframe refuses {data!r}, we took it"
        return
    if ours[0] != "ok":
        return  # stricter than hyperframe: rules it does not check (values, push, blocks, ids)
    frames = read(data)
    if isinstance(theirs, DataFrame):
        [(_, _, _, body, length)] = frames
        assert (body, length) == (bytes(theirs.data), theirs.flow_controlled_length)
    elif isinstance(theirs, HeadersFrame) and flags & f.END_HEADERS:
        [(_, _, _, block, _)] = frames
        assert block == bytes(theirs.data)
