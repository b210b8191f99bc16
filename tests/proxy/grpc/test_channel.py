"""The gRPC relay's flow control and shared connection to Triton, frame by frame, in process.

A relay with tenant connections and Triton channels on transports that record what is written:
what each side may send and when (windows, held DATA, credit), stream ids mapped between the
sides, Triton's GOAWAY, stream limit and a lost connection, and a tenant breaking flow control.
The same code runs against a real Triton in test_relay_channel.py; here each rule is isolated so
a broken one shows which.
"""

from __future__ import annotations

import asyncio

import pytest
from hpack import Decoder

from proxy.grpc import framing
from proxy.grpc.channel import RESPONSE_WINDOW
from proxy.grpc.connection import _CLOSED_KEPT, _RESETS, MAX_HEADER_BLOCK
from proxy.grpc.gate import StreamGate
from proxy.grpc.relay import H2Connection
from proxy.grpc.stream import RECEIVE_WINDOW
from proxy.http2 import frames as f
from proxy.http2.streamstates import StreamStateError
from proxy.policy.finals import ASK
from tests.proxy.conftest import data_frames
from tests.proxy.grpc.rig import HEADERS, Recording, Rig, data_bytes, goaway_code, infer, kinds


async def test_two_tenants_share_one_channel_under_their_own_stream_ids() -> None:
    rig = Rig()
    a, a_out = rig.tenant()
    b, b_out = rig.tenant()
    rig.call(a, 1, infer())
    rig.call(b, 1, infer())
    assert len(rig.relay.channels) == 1
    channel, up = rig.channel()
    sent = up.take()
    opened = [sid for kind, _, sid, _ in sent if kind == f.HEADERS]
    assert opened == [1, 3]  # the channel's own ids, not the tenants' (both 1)
    assert sent[0][0] == f.SETTINGS  # the channel's SETTINGS, not a tenant's
    rig.respond(channel, 3, framing.grpc_message(b"for-b"), trailers=True)
    rig.respond(channel, 1, framing.grpc_message(b"for-a"), trailers=True)
    for out, body in ((a_out, b"for-a"), (b_out, b"for-b")):
        frames = out.take()
        assert kinds(frames) == [(f.HEADERS, 1), (f.DATA, 1), (f.HEADERS, 1)]
        assert frames[1][3] == framing.grpc_message(body)
        assert frames[2][1] & f.END_STREAM
    assert not a.streams and not b.streams and not channel.streams


async def test_request_data_waits_for_tritons_window_and_the_tenant_is_credited_as_it_goes() -> (
    None
):
    rig = Rig()
    tenant, out = rig.tenant()
    rig.call(tenant, 1, b"", end=False)  # opens the stream
    channel, up = rig.channel()
    channel.data_received(f.settings({f.SETTINGS_INITIAL_WINDOW_SIZE: 1000}))
    rig.relay.flush()
    up.take()
    # A stream message bigger than the window, whole in one read: the relay may send 1000.
    big = framing.grpc_message(infer(70_000))
    stream_sid = 3
    block = f.header_block(
        [(n, b"/inference.GRPCInferenceService/ModelStreamInfer" if n == b":path" else v)
         for n, v in HEADERS]
    )  # fmt: skip
    tenant.data_received(
        f.frame(f.HEADERS, f.END_HEADERS, stream_sid, block) + data_frames(stream_sid, big, False)
    )
    rig.relay.flush()
    up_sid = 3
    assert data_bytes(up.take(), up_sid) == 1000
    assert not [frame for frame in out.take() if frame[0] == f.WINDOW_UPDATE and frame[2] == 3]
    channel.data_received(f.window_update(up_sid, 200_000) + f.window_update(0, 200_000))
    rig.relay.flush()
    assert data_bytes(up.take(), up_sid) == len(big) - 1000 + len(ASK)  # the rest, and the ask
    credits = [p for kind, _, sid, p in out.take() if kind == f.WINDOW_UPDATE and sid == 3]
    assert sum(int.from_bytes(p, "big") for p in credits) >= RECEIVE_WINDOW // 4


async def test_response_data_waits_for_the_tenants_window_and_triton_is_credited_as_it_goes() -> (
    None
):
    rig = Rig()
    tenant, out = rig.tenant(window=100)
    rig.call(tenant, 1, infer())
    channel, up = rig.channel()
    up.take()
    body = framing.grpc_message(b"x" * (RESPONSE_WINDOW // 2))
    rig.respond(channel, 1, body, trailers=False)
    assert data_bytes(out.take(), 1) == 100  # the tenant's stream window
    assert not [frame for frame in up.take() if frame[0] == f.WINDOW_UPDATE and frame[2] == 1]
    tenant.data_received(f.window_update(1, len(body)))
    rig.relay.flush()
    # The connection's window (65535 by default) is now the bound.
    assert data_bytes(out.take(), 1) == f.DEFAULT_WINDOW - 100
    tenant.data_received(f.window_update(0, len(body)))
    rig.relay.flush()
    assert data_bytes(out.take(), 1) == len(body) - f.DEFAULT_WINDOW
    credited = [p for kind, _, sid, p in up.take() if kind == f.WINDOW_UPDATE and sid == 1]
    assert sum(int.from_bytes(p, "big") for p in credited) >= len(body) // 2  # in steps


async def test_trailers_wait_behind_response_data_the_tenant_cannot_take_yet() -> None:
    rig = Rig()
    tenant, out = rig.tenant(window=10)
    rig.call(tenant, 1, infer())
    channel, _ = rig.channel()
    rig.respond(channel, 1, framing.grpc_message(b"y" * 50), trailers=True)
    frames = out.take()
    assert data_bytes(frames, 1) == 10
    assert not any(kind == f.HEADERS and flags & f.END_STREAM for kind, flags, _, _ in frames)
    tenant.data_received(f.window_update(1, 100))
    rig.relay.flush()
    frames = out.take()
    assert data_bytes(frames, 1) == 45
    assert frames[-1][0] == f.HEADERS and frames[-1][1] & f.END_STREAM
    assert not tenant.streams


async def test_a_tenant_overrunning_its_window_loses_its_connection_and_no_other() -> None:
    rig = Rig(container_concurrency="1")
    calm, calm_out = rig.tenant()
    rig.call(calm, 1, infer())  # holds the only slot: the next stream's bytes are held
    rude, rude_out = rig.tenant()
    block = f.header_block(HEADERS)
    rude.data_received(f.frame(f.HEADERS, f.END_HEADERS, 1, block))
    rig.relay.flush()
    message = framing.grpc_message(infer(RECEIVE_WINDOW + 100))
    rude.data_received(data_frames(1, message[: RECEIVE_WINDOW + 50], False))
    rig.relay.flush()
    channel, _ = rig.channel()
    assert rude_out.closed
    goaway = [p for kind, _, _, p in rude_out.take() if kind == f.GOAWAY]
    assert goaway and int.from_bytes(goaway[0][4:8], "big") == f.FLOW_CONTROL_ERROR
    rude.connection_lost(None)
    assert not channel.closing and 1 in channel.streams  # the calm tenant's call goes on
    rig.respond(channel, 1, framing.grpc_message(b"ok"), trailers=True)
    assert kinds(calm_out.take())[-1] == (f.HEADERS, 1)


async def test_tritons_goaway_refuses_unprocessed_streams_and_opens_a_new_channel() -> None:
    rig = Rig()
    tenant, out = rig.tenant()
    rig.call(tenant, 1, infer())
    rig.call(tenant, 3, infer())
    channel, up = rig.channel()
    channel.data_received(f.goaway(1))
    frames = out.take()
    assert (f.RST_STREAM, 3) in kinds(frames)
    refused = next(p for kind, _, sid, p in frames if kind == f.RST_STREAM and sid == 3)
    assert int.from_bytes(refused, "big") == f.REFUSED_STREAM
    assert rig.relay.channels == []  # the old one only finishes stream 1
    rig.call(tenant, 5, infer())
    assert len(rig.relay.channels) == 1 and rig.relay.channels[0] is not channel
    rig.respond(channel, 1, framing.grpc_message(b"ok"), trailers=True)
    assert up.closed  # the last stream ended on a channel Triton is closing


async def test_tritons_stream_limit_spreads_streams_over_channels() -> None:
    rig = Rig()
    tenant, _ = rig.tenant()
    rig.call(tenant, 1, infer())
    channel, _ = rig.channel()
    channel.data_received(f.settings({f.SETTINGS_MAX_CONCURRENT_STREAMS: 1}))
    rig.call(tenant, 3, infer())
    assert len(rig.relay.channels) == 2
    assert tenant.streams[3].channel is rig.relay.channels[1]


async def test_a_lost_channel_answers_its_calls_unavailable() -> None:
    rig = Rig()
    tenant, out = rig.tenant()
    rig.call(tenant, 1, infer())
    channel, _ = rig.channel()
    channel.connection_lost(ConnectionResetError("reset"))
    rig.relay.flush()
    (kind, flags, sid, block), *_ = out.take()
    assert (kind, sid) == (f.HEADERS, 1) and flags & f.END_STREAM
    fields = dict(Decoder().decode(block, raw=True))
    assert fields[b"grpc-status"] == str(framing.CODE_NUMBERS["UNAVAILABLE"]).encode()
    assert not tenant.streams and rig.relay.channels == []


async def test_frames_from_a_tenant_never_reach_triton_as_sent() -> None:
    rig = Rig()
    tenant, out = rig.tenant()
    rig.call(tenant, 1, infer(), end=False)
    _, up = rig.channel()
    up.take()
    tenant.data_received(
        f.frame(f.PING, 0, 0, b"12345678")
        + f.settings({f.SETTINGS_HEADER_TABLE_SIZE: 0})
        + f.window_update(0, 1000)
        + f.frame(f.PRIORITY, 0, 1, b"\x00\x00\x00\x00\x10")
    )
    rig.relay.flush()
    assert up.take() == []  # Triton hears none of it
    answered = kinds(out.take())
    assert (f.PING, 0) in answered and (f.SETTINGS, 0) in answered


async def test_an_endless_header_block_ends_the_tenants_connection() -> None:
    rig = Rig()
    tenant, out = rig.tenant()
    tenant.data_received(f.frame(f.HEADERS, 0, 1, f.header_block(HEADERS)))
    chunk = b"\x00" * f.DEFAULT_MAX_FRAME
    for _ in range(MAX_HEADER_BLOCK // len(chunk) + 1):  # a CONTINUATION flood
        tenant.data_received(f.frame(f.CONTINUATION, 0, 1, chunk))
    rig.relay.flush()
    assert out.closed and goaway_code(out.take()) == f.PROTOCOL_ERROR
    assert rig.relay.channels == []  # nothing reached Triton


async def test_a_reset_flood_ends_the_tenants_connection_and_spares_the_others() -> None:
    rig = Rig()
    calm, _ = rig.tenant()
    rig.call(calm, 1, infer(), end=False)
    rude, rude_out = rig.tenant()
    sid = 1
    while not rude_out.closed and sid < 4 * _RESETS:
        rig.call(rude, sid, infer(), end=False)
        rude.data_received(f.rst_stream(sid, f.CANCEL))
        sid += 2
    rig.relay.flush()
    assert rude_out.closed and goaway_code(rude_out.take()) == f.ENHANCE_YOUR_CALM
    assert sid // 2 == _RESETS + 1  # exactly the allowance, then the end
    channel, _ = rig.channel()
    assert not channel.closing and list(channel.streams) == [1]  # the calm tenant's call


async def test_completed_calls_earn_back_the_reset_allowance() -> None:
    rig = Rig()
    tenant, out = rig.tenant()
    sid = 1
    for _ in range(3 * _RESETS):  # a client that cancels every other call, for a long time
        rig.call(tenant, sid, infer(), end=False)
        tenant.data_received(f.rst_stream(sid, f.CANCEL))
        rig.call(tenant, sid + 2, infer())
        channel, _ = rig.channel()
        rig.respond(channel, max(channel.streams), framing.grpc_message(b"ok"), trailers=True)
        sid += 4
    assert not out.closed


@pytest.mark.parametrize(
    ("closed_ago", "code"),
    [
        (0, f.STREAM_CLOSED),  # the last call's stream: the tenant's HEADERS on it are an error
        (_CLOSED_KEPT - 1, f.STREAM_CLOSED),  # the oldest stream still remembered
        (_CLOSED_KEPT, f.PROTOCOL_ERROR),  # forgotten: like an id below one already used
    ],
)
async def test_the_last_closed_streams_are_remembered_and_older_ones_forgotten(
    closed_ago: int, code: int
) -> None:
    rig = Rig()
    tenant, out = rig.tenant()
    calls = _CLOSED_KEPT + 10
    for n in range(calls):  # each closed by the tenant's END_STREAM and Triton's trailers
        rig.call(tenant, 2 * n + 1, infer())
        channel, _ = rig.channel()
        rig.respond(channel, max(channel.streams), framing.grpc_message(b"ok"), trailers=True)
    rig.relay.flush()
    out.take()
    sid = 2 * (calls - 1 - closed_ago) + 1
    tenant.data_received(f.frame(f.HEADERS, f.END_HEADERS, sid, f.header_block(HEADERS)))
    rig.relay.flush()
    assert out.closed and goaway_code(out.take()) == code


async def test_a_tenant_that_does_not_read_is_not_read_either() -> None:
    rig = Rig()
    tenant, out = rig.tenant()
    tenant.pause_writing()
    assert not out.reading
    tenant.resume_writing()
    assert out.reading


async def test_a_held_last_message_ends_the_stream_at_triton_exactly_once() -> None:
    rig = Rig()
    tenant, _ = rig.tenant()
    rig.call(tenant, 1, b"", end=False)
    channel, up = rig.channel()
    channel.data_received(f.settings({f.SETTINGS_INITIAL_WINDOW_SIZE: 10}))
    rig.relay.flush()
    up.take()
    rig.call(tenant, 3, infer(100))  # one unary call, END_STREAM on its only DATA frame
    channel.data_received(f.window_update(3, 1_000))
    rig.relay.flush()
    sent = [frame for frame in up.take() if frame[0] == f.DATA and frame[2] == 3]
    ends = [frame for frame in sent if frame[1] & f.END_STREAM]
    assert len(ends) == 1 and sent[-1] is ends[0]
    assert sum(len(frame[3]) for frame in sent) == len(framing.grpc_message(infer(100)))


async def test_a_stream_triton_ends_first_is_closed_at_triton_too() -> None:
    rig = Rig()
    tenant, _ = rig.tenant()
    rig.call(tenant, 1, infer(), end=False)  # the tenant's side stays open
    rig.call(tenant, 3, infer())  # this one the tenant ended
    channel, up = rig.channel()
    up.take()
    rig.respond(channel, 1, framing.grpc_message(b"early"), trailers=True)
    rig.respond(channel, 3, framing.grpc_message(b"ok"), trailers=True)
    rig.relay.flush()
    resets = [(sid, payload) for kind, _, sid, payload in up.take() if kind == f.RST_STREAM]
    assert resets == [(1, f.NO_ERROR.to_bytes(4, "big"))]


async def test_a_response_ending_on_data_while_the_tenant_is_full_ends_once_it_drains() -> None:
    rig = Rig()
    tenant, out = rig.tenant()
    rig.call(tenant, 1, infer())
    channel, _ = rig.channel()
    tenant.pause_writing()  # the tenant's socket is full
    head = rig.triton_encoder.encode([(b":status", b"200"), (b"content-type", b"x")])
    channel.data_received(
        f.frame(f.HEADERS, f.END_HEADERS, 1, head)
        + f.frame(f.DATA, 0, 1, b"abc")
        + f.frame(f.DATA, f.END_STREAM, 1, b"")  # no trailers: not gRPC, passed on as it came
    )
    assert data_bytes(out.take(), 1) == 0
    tenant.resume_writing()
    rig.relay.flush()
    frames = [frame for frame in out.take() if frame[0] == f.DATA]
    assert b"".join(frame[3] for frame in frames) == b"abc"
    assert [bool(frame[1] & f.END_STREAM) for frame in frames][-1]
    assert sum(bool(frame[1] & f.END_STREAM) for frame in frames) == 1
    assert not tenant.streams


async def test_a_connection_that_never_sends_the_preface_is_closed() -> None:
    rig = Rig(head_timeout="0.05")
    silent = H2Connection(rig.relay)
    silent_out = Recording()
    silent.connection_made(silent_out)  # type: ignore[arg-type]
    _, talking_out = rig.tenant()  # sent its preface at once
    deadline = asyncio.get_running_loop().time() + 10
    while not silent_out.closed:
        assert asyncio.get_running_loop().time() < deadline, "the silent connection stayed open"
        await asyncio.sleep(0.01)
    assert not talking_out.closed


async def test_a_bug_that_loses_a_streams_state_ends_one_connection_not_the_proxy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A StreamStateError is the relay's bug, never the tenant's doing: that tenant's connection
    ends with GOAWAY INTERNAL_ERROR; nothing escapes into the event loop; others go on."""
    rig = Rig()
    calm, calm_out = rig.tenant()
    rig.call(calm, 1, infer(), end=False)

    def lost(*args: object) -> bool:
        raise StreamStateError("a stream in state closed cannot be sent END_STREAM")

    monkeypatch.setattr(StreamGate, "check", lost)
    unlucky, out = rig.tenant()
    rig.call(unlucky, 1, infer())
    assert out.closed and goaway_code(out.take()) == f.INTERNAL_ERROR
    assert not calm_out.closed


async def test_a_closed_stream_is_remembered_by_its_own_id_only() -> None:
    """Closed streams are kept in a table by stream number: a later stream whose number takes
    the same slot replaces it, and neither is ever mistaken for the other."""
    rig = Rig()
    tenant, out = rig.tenant()
    far = 1 + 2 * _CLOSED_KEPT  # the stream number _CLOSED_KEPT after stream 1's: its slot
    for sid in (1, far):
        rig.call(tenant, sid, infer())
        channel, _ = rig.channel()
        rig.respond(channel, max(channel.streams), framing.grpc_message(b"ok"), trailers=True)
    rig.relay.flush()
    out.take()
    tenant.data_received(f.frame(f.HEADERS, f.END_HEADERS, 1, f.header_block(HEADERS)))
    rig.relay.flush()
    assert out.closed and goaway_code(out.take()) == f.PROTOCOL_ERROR  # forgotten, as too old


async def test_a_stream_in_a_slot_is_still_known_as_closed() -> None:
    rig = Rig()
    tenant, out = rig.tenant()
    far = 1 + 2 * _CLOSED_KEPT
    for sid in (1, far):
        rig.call(tenant, sid, infer())
        channel, _ = rig.channel()
        rig.respond(channel, max(channel.streams), framing.grpc_message(b"ok"), trailers=True)
    rig.relay.flush()
    out.take()
    tenant.data_received(f.frame(f.HEADERS, f.END_HEADERS, far, f.header_block(HEADERS)))
    rig.relay.flush()
    assert out.closed and goaway_code(out.take()) == f.STREAM_CLOSED
