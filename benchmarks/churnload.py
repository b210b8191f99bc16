"""The churn benchmark's load: every model always has requests in flight, over every way a client
connects, from a process of its own.

Per model, `PER_WAY` closed-loop callers of each way in `WAYS` send their next request as soon as
the last one is answered:

- `rest`: REST on one keep-alive connection (it stays on one endpoint of the Service);
- `rest-new`: REST with a new connection per request (`Connection: close`), so each request is
  spread over the Service's endpoints as kube-proxy spreads connections;
- `grpc`: gRPC unary ModelInfer on one long-lived channel;
- `grpc-stream`: one request at a time on a bidirectional ModelStreamInfer stream, opened again
  only once it has ended with no request of its own in flight (a stream that ends under a request
  fails that request; one that ended idle is counted apart, `Load.idle_stream_ends`).

Per namespace one open-loop caller (`poisson`) sends REST requests, each on a new connection, to
one of the namespace's models drawn at random, at times drawn from a Poisson process of
`POISSON_RATE` a second, whatever the answers.

A request fails on an answer other than 200 (gRPC: OK), a connection error, or no answer within
`DEADLINE` seconds. The load runs in a process of its own (`LoadProcess`), so that its threads
share no interpreter lock with the Services' relays (`sim.service.ServiceProxy`) nor with the
churn itself, and its CPU is its own: `LoadCpu` says how much it took.

`LoadProcess.spike(model, factor, seconds)` multiplies one model's closed-loop callers by
`factor` for `seconds` (a load spike), their requests counted as the others'.

`in_flight_at` is the accounting that shows each change was sampled: from the requests' start and
end times, how many were in flight at a moment, per model. Pure.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import multiprocessing
import queue
import random
import resource
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple, dataclass, field
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from typing import Any

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

WAYS = ("rest", "rest-new", "grpc", "grpc-stream")
"""The ways a closed-loop caller connects (see the module's docstring)."""
PER_WAY = 2
"""Closed-loop callers per model and way: 8 a model, so that at least 4 are in flight at every
moment even while some are between two requests."""
POISSON = "poisson"
POISSON_RATE = 4.0
"""Requests a second of each namespace's open-loop caller."""
POISSON_THREADS = 160
"""The open-loop caller's senders: enough for `POISSON_RATE` requests a second each held up to
`DEADLINE`, so that the loop stays open while answers are held; a request drawn while all are
busy waits for one (`Load.late`)."""
DEADLINE = 40.0
"""Seconds a request may take before it counts as failed (no answer): past the longest hold the
product documents (`churnrule.HOLD_BOUND`), so that a slow answer is seen as slow, not cut."""
BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
).encode()
REST_PORT, GRPC_PORT = 9000, 9001


@dataclass(frozen=True)
class Request:
    model: str
    protocol: str
    start: float
    end: float
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class Target:
    """A model and its Service's cluster IP."""

    model: str
    namespace: str
    address: str


def in_flight_at(requests: Iterable[Request], moment: float) -> Counter[str]:
    """The requests in flight at `moment` (sent at or before it, not yet answered), per model."""
    return Counter(r.model for r in requests if r.start <= moment < r.end)


@dataclass
class LoadCpu:
    """The load process's CPU (`resource.getrusage`) and its callers' threads' own
    (`time.thread_time`), in seconds, over `wall` seconds."""

    process: float = 0.0
    threads: float = 0.0
    wall: float = 0.0

    def line(self, requests: int) -> str:
        per = 1000 * self.process / requests if requests else 0.0
        share = 100 * self.process / self.wall if self.wall else 0.0
        return (
            f"{self.process:.1f} CPU-s in {self.wall:.0f} s ({share:.0f} % of one core; its "
            f"callers' threads {self.threads:.1f} s), {per:.2f} ms of CPU a request"
        )


@dataclass
class Load:
    """What the load process hands back."""

    requests: list[Request] = field(default_factory=list)
    cpu: LoadCpu = field(default_factory=LoadCpu)
    idle_stream_ends: int = 0
    late: int = 0
    """Open-loop requests that waited for a free sender past their drawn time by 100 ms or
    more."""

    def dump(self) -> str:
        return json.dumps(
            {
                "requests": [astuple(r) for r in self.requests],
                "cpu": astuple(self.cpu),
                "idle_stream_ends": self.idle_stream_ends,
                "late": self.late,
            }
        )

    @classmethod
    def read(cls, text: str) -> Load:
        data = json.loads(text)
        return cls(
            [Request(*r) for r in data["requests"]],
            LoadCpu(*data["cpu"]),
            int(data["idle_stream_ends"]),
            int(data["late"]),
        )


# ---- the callers, in the load process ---------------------------------------------------------


def _infer_request(model: str) -> service_pb2.ModelInferRequest:
    tensor = service_pb2.ModelInferRequest.InferInputTensor(
        name="INPUT0", datatype="FP32", shape=[1, 3]
    )
    tensor.contents.fp32_contents.extend([1.0, 2.0, 3.0])
    return service_pb2.ModelInferRequest(model_name=model, inputs=[tensor])


def _rest(connection: http.client.HTTPConnection, model: str, close: bool) -> tuple[bool, str]:
    headers = {"Content-Type": "application/json"}
    if close:
        headers["Connection"] = "close"
    connection.request("POST", f"/v2/models/{model}/infer", BODY, headers)
    answer = connection.getresponse()
    body = answer.read()
    if answer.status == 200:
        return True, ""
    retry = answer.getheader("Retry-After")
    said = body[:200].decode(errors="replace")
    return False, f"{answer.status}{f' Retry-After {retry}' if retry else ''}: {said}"


def _grpc_detail(e: grpc.RpcError) -> str:
    """An error of a call (grpc's errors are its calls too: `code()` and `details()`)."""
    code = getattr(e, "code", None)
    details = getattr(e, "details", None)
    name = code().name if callable(code) else "RpcError"
    return f"{name}: {str(details() if callable(details) else e)[:200]}"


class _Stream:
    """One ModelStreamInfer stream; its answers (or its end) are read by a thread of its own."""

    ENDED = object()

    def __init__(self, channel: grpc.Channel) -> None:
        self._sends: queue.Queue[Any] = queue.Queue()
        self.answers: queue.Queue[Any] = queue.Queue()
        self.ended = threading.Event()
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        self._call = stub.ModelStreamInfer(iter(self._sends.get, None))
        self._reader = threading.Thread(target=self._read, daemon=True, name="churn-stream")
        self._reader.start()

    def _read(self) -> None:
        try:
            for answer in self._call:
                self.answers.put(answer)
            self.answers.put((self.ENDED, "the stream ended (OK) under it"))
        except grpc.RpcError as e:
            self.answers.put((self.ENDED, f"the stream ended: {_grpc_detail(e)}"))
        finally:
            self.ended.set()

    def send(self, request: service_pb2.ModelInferRequest) -> None:
        self._sends.put(request)

    def close(self) -> None:
        self._sends.put(None)
        with contextlib.suppress(Exception):
            self._call.cancel()
        self._reader.join(5)


class Caller:
    """A closed-loop caller of one model by one way."""

    def __init__(self, target: Target, way: str, log: list[Request], stop: threading.Event):
        self.target, self.way, self.log, self._stop = target, way, log, stop
        self.answered = threading.Event()
        self.cpu = 0.0
        self.idle_stream_ends = 0
        self._http: http.client.HTTPConnection | None = None
        self._channel: grpc.Channel | None = None
        self._stream: _Stream | None = None
        self._request = _infer_request(target.model)
        self.thread = threading.Thread(
            target=self._run, name=f"churn-{target.model}-{way}", daemon=True
        )

    def _run(self) -> None:
        send = {
            "rest": self._rest_keepalive,
            "rest-new": self._rest_new,
            "grpc": self._grpc,
            "grpc-stream": self._grpc_stream,
        }[self.way]
        try:
            while not self._stop.is_set():
                began = time.monotonic()
                ok, detail = send()
                self.log.append(
                    Request(self.target.model, self.way, began, time.monotonic(), ok, detail)
                )
                if ok:
                    self.answered.set()
                else:
                    self._stop.wait(0.05)  # a refused connection must not spin
        finally:
            self.cpu = time.thread_time()
            self._close()

    def _close(self) -> None:
        if self._http is not None:
            self._http.close()
        if self._stream is not None:
            self._stream.close()
        if self._channel is not None:
            self._channel.close()

    def _rest_keepalive(self) -> tuple[bool, str]:
        if self._http is None:
            self._http = http.client.HTTPConnection(self.target.address, REST_PORT, DEADLINE)
        try:
            return _rest(self._http, self.target.model, close=False)
        except (OSError, http.client.HTTPException) as e:
            self._http.close()
            self._http = None
            return False, f"{type(e).__name__}: {e}"

    def _rest_new(self) -> tuple[bool, str]:
        return rest_once(self.target)

    def _grpc(self) -> tuple[bool, str]:
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"{self.target.address}:{GRPC_PORT}")
        stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        try:
            stub.ModelInfer(self._request, timeout=DEADLINE)
        except grpc.RpcError as e:
            return False, _grpc_detail(e)
        return True, ""

    def _grpc_stream(self) -> tuple[bool, str]:
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"{self.target.address}:{GRPC_PORT}")
        if self._stream is not None and self._stream.ended.is_set():
            self.idle_stream_ends += 1  # ended with nothing of ours in flight: open another
            self._stream.close()
            self._stream = None
        if self._stream is None:
            self._stream = _Stream(self._channel)
        self._stream.send(self._request)
        try:
            answer = self._stream.answers.get(timeout=DEADLINE)
        except queue.Empty:
            self._stream.close()
            self._stream = None
            return False, f"no answer on the stream within {DEADLINE:g} s"
        if isinstance(answer, tuple) and answer[0] is _Stream.ENDED:
            self._stream.close()
            self._stream = None
            return False, str(answer[1])
        if answer.error_message:
            return False, f"stream answer: {answer.error_message[:200]}"
        return True, ""


def rest_once(target: Target) -> tuple[bool, str]:
    """One REST request on a connection of its own."""
    connection = http.client.HTTPConnection(target.address, REST_PORT, DEADLINE)
    try:
        return _rest(connection, target.model, close=True)
    except (OSError, http.client.HTTPException) as e:
        return False, f"{type(e).__name__}: {e}"
    finally:
        connection.close()


def poisson(
    targets: list[Target], log: list[Request], stop: threading.Event, seed: int, late: list[int]
) -> None:
    """The open-loop caller of one namespace's models, until `stop`."""
    rng = random.Random(seed)

    def send(target: Target, due: float) -> None:
        began = time.monotonic()
        if began - due >= 0.1:
            late.append(1)
        ok, detail = rest_once(target)
        log.append(Request(target.model, POISSON, began, time.monotonic(), ok, detail))

    with ThreadPoolExecutor(POISSON_THREADS, thread_name_prefix="churn-poisson") as senders:
        due = time.monotonic()
        while not stop.is_set():
            due += rng.expovariate(POISSON_RATE)
            if stop.wait(max(0.0, due - time.monotonic())):
                break
            senders.submit(send, rng.choice(targets), due)


def spike(
    target: Target,
    ways: tuple[str, ...],
    factor: int,
    seconds: float,
    log: list[Request],
    halt: threading.Event,
    callers: list[Caller],
) -> None:
    """`factor` times the closed-loop callers on `target` for `seconds` (or until `halt`): the
    extra callers, `PER_WAY * (factor - 1)` of each way, are added to `callers` and stop after
    their request in flight."""
    done = threading.Event()
    extra = [Caller(target, way, log, done) for way in ways for _ in range(PER_WAY * (factor - 1))]
    callers.extend(extra)
    for caller in extra:
        caller.thread.start()
    halt.wait(seconds)
    done.set()


def unanswered_path(out: Path) -> Path:
    return out.with_suffix(".unanswered")


def run_load(
    targets: list[Target],
    ways: tuple[str, ...],
    out: Path,
    seed: int,
    answered: MpEvent,
    stop: MpEvent,
    spikes: Any = None,
) -> None:
    """The load process: start every caller, set `answered` once each has had an answer (until
    then `unanswered_path(out)` names those that have not, each with its last answer), run until
    `stop`, then write what it saw to `out` (`Load.dump`). `spikes`: a queue of (model, factor,
    seconds) asking for a spike of that model's load (`spike`)."""
    began = time.monotonic()
    log: list[Request] = []
    halt = threading.Event()
    callers = [
        Caller(target, way, log, halt) for target in targets for way in ways for _ in range(PER_WAY)
    ]
    for caller in callers:
        caller.thread.start()
    late: list[int] = []
    namespaces = sorted({t.namespace for t in targets})
    open_loop = [
        threading.Thread(
            target=poisson,
            args=([t for t in targets if t.namespace == ns], log, halt, seed + i, late),
            name=f"churn-poisson-{ns}",
            daemon=True,
        )
        for i, ns in enumerate(namespaces)
    ]
    for thread in open_loop:
        thread.start()
    extra: list[Caller] = []
    spiking: list[threading.Thread] = []
    while not stop.is_set():
        while spikes is not None:
            try:
                model, factor, seconds = spikes.get_nowait()
            except queue.Empty:
                break
            target = next(t for t in targets if t.model == model)
            thread = threading.Thread(
                target=spike,
                args=(target, ways, factor, seconds, log, halt, extra),
                name=f"churn-spike-{model}",
                daemon=True,
            )
            thread.start()
            spiking.append(thread)
        if not answered.is_set():
            waiting = [c for c in callers if not c.answered.is_set()]
            if not waiting:
                answered.set()
            else:
                last = {(r.model, r.protocol): r.detail for r in log if not r.ok}
                said = sorted(
                    {
                        f"{c.target.model} {c.way}: {last.get((c.target.model, c.way), 'none yet')}"
                        for c in waiting
                    }
                )
                unanswered_path(out).write_text("\n".join(said))
        stop.wait(0.5)
    halt.set()
    for thread in spiking:
        thread.join(5)
    callers += extra
    for thread in [c.thread for c in callers] + open_loop:
        thread.join(DEADLINE + 5)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = LoadCpu(
        usage.ru_utime + usage.ru_stime,
        sum(c.cpu for c in callers),
        time.monotonic() - began,
    )
    load = Load(list(log), cpu, sum(c.idle_stream_ends for c in callers), len(late))
    out.write_text(load.dump())


class LoadProcess:
    """The load, run by `run_load` in a process of its own (spawned: no lock of this process's
    threads is inherited)."""

    def __init__(
        self, targets: list[Target], workdir: Path, seed: int, ways: tuple[str, ...] = WAYS
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self._out = workdir / "churn-load.json"
        self.answered = context.Event()
        self._stop = context.Event()
        self._spikes = context.Queue()
        self._process = context.Process(
            target=run_load,
            args=(targets, ways, self._out, seed, self.answered, self._stop, self._spikes),
            name="churn-load",
            daemon=True,
        )

    def start(self) -> None:
        self._process.start()

    def unanswered(self) -> list[str]:
        """The callers not answered yet, each with its last failed answer."""
        path = unanswered_path(self._out)
        return path.read_text().splitlines() if path.exists() else []

    def alive(self) -> bool:
        return self._process.is_alive()

    def spike(self, model: str, factor: int, seconds: float) -> None:
        """`factor` times `model`'s closed-loop callers for `seconds`, from now (`spike`)."""
        if factor < 1 or seconds <= 0:
            raise ValueError(f"a spike of {factor}x for {seconds} s: give 1x or more, over 0 s")
        self._spikes.put((model, factor, seconds))

    def stop(self) -> Load:
        """Stop the callers (each finishes its request first) and read what they saw."""
        self._stop.set()
        self._process.join(DEADLINE + 30)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        if not self._out.exists():
            return Load()
        return Load.read(self._out.read_text())


def machine_busy() -> Iterator[float]:
    """A generator: each `next` gives the machine's busy share of its CPUs (0-1) since the last
    (from /proc/stat); the first gives 0."""
    last: tuple[int, int] | None = None
    while True:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle, total = fields[3] + fields[4], sum(fields[:8])
        if last is None:
            last = (idle, total)
            yield 0.0
            continue
        spent = total - last[1]
        busy = 1 - (idle - last[0]) / spent if spent else 0.0
        last = (idle, total)
        yield busy
