"""The gRPC relay for a model Triton knows by a private name, driven frame by frame
(`rig.Rig` with --triton-name): what Triton receives names the private name, with lengths and
flow control to match, and what the tenant receives names the model id."""

from __future__ import annotations

import gzip

from tritonclient.grpc import service_pb2

from proxy.grpc import framing
from proxy.grpc.stream import CREDIT_STEP
from proxy.http2 import frames as f
from proxy.policy.finals import ASK
from tests.proxy.conftest import data_frames
from tests.proxy.grpc.rig import HEADERS, MODEL, Rig, infer

PRIVATE = "ns-a.add_one.5f0c2d91e4a7b6c3"
STREAM = [
    (b":path", b"/inference.GRPCInferenceService/ModelStreamInfer") if n == b":path" else (n, v)
    for n, v in HEADERS
]


def renamed(message: bytes, name: str = PRIVATE) -> bytes:
    request = service_pb2.ModelInferRequest.FromString(message)
    request.model_name = name
    data: bytes = request.SerializeToString()
    return data


def at_triton(rig: Rig) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The header fields and DATA bytes Triton got (its first stream)."""
    _, up = rig.channel()
    frames = up.take()
    fields = [
        (bytes(name), bytes(value))
        for kind, _, _, payload in frames
        if kind == f.HEADERS
        for name, value in rig.triton_decoder.decode(payload, raw=True)
    ]
    return fields, b"".join(p for kind, _, _, p in frames if kind == f.DATA)


async def test_a_unary_message_reaches_triton_under_the_private_name() -> None:
    rig = Rig(triton_name=PRIVATE)
    tenant, _ = rig.tenant()
    headers = [*HEADERS, (b"grpc-accept-encoding", b"identity,deflate,gzip")]
    frames = f.frame(f.HEADERS, f.END_HEADERS, 1, f.header_block(headers))
    tenant.data_received(frames + data_frames(1, framing.grpc_message(infer()), True))
    rig.relay.flush()
    fields, data = at_triton(rig)
    assert data == framing.grpc_message(renamed(infer()))
    # Triton may not compress its answers: the relay could not rename them.
    assert b"grpc-accept-encoding" not in dict(fields)


async def test_a_large_message_is_renamed_from_its_first_bytes_as_it_passes() -> None:
    rig = Rig(triton_name=PRIVATE)
    tenant, _ = rig.tenant()
    message = infer(200_000)
    rig.call(tenant, 1, message)
    _, data = at_triton(rig)
    # As far as Triton's window (64 KiB until its SETTINGS say more) lets it go.
    assert len(data) > 60_000
    assert framing.grpc_message(renamed(message)).startswith(data)


async def test_stream_messages_are_renamed_and_a_compressed_one_goes_uncompressed() -> None:
    rig = Rig(triton_name=PRIVATE)
    tenant, _ = rig.tenant()
    packed = gzip.compress(infer(8))
    headers = [*STREAM, (b"grpc-encoding", b"gzip")]
    frames = f.frame(f.HEADERS, f.END_HEADERS, 1, f.header_block(headers))
    payload = framing.grpc_message(infer()) + b"\x01" + len(packed).to_bytes(4, "big") + packed
    tenant.data_received(frames + data_frames(1, payload, False))
    rig.relay.flush()
    _, data = at_triton(rig)
    assert data == framing.grpc_message(renamed(infer()) + ASK) + framing.grpc_message(
        renamed(infer(8)) + ASK
    )


async def test_a_large_compressed_message_is_refused_saying_why() -> None:
    rig = Rig(triton_name=PRIVATE)
    tenant, out = rig.tenant()
    packed = gzip.compress(infer(200_000))
    headers = [*HEADERS, (b"grpc-encoding", b"gzip")]
    frames = f.frame(f.HEADERS, f.END_HEADERS, 1, f.header_block(headers))
    payload = b"\x01" + len(packed).to_bytes(4, "big") + packed
    tenant.data_received(frames + data_frames(1, payload, True))
    rig.relay.flush()
    trailers = [p for kind, _, sid, p in out.take() if kind == f.HEADERS and sid == 1]
    block = b"".join(trailers)
    assert b"send it uncompressed" in block and b"grpc-status" in block


async def test_answers_and_errors_name_the_model_id_and_triton_is_credited_every_byte() -> None:
    """Triton's answers shrink on the way (a private name longer than the id). Held for the
    tenant's window and sent later, Triton must still be credited every byte it sent, or a long
    stream of answers would run its window dry and stall."""
    rig = Rig(triton_name=PRIVATE)
    tenant, out = rig.tenant(window=0)  # every answer waits for the tenant's window
    frames = f.frame(f.HEADERS, f.END_HEADERS, 1, f.header_block(STREAM))
    tenant.data_received(frames + data_frames(1, framing.grpc_message(infer()), False))
    rig.relay.flush()
    channel, up = rig.channel()
    up.take()
    answer = service_pb2.ModelStreamInferResponse(
        infer_response=service_pb2.ModelInferResponse(model_name=PRIVATE, id="x")
    )
    answer.infer_response.raw_output_contents.append(b"\x02" * 1000)
    framed = framing.grpc_message(answer.SerializeToString())
    count = 3 * CREDIT_STEP // len(framed)
    rig.respond(channel, 1, framed * count, trailers=False)
    rig.relay.flush()
    assert not [p for kind, _, sid, p in out.take() if kind == f.DATA and sid == 1]
    grow = 1 << 24
    tenant.data_received(f.window_update(1, grow) + f.window_update(0, grow))
    rig.relay.flush()
    answered = out.take()
    got = b"".join(p for kind, _, sid, p in answered if kind == f.DATA and sid == 1)
    expected = answer
    expected.infer_response.model_name = MODEL
    assert got == framing.grpc_message(expected.SerializeToString()) * count
    # Triton's stream was credited every byte it sent (in steps), not the fewer renamed ones.
    credited = sum(
        int.from_bytes(p, "big")
        for kind, _, sid, p in up.take()
        if kind == f.WINDOW_UPDATE and sid == 1
    )
    owed = tenant.streams[1].given  # taken by the tenant, credited once a step is full
    assert len(got) < len(framed) * count  # the answers did shrink
    assert credited + owed == len(framed) * count
    error = rig.triton_encoder.encode(
        [(b"grpc-status", b"3"), (b"grpc-message", f"model '{PRIVATE}' failed".encode())]
    )
    channel.data_received(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, error))
    rig.relay.flush()
    trailers = [p for kind, _, sid, p in out.take() if kind == f.HEADERS and sid == 1]
    decoded = dict(rig.triton_decoder.decode(trailers[-1], raw=True)) if trailers else {}
    assert decoded.get(b"grpc-message") == f"model '{MODEL}' failed".encode()
