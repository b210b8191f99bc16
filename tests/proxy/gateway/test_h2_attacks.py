"""HTTP/2 denial-of-service attacks on the node gateway, as a tenant would run them (an
independent attack suite's cases, run here first).

One real `python -m proxy.gateway` process (module-scoped, as the node pod runs it) stands in front
of the real Triton; the attacker is a proven pod (in the caller table) that bypasses its own proxy
and writes raw HTTP/2 frames from its own address; a neighbour pod calls its own model through the
same gateway. Each test asserts the bound docs/security.md and docs/proxy.md state for the
gateway, per connection or per pod, or the neighbour's service:

- header blocks the relay keeps decoded, and its plans for them (a small block of indexed fields
  decodes to a thousand fields): what a connection may make the gateway hold (`C x 4.2 MiB` per
  pod, `budget.CONNECTION_BYTES` a connection);
- a rapid-reset flood (HEADERS then RST_STREAM, CVE-2023-44487): the connection ends with
  ENHANCE_YOUR_CALM, the neighbour is served;
- a CONTINUATION flood (a header block that never ends): the connection ends past 64 KiB;
- PING and SETTINGS floods whose answers the tenant never reads: the gateway stops reading;
- a connection that never sends the preface: closed after `--head-timeout`.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import hpack
import numpy as np
import psutil
import pytest
from tritonclient.grpc import service_pb2

from proxy.gateway.budget import CONNECTION_BYTES
from sim.triton import TritonServer
from tests.proxy.gateway.conftest import caller, publish
from tests.proxy.gateway.test_inflate_attacks import (
    ATTACKER,
    VICTIM,
    GatewayProcess,
    grpc_call,
    serving,
)

pytestmark = pytest.mark.triton

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEAD_TIMEOUT = 1.0
"""The gateway's `--head-timeout` here (30 s by default): how long a silent connection lives."""
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, CONTINUATION = 0, 1, 3, 4, 6, 7, 9
END_STREAM, END_HEADERS = 0x1, 0x4
CANCEL, ENHANCE_YOUR_CALM = 8, 11
INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"


def frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + sid.to_bytes(4, "big") + payload


def infer_block(authority: str) -> bytes:
    return hpack.Encoder().encode(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/inference.GRPCInferenceService/ModelInfer"),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
    )


@pytest.fixture(scope="module")
def gateway(
    served_triton: TritonServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    """A gateway process serving the neighbour (add_one) and the attacker (identity)."""
    table = tmp_path_factory.mktemp("h2-attacks") / "callers.json"
    publish(table, caller(VICTIM, "add_one", "b/victim"), caller(ATTACKER, "identity", "a/h2"))
    flags = ["--caller-table", str(table), "--table-max-age", "3600"]
    flags += ["--triton-http-url", served_triton.http_url]
    flags += ["--triton-grpc-url", served_triton.grpc_url]
    flags += ["--head-timeout", str(HEAD_TIMEOUT), "--max-connections-per-pod", "64"]
    with serving("proxy.gateway", flags) as running:
        yield running
        assert running.process.poll() is None, "an attack took the gateway down"


@contextlib.contextmanager
def attacker_connection(
    url: str, preface: bool = True, buffers: int = 0
) -> Iterator[socket.socket]:
    """A connection from the attacker's address; with `buffers`, its kernel send and receive
    buffers are that small, so what the gateway takes is what the gateway itself holds."""
    host, port = url.split(":")
    sock = socket.socket()
    if buffers:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffers)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffers)
    sock.bind((ATTACKER, 0))
    sock.connect((host, int(port)))
    try:
        if preface:
            sock.sendall(PREFACE + frame(SETTINGS, 0, 0))
        yield sock
    finally:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
        sock.close()


Frame = tuple[int, int, bytes]
"""A frame read: its type, stream id and payload."""


def frames_until(sock: socket.socket, done: Callable[[Frame], bool], within: float) -> list[Frame]:
    """The frames read until one that is `done`, the connection's end or `within` seconds."""
    buffer = b""
    seen: list[Frame] = []
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not select.select([sock], [], [], 0.05)[0]:
            continue
        try:
            data = sock.recv(1 << 20)
        except OSError:
            return seen
        if not data:
            return seen
        buffer += data
        while len(buffer) >= 9 and len(buffer) >= 9 + int.from_bytes(buffer[:3], "big"):
            size = int.from_bytes(buffer[:3], "big")
            got = (buffer[3], int.from_bytes(buffer[5:9], "big"), buffer[9 : 9 + size])
            buffer = buffer[9 + size :]
            seen.append(got)
            if done(got):
                return seen
    return seen


def goaway_code(seen: list[Frame]) -> int | None:
    return next((int.from_bytes(p[4:8], "big") for k, _, p in seen if k == GOAWAY), None)


# -- header blocks the relay keeps decoded -------------------------------------------------------

ATTACK_CONNECTIONS = 4


def fat_block(variant: int) -> bytes:
    """1,024 bytes of HPACK that decode to 1,024 fields: each byte an indexed static-table field
    (`:method: GET` or `:method: POST`, 42 bytes each against the 64 KiB header-list bound), the
    pattern of the first 7 bytes making each variant a distinct block. The request is malformed
    (the stream is reset); what matters is what decoding it leaves behind."""
    pattern = bytes(0x82 | ((variant >> bit) & 1) for bit in range(7))
    return pattern + b"\x82" * (1024 - len(pattern))


def long_block(variant: int) -> bytes:
    """1,720 bytes that decode to 1,720 fields (`:path: /`, 38 bytes each, or `:path:
    /index.html` in the pattern, just under the 64 KiB header-list bound): too long for the
    decoder's memory before, but each distinct list got a plan kept in the relay's."""
    pattern = bytes(0x84 | ((variant >> bit) & 1) for bit in range(7))
    return pattern + b"\x84" * (1720 - len(pattern))


def test_header_blocks_kept_decoded_hold_no_more_than_a_connections_share(
    gateway: GatewayProcess,
) -> None:
    """Distinct small header blocks that decode to many fields, as many as the relay's memories
    kept per connection before: 128 blocks of 1 KiB for its decoder (each block's 1,024 fields
    kept decoded: 4 connections grew the gateway by 36 MiB against their 17 MiB share), then
    64 of 1.7 KiB for its plans (each distinct list's plan kept: 30 MiB more). Both on the same
    connections, held together: memory one part freed cannot hide the other's. Now each memory
    holds at most `headers.KEPT_BYTES` (32 KiB), counted in `budget.CONNECTION_BYTES`."""
    blocks = [fat_block(i) for i in range(128)] + [long_block(i) for i in range(64)]
    process = psutil.Process(gateway.process.pid)
    before = process.memory_info().rss
    with contextlib.ExitStack() as stack:
        sockets = [
            stack.enter_context(attacker_connection(gateway.grpc_url))
            for _ in range(ATTACK_CONNECTIONS)
        ]
        for sock in sockets:
            sock.sendall(
                b"".join(
                    frame(HEADERS, END_HEADERS | END_STREAM, 1 + 2 * i, block)
                    for i, block in enumerate(blocks)
                )
            )
        last = 2 * len(blocks) - 1
        for sock in sockets:  # every block decoded: the last stream's reset came back
            seen = frames_until(sock, lambda f: f[0] == RST_STREAM and f[1] == last, 20)
            assert seen and seen[-1][:2] == (RST_STREAM, last), f"no reset of {last}: {seen[-3:]}"
        grown = process.memory_info().rss - before
    assert grown <= ATTACK_CONNECTIONS * CONNECTION_BYTES, (
        f"{ATTACK_CONNECTIONS} connections of {len(blocks)} distinct header blocks each grew the "
        f"gateway by {grown / 1024**2:.0f} MiB, over their "
        f"{ATTACK_CONNECTIONS * CONNECTION_BYTES / 1024**2:.0f} MiB share"
    )


# -- floods of frames --------------------------------------------------------------------------


def add_one_call() -> bytes:
    """A ModelInferRequest for the neighbour's add_one, serialized."""
    request = service_pb2.ModelInferRequest(model_name="add_one")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 3])
    request.raw_input_contents.append(np.array([[1, 2, 3]], dtype=np.float32).tobytes())
    return bytes(request.SerializeToString())


@dataclass
class GrpcNeighbour:
    """The victim calling its own model over gRPC through the gateway, one call after another,
    until `stop`: the gateway relays every tenant's calls over one shared connection to Triton,
    so anything that breaks that connection breaks these calls."""

    url: str
    stop: threading.Event = field(default_factory=threading.Event)
    answered: int = 0
    errors: list[dict[str, str]] = field(default_factory=list)

    def run(self) -> None:
        message = add_one_call()
        while not self.stop.is_set():
            answer = grpc_call(self.url, VICTIM, INFER_PATH, message, "identity")
            if answer.get("grpc-status") == "0":
                self.answered += 1
            else:
                self.errors.append(answer)


@contextlib.contextmanager
def grpc_neighbour_running(url: str) -> Iterator[GrpcNeighbour]:
    neighbour = GrpcNeighbour(url)
    thread = threading.Thread(target=neighbour.run, name="grpc neighbour", daemon=True)
    thread.start()
    try:
        yield neighbour
    finally:
        neighbour.stop.set()
        thread.join(60)


def rapid_resets(authority: str, count: int) -> bytes:
    """`count` ModelInfer calls each reset right after its HEADERS (its message never sent,
    so each opens a stream at Triton that the reset then cancels)."""
    block = infer_block(authority)
    cancel = CANCEL.to_bytes(4, "big")
    return b"".join(
        frame(HEADERS, END_HEADERS, sid, block) + frame(RST_STREAM, 0, sid, cancel)
        for sid in range(1, 2 * count, 2)
    )


def test_a_rapid_reset_flood_ends_the_connection(gateway: GatewayProcess) -> None:
    """HEADERS then RST_STREAM, again and again (CVE-2023-44487): past 256 more resets than
    completed calls the connection must end with ENHANCE_YOUR_CALM."""
    with attacker_connection(gateway.grpc_url) as sock:
        with contextlib.suppress(OSError):  # the gateway may close while we write
            sock.sendall(rapid_resets(gateway.grpc_url, 2000))
        seen = frames_until(sock, lambda f: f[0] == GOAWAY, 20)
    assert goaway_code(seen) == ENHANCE_YOUR_CALM, f"no GOAWAY ENHANCE_YOUR_CALM: {seen[-3:]}"


RESET_SECONDS = 1.0
"""How long the attacker keeps reconnecting and resetting."""


def test_rapid_resets_on_new_connections_do_not_break_the_neighbours_calls(
    gateway: GatewayProcess,
) -> None:
    """The per-connection bound, 256 resets, starts again with each new connection: a pod that
    reconnects as soon as it is cut off sends Triton's shared connection a reset stream after
    another for as long as it likes. The neighbour's calls share that connection."""
    flood = rapid_resets(gateway.grpc_url, 300)
    connections = 0
    with grpc_neighbour_running(gateway.grpc_url) as neighbour:
        deadline = time.monotonic() + 20
        while neighbour.answered < 5:
            assert time.monotonic() < deadline and not neighbour.errors, neighbour.errors
            time.sleep(0.01)
        calm = neighbour.answered
        until = time.monotonic() + RESET_SECONDS
        while time.monotonic() < until:
            with attacker_connection(gateway.grpc_url) as sock:
                with contextlib.suppress(OSError):
                    sock.sendall(flood)
                frames_until(sock, lambda f: f[0] == GOAWAY, 5)
            connections += 1
        during = neighbour.answered - calm
    assert not neighbour.errors, (
        f"{len(neighbour.errors)} of the neighbour's calls failed while the attacker reset "
        f"streams on {connections} connections: {neighbour.errors[:3]}"
    )
    assert during > 0, "the neighbour got no answer during the resets"


def test_a_continuation_flood_ends_the_connection_past_a_header_blocks_bound(
    gateway: GatewayProcess,
) -> None:
    """A header block that never ends: HEADERS without END_HEADERS, then CONTINUATION frames
    of 16 KiB, for ever. Past 64 KiB the connection must end (a relay that buffers the block
    until END_HEADERS would hold whatever the tenant sends)."""
    process = psutil.Process(gateway.process.pid)
    before = process.memory_info().rss
    piece = b"\x00\x01a\x7f" + b"\x7f" * (16 * 1024 - 4)  # a literal field that never ends
    sent = 0
    with attacker_connection(gateway.grpc_url) as sock:
        sock.settimeout(5)
        with contextlib.suppress(OSError):
            sock.sendall(frame(HEADERS, 0, 1, piece))
            while sent < 64 * 1024**2:
                sock.sendall(frame(CONTINUATION, 0, 1, piece))
                sent += len(piece)
        seen = frames_until(sock, lambda f: f[0] == GOAWAY, 10)
    grown = process.memory_info().rss - before
    assert goaway_code(seen) is not None, f"the connection went on after {sent >> 20} MiB"
    assert sent < 8 * 1024**2, f"the gateway read {sent >> 20} MiB of one header block"
    assert grown < 16 * 1024**2, f"the gateway grew by {grown >> 20} MiB"


@pytest.mark.parametrize("kind", ["ping", "settings"])
def test_frames_whose_answers_are_never_read_cannot_grow_the_gateway(
    gateway: GatewayProcess, kind: str
) -> None:
    """PINGs (each answered with a PING ACK) or SETTINGS (each acknowledged) written for ever
    by a tenant that reads nothing: the gateway must stop reading once its answers back up,
    instead of queueing answers in memory."""
    process = psutil.Process(gateway.process.pid)
    before = process.memory_info().rss
    one = (
        frame(PING, 0, 0, bytes(8))
        if kind == "ping"
        else frame(SETTINGS, 0, 0, b"\x00\x04\x00\x01\x00\x00")
    )
    flood = one * 16384
    sent = 0
    with attacker_connection(gateway.grpc_url) as sock:
        sock.settimeout(0.5)
        with contextlib.suppress(TimeoutError):
            while sent < 256 * 1024**2:
                sock.sendall(flood)
                sent += len(flood)
        grown = process.memory_info().rss - before
    # What was taken is what the kernel's buffers hold both ways plus a read or two.
    assert sent < 64 * 1024**2 and grown < 32 * 1024**2, (
        f"the gateway read {sent >> 20} MiB of {kind} frames whose answers were not read, and "
        f"grew by {grown >> 20} MiB"
    )


def test_a_connection_that_never_sends_the_preface_is_closed_after_the_head_timeout(
    gateway: GatewayProcess,
) -> None:
    with attacker_connection(gateway.grpc_url, preface=False) as sock:
        started = time.monotonic()
        sock.sendall(PREFACE[:10])  # a start, then silence
        seen = frames_until(sock, lambda f: False, 3 * HEAD_TIMEOUT + 5)
        took = time.monotonic() - started
    assert HEAD_TIMEOUT * 0.9 <= took <= 1.25 * HEAD_TIMEOUT + 2, f"closed after {took:.1f} s"
    assert goaway_code(seen) in (None, 1), seen
