"""Benchmark: the proxy's own Python work per exchange, with and without its memory of heads.

Feeds one request and its response through the real relay classes, in process, with transports
that only count bytes: the REST relay (`http1.listener.RestRelay`, `http1.relay.ClientConnection`,
`http1.upstream.Upstream`: a JSON infer request and Triton's answer) and the gRPC relay
(`grpc.relay.H2Connection` and `grpc.channel.TritonChannel`: a unary ModelInfer, its response head,
message and trailers, with header blocks from a real HPACK encoder as grpc-core and Triton send
them). No sockets, no Triton, no
other process: what is left is the CPU the proxy's own code spends per exchange, a figure the
noise of a shared machine hardly moves (the end-to-end figures are `proxy_latency.py`'s).

The baseline, in the same run, is the same relay with its memory turned off: REST heads parsed,
routed and serialized afresh on every request (as before the prepared-head cache), gRPC header
blocks decoded and encoded with plain `hpack` every time. Prints microseconds per exchange (the
best of several runs) and the ratio.

    .venv/bin/python -m benchmarks.proxy_hotpath [--exchanges 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpack import Decoder, Encoder
from tritonclient.grpc import service_pb2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy.app import Proxy  # noqa: E402
from proxy.grpc.channel import TritonChannel  # noqa: E402
from proxy.grpc.relay import H2Connection  # noqa: E402
from proxy.grpc.server import GrpcRelay  # noqa: E402
from proxy.http1.relay import ClientConnection  # noqa: E402
from proxy.http1.upstream import Upstream  # noqa: E402
from proxy.http2 import frames as f  # noqa: E402
from proxy.http2.headers import Fields  # noqa: E402
from proxy.settings import Settings, parse_settings  # noqa: E402

MODEL = "add_one"


class _Counting:
    """A transport that takes every write and keeps only the byte count."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class _Forgetful(dict[Any, Any]):
    """A cache that keeps nothing: the baseline's every lookup misses."""

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


class _PlainDecoder:
    """hpack's decoder, with no memory of blocks (the baseline)."""

    def __init__(self) -> None:
        self._decoder = Decoder()
        self.max_allowed_table_size = self._decoder.max_allowed_table_size

    def decode(self, block: bytes) -> Fields:
        return tuple((n, v) for n, v in self._decoder.decode(block, raw=True))


class _PlainEncoder:
    """hpack's encoder, encoding every list afresh (the baseline)."""

    def __init__(self) -> None:
        self._encoder = Encoder()

    def limit_table(self, size: int) -> None:
        self._encoder.header_table_size = size

    def encode(self, fields: Fields) -> bytes:
        block: bytes = self._encoder.encode(list(fields))
        return block


def _settings() -> Settings:
    return parse_settings(
        [
            "--model-id",
            MODEL,
            "--triton-http-url",
            "127.0.0.1:1",
            "--triton-grpc-url",
            "127.0.0.1:2",
        ],
        {},
    )


def rest_exchange(memory: bool) -> tuple[Callable[[], None], Callable[[], int]]:
    """One REST infer exchange through the relay's tenant and upstream connections."""
    relay = Proxy.build(_settings()).rest
    if not memory:
        relay._prepared = _Forgetful()
        relay.pool._heads = _Forgetful()
    tenant = ClientConnection(relay)
    tenant_transport = _Counting()
    tenant.connection_made(tenant_transport)  # type: ignore[arg-type]
    upstream = Upstream(relay.pool)
    upstream.connection_made(_Counting())  # type: ignore[arg-type]
    relay.pool.put(upstream)
    body = b'{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}'
    request = (
        b"POST /v2/models/add_one/infer HTTP/1.1\r\nHost: 127.0.0.1:9000\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    answer = b'{"model_name":"add_one","model_version":"1","outputs":[{"name":"OUTPUT0",'
    answer += b'"datatype":"FP32","shape":[1,4],"data":[2.0,3.0,4.0,5.0]}]}'
    response = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        % len(answer)
        + answer
    )

    def exchange() -> None:
        tenant.data_received(request)
        upstream.data_received(response)

    def answered() -> int:
        """Whole responses the tenant received: Triton's, not a refusal of the relay's own."""
        assert tenant_transport.written % len(response) == 0
        return tenant_transport.written // len(response)

    return exchange, answered


def grpc_exchanges(
    memory: bool, count: int
) -> tuple[GrpcRelay, H2Connection, TritonChannel, list[tuple[bytes, bytes]]]:
    """A relay with one tenant connection and its channel to Triton, and `count` unary
    ModelInfer exchanges (the tenant's request, Triton's response on the channel)."""
    relay = Proxy.build(_settings()).grpc
    assert isinstance(relay, GrpcRelay), "the default --grpc-mode is the relay"
    connection = H2Connection(relay)
    connection.transport = _Counting()  # type: ignore[assignment]
    connection._preface = True
    channel = TritonChannel(relay)
    channel.transport = _Counting()  # type: ignore[assignment]
    relay.channels.append(channel)
    # Both peers open their windows wide at the start, as grpc-core and h2load do.
    wide = f.settings({f.SETTINGS_INITIAL_WINDOW_SIZE: f.MAX_WINDOW})
    wide += f.window_update(0, f.MAX_WINDOW - f.DEFAULT_WINDOW)
    connection.data_received(wide)
    channel.data_received(wide)
    if not memory:
        connection._decoder = _PlainDecoder()  # type: ignore[assignment]
        connection.replies.encoder = _PlainEncoder()  # type: ignore[assignment]
        channel._decoder = _PlainDecoder()  # type: ignore[assignment]
        channel._encoder = _PlainEncoder()  # type: ignore[assignment]
        connection._plans = _Forgetful()
    client, triton = Encoder(), Encoder()
    headers = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
        (b":authority", b"127.0.0.1:9001"),
        (b"te", b"trailers"),
        (b"content-type", b"application/grpc"),
        (b"user-agent", b"grpc-python/1.81.1 grpc-c/50.0.0 (linux; chttp2)"),
    ]
    infer = service_pb2.ModelInferRequest(model_name=MODEL)
    infer.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    infer.raw_input_contents.append(struct.pack("<4f", 1, 2, 3, 4))
    message = infer.SerializeToString()
    answer = f.grpc_message(b"\n\x07add_one\x12\x011" + b"\x00" * 40)
    exchanges = []
    for number in range(count):
        sid = 2 * number + 1  # the tenant's, and (one tenant) the channel's too
        request = f.frame(f.HEADERS, f.END_HEADERS, sid, client.encode(headers))
        request += f.frame(f.DATA, f.END_STREAM, sid, f.grpc_message(message))
        head = [(b":status", b"200"), (b"content-type", b"application/grpc")]
        response = f.frame(f.HEADERS, f.END_HEADERS, sid, triton.encode(head))
        response += f.frame(f.DATA, 0, sid, answer)
        trailers = triton.encode([(b"grpc-status", b"0")])
        response += f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, sid, trailers)
        exchanges.append((request, response))
    return relay, connection, channel, exchanges


def _best(run: Callable[[], float], repeats: int) -> float:
    return min(run() for _ in range(repeats))


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--exchanges", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    n = int(args.exchanges)
    figures: dict[tuple[str, bool], float] = {}
    for memory in (True, False):
        exchange, answered = rest_exchange(memory)
        for _ in range(500):
            exchange()

        def rest_run(
            exchange: Callable[[], None] = exchange, answered: Callable[[], int] = answered
        ) -> float:
            before = answered()
            started = time.perf_counter()
            for _ in range(n):
                exchange()
            elapsed = (time.perf_counter() - started) / n
            assert answered() - before == n, "every request must have been relayed and answered"
            return elapsed

        figures[("REST", memory)] = _best(rest_run, args.repeats)

        def grpc_run(memory: bool = memory) -> float:
            relay, connection, channel, exchanges = grpc_exchanges(memory, n)
            started = time.perf_counter()
            for request, response in exchanges:
                connection.data_received(request)
                relay.flush()  # as at the end of the event-loop turn
                channel.data_received(response)
            elapsed = (time.perf_counter() - started) / n
            # Every request went to Triton and its answer to the tenant: nothing was answered
            # by the relay itself (a refusal would be cheaper and measure nothing).
            assert not connection.streams and not channel.streams, "every exchange must end"
            answered = relay.metrics._requests.counts.get(("grpc", "ModelInfer", "OK"), 0)
            assert answered == n, f"{answered} of {n} calls were answered OK by Triton"
            return elapsed

        figures[("gRPC", memory)] = _best(grpc_run, args.repeats)
    print(f"proxy hot path: CPU per exchange in process, best of {args.repeats} runs of {n}")
    for protocol in ("REST", "gRPC"):
        now, before = figures[(protocol, True)], figures[(protocol, False)]
        print(
            f"  {protocol}: {now * 1e6:6.2f} us with the memory of heads, {before * 1e6:6.2f} us "
            f"without (baseline): {now / before:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
