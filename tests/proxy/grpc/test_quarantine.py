"""A quarantined pod's gRPC calls, unary and streaming, in process: one admission verdict.

The node quarantines a pod by setting its limiter's refusal (`gateway.tenants`); the relay asks
`policy.admission.admit` for every call's verdict, a unary call's message and each request
message of a ModelStreamInfer stream alike, and quarantine is its first rule. A unary call is
answered FAILED_PRECONDITION; a stream's message is refused in the stream (that message only,
as Triton refuses one) and the stream goes on, its next message relayed once the quarantine is
lifted. Triton sees none of the refused bytes.
"""

from __future__ import annotations

import asyncio

from hpack import Decoder
from tritonclient.grpc import service_pb2

from proxy.grpc import framing
from proxy.grpc.intake import HOLD_LIMIT
from proxy.http2 import frames as f
from proxy.policy.refusals import QuarantinedError
from tests.proxy.conftest import data_frames
from tests.proxy.grpc.rig import HEADERS, Frame, Recording, Rig, data_bytes, infer

WHY = "quarantined: the pod's requests were at Triton when it exited; ask the operator"
STREAM_BLOCK = f.header_block(
    [(n, b"/inference.GRPCInferenceService/ModelStreamInfer" if n == b":path" else v)
     for n, v in HEADERS]
)  # fmt: skip


def _stream_request(request_id: str, payload: int = 4) -> bytes:
    request = service_pb2.ModelInferRequest.FromString(infer(payload))
    request.id = request_id
    data: bytes = request.SerializeToString()
    return data


async def _answers(rig: Rig, out: Recording, sid: int, count: int) -> list[Frame]:
    """The frames the tenant got until `count` in-stream answers came on `sid` (a refusal of
    the limiter's comes on a later event-loop turn), at most 100 turns."""
    got: list[Frame] = []
    for _ in range(100):
        rig.relay.flush()
        got += out.take()
        if len(_in_stream(got, sid)) >= count:
            return got
        await asyncio.sleep(0)
    raise AssertionError(f"{count} answers on stream {sid} never came: {got}")


def _in_stream(frames: list[Frame], sid: int) -> list[service_pb2.ModelStreamInferResponse]:
    body = b"".join(p for kind, _, s, p in frames if kind == f.DATA and s == sid)
    answers = []
    while body:
        size = int.from_bytes(body[1:5], "big")
        answers.append(service_pb2.ModelStreamInferResponse.FromString(body[5 : 5 + size]))
        body = body[5 + size :]
    return answers


def _ended(frames: list[Frame], sid: int) -> bool:
    return any(s == sid and flags & f.END_STREAM for _, flags, s, _ in frames)


async def test_a_quarantined_pods_unary_call_is_refused_before_triton() -> None:
    rig = Rig()
    rig.relay.limiter.refusal = QuarantinedError(WHY)
    tenant, out = rig.tenant()
    rig.call(tenant, 1, infer())
    frames = out.take()
    (kind, flags, sid, block), *_ = [frame for frame in frames if frame[0] == f.HEADERS]
    assert (kind, sid) == (f.HEADERS, 1) and flags & f.END_STREAM
    fields = dict(Decoder().decode(block, raw=True))
    assert fields[b"grpc-status"] == str(framing.CODE_NUMBERS["FAILED_PRECONDITION"]).encode()
    assert b"quarantined" in fields[b"grpc-message"]
    assert all(not channel.streams for channel in rig.relay.channels)


async def test_a_quarantined_pods_stream_messages_are_refused_in_the_stream_which_goes_on() -> None:
    rig = Rig()
    tenant, out = rig.tenant()
    tenant.data_received(f.frame(f.HEADERS, f.END_HEADERS, 1, STREAM_BLOCK))
    rig.relay.flush()
    _, up = rig.channel()
    up.take()
    rig.relay.limiter.refusal = QuarantinedError(WHY)
    small, large = _stream_request("first"), _stream_request("second", HOLD_LIMIT * 2)
    # One held whole, one past HOLD_LIMIT (read in pieces, `intake.StreamIntake._begin`).
    tenant.data_received(data_frames(1, framing.grpc_message(small), False))
    tenant.data_received(data_frames(1, framing.grpc_message(large), False))
    frames = await _answers(rig, out, 1, 2)
    answers = _in_stream(frames, 1)
    assert [a.infer_response.id for a in answers] == ["first", "second"]
    assert all("quarantined" in a.error_message for a in answers)
    assert not _ended(frames, 1)  # the stream goes on
    assert data_bytes(up.take(), 1) == 0  # Triton got none of them
    # Lifted: the next message goes to Triton on the same stream.
    rig.relay.limiter.refusal = None
    tenant.data_received(data_frames(1, framing.grpc_message(_stream_request("third")), False))
    rig.relay.flush()
    assert data_bytes(up.take(), 1) > len(_stream_request("third"))
    assert not _ended(out.take(), 1)
