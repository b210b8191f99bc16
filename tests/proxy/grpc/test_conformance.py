"""The gRPC relay against the HTTP/2 server cases of h2spec, re-expressed as tests (RFC 9113).

h2spec (summerwind/h2spec, a Go tool not available here) drives a server through a list of cases,
each a short exchange with the answer RFC 9113 requires. Every case of its `http2` group that
applies to the relay's tenant side is a row below, named by h2spec's id, run in process against a
real relay (`rig.Rig`: tenant connections and the channel to Triton on recording transports;
the harness, `h2spec.py`, is shared with the `generic` and `hpack` groups).
Cases h2spec accepts either of two answers for (a stream error or a connection error) are held to
the one the relay gives. h2spec's `generic` and `hpack` groups are `test_conformance_generic.py`
and `test_conformance_hpack.py`. Left out, and why: 6.9.1/1 (a server's own sending within the
client's window: grpc/test_channel.py), 8.1.2.6 (content-length against DATA: gRPC requests
carry none), and server push (the relay never pushes).

The cases marked "gap" were answered wrongly by an earlier relay (an uncaught IndexError, a short
PING echoed, a short SETTINGS acknowledged, a WINDOW_UPDATE of 0 or past 2^31-1 ignored): each
fails on the relay before the frame layer (`proxy.http2.reader`). Every answer is also fed to the
`h2` library's client, which must find it valid HTTP/2 (and reads the GOAWAY and RST_STREAM codes
asserted here), and nothing the tenant sent may reach Triton (`assert_triton_saw_only_the_relay`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import h2.events
import pytest

from proxy.grpc import framing
from proxy.grpc.connection import MAX_STREAMS
from proxy.grpc.relay import H2Connection
from proxy.http2 import frames as f
from tests.proxy.grpc.h2spec import (
    ALIVE,
    BLOCK,
    GOAWAY_,
    MESSAGE,
    PING,
    RST,
    Answer,
    Conversation,
    answer_of,
    assert_triton_saw_only_the_relay,
    conversation,
    goaway,
    resets,
    settings_payload,
)
from tests.proxy.grpc.rig import HEADERS, Recording, Rig


@dataclass(frozen=True)
class Case:
    state: str
    data: bytes | Callable[[Conversation], bytes]
    expected: Answer


def _data_too_large(_: Conversation) -> bytes:
    return f.frame(f.DATA, 0, 1, b"\x00" * (f.DEFAULT_MAX_FRAME + 1))


def _window_to_the_brim(_: Conversation) -> bytes:
    return f.window_update(1, f.MAX_WINDOW - f.DEFAULT_WINDOW) + f.settings(
        {f.SETTINGS_INITIAL_WINDOW_SIZE: f.DEFAULT_WINDOW + 1}
    )


def _too_many_streams(_: Conversation) -> bytes:
    return b"".join(
        f.frame(f.HEADERS, f.END_HEADERS, sid, BLOCK) for sid in range(1, 2 * MAX_STREAMS + 4, 2)
    )


def _request(fields: list[tuple[bytes, bytes]], sid: int = 1) -> bytes:
    return f.frame(f.HEADERS, f.END_HEADERS, sid, f.header_block(fields))


def _without(name: bytes) -> list[tuple[bytes, bytes]]:
    return [(n, v) for n, v in HEADERS if n != name]


CASES: dict[str, Case] = {
    # 4.1 frame format, 4.2 frame size, 4.3 header compression
    "4.1/1 unknown frame type": Case("idle", f.frame(0x16, 0, 0, b"x" * 8), ALIVE),
    "4.1/2 PING with undefined flags": Case("idle", f.frame(f.PING, 0x16, 0, b"x" * 8), ALIVE),
    "4.1/3 reserved bit in a stream id": Case("open", f.window_update(1 | 1 << 31, 100), ALIVE),
    "4.2/1 DATA of 2^14 octets": Case(
        "open", f.frame(f.DATA, 0, 1, b"\x00" * f.DEFAULT_MAX_FRAME), ALIVE
    ),
    "4.2/2 DATA over SETTINGS_MAX_FRAME_SIZE": Case(
        "open", _data_too_large, (GOAWAY_, f.FRAME_SIZE_ERROR)
    ),
    "4.2/3 HEADERS over SETTINGS_MAX_FRAME_SIZE": Case(
        "idle",
        f.frame(f.HEADERS, f.END_HEADERS, 1, b"\x00" * (f.DEFAULT_MAX_FRAME + 1)),
        (GOAWAY_, f.FRAME_SIZE_ERROR),
    ),
    "4.3/1 invalid header block fragment": Case(
        "idle",
        f.frame(f.HEADERS, f.END_HEADERS, 1, b"\x80\xff\xff\xff\x7f"),
        (GOAWAY_, f.COMPRESSION_ERROR),
    ),
    "4.3/2 PRIORITY inside a header block": Case(
        "idle",
        f.frame(f.HEADERS, 0, 1, BLOCK) + f.frame(f.PRIORITY, 0, 1, b"\x00\x00\x00\x00\x10"),
        (GOAWAY_, f.PROTOCOL_ERROR),
    ),
    # 5.1 stream states
    "5.1/1 idle: DATA": Case("idle", f.frame(f.DATA, 0, 1, MESSAGE), (GOAWAY_, 1)),
    "5.1/2 idle: RST_STREAM": Case("idle", f.rst_stream(1, f.CANCEL), (GOAWAY_, 1)),
    "5.1/3 idle: WINDOW_UPDATE": Case("idle", f.window_update(1, 100), (GOAWAY_, 1)),
    "5.1/4 idle: CONTINUATION": Case(
        "idle", f.frame(f.CONTINUATION, f.END_HEADERS, 1, BLOCK), (GOAWAY_, 1)
    ),
    "5.1/5 half-closed (remote): DATA": Case(
        "half-closed", f.frame(f.DATA, 0, 1, MESSAGE), (RST, f.STREAM_CLOSED)
    ),
    "5.1/6 half-closed (remote): HEADERS": Case(
        "half-closed",
        f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, f.header_block([(b"x", b"y")])),
        (RST, f.STREAM_CLOSED),
    ),
    "5.1/7 half-closed (remote): CONTINUATION": Case(
        "half-closed", f.frame(f.CONTINUATION, f.END_HEADERS, 1, BLOCK), (GOAWAY_, 1)
    ),
    "5.1/8 closed: DATA after RST_STREAM": Case(
        "reset", f.frame(f.DATA, 0, 1, MESSAGE), (RST, f.STREAM_CLOSED)
    ),
    "5.1/9 closed: HEADERS after RST_STREAM": Case(
        "reset", _request(HEADERS), (GOAWAY_, f.STREAM_CLOSED)
    ),
    "5.1/10 closed: CONTINUATION after RST_STREAM": Case(
        "reset", f.frame(f.CONTINUATION, f.END_HEADERS, 1, BLOCK), (GOAWAY_, 1)
    ),
    "5.1/11 closed: DATA after END_STREAM": Case(
        "closed", f.frame(f.DATA, 0, 1, MESSAGE), (RST, f.STREAM_CLOSED)
    ),
    "5.1/12 closed: HEADERS after END_STREAM": Case(
        "closed", _request(HEADERS), (GOAWAY_, f.STREAM_CLOSED)
    ),
    "5.1/13 closed: CONTINUATION after END_STREAM": Case(
        "closed", f.frame(f.CONTINUATION, f.END_HEADERS, 1, BLOCK), (GOAWAY_, 1)
    ),
    "5.1.1/1 an even stream id": Case("idle", _request(HEADERS, 2), (GOAWAY_, 1)),
    "5.1.1/2 a stream id below one already used": Case(
        "idle", _request(HEADERS, 5) + _request(HEADERS, 3), (GOAWAY_, f.PROTOCOL_ERROR)
    ),
    "5.1.2/1 more streams than SETTINGS_MAX_CONCURRENT_STREAMS": Case(
        "idle", _too_many_streams, (RST, f.REFUSED_STREAM)
    ),
    # 5.3.1 dependencies, 5.5 extensions
    "5.3.1/1 HEADERS depending on their own stream": Case(
        "idle",
        f.frame(f.HEADERS, f.END_HEADERS | f.PRIORITY_FLAG, 1, b"\x00\x00\x00\x01\x10" + BLOCK),
        (RST, f.PROTOCOL_ERROR),
    ),
    "5.3.1/2 PRIORITY depending on its own stream": Case(
        "open", f.frame(f.PRIORITY, 0, 1, b"\x00\x00\x00\x01\x10"), (RST, f.PROTOCOL_ERROR)
    ),
    "5.5/1 an unknown extension frame": Case("open", f.frame(0x20, 0, 1, b"ext"), ALIVE),
    "5.5/2 an unknown extension frame inside a header block": Case(
        "idle", f.frame(f.HEADERS, 0, 1, BLOCK) + f.frame(0x20, 0, 1, b"x"), (GOAWAY_, 1)
    ),
    # 6.1 DATA
    "6.1/1 DATA on stream 0": Case("open", f.frame(f.DATA, 0, 0, MESSAGE), (GOAWAY_, 1)),
    "6.1/2 DATA on a stream not open": Case(
        "half-closed", f.frame(f.DATA, 0, 1, MESSAGE), (RST, f.STREAM_CLOSED)
    ),
    "6.1/3 DATA with a pad length past its end": Case(
        "open", f.frame(f.DATA, f.PADDED, 1, b"\x09abc"), (GOAWAY_, f.PROTOCOL_ERROR)
    ),
    "gap: an empty PADDED DATA frame": Case(
        "open", f.frame(f.DATA, f.PADDED, 1), (GOAWAY_, f.FRAME_SIZE_ERROR)
    ),
    # 6.2 HEADERS
    "6.2/1 HEADERS without END_HEADERS, then PRIORITY": Case(
        "idle",
        f.frame(f.HEADERS, 0, 1, BLOCK) + f.frame(f.PRIORITY, 0, 1, b"\x00\x00\x00\x00\x10"),
        (GOAWAY_, 1),
    ),
    "6.2/2 HEADERS without END_HEADERS, then CONTINUATION of another stream": Case(
        "idle",
        f.frame(f.HEADERS, 0, 1, BLOCK) + f.frame(f.CONTINUATION, f.END_HEADERS, 3, b""),
        (GOAWAY_, 1),
    ),
    "6.2/3 HEADERS on stream 0": Case(
        "idle", f.frame(f.HEADERS, f.END_HEADERS, 0, BLOCK), (GOAWAY_, 1)
    ),
    "6.2/4 HEADERS with a pad length past its end": Case(
        "idle", f.frame(f.HEADERS, f.END_HEADERS | f.PADDED, 1, b"\xff" + BLOCK), (GOAWAY_, 1)
    ),
    # 6.3 PRIORITY, 6.4 RST_STREAM
    "6.3/1 PRIORITY on stream 0": Case(
        "idle", f.frame(f.PRIORITY, 0, 0, b"\x00\x00\x00\x00\x10"), (GOAWAY_, 1)
    ),
    "6.3/2 a 4-byte PRIORITY": Case(
        "open", f.frame(f.PRIORITY, 0, 1, b"\x00" * 4), (RST, f.FRAME_SIZE_ERROR)
    ),
    "6.4/1 RST_STREAM on stream 0": Case("idle", f.rst_stream(0, f.CANCEL), (GOAWAY_, 1)),
    "6.4/2 RST_STREAM on an idle stream": Case("idle", f.rst_stream(1, f.CANCEL), (GOAWAY_, 1)),
    "6.4/3 a 3-byte RST_STREAM": Case(
        "open", f.frame(f.RST_STREAM, 0, 1, b"\x00" * 3), (GOAWAY_, f.FRAME_SIZE_ERROR)
    ),
    # 6.5 SETTINGS
    "6.5/1 a SETTINGS ACK with a payload": Case(
        "idle", f.frame(f.SETTINGS, f.ACK, 0, b"\x00"), (GOAWAY_, f.FRAME_SIZE_ERROR)
    ),
    "6.5/2 SETTINGS on stream 1": Case(
        "idle", f.frame(f.SETTINGS, 0, 1, settings_payload({3: 100})), (GOAWAY_, 1)
    ),
    "6.5/3 a 3-byte SETTINGS": Case(
        "idle", f.frame(f.SETTINGS, 0, 0, b"\x00" * 3), (GOAWAY_, f.FRAME_SIZE_ERROR)
    ),
    "gap: a 5-byte SETTINGS": Case(
        "idle", f.frame(f.SETTINGS, 0, 0, b"\x00\x03\x00\x00\x00"), (GOAWAY_, 6)
    ),
    "6.5.2/1 SETTINGS_ENABLE_PUSH 2": Case(
        "idle", f.settings({f.SETTINGS_ENABLE_PUSH: 2}), (GOAWAY_, f.PROTOCOL_ERROR)
    ),
    "6.5.2/2 SETTINGS_INITIAL_WINDOW_SIZE 2^31": Case(
        "idle", f.settings({f.SETTINGS_INITIAL_WINDOW_SIZE: 2**31}), (GOAWAY_, 3)
    ),
    "6.5.2/3 SETTINGS_MAX_FRAME_SIZE 16383": Case(
        "idle", f.settings({f.SETTINGS_MAX_FRAME_SIZE: 16383}), (GOAWAY_, 1)
    ),
    "6.5.2/4 SETTINGS_MAX_FRAME_SIZE 2^24": Case(
        "idle", f.settings({f.SETTINGS_MAX_FRAME_SIZE: 2**24}), (GOAWAY_, 1)
    ),
    "6.5.2/5 an unknown SETTINGS identifier": Case("idle", f.settings({0xFF: 1}), ALIVE),
    # 6.7 PING, 6.8 GOAWAY
    "6.7/2 a PING ACK is not answered": Case("idle", f.frame(f.PING, f.ACK, 0, b"x" * 8), ALIVE),
    "6.7/3 PING on stream 1": Case("idle", f.frame(f.PING, 0, 1, b"x" * 8), (GOAWAY_, 1)),
    "6.7/4 a 6-byte PING": Case("idle", f.frame(f.PING, 0, 0, b"x" * 6), (GOAWAY_, 6)),
    "gap: a 3-byte PING": Case("idle", f.frame(f.PING, 0, 0, b"abc"), (GOAWAY_, 6)),
    "6.8/1 GOAWAY on stream 1": Case(
        "idle", f.frame(f.GOAWAY, 0, 1, b"\x00" * 8), (GOAWAY_, f.PROTOCOL_ERROR)
    ),
    # 6.9 WINDOW_UPDATE
    "6.9/1 gap: a WINDOW_UPDATE of 0 on the connection": Case(
        "idle", f.window_update(0, 0), (GOAWAY_, f.PROTOCOL_ERROR)
    ),
    "6.9/2 gap: a WINDOW_UPDATE of 0 on a stream": Case(
        "open", f.window_update(1, 0), (RST, f.PROTOCOL_ERROR)
    ),
    "6.9/3 a 3-byte WINDOW_UPDATE": Case(
        "idle", f.frame(f.WINDOW_UPDATE, 0, 0, b"\x00\x00\x01"), (GOAWAY_, f.FRAME_SIZE_ERROR)
    ),
    "6.9.1/2 the connection window past 2^31-1": Case(
        "idle", f.window_update(0, f.MAX_WINDOW), (GOAWAY_, f.FLOW_CONTROL_ERROR)
    ),
    "6.9.1/3 gap: a stream window past 2^31-1": Case(
        "open", f.window_update(1, f.MAX_WINDOW), (RST, f.FLOW_CONTROL_ERROR)
    ),
    "6.9.2/3 SETTINGS_INITIAL_WINDOW_SIZE taking a stream window past 2^31-1": Case(
        "open", _window_to_the_brim, (GOAWAY_, f.FLOW_CONTROL_ERROR)
    ),
    # 6.10 CONTINUATION
    "6.10/1 several CONTINUATION frames": Case(
        "idle",
        f.frame(f.HEADERS, 0, 1, BLOCK[:5])
        + f.frame(f.CONTINUATION, 0, 1, BLOCK[5:20])
        + f.frame(f.CONTINUATION, f.END_HEADERS, 1, BLOCK[20:]),
        ALIVE,
    ),
    "6.10/2 CONTINUATION after END_HEADERS": Case(
        "idle",
        _request(HEADERS) + f.frame(f.CONTINUATION, f.END_HEADERS, 1, b""),
        (GOAWAY_, 1),
    ),
    "6.10/3 CONTINUATION after DATA": Case(
        "open",
        f.frame(f.DATA, 0, 1, MESSAGE) + f.frame(f.CONTINUATION, f.END_HEADERS, 1, b""),
        (GOAWAY_, 1),
    ),
    "6.10/4 CONTINUATION on stream 0": Case(
        "idle", f.frame(f.HEADERS, 0, 1, BLOCK) + f.frame(f.CONTINUATION, 4, 0, b""), (GOAWAY_, 1)
    ),
    # 8.1 messages
    "8.1/1 a second HEADERS without END_STREAM": Case(
        "open", _request([(b"x-trailer", b"1")]), (RST, f.PROTOCOL_ERROR)
    ),
    "8.1.2/1 an uppercase field name": Case(
        "idle", _request([*HEADERS, (b"X-Upper", b"1")]), (RST, f.PROTOCOL_ERROR)
    ),
    "8.1.2.1/1 an unknown pseudo-header": Case(
        "idle", _request([*HEADERS[:4], (b":foo", b"x"), *HEADERS[4:]]), (RST, 1)
    ),
    "8.1.2.1/2 a response pseudo-header in a request": Case(
        "idle", _request([(b":status", b"200"), *HEADERS]), (RST, f.PROTOCOL_ERROR)
    ),
    "8.1.2.1/3 a pseudo-header in trailers": Case(
        "open",
        f.frame(
            f.HEADERS,
            f.END_HEADERS | f.END_STREAM,
            1,
            f.header_block([(b":path", b"/x")]),
        ),
        (RST, f.PROTOCOL_ERROR),
    ),
    "8.1.2.1/4 a pseudo-header after a regular field": Case(
        "idle", _request([*HEADERS[1:], HEADERS[0]]), (RST, f.PROTOCOL_ERROR)
    ),
    "8.1.2.2/1 a connection-specific field": Case(
        "idle", _request([*HEADERS, (b"connection", b"keep-alive")]), (RST, 1)
    ),
    "8.1.2.2/2 TE other than trailers": Case(
        "idle", _request([*_without(b"te"), (b"te", b"trailers, deflate")]), (RST, 1)
    ),
    "8.1.2.3/1 an empty :path": Case(
        "idle", _request([*_without(b":path"), (b":path", b"")]), (RST, f.PROTOCOL_ERROR)
    ),
    "8.1.2.3/2 no :method": Case("idle", _request(_without(b":method")), (RST, 1)),
    "8.1.2.3/3 no :scheme": Case("idle", _request(_without(b":scheme")), (RST, 1)),
    "8.1.2.3/4 no :path": Case("idle", _request(_without(b":path")), (RST, 1)),
    "8.1.2.3/5 :method twice": Case(
        "idle", _request([HEADERS[0], *HEADERS]), (RST, f.PROTOCOL_ERROR)
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
async def test_h2spec_case(name: str) -> None:
    case = CASES[name]
    talk = conversation(case.state)
    data = case.data(talk) if callable(case.data) else case.data
    frames = talk.send(data)
    assert answer_of(talk, frames) == case.expected
    assert_triton_saw_only_the_relay(talk.rig)


async def test_3_5_a_wrong_connection_preface_ends_the_connection() -> None:
    rig = Rig()
    tenant = H2Connection(rig.relay)
    out = Recording()
    tenant.connection_made(out)  # type: ignore[arg-type]
    tenant.data_received(b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n")
    rig.relay.flush()
    assert out.closed and goaway(out.take()) == f.PROTOCOL_ERROR


async def test_6_5_3_and_6_7_1_settings_and_ping_are_acknowledged() -> None:
    talk = conversation("idle")
    frames = talk.send(f.settings({f.SETTINGS_INITIAL_WINDOW_SIZE: 1000}) + PING)
    assert (f.SETTINGS, f.ACK, 0, b"") in frames
    assert (f.PING, f.ACK, 0, b"h2spec!!") in frames
    assert any(isinstance(e, h2.events.SettingsAcknowledged) for e in talk.events)
    assert any(isinstance(e, h2.events.PingAckReceived) for e in talk.events)


async def test_a_whole_call_reads_as_valid_http2_to_the_h2_client() -> None:
    """The relay's side of a call, read by h2: response headers, a message, trailers."""
    talk = conversation("half-closed")
    channel, _ = talk.rig.channel()
    talk.rig.respond(channel, 1, framing.grpc_message(b"answer"), trailers=True)
    talk.send(b"")
    kinds = [type(e) for e in talk.events]
    for event in (h2.events.ResponseReceived, h2.events.DataReceived, h2.events.TrailersReceived):
        assert event in kinds
    data = b"".join(e.data for e in talk.events if isinstance(e, h2.events.DataReceived))
    assert data == framing.grpc_message(b"answer")
    assert_triton_saw_only_the_relay(talk.rig)


# -- the same frame layer on the channel to Triton ------------------------------------------------

TRITON_BREAKS: dict[str, tuple[bytes, int]] = {
    "an empty PADDED DATA frame": (f.frame(f.DATA, f.PADDED, 1), f.FRAME_SIZE_ERROR),
    "a 3-byte PING": (f.frame(f.PING, 0, 0, b"abc"), f.FRAME_SIZE_ERROR),
    "a 5-byte SETTINGS": (f.frame(f.SETTINGS, 0, 0, b"\x00\x03\x00\x00\x00"), 6),
    "a WINDOW_UPDATE of 0 on the connection": (f.window_update(0, 0), f.PROTOCOL_ERROR),
    "the connection window past 2^31-1": (f.window_update(0, f.MAX_WINDOW), 3),
    "PUSH_PROMISE although push is disabled": (
        f.frame(f.PUSH_PROMISE, f.END_HEADERS, 1, b"\x00\x00\x00\x02"),
        f.PROTOCOL_ERROR,
    ),
}


@pytest.mark.parametrize("name", sorted(TRITON_BREAKS))
async def test_triton_breaking_a_connection_rule_gets_goaway_and_its_calls_fail(name: str) -> None:
    """The channel reads Triton through the same checks: GOAWAY with the RFC's code, the
    connection closed (the next call opens a new one), nothing echoed back."""
    data, code = TRITON_BREAKS[name]
    talk = conversation("half-closed")
    channel, up = talk.rig.channel()
    up.take()
    channel.data_received(data)
    sent = up.take()
    assert up.closed
    assert goaway(sent) == code
    assert not [frame for frame in sent if frame[0] in (f.PING, f.SETTINGS)], "it was answered"
    channel.connection_lost(None)
    talk.send(b"")
    assert 1 not in talk.tenant.streams  # the tenant's call is answered (UNAVAILABLE)
    assert any(isinstance(e, h2.events.StreamEnded) for e in talk.events)


@pytest.mark.parametrize(
    ("name", "data", "code"),
    [
        ("a WINDOW_UPDATE of 0 on a stream", f.window_update(1, 0), f.PROTOCOL_ERROR),
        ("a stream window past 2^31-1", f.window_update(1, f.MAX_WINDOW), 3),
    ],
)
async def test_triton_breaking_a_stream_rule_resets_that_call_only(
    name: str, data: bytes, code: int
) -> None:
    talk = conversation("half-closed")
    channel, up = talk.rig.channel()
    up.take()
    channel.data_received(data)
    talk.rig.relay.flush()
    assert resets(up.take()) == {1: code}, name
    assert not up.closed
    talk.send(b"")
    assert any(isinstance(e, h2.events.StreamReset) for e in talk.events)
