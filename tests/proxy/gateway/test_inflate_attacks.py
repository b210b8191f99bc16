"""Inflate bombs against the node gateway, through real processes.

A real `python -m proxy.gateway` process stands in front of the real Triton; the attacker is a
proven pod (it is in the caller table) that bypasses its own proxy and talks to the gateway from
its own address with a real HTTP/2 or HTTP/1.1 client; a neighbour pod keeps calling its own model
through the same gateway meanwhile. Memory is read with psutil while the attack runs (peak RSS,
sampled by a thread), the neighbour's latency per request; nothing sleeps: the attacker sends its
bomb again and again until the neighbour got NEIGHBOUR_ANSWERS answers meanwhile, and the sampler
runs until the attacker is done.

- A gzip gRPC message a few hundred KiB long that inflates to 512 MiB: the gateway must refuse it
  (RESOURCE_EXHAUSTED) without ever holding more than a bounded slice of it, and the neighbour
  must keep being answered.
- A REST body with `Content-Encoding: gzip` that inflates to 512 MiB: it must be refused (413)
  before Triton has the whole body, so Triton never inflates it.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import h2.config
import h2.connection
import h2.events
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from proxy.grpc import relay
from sim.triton import TritonServer, free_port
from tests.proxy.gateway.conftest import caller, publish

pytestmark = pytest.mark.triton

ROOT = Path(__file__).resolve().parents[3]
VICTIM = "127.1.0.7"  # add_one's pod
ATTACKER = "127.1.0.8"  # identity's pod
INFLATED = 512 * 1024**2
"""What each bomb inflates to: half a GiB from a few hundred KiB on the wire."""
CAP = 16 * 1024**2
"""The inflate cap the gateway runs with (`--max-inflated`; passed by its variable)."""
GATEWAY_GROWTH = 32 * 1024**2
"""The most the gateway's (or the proxy's) RSS may grow while it refuses a bomb (measured: under
2 MiB): nothing inflated is held whole (it is scanned in slices), so this is allocator noise and
buffers, far below one bomb (on the code before: 1024 MiB)."""
TRITON_GROWTH = 2 * CAP
"""The most Triton's RSS may grow while a REST bomb is refused: it must never inflate past the cap
(it gets no complete body at all)."""
STALL = 1.0
"""The longest one neighbour request may take while the gateway handles the bomb (alone: a few
milliseconds; on today's code the inflate blocks the gateway's one event loop for seconds)."""
NEIGHBOUR_ANSWERS = 20
"""Neighbour requests the attack lasts at least (the bomb is sent again until then)."""
INFER = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
).encode()


def gzip_bomb(prefix: bytes, size: int, wbits: int = 31) -> bytes:
    """`prefix` followed by zeros up to `size` bytes, compressed (gzip: 31, zlib deflate: 15),
    built a MiB at a time so the test never holds the inflated bytes."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
    parts = [compressor.compress(prefix)]
    zeros = bytes(1024**2)
    left = size - len(prefix)
    while left > 0:
        step = min(left, len(zeros))
        parts.append(compressor.compress(zeros[:step]))
        left -= step
    parts.append(compressor.flush())
    return b"".join(parts)


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append(value & 0x7F | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def infer_bomb(model: str, size: int, wbits: int = 31) -> bytes:
    """A ModelInferRequest naming `model` whose raw_input_contents (field 7) make it `size` bytes
    inflated, compressed with `wbits`."""
    name = b"\x0a" + varint(len(model)) + model.encode()
    payload = size - len(name) - 1 - len(varint(size))
    return gzip_bomb(name + b"\x3a" + varint(payload), size, wbits)


@dataclass
class GatewayProcess:
    process: subprocess.Popen[bytes]
    http_url: str
    grpc_url: str


def _ready(process: subprocess.Popen[bytes], metrics_port: int, what: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{metrics_port}/readyz", timeout=5
            ) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        assert process.poll() is None, f"the {what} exited while starting"
        assert time.monotonic() < deadline, f"the {what} did not become ready in 60 s"
        time.sleep(0.05)


def python() -> list[str]:
    """This interpreter as a child process that imports `proxy` from where this test does: with
    `-P` when the tests run so (against the native build, `tests/native_build.py`), since
    otherwise `python -m` puts the working directory, the source tree, first."""
    return [sys.executable, "-P"] if sys.flags.safe_path else [sys.executable]


def test_the_gateway_process_runs_the_proxy_these_tests_import() -> None:
    shown = "import proxy.grpc.relay as m; print(m.__file__)"
    child = subprocess.run(
        [*python(), "-c", shown], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert Path(child.stdout.strip()) == Path(relay.__file__), "the child runs another build"


START_ATTEMPTS = 3
"""Free ports are free a moment before the child binds them; another process of a busy machine
may take one meanwhile: the child is started again on other ports."""


@contextlib.contextmanager
def serving(module: str, flags: list[str], *, clean_log: bool = False) -> Iterator[GatewayProcess]:
    """`python -m <module>` (the gateway or the proxy) from this tree, listening on free ports,
    with the inflate cap CAP given by its variable; its log is written out when it stops. With
    `clean_log`, an exception it logged (none is expected under the inflate attacks) fails the
    test."""
    env = {**os.environ, "TRITONSHARE_MAX_INFLATED": str(CAP)}
    with tempfile.TemporaryFile() as log:
        for attempt in range(1, START_ATTEMPTS + 1):
            http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
            command = [*python(), "-m", module, *flags]
            command += ["--listen-http", f"127.0.0.1:{http_port}", "--listen-grpc"]
            command += [f"127.0.0.1:{grpc_port}", "--listen-metrics", f"127.0.0.1:{metrics_port}"]
            command += ["--log-level", "WARNING"]
            start = log.seek(0, os.SEEK_END)
            process = subprocess.Popen(command, cwd=ROOT, env=env, stderr=log)
            try:
                _ready(process, metrics_port, module)
            except AssertionError:
                log.seek(start)
                taken = b"Address already in use" in log.read()
                if process.poll() is None or not taken or attempt == START_ATTEMPTS:
                    _stop(process, log)
                    raise
                continue
            break
        try:
            yield GatewayProcess(process, f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}")
        finally:
            output = _stop(process, log)
        if clean_log:
            assert "Traceback" not in output, f"{module} logged an exception:\n{output[-4000:]}"


def _stop(process: subprocess.Popen[bytes], log: IO[bytes]) -> str:
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
    log.seek(0)
    output = log.read().decode(errors="replace")
    sys.stderr.write(output)
    return output


def gateway_process(
    triton: TritonServer, table: Path, *, clean_log: bool = False
) -> contextlib.AbstractContextManager[GatewayProcess]:
    """`python -m proxy.gateway` from this tree, as the node pod runs it."""
    flags = ["--caller-table", str(table), "--table-max-age", "3600"]
    flags += ["--triton-http-url", triton.http_url, "--triton-grpc-url", triton.grpc_url]
    return serving("proxy.gateway", flags, clean_log=clean_log)


@dataclass
class PeakRss:
    """The highest RSS of a process (and its children) while `running`, sampled by a thread."""

    pid: int
    baseline: int = 0
    peak: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _rss(self) -> int:
        process = psutil.Process(self.pid)
        return int(process.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self.baseline = self.peak = self._rss()
        self._thread = threading.Thread(target=self._sample, name="rss sampler", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self.done.wait(0.002):
            with contextlib.suppress(psutil.NoSuchProcess):
                self.peak = max(self.peak, self._rss())

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        assert self._thread is not None
        self._thread.join(10)
        with contextlib.suppress(psutil.NoSuchProcess):
            self.peak = max(self.peak, self._rss())

    @property
    def growth(self) -> int:
        return self.peak - self.baseline


@dataclass
class Neighbour:
    """The victim: REST infers to its own model through the gateway, one after another, until
    `stop` is set; each request's latency is kept."""

    url: str
    stop: threading.Event = field(default_factory=threading.Event)
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    first: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        host, port = self.url.split(":")
        connection = http.client.HTTPConnection(
            host, int(port), timeout=30, source_address=(VICTIM, 0)
        )
        try:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    connection.request("POST", "/v2/models/add_one/infer", body=INFER)
                    response = connection.getresponse()
                    body = response.read()
                except OSError as e:
                    self.errors.append(repr(e))
                    connection.close()
                    continue
                self.latencies.append(time.monotonic() - started)
                if response.status != 200:
                    self.errors.append(f"{response.status} {body[:200]!r}")
                self.first.set()
        finally:
            connection.close()


@contextlib.contextmanager
def neighbour_running(url: str) -> Iterator[Neighbour]:
    neighbour = Neighbour(url)
    thread = threading.Thread(target=neighbour.run, name="neighbour", daemon=True)
    thread.start()
    try:
        assert neighbour.first.wait(30), f"the neighbour got no answer: {neighbour.errors}"
        neighbour.latencies.clear()
        yield neighbour
    finally:
        neighbour.stop.set()
        thread.join(60)


def grpc_call(url: str, source: str, path: str, message: bytes, encoding: str) -> dict[str, str]:
    """One gRPC call over HTTP/2 from `source` (h2, a real HTTP/2 client), sending `message` (one
    length-prefixed gRPC message, compressed unless `encoding` is identity) within the peer's
    windows; the trailers it ends with, and how many response bytes came ("received"). A reset
    stream or a closed connection is reported as such."""
    host, port = url.split(":")
    sock = socket.create_connection((host, int(port)), timeout=60, source_address=(source, 0))
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    connection.initiate_connection()
    sid = connection.get_next_available_stream_id()
    connection.send_headers(
        sid,
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", url),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("grpc-encoding", encoding),
        ],
    )
    flag = b"\x00" if encoding == "identity" else b"\x01"
    framed = flag + len(message).to_bytes(4, "big") + message
    sent = 0
    received = 0
    trailers: dict[str, str] = {}
    with sock:
        sock.sendall(connection.data_to_send())
        while True:
            while sent < len(framed):
                window = min(
                    connection.local_flow_control_window(sid), connection.max_outbound_frame_size
                )
                if window <= 0:
                    break
                chunk = framed[sent : sent + window]
                sent += len(chunk)
                connection.send_data(sid, chunk, end_stream=sent == len(framed))
            sock.sendall(connection.data_to_send())
            data = sock.recv(65536)
            if not data:
                return {**trailers, "closed": "connection"}
            for event in connection.receive_data(data):
                if isinstance(event, h2.events.DataReceived):
                    received += len(event.data)
                    connection.acknowledge_received_data(
                        event.flow_controlled_length, event.stream_id
                    )
                if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                    trailers.update(
                        (k.decode() if isinstance(k, bytes) else k,
                         v.decode() if isinstance(v, bytes) else v)
                        for k, v in event.headers
                    )  # fmt: skip
                if isinstance(event, h2.events.StreamEnded):
                    return {**trailers, "received": str(received)}
                if isinstance(event, h2.events.StreamReset):
                    return {**trailers, "reset": str(event.error_code)}
                if isinstance(event, h2.events.ConnectionTerminated):
                    return {**trailers, "closed": str(event.error_code)}
            with contextlib.suppress(h2.exceptions.ProtocolError):
                sock.sendall(connection.data_to_send())


def rest_call(url: str, source: str, body: bytes, encoding: str) -> tuple[int, bytes]:
    host, port = url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60, source_address=(source, 0))
    try:
        connection.request(
            "POST",
            "/v2/models/identity/infer",
            body=body,
            headers={"Content-Encoding": encoding, "Content-Type": "application/json"},
        )
        response = connection.getresponse()
        return response.status, response.read()
    except (BrokenPipeError, ConnectionResetError) as e:
        return 0, repr(e).encode()
    finally:
        connection.close()


@pytest.fixture
def gateway(served_triton: TritonServer, tmp_path: Path) -> Iterator[GatewayProcess]:
    table = tmp_path / "callers.json"
    publish(table, caller(VICTIM, "add_one"), caller(ATTACKER, "identity"))
    with gateway_process(served_triton, table, clean_log=True) as running:
        yield running


def attack(
    gateway: GatewayProcess, send: Callable[[], object]
) -> tuple[list[object], PeakRss, list[float]]:
    """Run `send` (the attacker's request) again and again while the neighbour calls its model,
    until the neighbour got NEIGHBOUR_ANSWERS answers meanwhile (a refusal can take less time
    than one of its requests); the attacker's answers, the gateway's RSS, and the neighbour's
    latencies meanwhile."""
    answers: list[object] = []
    with neighbour_running(gateway.http_url) as neighbour:
        deadline = time.monotonic() + 120
        with PeakRss(gateway.process.pid) as rss:
            while len(neighbour.latencies) < NEIGHBOUR_ANSWERS or len(answers) < 2:
                answers.append(send())
                assert time.monotonic() < deadline, "the attack ran for two minutes"
        answered = list(neighbour.latencies)
    assert not neighbour.errors, f"the neighbour's requests failed: {neighbour.errors[:3]}"
    return answers, rss, answered


@pytest.mark.parametrize(("encoding", "wbits"), [("gzip", 31), ("deflate", 15)])
def test_a_grpc_inflate_bomb_is_refused_in_bounded_memory_and_stalls_nobody(
    gateway: GatewayProcess, encoding: str, wbits: int
) -> None:
    bomb = infer_bomb("identity", INFLATED, wbits)
    assert len(bomb) < 1024**2  # a few hundred KiB on the wire
    path = "/inference.GRPCInferenceService/ModelInfer"
    answers, rss, latencies = attack(
        gateway, lambda: grpc_call(gateway.grpc_url, ATTACKER, path, bomb, encoding)
    )
    assert latencies, "the neighbour got no answer during the attack"
    stalled = f"the neighbour waited {max(latencies):.2f} s"
    grew = f"the gateway grew by {rss.growth / 2**20:.0f} MiB"
    assert rss.growth < GATEWAY_GROWTH, f"{grew}; {stalled}"
    assert max(latencies) < STALL, f"{grew}; {stalled}"
    for answer in answers:
        assert isinstance(answer, dict)
        assert answer.get("grpc-status") == "8", answer  # RESOURCE_EXHAUSTED
        assert f"{CAP} bytes" in answer.get("grpc-message", ""), answer


@pytest.mark.parametrize(("encoding", "wbits"), [("gzip", 31), ("deflate", 15)])
def test_a_rest_inflate_bomb_is_refused_before_triton_inflates_it(
    gateway: GatewayProcess, served_triton: TritonServer, encoding: str, wbits: int
) -> None:
    assert served_triton.process is not None
    bomb = gzip_bomb(b'{"inputs": []}', INFLATED, wbits)
    with PeakRss(served_triton.process.pid) as triton_rss:
        answers, rss, latencies = attack(
            gateway, lambda: rest_call(gateway.http_url, ATTACKER, bomb, encoding)
        )
    assert triton_rss.growth < TRITON_GROWTH, (
        f"Triton grew by {triton_rss.growth / 2**20:.0f} MiB; the answers: {answers[:1]!r:.300}"
    )
    for answer in answers:
        assert isinstance(answer, tuple)
        status, body = answer
        assert status == 413, (status, body[:300])
        assert f"{CAP} bytes" in body.decode(), body[:300]
    assert rss.growth < GATEWAY_GROWTH, f"the gateway grew by {rss.growth / 2**20:.0f} MiB"
    assert max(latencies) < STALL, f"the neighbour waited {max(latencies):.2f} s"


def test_a_compressed_body_within_the_cap_is_still_served(gateway: GatewayProcess) -> None:
    """The cap refuses bombs, not compression: a gzip infer request reaches Triton and is
    answered as before (REST and gRPC)."""
    body = json.dumps(
        {"inputs": [{"name": "INPUT_FP32", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}]}
    ).encode()
    status, answer = rest_call(gateway.http_url, ATTACKER, zlib.compress(body), "deflate")
    assert status == 200, answer[:300]
    assert json.loads(answer)["outputs"][0]["data"] == [1.0, 2.0, 3.0]


def test_a_compressed_body_of_a_coding_triton_does_not_read_is_refused_at_once(
    gateway: GatewayProcess,
) -> None:
    status, answer = rest_call(gateway.http_url, ATTACKER, b"\x00" * 64, "br")
    assert status == 415, answer[:300]
    assert b"send gzip, deflate, or an uncompressed body" in answer


def test_a_large_compressed_grpc_message_within_the_cap_is_answered(
    gateway: GatewayProcess,
) -> None:
    """Read in pieces (it inflates past what is inflated inline), checked, and answered by Triton:
    the identity model echoes 4 MiB."""
    request = service_pb2.ModelInferRequest(model_name="identity")
    request.inputs.add(name="INPUT_FP32", datatype="FP32", shape=[1024 * 1024])
    request.raw_input_contents.append(bytes(4 * 1024 * 1024))
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
    message = compressor.compress(request.SerializeToString()) + compressor.flush()
    path = "/inference.GRPCInferenceService/ModelInfer"
    answer = grpc_call(gateway.grpc_url, ATTACKER, path, message, "gzip")
    assert answer.get("grpc-status") == "0", answer
    assert int(answer["received"]) > 4 * 1024 * 1024


def test_requests_that_are_not_inference_cannot_be_made_large(gateway: GatewayProcess) -> None:
    """Only inference counts against the in-flight limits, so only inference may be large: a
    1 MiB metadata request (REST body or gRPC message) is refused before Triton holds it."""
    host, port = gateway.http_url.split(":")
    # The head alone: the refusal comes from it, before any of the body is read (a client
    # still sending the body when the refusal closes the connection may see a reset instead).
    head = b"GET /v2/models/identity HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n"
    with socket.create_connection(
        (host, int(port)), timeout=30, source_address=(ATTACKER, 0)
    ) as sock:
        sock.sendall(head)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    body = answer.partition(b"\r\n\r\n")[2]
    assert status == 413, body[:300]
    assert b"only inference requests may be larger" in body
    message = b"\x0a\x08identity\x12" + varint(1024 * 1024) + bytes(1024 * 1024)
    path = "/inference.GRPCInferenceService/ModelMetadata"
    trailers = grpc_call(gateway.grpc_url, ATTACKER, path, message, "identity")
    assert trailers.get("grpc-status") == "8", trailers  # RESOURCE_EXHAUSTED
    assert "only inference requests may be larger" in trailers.get("grpc-message", "")


def test_the_pods_own_proxy_refuses_a_bomb_from_tritonclient_in_bounded_memory(
    gateway: GatewayProcess,
) -> None:
    """The same relays in the pod's proxy (`python -m proxy`, sending to the gateway from the
    pod's address), against tritonclient's own compression (gRPC gzip, REST gzip): refused at
    the cap, the proxy's RSS bounded, and the proxy still serves."""
    flags = ["--model-id", "identity", "--source-address", ATTACKER, "--drain-seconds", "0"]
    flags += ["--triton-http-url", gateway.http_url, "--triton-grpc-url", gateway.grpc_url]
    zeros = np.zeros(INFLATED // 4 // 4, np.float32)  # 128 MiB: the client holds it whole
    with serving("proxy", flags, clean_log=True) as proxy:
        grpc_client = grpcclient.InferenceServerClient(proxy.grpc_url)
        rest_client = httpclient.InferenceServerClient(proxy.http_url, network_timeout=120)
        try:
            grpc_input = grpcclient.InferInput("INPUT_FP32", [len(zeros)], "FP32")
            grpc_input.set_data_from_numpy(zeros)
            rest_input = httpclient.InferInput("INPUT_FP32", [len(zeros)], "FP32")
            rest_input.set_data_from_numpy(zeros, binary_data=True)
            with PeakRss(proxy.process.pid) as rss:
                with pytest.raises(InferenceServerException) as grpc_refusal:
                    grpc_client.infer("identity", [grpc_input], compression_algorithm="gzip")
                with pytest.raises(InferenceServerException) as rest_refusal:
                    rest_client.infer(
                        "identity", [rest_input], request_compression_algorithm="gzip"
                    )
            assert grpc_refusal.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
            assert f"{CAP} bytes" in str(grpc_refusal.value.message())
            assert f"{CAP} bytes" in str(rest_refusal.value.message())
            assert rss.growth < GATEWAY_GROWTH, f"the proxy grew by {rss.growth / 2**20:.0f} MiB"
            small = grpcclient.InferInput("INPUT_FP32", [3], "FP32")
            small.set_data_from_numpy(np.ones(3, np.float32))
            answer = grpc_client.infer("identity", [small], compression_algorithm="gzip")
            assert answer.as_numpy("OUTPUT_FP32").tolist() == [1.0, 1.0, 1.0]
        finally:
            grpc_client.close()
            rest_client.close()


def test_the_proxy_answers_once_when_the_gateway_refused_the_body_first(
    gateway: GatewayProcess,
) -> None:
    """The gateway counts an inflating body too: with a lower cap than the pod's proxy it
    refuses first (413, `Connection: close`), and the proxy passes that answer on, then reads and
    drops the rest of the body. Its own count must not answer a second time: a client reading
    after the first answer finds the connection ending there, not another response."""
    flags = ["--model-id", "identity", "--source-address", ATTACKER, "--drain-seconds", "0"]
    flags += ["--triton-http-url", gateway.http_url, "--triton-grpc-url", gateway.grpc_url]
    flags += ["--max-inflated", str(4 * CAP)]
    bomb = gzip_bomb(b'{"inputs": []}', 8 * CAP)
    head = (
        b"POST /v2/models/identity/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(bomb)
    )
    # A quarter of the body inflates past the gateway's cap, not the proxy's: the gateway's
    # refusal comes first whatever the two processes' speeds. The rest follows that answer.
    first, rest = bomb[: len(bomb) // 4], bomb[len(bomb) // 4 :]
    with serving("proxy", flags, clean_log=True) as proxy:
        host, port = proxy.http_url.split(":")
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(head + first)
            answer = b""
            while b"\r\n\r\n" not in answer and (chunk := sock.recv(65536)):
                answer += chunk
            with contextlib.suppress(OSError):  # the proxy may have closed once it answered
                sock.sendall(rest)
            with contextlib.suppress(ConnectionResetError):
                while chunk := sock.recv(65536):
                    answer += chunk
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:300]
    assert f"{CAP} bytes".encode() in answer, answer[:300]  # the gateway's cap: its answer
    assert answer.count(b"HTTP/1.1 ") == 1, answer
