"""An in-process gRPC relay driven frame by frame, for the relay's tests (`test_channel`,
`test_conformance*`, `test_fuzz`).

`Rig` builds a relay whose tenant connections and Triton channels write to `Recording`
transports: each test feeds one side bytes, ends the event-loop turn by hand (`relay.flush()`),
and reads the frames each side got. Nothing here listens on a socket or needs Triton.
"""

from __future__ import annotations

from typing import Any

from hpack import Decoder, Encoder
from tritonclient.grpc import service_pb2

from proxy.grpc import framing
from proxy.grpc.channel import TritonChannel
from proxy.grpc.relay import H2Connection
from proxy.grpc.server import GrpcRelay
from proxy.http2 import frames as f
from proxy.metrics import ProxyMetrics
from proxy.policy.limiter import Limiter
from proxy.processflags import ProxyState
from proxy.settings import parse_settings
from proxy.table import ModelTable, Served
from tests.proxy.conftest import data_frames

Frame = tuple[int, int, int, bytes]  # kind, flags, stream id, payload
MODEL = "add_one"
HEADERS = [
    (b":method", b"POST"),
    (b":scheme", b"http"),
    (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
    (b":authority", b"proxy"),
    (b"te", b"trailers"),
    (b"content-type", b"application/grpc"),
]


class Recording:
    """A transport that keeps what is written."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def write(self, data: bytes) -> None:
        self.data += data

    def close(self) -> None:
        self.closed = True

    abort = close

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def get_write_buffer_size(self) -> int:
        return len(self.data)

    def take(self) -> list[Frame]:
        """The frames written since the last call (a leading connection preface skipped)."""
        data = bytes(self.data)
        self.data.clear()
        if data.startswith(f.PREFACE):
            data = data[len(f.PREFACE) :]
        frames = []
        while data:
            length = int.from_bytes(data[:3], "big")
            sid = int.from_bytes(data[5:9], "big")
            frames.append((data[3], data[4], sid, data[9 : 9 + length]))
            data = data[9 + length :]
        return frames


class Rig:
    """A relay, its tenants and channels, driven by hand (flush = the end of a loop turn)."""

    def __init__(self, **flags: str) -> None:
        argv = ["--model-id", MODEL, "--triton-http-url", "127.0.0.1:1"]
        argv += ["--triton-grpc-url", "127.0.0.1:2", "--connect-retry", "0"]
        for name, value in flags.items():
            argv += [f"--{name.replace('_', '-')}", value]
        settings = parse_settings(argv, {})
        limiter = Limiter(0, 0, 1.0)
        metrics = ProxyMetrics(limiter, MODEL)
        table = ModelTable.of_one(Served(MODEL, limiter, metrics))
        self.relay = GrpcRelay(settings, limiter, metrics, ProxyState(), table)
        self.triton_encoder = Encoder()
        self.triton_decoder = Decoder()

    def tenant(self, window: int | None = None) -> tuple[H2Connection, Recording]:
        connection = H2Connection(self.relay)
        transport = Recording()
        connection.connection_made(transport)  # type: ignore[arg-type]
        hello = f.PREFACE + f.settings(
            {} if window is None else {f.SETTINGS_INITIAL_WINDOW_SIZE: window}
        )
        connection.data_received(hello)
        self.relay.flush()
        transport.take()
        return connection, transport

    def channel(self) -> tuple[TritonChannel, Recording]:
        """The channel the last stream went on, connected to a recording transport."""
        channel = self.relay.channels[-1]
        if channel.transport is None:
            transport = Recording()
            channel.transport = transport  # type: ignore[assignment]
            channel.out.flush()
        return channel, channel.transport  # type: ignore[return-value]

    def call(self, tenant: H2Connection, sid: int, message: bytes, end: bool = True) -> None:
        frames = f.frame(f.HEADERS, f.END_HEADERS, sid, f.header_block(HEADERS))
        frames += data_frames(sid, framing.grpc_message(message), end)
        tenant.data_received(frames)
        self.relay.flush()

    def respond(self, channel: TritonChannel, sid: int, body: bytes, trailers: bool) -> None:
        head = self.triton_encoder.encode([(b":status", b"200"), (b"content-type", b"x")])
        frames = f.frame(f.HEADERS, f.END_HEADERS, sid, head)
        frames += data_frames(sid, body, False)
        if trailers:
            block = self.triton_encoder.encode([(b"grpc-status", b"0")])
            frames += f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, sid, block)
        channel.data_received(frames)


def infer(payload: int = 4) -> bytes:
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="INPUT0", datatype="UINT8", shape=[payload])
    request.raw_input_contents.append(b"\x01" * payload)
    data: bytes = request.SerializeToString()
    return data


def kinds(frames: list[Frame]) -> list[tuple[int, int]]:
    return [(kind, sid) for kind, _, sid, _ in frames]


def data_bytes(frames: list[Frame], sid: int) -> int:
    return sum(len(p) for kind, _, s, p in frames if kind == f.DATA and s == sid)


def goaway_code(frames: list[Frame]) -> int:
    """The error code of the last GOAWAY among `frames` (one must be there)."""
    goaway = [payload for kind, _, _, payload in frames if kind == f.GOAWAY]
    assert goaway, "the proxy must say why it closes the connection"
    return int.from_bytes(goaway[-1][4:8], "big")
