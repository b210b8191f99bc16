"""Black-box tests of the gRPC endpoint's connection handling, in both gRPC modes.

What the proxy must hold however it reaches Triton: every tenant connection of a proxy process
shares ONE connection to Triton ("one pooled upstream session and channel per process"); a
tenant that breaks HTTP/2 loses its own connection and disturbs nobody else; the tenant's flow
control, SETTINGS and PING are honoured; a reset stream gives its concurrency slot back; and many
calls on many connections at once each get their own answer. Misbehaving tenants are spoken with
a bare HTTP/2 client (`RawTenant`) built on `proxy.http2.frames`, since no grpc client can be
made to break the protocol; well-behaved ones use tritonclient.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import hpack
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2

from proxy.grpc import framing
from proxy.http2 import frames as f
from sim.triton import TritonServer
from tests.proxy.conftest import RunningProxy, data_frames, proxy_settings, running_proxy

pytestmark = pytest.mark.triton
SERVICE = "/inference.GRPCInferenceService/"
SETTINGS_INITIAL_WINDOW_SIZE = 4
DEFAULT_WINDOW = 65535
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]
"""grpc shares one TCP connection between channels to the same address unless told not to: each
client given this is a tenant connection of its own."""


# -- a bare HTTP/2 tenant -------------------------------------------------------------------------


@dataclass
class Seen:
    """What the proxy sent on one stream."""

    blocks: list[list[tuple[bytes, bytes]]] = field(default_factory=list)
    data: bytearray = field(default_factory=bytearray)
    ended: bool = False
    reset: int | None = None

    def fields(self) -> dict[bytes, bytes]:
        """Every header and trailer field of the stream (later blocks win)."""
        return {name: value for block in self.blocks for name, value in block}

    def messages(self) -> list[bytes]:
        """The gRPC messages in the stream's DATA (uncompressed: the tenant asked for none)."""
        out = []
        pos = 0
        while pos + 5 <= len(self.data):
            assert self.data[pos] == 0, "the proxy compressed a message nobody asked it to"
            length = int.from_bytes(self.data[pos + 1 : pos + 5], "big")
            out.append(bytes(self.data[pos + 5 : pos + 5 + length]))
            pos += 5 + length
        assert pos == len(self.data), "the stream's DATA ends inside a gRPC message"
        return out


class RawTenant:
    """A tenant speaking HTTP/2 byte by byte: it can misbehave, and it sees every frame.

    Reading is explicit (`pump`, `quiet`, `wait_closed`); while reading it answers the proxy's
    SETTINGS and PING as any client must, and keeps one HPACK decoder in step over every header
    block the proxy sends. It never sends WINDOW_UPDATE on its own.
    """

    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self._buf = bytearray()
        self._decoder = hpack.Decoder()
        self._block: tuple[int, bytearray] | None = None
        self.peer_settings: dict[int, int] = {}
        self.peer_settings_seen = False
        self.settings_acks = 0
        self.ping_acks: list[bytes] = []
        self.window_updates: dict[int, int] = {}
        self.goaway: bytes | None = None
        self.streams: dict[int, Seen] = {}
        self.closed = False
        self._next_sid = 1
        self._unsent = b""

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def start(self, settings: dict[int, int] | None = None) -> None:
        """The client preface and our SETTINGS; then wait for the proxy's SETTINGS."""
        self.send(f.PREFACE + settings_frame(settings or {}))
        self.pump(lambda: self.peer_settings_seen, "the proxy's SETTINGS arriving")

    def sync(self) -> None:
        """PING and wait for its ACK: every frame the proxy sent before it has been read."""
        self.send(f.frame(f.PING, 0, 0, b"syncsync"))
        self.pump(lambda: b"syncsync" in self.ping_acks, "the proxy's answer to a PING")

    def open_stream(self, method: str, end_stream: bool = False, send: bool = True) -> int:
        """A new stream calling `method` with valid request headers (kept for `take_unsent`
        unless `send`)."""
        sid = self._next_sid
        self._next_sid += 2
        head = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", (SERVICE + method).encode()),
            (b":authority", b"tenant"),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ]
        frames = f.headers_frames(sid, f.header_block(head), end_stream)
        if send:
            self.send(frames)
        else:
            self._unsent += frames
        self.streams[sid] = Seen()
        return sid

    def take_unsent(self) -> bytes:
        unsent, self._unsent = self._unsent, b""
        return unsent

    def call(self, method: str, message: bytes, within: float = 30) -> Seen:
        """A unary call on a new stream, read until the proxy ends the stream."""
        sid = self.open_stream(method)
        self.send(data_frames(sid, framing.grpc_message(message), end_stream=True))
        seen = self.streams[sid]
        self.pump(
            lambda: seen.ended or seen.reset is not None, f"the answer on stream {sid}", within
        )
        return seen

    def read_frame(self, deadline: float) -> tuple[int, int, int, bytes] | None:
        """The next frame (kind, flags, stream, payload), handled; None when the proxy closed
        the connection; TimeoutError when nothing whole arrives by `deadline`."""
        while len(self._buf) < 9 or len(self._buf) < 9 + int.from_bytes(self._buf[:3], "big"):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(1 << 20)
            except TimeoutError:
                raise
            except OSError:
                chunk = b""  # a reset is a close too
            if not chunk:
                self.closed = True
                return None
            self._buf += chunk
        length = int.from_bytes(self._buf[:3], "big")
        kind, flags = self._buf[3], self._buf[4]
        sid = int.from_bytes(self._buf[5:9], "big") & 0x7FFFFFFF
        payload = bytes(self._buf[9 : 9 + length])
        del self._buf[: 9 + length]
        self._handle(kind, flags, sid, payload)
        return kind, flags, sid, payload

    def _handle(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if kind == f.SETTINGS:
            if flags & f.ACK:
                self.settings_acks += 1
            else:
                self.peer_settings.update(f.settings_values(payload))
                self.peer_settings_seen = True
                self._answer(f.frame(f.SETTINGS, f.ACK, 0))
        elif kind == f.PING:
            if flags & f.ACK:
                self.ping_acks.append(payload)
            else:
                self._answer(f.frame(f.PING, f.ACK, 0, payload))
        elif kind == f.GOAWAY:
            self.goaway = payload
        elif kind == f.WINDOW_UPDATE:
            increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
            self.window_updates[sid] = self.window_updates.get(sid, 0) + increment
        elif kind == f.RST_STREAM:
            self.streams.setdefault(sid, Seen()).reset = int.from_bytes(payload, "big")
        elif kind == f.DATA:
            seen = self.streams.setdefault(sid, Seen())
            body = payload[1 : len(payload) - payload[0]] if flags & f.PADDED else payload
            seen.data += body
            seen.ended = seen.ended or bool(flags & f.END_STREAM)
        elif kind == f.HEADERS:
            block = payload[1 : len(payload) - payload[0]] if flags & f.PADDED else payload
            block = block[5:] if flags & f.PRIORITY_FLAG else block
            if flags & f.END_STREAM:
                self.streams.setdefault(sid, Seen()).ended = True
            self._block = (sid, bytearray(block))
            if flags & f.END_HEADERS:
                self._decode()
        elif kind == f.CONTINUATION:
            assert self._block is not None and self._block[0] == sid, "a stray CONTINUATION"
            self._block[1].extend(payload)
            if flags & f.END_HEADERS:
                self._decode()

    def _decode(self) -> None:
        assert self._block is not None
        sid, block = self._block
        self._block = None
        fields = [(bytes(n), bytes(v)) for n, v in self._decoder.decode(bytes(block), raw=True)]
        self.streams.setdefault(sid, Seen()).blocks.append(fields)

    def _answer(self, frame: bytes) -> None:
        with contextlib.suppress(OSError):  # the proxy is closing: the reader sees it next
            self.send(frame)

    def pump(self, condition: Callable[[], bool], what: str, within: float = 10) -> None:
        """Read frames until `condition` holds; fail saying `what` did not happen."""
        deadline = time.monotonic() + within
        while not condition():
            try:
                frame = self.read_frame(deadline)
            except TimeoutError:
                raise AssertionError(f"{what} did not happen within {within:g} s") from None
            if frame is None:
                raise AssertionError(f"the proxy closed the connection before {what}")

    def quiet(self, seconds: float) -> None:
        """Read (and handle) whatever arrives for `seconds`: a check that nothing more does."""
        deadline = time.monotonic() + seconds
        try:
            while self.read_frame(deadline) is not None:
                pass
        except TimeoutError:
            pass

    def wait_closed(self, within: float = 10) -> None:
        """Read until the proxy closes the connection (any bytes, framed or not, before it)."""
        deadline = time.monotonic() + within
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"the proxy kept the connection open for {within:g} s")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                return
            self._buf += chunk


def settings_frame(values: dict[int, int]) -> bytes:
    payload = b"".join(k.to_bytes(2, "big") + v.to_bytes(4, "big") for k, v in values.items())
    return f.frame(f.SETTINGS, 0, 0, payload)


@pytest.fixture
def raw_tenants() -> Iterator[list[RawTenant]]:
    """Raw tenants made in the test; each socket is closed after it."""
    made: list[RawTenant] = []
    yield made
    for tenant in made:
        tenant.close()


def raw(made: list[RawTenant], address: str) -> RawTenant:
    tenant = RawTenant(address)
    made.append(tenant)
    return tenant


# -- requests and connection counts ---------------------------------------------------------------


def sleepy_request(delay_ms: int) -> bytes:
    request = service_pb2.ModelInferRequest(model_name="sleepy")
    request.inputs.add(name="DELAY_MS", datatype="INT32", shape=[1])
    request.raw_input_contents.append(np.array([delay_ms], np.int32).tobytes())
    data: bytes = request.SerializeToString()
    return data


def sleepy_inputs(delay_ms: int) -> list[grpcclient.InferInput]:
    tensor = np.array([delay_ms], np.int32)
    infer_input = grpcclient.InferInput("DELAY_MS", [1], "INT32")
    infer_input.set_data_from_numpy(tensor)
    return [infer_input]


def add_one_inputs(values: list[float]) -> list[grpcclient.InferInput]:
    tensor = np.array([values], np.float32)
    infer_input = grpcclient.InferInput("INPUT0", list(tensor.shape), "FP32")
    infer_input.set_data_from_numpy(tensor)
    return [infer_input]


def text_inputs(text: str, repeat: int, delay_ms: int) -> list[grpcclient.InferInput]:
    inputs = [
        grpcclient.InferInput("text_input", [1], "BYTES"),
        grpcclient.InferInput("repeat", [1], "INT32"),
        grpcclient.InferInput("delay_ms", [1], "INT32"),
    ]
    inputs[0].set_data_from_numpy(np.array([text.encode()], dtype=object))
    inputs[1].set_data_from_numpy(np.array([repeat], np.int32))
    inputs[2].set_data_from_numpy(np.array([delay_ms], np.int32))
    return inputs


def established_to(port: int) -> set[tuple[str, int]]:
    """The local ends of this process's ESTABLISHED TCP connections to `port` (the proxy runs
    in this process)."""
    return {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_ESTABLISHED and c.raddr and c.raddr.port == port
    }


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def poll(predicate: Callable[[], bool], what: str, within: float = 20) -> None:
    """Wait (from a synchronous test) until `predicate` holds."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {within:g} s")
        time.sleep(0.02)


# -- 1: one connection to Triton ------------------------------------------------------------------


def test_every_tenant_connection_shares_one_connection_to_triton(
    served_triton: TritonServer, grpc_mode: str
) -> None:
    """Eight tenant connections with a call in flight each at the same moment: the proxy holds
    one connection to Triton's gRPC port. A blocker call holds sleepy's single instance, so the
    seven others stay queued in Triton, in flight, until it ends."""
    settings = proxy_settings(served_triton, model_id="sleepy", grpc_mode=grpc_mode)
    blocker_ms = 1200
    triton_port = port_of(served_triton.grpc_url)
    before = established_to(triton_port)  # any other test's, not the proxy's
    with running_proxy(settings) as running:
        clients = [
            grpcclient.InferenceServerClient(running.grpc_url, channel_args=OWN_CONNECTION)
            for _ in range(8)
        ]
        try:
            # Each client connects first, so the calls below start together on open connections.
            assert all(client.is_server_live() for client in clients)
            with ThreadPoolExecutor(8) as pool:
                first = pool.submit(clients[0].infer, "sleepy", sleepy_inputs(blocker_ms))
                poll(lambda: running.proxy.limiter.in_flight == 1, "the blocker call starting")
                others = [
                    pool.submit(clients[i].infer, "sleepy", sleepy_inputs(i)) for i in range(1, 8)
                ]
                poll(lambda: running.proxy.limiter.in_flight == 8, "eight calls in flight")
                tenants = len(established_to(running.proxy.grpc.port))
                upstream = len(established_to(triton_port) - before)
                results = [first.result(30)] + [o.result(30) for o in others]
        finally:
            for client in clients:
                client.close()
    outputs = [r.as_numpy("OUTPUT0").tolist() for r in results]
    assert outputs == [[blocker_ms]] + [[i] for i in range(1, 8)]
    assert tenants == 8, "the test did not make eight tenant connections"
    assert upstream == 1, f"{upstream} connections to Triton for 8 tenant connections, not 1"


# -- 2: a misbehaving tenant ----------------------------------------------------------------------


def _garbage_preface(tenant: RawTenant) -> None:
    tenant.send(b"GARBAGE * HTTP/9.9\r\n\r\nthis is not the HTTP/2 preface\r\n\r\n")


def _bad_hpack(tenant: RawTenant) -> None:
    tenant.start()
    # An indexed field naming table entry 0, which does not exist: a COMPRESSION_ERROR.
    tenant.send(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, b"\x80\xff\xff\xff\x7f"))


def _data_on_stream_zero(tenant: RawTenant) -> None:
    tenant.start()
    tenant.send(f.frame(f.DATA, 0, 0, framing.grpc_message(b"stream zero carries no DATA")))


def _window_overrun(tenant: RawTenant) -> None:
    """More DATA on one new stream than the stream window the proxy advertised (and, when the
    connection's window is the smaller, than that too)."""
    tenant.start()
    tenant.sync()  # every WINDOW_UPDATE the proxy sent at the start is read
    stream_window = tenant.peer_settings.get(SETTINGS_INITIAL_WINDOW_SIZE, DEFAULT_WINDOW)
    # The start of one large, valid request for the model, longer than the window: nothing but
    # the overrun is wrong.
    request = service_pb2.ModelInferRequest(model_name="text_stream", id="overrun")
    request.raw_input_contents.append(b"\x00" * (2 * stream_window))
    message = framing.grpc_message(request.SerializeToString())[
        : stream_window + 4 * f.DEFAULT_MAX_FRAME
    ]
    sid = tenant.open_stream("ModelStreamInfer", send=False)
    head = tenant.take_unsent()
    # Headers and DATA at once: no WINDOW_UPDATE for the stream can be read in between. The
    # proxy may close the connection while we still send.
    with contextlib.suppress(OSError):
        tenant.send(head + data_frames(sid, message, end_stream=False))


def _stray_continuation(tenant: RawTenant) -> None:
    tenant.start()
    block = f.header_block([(b":method", b"POST"), (b":path", (SERVICE + "ModelInfer").encode())])
    tenant.send(f.frame(f.CONTINUATION, f.END_HEADERS, 1, block))


MISBEHAVIOURS: dict[str, Callable[[RawTenant], None]] = {
    "garbage-preface": _garbage_preface,
    "invalid-hpack": _bad_hpack,
    "data-on-stream-0": _data_on_stream_zero,
    "window-overrun": _window_overrun,
    "continuation-without-headers": _stray_continuation,
}


def _ignored(tenant: RawTenant) -> None:
    tenant.sync()


def _stream_reset(tenant: RawTenant) -> None:
    tenant.pump(
        lambda: any(seen.reset for seen in tenant.streams.values()),
        "an error reset of the overrunning stream",
    )
    tenant.sync()


GRPC_CORE_ANSWERS: dict[str, Callable[[RawTenant], None]] = {
    "data-on-stream-0": _ignored,
    "window-overrun": _stream_reset,
}
"""In grpcio mode the tenant's HTTP/2 peer is grpc core itself, which the proxy cannot change:
it ignores DATA on stream 0 and answers a flow-control overrun by resetting the stream that
overran (with PROTOCOL_ERROR), keeping the connection. There the test asserts exactly that
answer (the connection then still answers a PING) instead of the close the relay must give."""


StreamAnswer = tuple[grpcclient.InferResult | None, Exception | None]


def _collect(into: queue.Queue[StreamAnswer], result: Any, error: Any) -> None:
    into.put((result, error))


def _texts(answers: queue.Queue[StreamAnswer], count: int) -> list[str]:
    texts: list[str] = []
    for _ in range(count):
        try:
            result, error = answers.get(timeout=30)
        except queue.Empty:
            raise AssertionError(f"the stream gave no answer within 30 s after {texts}") from None
        assert error is None, f"the stream failed: {error}"
        assert result is not None
        texts.append(result.as_numpy("text_output").reshape(-1)[0].decode())
    return texts


@pytest.mark.parametrize("misbehaviour", sorted(MISBEHAVIOURS))
def test_a_tenant_breaking_http2_loses_only_its_own_connection(
    served_triton: TritonServer, grpc_mode: str, misbehaviour: str, raw_tenants: list[RawTenant]
) -> None:
    """Tenant A is mid-way through a ModelStreamInfer stream (one response in, one to come, the
    stream open for more) while tenant B breaks the protocol on its own connection: B's
    connection is closed, A's stream goes on to the end, and a new call works.

    A holds the proxy's only concurrency slot, so a stream B opens waits in the queue and the
    proxy cannot pass its DATA on (and credit it back at once, which would be a legitimate way
    never to see an overrun); B's queued stream must leave no trace for the call after A's."""
    settings = proxy_settings(
        served_triton, model_id="text_stream", grpc_mode=grpc_mode, container_concurrency=1
    )
    with running_proxy(settings) as running:
        answers: queue.Queue[StreamAnswer] = queue.Queue()
        a = grpcclient.InferenceServerClient(running.grpc_url, channel_args=OWN_CONNECTION)
        try:
            a.start_stream(partial(_collect, answers))
            a.async_stream_infer("text_stream", text_inputs("first", 2, 300))
            assert _texts(answers, 1) == ["first 0"]
            b = raw(raw_tenants, running.grpc_url)
            MISBEHAVIOURS[misbehaviour](b)
            if grpc_mode == "grpcio" and misbehaviour in GRPC_CORE_ANSWERS:
                GRPC_CORE_ANSWERS[misbehaviour](b)
            else:
                b.wait_closed()
            b.close()  # or the proxy's stop would wait for B's unfinished streams
            poll(lambda: running.proxy.limiter.queued == 0, "B's stream leaving the queue")
            assert _texts(answers, 1) == ["first 1"]
            a.async_stream_infer("text_stream", text_inputs("second", 1, 0))
            assert _texts(answers, 1) == ["second 0"]
            a.stop_stream()
        finally:
            a.close()
        after = grpcclient.InferenceServerClient(running.grpc_url, channel_args=OWN_CONNECTION)
        try:
            after.start_stream(partial(_collect, answers))
            after.async_stream_infer("text_stream", text_inputs("after", 1, 0))
            assert _texts(answers, 1) == ["after 0"]
            after.stop_stream()
        finally:
            after.close()


# -- 3: the tenant's flow control -----------------------------------------------------------------


def test_a_tenants_small_window_holds_the_response_back_until_it_grants_more(
    served_triton: TritonServer, grpc_mode: str, raw_tenants: list[RawTenant]
) -> None:
    window = 1000
    values = np.arange(5000, dtype=np.float32)  # a 20 000-byte tensor: over one 16 KiB frame
    request = service_pb2.ModelInferRequest(model_name="identity")
    request.inputs.add(name="INPUT_FP32", datatype="FP32", shape=[len(values)])
    request.raw_input_contents.append(values.tobytes())
    settings = proxy_settings(served_triton, model_id="identity", grpc_mode=grpc_mode)
    with running_proxy(settings) as running:
        tenant = raw(raw_tenants, running.grpc_url)
        tenant.start({SETTINGS_INITIAL_WINDOW_SIZE: window})
        sid = tenant.open_stream("ModelInfer")
        tenant.send(data_frames(sid, framing.grpc_message(request.SerializeToString()), True))
        seen = tenant.streams[sid]
        deadline = time.monotonic() + 15
        while len(seen.data) < window and not seen.ended:
            try:
                assert tenant.read_frame(deadline) is not None, "the proxy closed the connection"
            except TimeoutError:
                break  # less than the window: still checked below
        tenant.quiet(0.5)
        held = len(seen.data)
        assert held <= window, f"{held} bytes of DATA sent into a stream window of {window}"
        assert not seen.ended
        tenant.send(f.window_update(sid, 1 << 20) + f.window_update(0, 1 << 20))
        tenant.pump(lambda: seen.ended, "the rest of the response after the WINDOW_UPDATE")
        tenant.close()
    [message] = seen.messages()
    response = service_pb2.ModelInferResponse.FromString(message)
    assert response.raw_output_contents[0] == values.tobytes()
    assert seen.fields().get(b"grpc-status") == b"0"


# -- 4: SETTINGS and PING -------------------------------------------------------------------------


def test_a_tenants_settings_and_ping_are_acknowledged(
    proxy: RunningProxy, raw_tenants: list[RawTenant]
) -> None:
    tenant = raw(raw_tenants, proxy.grpc_url)
    tenant.start({SETTINGS_INITIAL_WINDOW_SIZE: 70000})
    tenant.pump(lambda: tenant.settings_acks == 1, "the ACK of the first SETTINGS")
    tenant.send(settings_frame({f.SETTINGS_MAX_FRAME_SIZE: 32768}))
    tenant.send(f.frame(f.PING, 0, 0, b"tenant42"))
    tenant.pump(
        lambda: tenant.settings_acks == 2 and b"tenant42" in tenant.ping_acks,
        "the ACKs of a second SETTINGS and of a PING",
    )
    answer = tenant.call(
        "ModelReady", service_pb2.ModelReadyRequest(name="add_one").SerializeToString()
    )
    assert answer.fields().get(b"grpc-status") == b"0"
    assert service_pb2.ModelReadyResponse.FromString(answer.messages()[0]).ready


# -- 5: a reset stream ----------------------------------------------------------------------------


def test_a_stream_reset_mid_call_gives_its_slot_back(
    served_triton: TritonServer, grpc_mode: str, raw_tenants: list[RawTenant]
) -> None:
    """With one concurrency slot and no queue, a call is admitted only if the reset one's slot
    was given back; the reset tenant's connection goes on serving too."""
    settings = proxy_settings(
        served_triton,
        model_id="sleepy",
        grpc_mode=grpc_mode,
        container_concurrency=1,
        queue_size=0,
    )
    with running_proxy(settings) as running:
        tenant = raw(raw_tenants, running.grpc_url)
        tenant.start()
        sid = tenant.open_stream("ModelInfer")
        tenant.send(data_frames(sid, framing.grpc_message(sleepy_request(1000)), True))
        poll(lambda: running.proxy.limiter.in_flight == 1, "the sleepy call starting")
        tenant.send(f.rst_stream(sid, f.CANCEL))
        poll(lambda: running.proxy.limiter.in_flight == 0, "the reset call's slot being freed")
        client = grpcclient.InferenceServerClient(running.grpc_url, channel_args=OWN_CONNECTION)
        try:
            result = client.infer("sleepy", sleepy_inputs(3), client_timeout=30)
        finally:
            client.close()
        assert result.as_numpy("OUTPUT0").tolist() == [3]
        again = tenant.call("ModelInfer", sleepy_request(4))
        tenant.close()
    assert again.fields().get(b"grpc-status") == b"0"
    response = service_pb2.ModelInferResponse.FromString(again.messages()[0])
    assert np.frombuffer(response.raw_output_contents[0], np.int32).tolist() == [4]
    assert not tenant.streams[sid].data, "the reset call was answered after all"


# -- 6: many calls on many connections ------------------------------------------------------------


async def test_many_parallel_calls_on_several_connections_each_get_their_own_answer(
    proxy: RunningProxy,
) -> None:
    clients = [
        aioclient.InferenceServerClient(proxy.grpc_url, channel_args=OWN_CONNECTION)
        for _ in range(5)
    ]

    async def one(tenant: int, call: int) -> tuple[list[float], list[list[float]]]:
        values = [tenant * 1000.0 + call, -call - 0.5]
        result = await clients[tenant].infer("add_one", add_one_inputs(values))
        output: list[list[float]] = result.as_numpy("OUTPUT0").tolist()
        return values, output

    try:
        results = await asyncio.gather(*(one(t, c) for t in range(5) for c in range(64)))
        tenants = len(established_to(proxy.proxy.grpc.port))
    finally:
        for client in clients:
            await client.close()
    for values, output in results:
        assert output == [[v + 1 for v in values]]
    assert len(results) == 320
    assert tenants == 5, "the test did not make five tenant connections"
