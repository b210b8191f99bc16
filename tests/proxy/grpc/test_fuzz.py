"""Mutated HTTP/2 frame sequences thrown at the gRPC relay's tenant side (property-based).

A valid conversation (two calls, one split over CONTINUATION, SETTINGS, PING, WINDOW_UPDATE,
PRIORITY, RST_STREAM) is mutated frame by frame (dropped, repeated, swapped, its type, flags,
stream id or payload changed) and fed to an in-process relay (`h2rig.Rig`) one frame per read
or cut at random places; fed one frame per read, Triton acts between the tenant's frames too
(answers a call whole or in part, resets it, or answers Trailers-Only), so the stream states
meet both sides' ends in every order. Whatever comes, the relay must:

- raise nothing (every exception inside `data_received` would escape into the test);
- answer a broken rule the way RFC 9113 names: a connection closed only after a GOAWAY with one
  of the error codes, as its last frame, and RST_STREAM codes from the same list; where the
  `hyperframe` parser (python-hyper's) refuses a frame on its own, the relay answers that very
  frame with GOAWAY or RST_STREAM, with a code of that kind of fault;
- never let Triton receive a tenant's frame as sent (`assert_triton_saw_only_the_relay`): only
  the channel's own frames, header blocks Triton's HPACK decoder reads in order, DATA on streams
  the channel opened.
"""

from __future__ import annotations

import asyncio

from hyperframe.exceptions import (
    HyperframeError,
    InvalidDataError,
    InvalidFrameError,
    InvalidPaddingError,
)
from hyperframe.frame import Frame as HyperFrame
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.grpc import framing
from proxy.http2 import frames as f
from tests.proxy.grpc.h2spec import assert_triton_saw_only_the_relay
from tests.proxy.grpc.rig import HEADERS, Frame, Rig, infer

Parts = tuple[int, int, int, bytes]  # type, flags, stream id, payload
READY = [
    (n, b"/inference.GRPCInferenceService/ModelReady" if n == b":path" else v) for n, v in HEADERS
]
BLOCK = f.header_block(HEADERS)

BASE: list[Parts] = [
    (f.SETTINGS, 0, 0, b"\x00\x04\x00\x00\x03\xe8"),  # INITIAL_WINDOW_SIZE 1000
    (f.HEADERS, f.END_HEADERS, 1, BLOCK),
    (f.DATA, f.END_STREAM, 1, framing.grpc_message(infer())),
    (f.PING, 0, 0, b"fuzzping"),
    (f.HEADERS, 0, 3, BLOCK[:7]),
    (f.CONTINUATION, f.END_HEADERS, 3, BLOCK[7:]),
    (f.WINDOW_UPDATE, 0, 0, (1000).to_bytes(4, "big")),
    (f.WINDOW_UPDATE, 0, 3, (500).to_bytes(4, "big")),
    (f.DATA, f.PADDED, 3, b"\x02" + framing.grpc_message(infer(8)) + b"\x00\x00"),
    (f.PRIORITY, 0, 3, b"\x00\x00\x00\x01\x10"),
    (f.RST_STREAM, 0, 3, f.CANCEL.to_bytes(4, "big")),
    (f.HEADERS, f.END_HEADERS | f.END_STREAM, 5, f.header_block(READY)),
    (f.SETTINGS, f.ACK, 0, b""),
]

ERRORS = {
    f.PROTOCOL_ERROR,
    f.FLOW_CONTROL_ERROR,
    f.STREAM_CLOSED,
    f.FRAME_SIZE_ERROR,
    f.REFUSED_STREAM,
    f.CANCEL,
    f.COMPRESSION_ERROR,
    f.ENHANCE_YOUR_CALM,
}
"""Every code the relay may answer a tenant's frames with (CANCEL: a call Triton reset)."""
HYPERFRAME_CODES: dict[type[HyperframeError], set[int]] = {
    InvalidPaddingError: {f.PROTOCOL_ERROR},
    InvalidFrameError: {f.FRAME_SIZE_ERROR, f.PROTOCOL_ERROR},  # lengths; an unreadable pad
    InvalidDataError: {f.PROTOCOL_ERROR, f.FRAME_SIZE_ERROR},  # ids, values; an ACK's payload
}


def mutations(parts: Parts) -> st.SearchStrategy[list[Parts]]:
    kind, flags, sid, payload = parts
    return st.one_of(
        st.just([parts]),
        st.just([parts]),
        st.just([]),
        st.just([parts, parts]),
        st.integers(0, 0x21).map(lambda k: [(k, flags, sid, payload)]),
        st.integers(0, 255).map(lambda fl: [(kind, fl, sid, payload)]),
        st.sampled_from([0, 1, 2, 3, 5, 7, 2**31 - 1]).map(lambda s: [(kind, flags, s, payload)]),
        st.binary(max_size=12).map(lambda p: [(kind, flags, sid, p)]),
        st.tuples(st.integers(0, max(len(payload) - 1, 0)), st.integers(0, 255)).map(
            lambda at: [(kind, flags, sid, _poke(payload, *at))]
        ),
    )


def _poke(payload: bytes, at: int, value: int) -> bytes:
    if not payload:
        return bytes([value])
    return payload[:at] + bytes([value]) + payload[at + 1 :]


@st.composite
def conversations(draw: st.DrawFn) -> list[Parts]:
    frames: list[Parts] = []
    for parts in BASE:
        frames += draw(mutations(parts))
    if len(frames) > 1 and draw(st.booleans()):
        at = draw(st.integers(0, len(frames) - 2))
        frames[at], frames[at + 1] = frames[at + 1], frames[at]
    return frames


def _hyperframe_refusal(data: bytes) -> type[HyperframeError] | None:
    if data[3] == f.WINDOW_UPDATE and len(data) == 13:
        # hyperframe refuses the reserved bit, which RFC 9113 6.9 says a receiver ignores.
        data = data[:9] + bytes([data[9] & 0x7F]) + data[10:]
    try:
        frame, length = HyperFrame.parse_frame_header(memoryview(data[:9]))
        frame.parse_body(memoryview(data[9 : 9 + length]))
    except HyperframeError as e:
        return type(e)
    return None


def _errors(frames: list[Frame]) -> list[tuple[int, int]]:
    """(type, code) of every GOAWAY and RST_STREAM among `frames`."""
    out = []
    for kind, _, _, payload in frames:
        if kind == f.GOAWAY:
            out.append((kind, int.from_bytes(payload[4:8], "big")))
        elif kind == f.RST_STREAM:
            out.append((kind, int.from_bytes(payload, "big")))
    return out


TRITON_ACTS = 5  # nothing, a whole answer, head and DATA only, RST_STREAM, Trailers-Only


def _triton_acts(rig: Rig, action: int, headed: set[int]) -> None:
    """Triton does `action` (one of TRITON_ACTS) on the oldest stream open at the channel."""
    if not action or not rig.relay.channels:
        return
    channel, _ = rig.channel()
    if not channel.streams:
        return
    up = min(channel.streams)
    encode = rig.triton_encoder.encode
    head = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    if action == 3:
        channel.data_received(f.rst_stream(up, f.CANCEL))
    elif action == 4 and up not in headed:
        block = encode([*head, (b"grpc-status", b"5")])
        channel.data_received(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, up, block))
    else:
        frames = b""
        if up not in headed:
            headed.add(up)
            frames += f.frame(f.HEADERS, f.END_HEADERS, up, encode(head))
        frames += f.frame(f.DATA, 0, up, framing.grpc_message(b"answer"))
        if action == 1:
            trailers = encode([(b"grpc-status", b"0")])
            frames += f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, up, trailers)
        channel.data_received(frames)
    rig.relay.flush()


async def _converse(frames: list[Parts], cuts: list[int] | None, acts: list[int]) -> None:
    rig = Rig()
    tenant, out = rig.tenant()
    wire = [f.frame(*parts) for parts in frames]
    headed: set[int] = set()
    if cuts is None:  # one frame per read: each answer belongs to one frame
        for number, (parts, data) in enumerate(zip(frames, wire, strict=True)):
            _triton_acts(rig, acts[number] if number < len(acts) else 0, headed)
            triton_answered = out.take()
            _check_answers(triton_answered, out.closed)
            goaway = [frame for frame in triton_answered if frame[0] == f.GOAWAY]
            assert not goaway, "what Triton did ended the tenant's connection"
            tenant.data_received(data)
            rig.relay.flush()
            answered = out.take()
            _check_answers(answered, out.closed)
            # Types past CONTINUATION are extensions the relay ignores (hyperframe knows ALTSVC).
            refusal = _hyperframe_refusal(data) if parts[0] <= f.CONTINUATION else None
            if refusal is not None and not out.closed:
                assert _errors(answered), f"{parts} (hyperframe: {refusal.__name__}) passed"
            if refusal is not None and _errors(answered):
                codes = {code for _, code in _errors(answered)}
                assert codes & HYPERFRAME_CODES[refusal], (parts, refusal, codes)
            if out.closed:
                break
    else:
        data = b"".join(wire)
        for start, stop in zip([0, *cuts], [*cuts, len(data)], strict=True):
            tenant.data_received(data[start:stop])
            rig.relay.flush()
            if out.closed:
                break
        _check_answers(out.take(), out.closed)
    tenant.connection_lost(None)
    assert_triton_saw_only_the_relay(rig)


def _check_answers(answered: list[Frame], closed: bool) -> None:
    for kind, code in _errors(answered):
        assert code in ERRORS or (kind == f.GOAWAY and code == f.NO_ERROR), code
    goaways = [frame for frame in answered if frame[0] == f.GOAWAY]
    if closed:
        assert goaways and answered[-1][0] == f.GOAWAY, "closed without GOAWAY as its last word"
        assert int.from_bytes(goaways[-1][3][4:8], "big") != f.NO_ERROR
    for kind, _, _, payload in answered:
        assert len(payload) <= f.DEFAULT_MAX_FRAME
        assert kind != f.PING or payload == b"fuzzping" or len(payload) == 8


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames=conversations(), acts=st.lists(st.integers(0, TRITON_ACTS - 1), max_size=16))
def test_mutated_frames_one_per_read(frames: list[Parts], acts: list[int]) -> None:
    asyncio.run(_converse(frames, None, acts))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames=conversations(), data=st.data())
def test_mutated_frames_cut_anywhere(frames: list[Parts], data: st.DataObject) -> None:
    total = sum(9 + len(parts[3]) for parts in frames)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(total - 1, 1)), max_size=6))))
    asyncio.run(_converse(frames, [c for c in cuts if c < total], []))
