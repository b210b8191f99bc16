"""Many pods together holding partial messages in the node gateway ("the bounds add up over
pods"), through a real gateway process in front of the real Triton.

Each pod's share of the gateway is bounded on its own, but the bounds add up: on the code before,
eight pod addresses each holding 64 connections of 128 ModelInfer streams with a message 384
bytes short of whole grew the gateway by about 1 GiB, and eleven would pass its deploy limit.
Here, scaled down: ATTACKERS pod addresses each open CONNECTIONS connections of STREAMS streams,
each sending all of a 16 KiB message but its last 384 bytes, against a gateway with a byte budget
of BUDGET (`--max-buffered-bytes`, passed by its variable, so the same test runs against the
code before, which ignores it: there the gateway grows by the whole attack, ~45 MiB). The
neighbour (its own pod, holding nothing) calls its model meanwhile.

Asserted: the gateway's RSS grows by less than its node-wide bound (`budget.held_bound`, twice
the budget, plus SLACK of allocator noise), the neighbour is answered throughout, and every
attacker stream that ends is answered RESOURCE_EXHAUSTED with a message naming the budget and
what to do, never closed silently.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import hpack
import pytest
from tritonclient.grpc import service_pb2

from sim.triton import TritonServer
from tests.proxy.gateway.conftest import caller, publish
from tests.proxy.gateway.test_h2_attacks import frame, infer_block
from tests.proxy.gateway.test_inflate_attacks import (
    VICTIM,
    PeakRss,
    gateway_process,
    neighbour_running,
)
from tests.proxy.gateway.test_loop_share import latencies

pytestmark = pytest.mark.triton

ATTACKERS = [f"127.1.0.{n}" for n in range(51, 55)]
CONNECTIONS = 6
STREAMS = 120
MESSAGE = 16 * 1024
SHORT = 384
"""Each attacker stream's message is MESSAGE bytes, sent all but its last SHORT."""
ATTACK = len(ATTACKERS) * CONNECTIONS * STREAMS * (MESSAGE - SHORT)
"""What the attack makes the gateway hold without a budget: ~45 MiB."""
BUDGET = 6 * 1024**2
SLACK = 8 * 1024**2
"""Allocator noise and the gateway's own buffers beside what it holds for the pods."""
GROWTH = 2 * BUDGET + SLACK
"""The most the gateway's RSS may grow (docs/proxy.md, "Worst-case memory": held bytes stay under
twice the budget, and under the budget once the grace has passed)."""
NEIGHBOUR_ANSWERS = 30


def held_streams(authority: str) -> bytes:
    """The preface and STREAMS ModelInfer calls to `identity`, each a HEADERS and a DATA frame
    carrying all of a MESSAGE-byte message but its last SHORT bytes."""
    block = infer_block(authority)
    body = MESSAGE - 5
    # field 1 (model_name) "identity", then field 7 (raw_input_contents) filling the message.
    name = b"\x0a\x08identity"
    fill = body - len(name) - 1 - 2
    message = name + b"\x3a" + bytes([fill & 0x7F | 0x80, fill >> 7]) + bytes(fill)
    assert len(message) == body
    sent = (b"\x00" + body.to_bytes(4, "big") + message)[: MESSAGE - SHORT]
    frames = [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", frame(4, 0, 0, b"")]
    for sid in range(1, 2 * STREAMS, 2):
        frames.append(frame(1, 4, sid, block))
        frames.append(frame(0, 0, sid, sent))
    return b"".join(frames)


ANSWER = 192 * 1024
"""Bytes of each answer an answer-hoarding stream draws from `identity` (and never reads)."""
HOARDED = 64
"""Streams per answer-hoarding pod: its in-flight limit at the gateway's default."""


def hoarded_answers(authority: str) -> bytes:
    """The preface, SETTINGS with a stream window of 0 (the pod reads no answer byte), and
    HOARDED whole ModelInfer calls to `identity` each drawing an ANSWER-byte answer."""
    block = infer_block(authority)
    request = service_pb2.ModelInferRequest(model_name="identity")
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = "INPUT_FP32", "FP32"
    tensor.shape.append(ANSWER // 4)
    request.raw_input_contents.append(bytes(ANSWER))
    body = request.SerializeToString()
    message = b"\x00" + len(body).to_bytes(4, "big") + body
    frames = [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", frame(4, 0, 0, b"\x00\x04" + bytes(4))]
    for sid in range(1, 2 * HOARDED, 2):
        frames.append(frame(1, 4, sid, block))
        for start in range(0, len(message), 16384):
            last = start + 16384 >= len(message)
            frames.append(frame(0, 1 if last else 0, sid, message[start : start + 16384]))
    return b"".join(frames)


@dataclass
class HeldConnection:
    """One attacker connection: sends its held streams, then reads what the gateway answers."""

    url: str
    source: str
    stop: threading.Event
    attack: Callable[[str], bytes] = held_streams
    sent: bool = False
    statuses: list[tuple[str, str]] = field(default_factory=list)
    """(grpc-status, grpc-message) of each stream the gateway ended."""
    resets: int = 0
    goaway: bool = False
    closed: bool = False
    errors: list[str] = field(default_factory=list)
    """What reading the gateway's answers failed with."""
    send_error: str = ""

    def run(self) -> None:
        host, port = self.url.split(":")
        try:
            sock = socket.create_connection(
                (host, int(port)), timeout=30, source_address=(self.source, 0)
            )
        except OSError as e:
            self.errors.append(f"connect: {e!r}")
            return
        decoder = hpack.Decoder()
        # Sent beside the reading, as a tenant with a reader of its own would: a pod stopped
        # mid-send is answered while its last bytes still wait.
        sender = threading.Thread(target=self._send, args=(sock,), daemon=True)
        try:
            sock.settimeout(0.1)
            sender.start()
            data = b""
            while not self.stop.is_set():
                try:
                    chunk = sock.recv(1 << 16)
                except TimeoutError:
                    continue
                if not chunk:
                    self.closed = True
                    return
                data += chunk
                while len(data) >= 9 and len(data) >= 9 + int.from_bytes(data[:3], "big"):
                    size = int.from_bytes(data[:3], "big")
                    kind, payload = data[3], data[9 : 9 + size]
                    data = data[9 + size :]
                    if kind == 1:
                        fields = {
                            bytes(n).decode(): bytes(v).decode()
                            for n, v in decoder.decode(payload, raw=True)
                        }
                        if "grpc-status" in fields:
                            self.statuses.append(
                                (fields["grpc-status"], fields.get("grpc-message", ""))
                            )
                    elif kind == 3:
                        self.resets += 1
                    elif kind == 7:
                        self.goaway = True
        except OSError as e:
            self.errors.append(repr(e))
        finally:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
            if sender.is_alive():
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # ends a send still waiting
            sender.join(5)
            sock.close()

    def _send(self, sock: socket.socket) -> None:
        data = memoryview(self.attack(self.url))
        try:
            while data:
                try:
                    data = data[sock.send(data) :]
                except TimeoutError:
                    if self.stop.is_set():
                        return
        except OSError as e:
            self.send_error = repr(e)  # the gateway ended the connection before all was sent
        else:
            self.sent = True


@contextlib.contextmanager
def attacking(
    url: str, attack: Callable[[str], bytes] = held_streams, connections_per_pod: int = CONNECTIONS
) -> Iterator[list[HeldConnection]]:
    stop = threading.Event()
    connections = [
        HeldConnection(url, source, stop, attack)
        for source in ATTACKERS
        for _ in range(connections_per_pod)
    ]
    threads = [threading.Thread(target=c.run, daemon=True) for c in connections]
    for thread in threads:
        thread.start()
    try:
        yield connections
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)


@pytest.fixture
def gateway(
    served_triton: TritonServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, str, int]]:
    """A gateway process with the byte budget BUDGET, serving the neighbour (add_one) and the
    attackers (identity); its REST and gRPC addresses and its pid."""
    monkeypatch.setenv("TRITONSHARE_MAX_BUFFERED_BYTES", str(BUDGET))
    table = tmp_path / "callers.json"
    callers = [caller(VICTIM, "add_one", "b/victim")]
    callers += [caller(a, "identity", f"a/attacker-{a.rsplit('.', 1)[1]}") for a in ATTACKERS]
    publish(table, *callers)
    with gateway_process(served_triton, table) as running:
        yield running.http_url, running.grpc_url, running.process.pid
        assert running.process.poll() is None, "the gateway died under the attack"


def test_many_pods_holding_partial_messages_stay_within_the_nodes_byte_budget(
    gateway: tuple[str, str, int],
) -> None:
    http_url, grpc_url, pid = gateway
    with (
        neighbour_running(http_url) as neighbour,
        PeakRss(pid) as rss,
        attacking(grpc_url) as connections,
    ):
        served = latencies(neighbour, NEIGHBOUR_ANSWERS, within=5.0)
        # Past the grace, the pods over their share are answered and their memory returns (on
        # the code before, nothing is ever answered: this waits out the deadline).
        deadline = time.monotonic() + 5
        while not any(c.statuses for c in connections) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not neighbour.errors, neighbour.errors
    refused = [s for c in connections for s in c.statuses]
    assert len(served) == NEIGHBOUR_ANSWERS, (
        f"the neighbour got {len(served)} answers in 5 s while the attackers held their streams"
    )
    assert rss.growth < GROWTH, (
        f"the gateway grew by {rss.growth / 2**20:.0f} MiB under the attack "
        f"(budget {BUDGET / 2**20:.0f} MiB, attack {ATTACK / 2**20:.0f} MiB)"
    )
    # The attackers are told, never left hanging: every stream the gateway ended carries the
    # reason and what to do.
    assert refused, "no attacker stream was answered: they hang"
    for status, message in refused:
        assert status == "8", (status, message)  # RESOURCE_EXHAUSTED
        assert "--max-buffered-bytes" in message and "budget" in message, message
    assert not any(c.resets for c in connections), "streams were reset without an answer"


def test_many_pods_drawing_answers_they_never_read_stay_within_the_nodes_byte_budget(
    gateway: tuple[str, str, int],
) -> None:
    """The same with answers: each attacker pod has HOARDED calls at Triton drawing ANSWER bytes
    each with a stream window of 0, so the gateway holds every answer (on the code before: the
    whole ~48 MiB). Stopping a pod's reading does not stop Triton's answers to what it already
    sent: what Triton sends counts as it arrives, and the pods over their share are shed."""
    http_url, grpc_url, pid = gateway
    with (
        neighbour_running(http_url) as neighbour,
        PeakRss(pid) as rss,
        attacking(grpc_url, hoarded_answers, connections_per_pod=1) as connections,
    ):
        served = latencies(neighbour, NEIGHBOUR_ANSWERS, within=5.0)
        # A poll with a deadline: the shed comes a grace (1 s) and a walk after the pod stops,
        # later on a loaded box.
        deadline = time.monotonic() + 15
        while not all(c.closed or c.errors for c in connections) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not neighbour.errors, neighbour.errors
    assert len(served) == NEIGHBOUR_ANSWERS
    assert rss.growth < GROWTH, (
        f"the gateway grew by {rss.growth / 2**20:.0f} MiB under the attack (budget "
        f"{BUDGET / 2**20:.0f} MiB, answers {len(ATTACKERS) * HOARDED * ANSWER / 2**20:.0f} MiB)"
    )
    refused = [s for c in connections for s in c.statuses]
    assert refused, "no attacker stream was answered: they hang " + repr(
        [(c.closed, c.resets, c.goaway, c.errors) for c in connections]
    )
    for status, message in refused:
        assert status == "8" and "--max-buffered-bytes" in message, (status, message)


HEADS = 128
"""REST connections per attacker pod, each holding a partial request head (all of them: ~30 MiB)."""
HEAD = 60 * 1024
"""Bytes of each partial head: under the relay's 64 KiB limit, so it waits for the rest."""


def test_many_pods_holding_partial_rest_heads_are_answered_503_past_the_budget(
    gateway: tuple[str, str, int],
) -> None:
    """REST: each attacker pod opens HEADS connections, each sending a request head HEAD bytes
    long with no end (held by the relay until its head timeout, 30 s). The pods over their share
    are answered 503 saying why, their connections opened once they were stopped are reset at
    accept, and the neighbour is served meanwhile."""
    http_url, _, pid = gateway
    host, port = http_url.split(":")
    head = b"POST /v2/models/identity/infer HTTP/1.1\r\nX-Pad: " + b"a" * HEAD
    sockets: list[socket.socket] = []
    answers: list[bytes] = []
    resets = 0
    try:
        with neighbour_running(http_url) as neighbour, PeakRss(pid) as rss:
            for source in ATTACKERS:
                for _ in range(HEADS):
                    sock = socket.create_connection(
                        (host, int(port)), timeout=10, source_address=(source, 0)
                    )
                    sockets.append(sock)
                    try:
                        sock.sendall(head)  # within the socket buffers while its pod is paused
                    except (ConnectionResetError, BrokenPipeError):
                        resets += 1  # refused at accept: its pod is stopped for the budget
            served = latencies(neighbour, NEIGHBOUR_ANSWERS, within=5.0)
            # Answers come after the grace (1 s); done once none came for as long again.
            deadline = time.monotonic() + 5
            pending = list(sockets)
            quiet_until = deadline
            while pending and time.monotonic() < min(deadline, quiet_until):
                ready, _, _ = select.select(pending, [], [], 0.1)
                for sock in ready:
                    try:
                        answers.append(sock.recv(1 << 16))
                    except ConnectionResetError:
                        resets += 1
                    pending.remove(sock)
                    quiet_until = time.monotonic() + 1.5
            assert not neighbour.errors, neighbour.errors
    finally:
        for sock in sockets:
            sock.close()
    assert len(served) == NEIGHBOUR_ANSWERS
    assert rss.growth < GROWTH, f"the gateway grew by {rss.growth / 2**20:.0f} MiB"
    answered = [answer for answer in answers if answer]  # b"": reset at accept, read as closed
    assert answered, f"no attacker connection was answered ({resets} reset): they hang"
    for answer in answered:
        assert answer.startswith(b"HTTP/1.1 503 "), answer[:200]
        assert b"--max-buffered-bytes" in answer and b"budget" in answer, answer[:400]
