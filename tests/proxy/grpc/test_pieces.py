"""Messages read in pieces by the gRPC relay, driven frame by frame in process (`rig.Rig`): a
compressed message that inflates past what is inflated inline, whole in the buffer with the next
messages behind it, and a large message's memory (the buffer never holds it whole)."""

from __future__ import annotations

import zlib

from tritonclient.grpc import service_pb2

from proxy.grpc import framing
from proxy.grpc.intake import PREFIX_HOLD
from proxy.http2 import frames as f
from proxy.policy.finals import ASK
from tests.proxy.conftest import data_frames
from tests.proxy.grpc.rig import MODEL, Rig, infer

STREAM_HEADERS = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", b"/inference.GRPCInferenceService/ModelStreamInfer"),
    (b":authority", b"proxy"),
    (b"te", b"trailers"),
    (b"content-type", b"application/grpc"),
    (b"grpc-encoding", b"gzip"),
]


def gzipped(message: bytes) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    packed = compressor.compress(message) + compressor.flush()
    return b"\x01" + len(packed).to_bytes(4, "big") + packed


def ghost(size: int, request_id: str) -> bytes:
    request = service_pb2.ModelInferRequest(model_name="ghost", id=request_id)
    request.raw_input_contents.append(bytes(size))
    data: bytes = request.SerializeToString()
    return data


async def test_a_refused_message_read_whole_leaves_the_ones_behind_it() -> None:
    """One read brings a 1 MiB (inflated) message naming another model and two good ones: the
    first gets the in-stream error, the other two reach Triton, in that read."""
    rig = Rig()
    tenant, out = rig.tenant()
    payload = gzipped(ghost(1024 * 1024, "a")) + framing.grpc_message(infer()) + gzipped(infer(8))
    frames = f.frame(f.HEADERS, f.END_HEADERS, 1, f.header_block(STREAM_HEADERS))
    tenant.data_received(frames + data_frames(1, payload, False))
    rig.relay.flush()
    _, up = rig.channel()
    at_triton = b"".join(p for kind, _, _, p in up.take() if kind == f.DATA)
    # Each asks for its final answer (`policy.finals`): the compressed one goes uncompressed.
    assert at_triton == framing.grpc_message(infer() + ASK) + framing.grpc_message(infer(8) + ASK)
    answers = [p for kind, _, sid, p in out.take() if kind == f.DATA and sid == 1]
    response = service_pb2.ModelStreamInferResponse.FromString(b"".join(answers)[5:])
    assert response.error_message == (
        "Request for unknown model: 'ghost' is not found; this pod serves 'add_one'"
    )
    assert response.infer_response.id == "a"
    assert 1 in tenant.streams  # the stream goes on


async def test_a_large_message_is_relayed_as_it_comes_and_never_held_whole() -> None:
    """A 4 MiB message naming the model, sent in 16 KiB frames as Triton's window allows: the
    relay's buffer never holds more than the stream's window, and Triton gets every byte but the
    last until the message is whole."""
    rig = Rig()
    tenant, _ = rig.tenant()
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="INPUT0", datatype="UINT8", shape=[4 * 1024 * 1024])
    request.raw_input_contents.append(bytes(4 * 1024 * 1024))
    framed = framing.grpc_message(request.SerializeToString())
    head = f.frame(f.HEADERS, f.END_HEADERS, 1, f.header_block(STREAM_HEADERS[:-1]))
    tenant.data_received(head)
    channel, up = rig.channel()
    channel.data_received(f.settings({f.SETTINGS_INITIAL_WINDOW_SIZE: 1 << 30}))
    channel.data_received(f.frame(f.WINDOW_UPDATE, 0, 0, (1 << 30).to_bytes(4, "big")))
    rig.relay.flush()
    up.take()
    stream = tenant.streams[1]
    sent = 0
    held = 0
    step = 16 * 1024
    for pos in range(0, len(framed), step):
        piece = framed[pos : pos + step]
        end = pos + step >= len(framed)
        tenant.data_received(data_frames(1, piece, end))
        rig.relay.flush()
        held = max(held, len(stream.buf))
        sent += sum(len(p) for kind, _, _, p in up.take() if kind == f.DATA)
        if not end:
            assert sent >= pos + len(piece) - PREFIX_HOLD - 5  # relayed as it comes
            assert sent < len(framed)  # never the last byte before the message is whole
    assert sent == len(framed) + len(ASK)  # and the ask for its final answer after it
    assert held <= PREFIX_HOLD + step
