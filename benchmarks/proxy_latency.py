"""Benchmark: what the proxy, and the path through the node gateway, add over Triton directly.

Starts a real Triton serving the small Python-backend model add_one, two proxies as their own
processes (`python -m proxy`, as in a pod: `--grpc-mode relay`, the default, and `--grpc-mode
grpcio`), and a bare TCP relay (`benchmarks/tcp_relay.py`, the floor of any extra Python hop). It
runs the SAME load generator against each of them in rounds: wrk for REST (a JSON infer request),
h2load for gRPC (a framed ModelInfer request on HTTP/2), and a blocking python grpc client (the
grpc-core stack tritonclient uses) for gRPC at concurrency 1; with `--hey`, hey as a second REST
client at concurrency 1 (its mean time per request, from its rate: hey prints latencies to 0.1 ms).

Two more chains run in the same rounds: the full path of a model pod, a relay-mode
proxy sending from its own address (`--source-address 127.1.0.7`) to the node gateway (`python -m
proxy.gateway`, its own process, with a caller table mapping that address to add_one), which
relays to Triton; and the same proxy in front of a second bare relay in front of Triton, the
"today's proxy plus one bare byte-relay hop" the full path is held to. The full path may add at
most +0.15 ms (REST) / +0.12 ms (gRPC) at c=1 over the proxy alone, and the gateway's CPU time
per request at c=16 may be at most 1.3x the bare relay's of the same rounds; its throughput at
c=16 and its latency are also set against the proxy + bare relay chain, so "at most one bare relay
hop more" reads directly.

The box is shared and its speed drifts by tens of percent within a minute, so every round runs
each measure against Triton directly and through each hop back to back (the hop order reversed
every other measure), and the figures are the medians over rounds of the per-round differences
(latency added at c=1) and ratios (throughput kept at c=16), next to the targets (<= 0.25 ms /
0.2 ms added, >= 85% / 70% kept), each with a 95% bootstrap interval of that median, so a verdict
the noise could flip shows as one. Each proxy line also says what the proxy costs beyond the bare
relay of the same round (the part any Python hop pays is the floor's), judged against the proxy's
targets: at c=1 at most +0.05 ms (REST) and +0.08 ms (gRPC, with the grpc client's framing and
with h2load's, one stream at a time) over the bare relay; at c=16 at least 95% (REST) and 90%
(gRPC) of its throughput, and at most 1.15x (REST) and 1.3x (gRPC) its CPU time per request, read
from /proc (the proxy's own cost, which the noise does not move much). h2load against Triton
directly waits on its own small writes in a way a hop in between hides (direct is often slower
than through the relay), so its c=1 figure is judged against the bare relay only.

Two counters explain the figures rather than judge them: each hop's processes' CPU time per
call over the python grpc client's calls at c=1 (a call waits for all of a hop's work on it, so a
hop's added latency follows it, and it moves far less with the box's load than the latency does),
and `others`, the share of the box's CPU that work outside the benchmark took during each round
(/proc/stat less this benchmark's processes): the load that widens the intervals.

    .venv/bin/python benchmarks/proxy_latency.py [--rounds 5] [--seconds 2] [--hey]
        [--paths floor,relay,grpcio,chain,full] [--save FILE] [--report FILE ...]
        [--native] [--baseline-tree DIR] [--models N]

`--native` runs the proxy and the gateway compiled (`python -m proxy.native`, built first when
stale), and the bare relay compiled too (`benchmarks.native_relay`), so that what the proxy costs
beyond the floor compares compiled with compiled; `--baseline-tree build/native` instead adds the
compiled proxy as one more hop beside the pure one, for a pure/compiled comparison in the same
rounds; with the full path measured, a
`--baseline-tree` (another checkout, such as the code before a change) also adds its full path
(`fullbase`), so a gateway change is set against the gateway before it in the same rounds.
`--models N` adds a model host's proxy whose table holds add_one and N-1 idle models (a request's
cost must not grow with them), and prints the resident memory of the one-model proxy and of the
host after warm-up (goals: at most 150 MiB, and at most +0.05 ms at c=1 over the one-model proxy).

Every target is printed with met or NOT MET; the run exits 1 when one is not met (`--no-goal`: 0
anyway). The last line is the headline: each hop's latency added over Triton directly at c=1 and
its throughput kept of Triton's at c=16, beside what the proxy adds over the bare relay.

A round of every hop takes about 65 s on a 2-core box (5 rounds, the default, about 6 minutes);
more rounds narrow the intervals, and `--report` pools the rounds of several saved runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import psutil
from tritonclient.grpc import service_pb2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import command_line, goals, native_relay  # noqa: E402
from benchmarks import results as results_page  # noqa: E402
from common.callerkeys import digest  # noqa: E402
from common.callers import Caller, CallerTable, write_table  # noqa: E402
from protos import agent_pb2, agent_pb2_grpc  # noqa: E402
from proxy import native  # noqa: E402
from sim.triton import TritonServer, free_port  # noqa: E402

MODEL = "add_one"
POD_ADDRESS = "127.1.0.7"
"""The full path's model pod address: its proxy sends from it, the caller table maps it to MODEL
(on Linux every 127.x.y.z address is local)."""
Results = dict[tuple[str, str], list[float]]
"""(measure, hop) -> one figure per round; hop "direct" is Triton itself. CPU figures of a hop's
other processes are under "hop:process" (e.g. "full:proxy")."""
Upstream = tuple[str, str]
"""host:port of an upstream's REST and gRPC endpoints."""


@dataclass(frozen=True)
class Hop:
    """Where a load generator sends, and whose CPU time it reads."""

    rest: str
    grpc: str
    cpu: tuple[tuple[str, int], ...] = ()
    """(process, pid) of the processes whose CPU time per request is read at c=16; the first is
    the hop's own figure (the gateway for the full path, the bare relay for the proxy + relay)."""


REST_BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
)


def grpc_request() -> bytes:
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    del tensor
    request.raw_input_contents.append(struct.pack("<4f", 1, 2, 3, 4))
    data: bytes = request.SerializeToString()
    return data


def _wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer 200 within {timeout:.0f} s")


@contextmanager
def running_triton(workdir: Path, private_name: str = "") -> Iterator[TritonServer]:
    """Triton serving MODEL, and the same model under `private_name` too when one is given (as
    the agent loads a pod's model under its private name)."""
    repository = workdir / "repository"
    repository.mkdir()
    shutil.copytree(ROOT / "tests" / "models" / MODEL, repository / MODEL)
    if private_name:
        shutil.copytree(ROOT / "tests" / "models" / MODEL, repository / private_name)
        config = repository / private_name / "config.pbtxt"
        config.write_text(config.read_text().replace(f'"{MODEL}"', f'"{private_name}"', 1))
    with TritonServer(repository) as server:
        for name in (MODEL, *([private_name] if private_name else [])):
            load = urllib.request.Request(
                f"http://{server.http_url}/v2/repository/models/{name}/load", method="POST"
            )
            with urllib.request.urlopen(load, timeout=60):
                pass
        yield server


@contextmanager
def running_proxy(
    upstream: Upstream,
    extra: list[str],
    root: Path = ROOT,
    wrapper: Sequence[str] = (),
    timeout: float = 30.0,
    models_file: Path | None = None,
    model_id: str = MODEL,
) -> Iterator[Hop]:
    """`python -m proxy` from the source tree `root`, its command prefixed by `wrapper` (such as
    valgrind, which keeps the process id), ready within `timeout` seconds; a model host's proxy
    serving the table of `models_file` when given, else a model pod's for `model_id`."""
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    model = ["--model-id", model_id] if models_file is None else ["--models-file", str(models_file)]
    command = [
        *wrapper,
        sys.executable,
        "-m",
        "proxy",
        *model,
        "--triton-http-url",
        upstream[0],
        "--triton-grpc-url",
        upstream[1],
        "--listen-http",
        f"127.0.0.1:{http_port}",
        "--listen-grpc",
        f"127.0.0.1:{grpc_port}",
        "--listen-metrics",
        f"127.0.0.1:{metrics_port}",
        "--drain-seconds",
        "0",
        "--log-level",
        "WARNING",
        *extra,
    ]
    process = subprocess.Popen(command, cwd=root)  # `-m proxy` imports the proxy under `root`
    try:
        _wait_http(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout)
        yield Hop(f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", (("proxy", process.pid),))
    finally:
        _stop(process, 30)


@contextmanager
def running_floor(
    upstream: Upstream,
    wrapper: Sequence[str] = (),
    timeout: float = 30.0,
    compiled: bool = False,
) -> Iterator[Hop]:
    """The bare TCP relay (`benchmarks/tcp_relay.py`) for REST and gRPC, in one process (its
    command prefixed by `wrapper`, listening within `timeout` seconds); compiled with mypyc
    (`benchmarks.native_relay`, built first when stale) with `compiled`."""
    http_port, grpc_port = free_port(), free_port()
    if compiled:
        native_relay.build()
        if not native_relay.compiled():
            raise RuntimeError(f"{native_relay.OUT} holds no compiled relay")
        command, where = [*wrapper, *native_relay.command()], native_relay.OUT
    else:
        command, where = [*wrapper, sys.executable, "-m", "benchmarks.tcp_relay"], ROOT
    command += [upstream[0], f"127.0.0.1:{http_port}", upstream[1], f"127.0.0.1:{grpc_port}"]
    process = subprocess.Popen(command, cwd=where)
    try:
        for port in (http_port, grpc_port):
            _wait_port(port, timeout)
        yield Hop(f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", (("relay", process.pid),))
    finally:
        _stop(process, 10)


@contextmanager
def running_gateway(
    upstream: Upstream,
    work: Path,
    root: Path = ROOT,
    wrapper: Sequence[str] = (),
    timeout: float = 30.0,
    private_name: str = "",
    model_id: str = MODEL,
    key: bytes = b"",
) -> Iterator[Hop]:
    """The node gateway (`python -m proxy.gateway`) as in a node pod, with a caller table that
    lets POD_ADDRESS reach `model_id` (in Triton `private_name`, if given), by caller `key` too
    when given, and that stays fresh for the whole run; its command prefixed by `wrapper`, ready
    within `timeout` seconds."""
    table = work / "callers.json"
    pod = Caller(
        POD_ADDRESS,
        model_id,
        f"bench/{model_id.replace('_', '-')}",
        "bench-uid",
        triton_name=private_name,
        key=digest(key) if key else "",
    )
    write_table(table, CallerTable("bench-node", time.time(), (pod,)))
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    command = [*wrapper, sys.executable, "-m", "proxy.gateway", "--caller-table", str(table)]
    command += ["--triton-http-url", upstream[0], "--triton-grpc-url", upstream[1]]
    command += ["--listen-http", f"127.0.0.1:{http_port}", "--listen-grpc"]
    command += [f"127.0.0.1:{grpc_port}", "--listen-metrics", f"127.0.0.1:{metrics_port}"]
    command += ["--table-max-age", "100000", "--log-level", "WARNING"]
    # With a key, the gateway refuses a connection without it, so the path measured is the key's
    # (a gateway of a tree before keys knows no such variable and goes by the address).
    env = {**os.environ, "TRITONSHARE_CALLER_IDENTITY": "key"} if key else None
    process = subprocess.Popen(command, cwd=root, env=env)  # `-m proxy.gateway` under `root`
    try:
        _wait_http(f"http://127.0.0.1:{metrics_port}/readyz", timeout)
        yield Hop(f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", (("gateway", process.pid),))
    finally:
        _stop(process, 30)


class _KeyGivingAgent(agent_pb2_grpc.AgentServicer):  # type: ignore[misc]
    """The agent calls of a model pod's proxy without --model-dir: its caller key at start, the
    unload at its end."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def CallerKey(self, request: object, context: object) -> agent_pb2.CallerKeyResponse:  # noqa: N802
        return agent_pb2.CallerKeyResponse(key=self.key, pod="bench/add-one")

    def UnloadModel(self, request: Any, context: object) -> agent_pb2.ModelStatus:  # noqa: N802
        return agent_pb2.ModelStatus(model_id=request.model_id, state=agent_pb2.MODEL_STATE_ABSENT)


@contextmanager
def key_giving_agent(key: bytes) -> Iterator[str]:
    """A stand-in agent that gives every caller `key`; yields its address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    agent_pb2_grpc.add_AgentServicer_to_server(_KeyGivingAgent(key), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


@contextmanager
def running_full_path(
    upstream: Upstream,
    extra: list[str],
    work: Path,
    root: Path = ROOT,
    wrapper: Sequence[str] = (),
    timeout: float = 30.0,
    private_name: str = "",
    model_id: str = MODEL,
) -> Iterator[Hop]:
    """A model pod's full path: the gateway (its command prefixed by `wrapper`) in front of
    `upstream`, and a proxy (flags `extra`) sending to it from POD_ADDRESS, both from `root`, for
    `model_id`; the gateway maps it to `private_name` in Triton when one is given. The proxy gets
    its caller key from a stand-in agent and presents it on each connection (a proxy of a tree
    before keys presents none and is known by its address). The hop's CPU figures are the
    gateway's, then the proxy's."""
    key = secrets.token_bytes(32)
    token = work / "token"
    token.write_text("bench-token\n")
    with contextlib.ExitStack() as stack:
        agent = stack.enter_context(key_giving_agent(key))
        gateway = stack.enter_context(
            running_gateway(upstream, work, root, wrapper, timeout, private_name, model_id, key)
        )
        proxy = stack.enter_context(
            running_proxy(
                (gateway.rest, gateway.grpc),
                [
                    *extra,
                    "--source-address",
                    POD_ADDRESS,
                    "--agent-address",
                    agent,
                    "--token-file",
                    str(token),
                ],
                root,
                timeout=timeout,
                model_id=model_id,
            )
        )
        yield Hop(proxy.rest, proxy.grpc, gateway.cpu + proxy.cpu)


@contextmanager
def running_chain(
    upstream: Upstream,
    extra: list[str],
    root: Path = ROOT,
    wrapper: Sequence[str] = (),
    timeout: float = 30.0,
) -> Iterator[Hop]:
    """The bare relay (its command prefixed by `wrapper`) in front of `upstream`, behind a proxy
    (flags `extra`) from `root`: a relay in the place the gateway has in the full path. The hop's
    CPU figures are the relay's, then the proxy's."""
    with contextlib.ExitStack() as stack:
        relay = stack.enter_context(running_floor(upstream, wrapper, timeout))
        front = (relay.rest, relay.grpc)
        proxy = stack.enter_context(running_proxy(front, extra, root, timeout=timeout))
        yield Hop(proxy.rest, proxy.grpc, relay.cpu + proxy.cpu)


def source_trees(use_native: bool, baseline: Path | None) -> tuple[Path, Path | None]:
    """The tree the measured proxy and gateway run from (the native build with `use_native`,
    else this one) and the baseline tree, resolved. The native build is brought up to date first
    when either is it, and must then import its compiled modules: `python -m` puts the working
    directory first on the path, ahead of any PYTHONPATH."""
    tree = native.DEFAULT_OUT if use_native else ROOT
    resolved = baseline.resolve() if baseline is not None else None
    if native.DEFAULT_OUT in (tree, resolved):
        print("Building the native proxy (python -m proxy.native)...", file=sys.stderr)
        native.build()
        probe = [sys.executable, "-c", "import proxy.http1.relay as m; print(m.__file__)"]
        found = subprocess.run(
            probe, cwd=native.DEFAULT_OUT, capture_output=True, text=True, check=False
        )
        if not found.stdout.strip().endswith(".so"):
            raise RuntimeError(f"{native.DEFAULT_OUT} does not run compiled: {found}")
    return tree, resolved


def _stop(process: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM, as a pod is stopped; kill after `grace` seconds."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port} after {timeout:.0f} s")


_SCHEDSTAT = Path("/proc/self/schedstat").exists()


def resident_mib(pid: int) -> float:
    """The resident memory of process `pid` (VmRSS), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    """CPU time of process `pid` so far (Linux /proc): the time its threads have run, to the
    nanosecond (`task/*/schedstat`), where user + system time from `stat` counts in clock ticks
    (10 ms: a few percent of one run's figure here). `stat` only on a kernel without schedstat.
    A thread that has ended leaves the sum; the hops measured here start none per request."""
    if not _SCHEDSTAT:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    nanoseconds = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            nanoseconds += int((task / "schedstat").read_text().split()[0])
    return nanoseconds / 1e9


def box_cpu_seconds() -> tuple[float, float]:
    """CPU seconds the whole box and this benchmark (this process, every process under it, and
    those it has waited for: Triton, the hops, the load generators) have used so far: their
    difference over a round is the load from outside the benchmark, other work on a shared box,
    which is what widens the intervals (/proc/stat; steal time, the hypervisor's, is left out)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[:7])
    box = (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")
    me = psutil.Process()
    own = sum(me.cpu_times()[:4])  # user, system, and the children's it waited for
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # one that ended meanwhile
            own += sum(child.cpu_times()[:4])
    return box, own


def wrk(address: str, concurrency: int, seconds: float, script: Path) -> tuple[float, float]:
    """(median latency in ms, requests per second) of one wrk run."""
    out = subprocess.run(
        [
            "wrk",
            "-t",
            "1" if concurrency == 1 else "2",
            "-c",
            str(concurrency),
            "-d",
            f"{seconds:g}s",
            "--latency",
            "-s",
            str(script),
            f"http://{address}/v2/models/{MODEL}/infer",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    if "Non-2xx" in out:
        raise RuntimeError(f"wrk saw errors:\n{out}")
    median = re.search(r"^\s+50%\s+([\d.]+)(us|ms|s)\s*$", out, re.MULTILINE)
    rate = re.search(r"^Requests/sec:\s+([\d.]+)", out, re.MULTILINE)
    if median is None or rate is None:
        raise RuntimeError(f"cannot read wrk's output:\n{out}")
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}[median[2]]
    return float(median[1]) * scale, float(rate[1])


def h2load(
    address: str, concurrency: int, seconds: float, data: Path, log: Path
) -> tuple[float, float]:
    """(median latency in ms, requests per second) of one h2load run with a gRPC request."""
    out = subprocess.run(
        [
            "h2load",
            "-c",
            str(concurrency),
            "-m",
            "1",
            "-t",
            "1",
            "-D",
            f"{seconds:g}",
            "-d",
            str(data),
            "-H",
            "content-type: application/grpc",
            "-H",
            "te: trailers",
            "--log-file",
            str(log),
            f"http://{address}/inference.GRPCInferenceService/ModelInfer",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rate = re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", out)
    failed = re.search(r"(\d+) failed", out)
    if rate is None or failed is None:
        raise RuntimeError(f"cannot read h2load's output:\n{out}")
    if int(failed[1]):
        raise RuntimeError(f"h2load saw failed requests:\n{out}")
    # Log lines: start time (us), status, elapsed (us).
    elapsed = [int(line.split()[2]) for line in log.read_text().splitlines() if line.strip()]
    return statistics.median(elapsed) / 1000, float(rate[1])


def hey(address: str, seconds: float, body: Path) -> float:
    """Mean time per request in ms of one hey run at concurrency 1 (from its request rate: its
    latency figures have 0.1 ms steps, too coarse for the targets)."""
    out = subprocess.run(
        [
            "hey",
            "-c",
            "1",
            "-z",
            f"{seconds:g}s",
            "-m",
            "POST",
            "-T",
            "application/json",
            "-D",
            str(body),
            f"http://{address}/v2/models/{MODEL}/infer",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rate = re.search(r"^\s*Requests/sec:\s+([\d.]+)", out, re.MULTILINE)
    statuses = re.findall(r"^\s*\[(\d+)\]\s+\d+ responses", out, re.MULTILINE)
    if rate is None or statuses != ["200"] or "Error distribution" in out:
        raise RuntimeError(f"hey saw errors, or its output cannot be read:\n{out}")
    return 1000 / float(rate[1])


def grpc_client_latency(
    address: str, request: bytes, seconds: float, pids: Sequence[int] = ()
) -> tuple[float, list[float]]:
    """Median latency in ms of back-to-back ModelInfer calls from one blocking grpc client: a
    second view of gRPC at concurrency 1, since h2load times HTTP/2 streams, not gRPC calls.
    With it, the CPU time per call in us of each process of `pids` over the same calls."""
    times = []
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer", None, None)
        call(request, timeout=10)
        before = [cpu_seconds(pid) for pid in pids]
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            call(request, timeout=10)
            times.append(time.perf_counter() - started)
        spent = [
            (cpu_seconds(pid) - b) / len(times) * 1e6 for pid, b in zip(pids, before, strict=True)
        ]
    return statistics.median(times) * 1000, spent


def check_grpc(address: str, request: bytes) -> None:
    """Send the benchmark's gRPC request once and make sure it succeeds."""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer", None, None)
        response = service_pb2.ModelInferResponse.FromString(call(request, timeout=10))
        assert response.model_name == MODEL, response


MEASURES = ("rest1", "hey1", "rest16", "h2c1", "grpc16", "grpc1")
"""Every measure of a round, in the order they run; "hey1" only with --hey."""


class Loads:
    """The load generators' inputs, and one measure against one hop."""

    def __init__(self, work: Path, seconds: float) -> None:
        self.seconds = seconds
        self.script = work / "post.lua"
        self.script.write_text(
            'wrk.method = "POST"\n'
            f"wrk.body = {json.dumps(REST_BODY)}\n"
            'wrk.headers["Content-Type"] = "application/json"\n'
        )
        self.body = work / "infer.json"
        self.body.write_text(REST_BODY)
        self.message = grpc_request()
        self.framed = work / "infer.grpc"
        self.framed.write_bytes(b"\x00" + struct.pack(">I", len(self.message)) + self.message)
        self.log = work / "h2load.log"

    def warm_up(self, hop: Hop, rest: bool, with_hey: bool) -> None:
        """Every load once, c=16 too: a proxy's pool of upstream connections grows to 16 before
        the first round (else the first round pays its connects, to the gateway's accept loop
        in the full path)."""
        check_grpc(hop.grpc, self.message)
        if rest:
            wrk(hop.rest, 1, 1, self.script)
            wrk(hop.rest, 16, 1, self.script)
            if with_hey:
                hey(hop.rest, 1, self.body)
        h2load(hop.grpc, 1, 1, self.framed, self.log)
        h2load(hop.grpc, 16, 1, self.framed, self.log)

    def measure(self, results: Results, measure: str, name: str, hop: Hop) -> None:
        """One figure of `measure` through `hop`: c=1 latency, or c=16 throughput with the CPU
        time per request of each of the hop's processes."""

        def record(key: str, hop_name: str, figure: float) -> None:
            results.setdefault((key, hop_name), []).append(figure)

        if measure == "rest1":
            record(measure, name, wrk(hop.rest, 1, self.seconds, self.script)[0])
        elif measure == "hey1":
            record(measure, name, hey(hop.rest, self.seconds, self.body))
        elif measure == "h2c1":
            record(measure, name, h2load(hop.grpc, 1, self.seconds, self.framed, self.log)[0])
        elif measure == "grpc1":
            # With the CPU each of the hop's processes spent per call: at c=1 a call waits for
            # every hop's work on it, so a hop's added latency is mostly this, and it does not
            # move with the box's noise as the latency does (an explaining counter).
            pids = [pid for _, pid in hop.cpu]
            latency, per_calls = grpc_client_latency(hop.grpc, self.message, self.seconds, pids)
            record(measure, name, latency)
            for index, ((process, _), per_call) in enumerate(zip(hop.cpu, per_calls, strict=True)):
                record("grpc1cpu", name if index == 0 else f"{name}:{process}", per_call)
        else:
            before = [cpu_seconds(pid) for _, pid in hop.cpu]
            if measure == "rest16":
                rate = wrk(hop.rest, 16, self.seconds, self.script)[1]
            else:
                rate = h2load(hop.grpc, 16, self.seconds, self.framed, self.log)[1]
            record(measure, name, rate)
            for index, ((process, pid), spent) in enumerate(zip(hop.cpu, before, strict=True)):
                per_request = (cpu_seconds(pid) - spent) / (rate * self.seconds) * 1e6
                record(
                    measure[:4] + "cpu", name if index == 0 else f"{name}:{process}", per_request
                )


def _paired(
    results: Results, measure: str, name: str, kept: bool, base: str = "direct"
) -> list[float]:
    """Per-round figures of `name` against `base` (Triton directly) in the same round."""
    pairs = zip(results[(measure, name)], results[(measure, base)], strict=True)
    return [p / d if kept else p - d for p, d in pairs]


def median_interval(figures: list[float], resamples: int = 2000) -> tuple[float, float]:
    """A 95% bootstrap interval of the median of `figures` (seeded: the same figures give the
    same interval): where the median of another run of as many rounds would likely fall."""
    rng = random.Random(0)
    medians = sorted(
        statistics.median(rng.choices(figures, k=len(figures))) for _ in range(resamples)
    )
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def _verdict(ok: bool, seen: list[bool]) -> str:
    """A target's verdict, `ok` kept in `seen` for the exit status (`benchmarks.goals`)."""
    seen.append(ok)
    return "met" if ok else "NOT MET"


HOST_ADDED_GOAL_MS = 0.05
"""With --models: the host's proxy adds at most this over the one-model proxy at c=1."""
HOST_RSS_GOAL_MIB = 150.0
"""With --models: the host's proxy's resident memory after warm-up, at most."""


# (title, measure, hops, added-latency target in ms, kept-throughput target, target against the
# bare relay of the same rounds: ms added over it at c=1, or the share of its throughput at c=16)
_ROWS = [
    ("REST c=1 latency, wrk", "rest1", ["floor", "relay"], 0.25, None, 0.05),
    ("REST c=1 latency, hey (mean)", "hey1", ["floor", "relay"], 0.25, None, 0.05),
    (
        "gRPC c=1 latency, python grpc client",
        "grpc1",
        ["floor", "relay", "grpcio"],
        0.20,
        None,
        0.08,
    ),
    ("gRPC c=1 latency, h2load's framing", "h2c1", ["floor", "relay", "grpcio"], None, None, 0.08),
    ("REST c=16 throughput, wrk", "rest16", ["floor", "relay"], None, 0.85, 0.95),
    ("gRPC c=16 throughput, h2load", "grpc16", ["floor", "relay", "grpcio"], None, 0.70, 0.90),
]
_CPU_TARGETS = {"restcpu": 1.15, "grpccpu": 1.3}
"""The proxy's CPU per request at c=16 as a multiple of the bare relay's."""

# (title, measure, most ms the full path may add at c=1 over the proxy alone; None: throughput)
_GATEWAY_ROWS = [
    ("REST c=1, wrk", "rest1", 0.15),
    ("REST c=1, hey (mean)", "hey1", 0.15),
    ("gRPC c=1, python grpc client", "grpc1", 0.12),
    ("gRPC c=1, h2load", "h2c1", 0.12),
    ("REST c=16, wrk", "rest16", None),
    ("gRPC c=16, h2load", "grpc16", None),
]
_GATEWAY_CPU_TARGET = 1.3
"""The gateway's CPU per request at c=16 as a multiple of the bare relay's."""


def _label(measure: str, name: str) -> str:
    if name == "host":
        return "proxy, host of --models"
    if name == "floor":
        return "bare TCP relay (floor)"
    if name == "baseline":
        return "proxy from --baseline-tree"
    if name == "chain":
        return "proxy + bare relay"
    if name == "full":
        return "proxy + gateway (full path)"
    if name == "fullbase":
        return "full path, --baseline-tree"
    return (
        "proxy" if measure.startswith("rest") or measure == "hey1" else f"proxy, --grpc-mode {name}"
    )


def _figure(figures: list[float], latency: bool) -> str:
    """The median of per-round figures with its interval and range, in ms added or share kept."""
    value = statistics.median(figures)
    low, high = median_interval(figures)
    if latency:
        return f"{value:+.3f} ms (95% CI {low:+.3f} .. {high:+.3f})"
    return f"{value:.1%} (95% CI {low:.0%} .. {high:.0%})"


def report(results: Results, rounds: int, seconds: float) -> list[bool]:
    """Print every figure, and each target's verdict on the medians over rounds; the
    verdicts."""
    seen: list[bool] = []
    print(
        f"proxy benchmark: {rounds} rounds of {seconds:g} s; each round every measure against "
        f"Triton directly and every hop back to back; medians over rounds of per-round figures; "
        f"cpus={os.cpu_count()}"
    )
    if ("others", "box") in results:
        others = results[("others", "box")]
        print(
            f"others: work outside this benchmark took {statistics.median(others):.0%} of the "
            f"box's CPU during the rounds (rounds {min(others):.0%} .. {max(others):.0%}); "
            "the more, the wider the intervals"
        )
    for title, measure, names, added_target, kept_target, floor_target in _ROWS:
        if (measure, "direct") not in results:
            continue
        names = [
            n
            for n in [*names, "host", "chain", "full", "fullbase", "baseline"]
            if (measure, n) in results
        ]
        has_floor = (measure, "floor") in results
        direct = statistics.median(results[(measure, "direct")])
        latency = added_target is not None or measure.endswith("1")
        print(
            f"\n{title}: direct {direct:.3f} ms" if latency else f"\n{title}: direct {direct:.0f}/s"
        )
        for name in names:
            figures = _paired(results, measure, name, kept=not latency)
            value = statistics.median(figures)
            if latency:
                low, high = median_interval(figures)
                line = (
                    f"added {value:+.3f} ms (95% CI {low:+.3f} .. {high:+.3f}; "
                    f"rounds {min(figures):+.3f} .. {max(figures):+.3f})"
                )
                if added_target is not None and name in ("relay", "grpcio", "baseline"):
                    line += (
                        f"  target <= {added_target} ms: {_verdict(value <= added_target, seen)}"
                    )
            else:
                low, high = median_interval(figures)
                line = (
                    f"kept {value:6.1%} (95% CI {low:.0%} .. {high:.0%}; "
                    f"rounds {min(figures):.0%} .. {max(figures):.0%})"
                )
                if kept_target is not None and name in ("relay", "grpcio", "baseline"):
                    line += f"  target >= {kept_target:.0%}: {_verdict(value >= kept_target, seen)}"
            if name != "floor" and has_floor:  # what the hop costs beyond the floor
                against = _paired(results, measure, name, not latency, "floor")
                beyond = statistics.median(against)
                low, high = median_interval(against)
                if latency:
                    line += f"; {beyond:+.3f} ms over the bare relay ({low:+.3f} .. {high:+.3f})"
                    ok = beyond <= floor_target
                    target = f"<= +{floor_target} ms"
                else:
                    line += f"; {beyond:.0%} of the bare relay ({low:.0%} .. {high:.0%})"
                    ok = beyond >= floor_target
                    target = f">= {floor_target:.0%}"
                if name == "relay":
                    line += f"  target {target}: {_verdict(ok, seen)}"
            if name == "host" and latency and (measure, "relay") in results:
                more = statistics.median(_paired(results, measure, "host", False, "relay"))
                ok = more <= HOST_ADDED_GOAL_MS
                line += (
                    f"; {more:+.3f} ms over the one-model proxy  target <= +{HOST_ADDED_GOAL_MS} "
                    f"ms: {_verdict(ok, seen)}"
                )
            print(f"  {_label(measure, name):28} {line}")
    _report_cpu(results, seen)
    _report_gateway(results, seen)
    print(headline(results))
    return seen


def headline(results: Results) -> str:
    """One line: per protocol, what the proxy and the full path add over Triton directly at c=1
    (and the proxy over the bare relay), and the throughput each keeps of Triton's at c=16;
    medians of per-round figures, of the hops measured."""
    parts = []
    for protocol, latency, throughput in (("REST", "rest1", "rest16"), ("gRPC", "grpc1", "grpc16")):
        said = []
        for name, label in (("relay", "proxy"), ("full", "full path")):
            if (latency, name) in results and (latency, "direct") in results:
                added = statistics.median(_paired(results, latency, name, False))
                said.append(f"{label} +{added:.3f} ms" if added >= 0 else f"{label} {added:.3f} ms")
        if (latency, "relay") in results and (latency, "floor") in results:
            beyond = statistics.median(_paired(results, latency, "relay", False, "floor"))
            said.append(f"the proxy {beyond:+.3f} ms over the bare relay")
        kept = [
            f"{label} {statistics.median(_paired(results, throughput, name, True)):.0%}"
            for name, label in (("relay", "proxy"), ("full", "full path"))
            if (throughput, name) in results and (throughput, "direct") in results
        ]
        if kept:
            said.append(f"c=16 kept of Triton's: {', '.join(kept)}")
        if said:
            parts.append(f"{protocol} c=1 over Triton directly: {', '.join(said)}")
    return "proxy_latency: " + ("; ".join(parts) or "no hop measured beside Triton directly")


def _report_cpu(results: Results, seen: list[bool]) -> None:
    print("\nCPU time per request (the hop's own process, from /proc), at c=16 unless said:")
    for measure in ("restcpu", "grpccpu"):
        names = ["floor", "relay", "host", "grpcio", "baseline", "chain", "full", "chain:proxy"]
        names += ["full:proxy", "fullbase"]
        per_hop = [
            f"{n} {statistics.median(results[(measure, n)]):.0f} us"
            for n in names
            if (measure, n) in results
        ]
        if not per_hop:
            continue
        line = f"  {'REST' if measure == 'restcpu' else 'gRPC'}: {', '.join(per_hop)}"
        if (measure, "relay") in results and (measure, "floor") in results:
            ratio = statistics.median(_paired(results, measure, "relay", True, "floor"))
            most = _CPU_TARGETS[measure]
            line += (
                f"; relay {ratio:.2f}x the bare relay (median of rounds)  target <= {most}x: "
                f"{_verdict(ratio <= most, seen)}"
            )
        print(line)
        if (measure, "relay") in results and (measure, "baseline") in results:
            times = statistics.median(_paired(results, measure, "relay", True, "baseline"))
            print(f"    relay {times:.2f}x the --baseline-tree proxy's CPU (median of rounds)")
        if (measure, "relay") in results and (measure, "host") in results:
            times = statistics.median(_paired(results, measure, "host", True, "relay"))
            print(f"    host {times:.2f}x the one-model proxy's CPU (median of rounds)")
    names = ["floor", "relay", "host", "grpcio", "baseline", "chain", "full", "chain:proxy"]
    names += ["full:proxy", "fullbase"]
    per_call = [
        f"{n} {statistics.median(results[('grpc1cpu', n)]):.0f} us"
        for n in names
        if ("grpc1cpu", n) in results
    ]
    if per_call:
        # At c=1 a call waits for each hop's work on it: a hop's latency over the bare relay's
        # follows its CPU over the bare relay's (the gateway's gRPC figure).
        print(f"  gRPC c=1, per call (python grpc client): {', '.join(per_call)}")
    print(
        "  (chain: the bare relay behind the proxy; full: the gateway; chain:proxy, full:proxy: "
        "the proxy in front of them)"
    )


def _report_gateway(results: Results, seen: list[bool]) -> None:
    """The full path against the proxy alone, the proxy + one bare relay, and the
    gateway's CPU against the bare relay's, all paired by round."""
    if ("grpc1", "full") not in results:
        return
    print(
        "\nThe full path (client -> proxy -> gateway -> Triton), per-round differences at c=1 "
        "and ratios at c=16:"
    )
    for title, measure, most in _GATEWAY_ROWS:
        if (measure, "full") not in results:
            continue
        latency = most is not None
        parts = []
        if (measure, "relay") in results:
            figures = _paired(results, measure, "full", not latency, "relay")
            part = f"vs the proxy alone {_figure(figures, latency)}"
            if most is not None:
                ok = statistics.median(figures) <= most
                part += f" target <= +{most} ms: {_verdict(ok, seen)}"
            parts.append(part)
        if (measure, "chain") in results:
            figures = _paired(results, measure, "full", not latency, "chain")
            value = statistics.median(figures)
            low, high = median_interval(figures)
            ok = value <= 0 if latency else value >= 1
            noise = low <= 0 <= high if latency else low <= 1 <= high
            verdict = "yes" if ok else "no, within noise" if noise else "no"
            parts.append(
                f"vs proxy + bare relay {_figure(figures, latency)} (at most one bare relay hop "
                f"more: {verdict})"
            )
        if parts:
            print(f"  {title:30} " + "; ".join(parts))
        if (measure, "chain") in results and (measure, "relay") in results:
            hop = _paired(results, measure, "chain", not latency, "relay")
            print(f"  {'':30} (one bare relay hop behind the proxy: {_figure(hop, latency)})")
    if ("grpc1cpu", "full") in results and ("grpc1cpu", "chain") in results:
        # The explaining counter: the gateway's CPU per call over the bare relay's in
        # the same place, next to the latency the gateway adds over that relay.
        cpu = _paired(results, "grpc1cpu", "full", False, "chain")
        added = _paired(results, "grpc1", "full", False, "chain")
        print(
            f"  gRPC c=1, python grpc client: the gateway's CPU per call "
            f"{statistics.median(results[('grpc1cpu', 'full')]):.0f} us, "
            f"{statistics.median(cpu):+.0f} us over the bare relay's behind the proxy, which it "
            f"adds {statistics.median(added) * 1000:+.0f} us of latency over"
        )
    print("The gateway's CPU time per request at c=16 (from /proc), per-round ratios:")
    for measure, protocol in (("restcpu", "REST"), ("grpccpu", "gRPC")):
        if (measure, "full") not in results:
            continue
        gateway = statistics.median(results[(measure, "full")])
        line = f"  {protocol}: gateway {gateway:.0f} us"
        if (measure, "relay") in results:  # the gateway runs the proxy's relay code
            ratios = _paired(results, measure, "full", True, "relay")
            line += f" ({statistics.median(ratios):.2f}x the proxy alone's)"
        if (measure, "floor") in results:
            ratios = _paired(results, measure, "full", True, "floor")
            value = statistics.median(ratios)
            low, high = median_interval(ratios)
            floor = statistics.median(results[(measure, "floor")])
            line += (
                f"; the bare relay {floor:.0f} us: {value:.2f}x ({low:.2f} .. {high:.2f}) "
                f"target <= {_GATEWAY_CPU_TARGET}x: "
                f"{_verdict(value <= _GATEWAY_CPU_TARGET, seen)}"
            )
        if (measure, "chain") in results:
            ratios = _paired(results, measure, "full", True, "chain")
            chain = statistics.median(results[(measure, "chain")])
            line += (
                f"; the bare relay behind the proxy {chain:.0f} us: "
                f"{statistics.median(ratios):.2f}x"
            )
        if (measure, "full:proxy") in results and (measure, "relay") in results:
            ratios = _paired(results, measure, "full:proxy", True, "relay")
            line += f"; the proxy in front of it {statistics.median(ratios):.2f}x the proxy alone"
        if (measure, "fullbase") in results:
            ratios = _paired(results, measure, "full", True, "fullbase")
            value = statistics.median(ratios)
            low, high = median_interval(ratios)
            line += f"; {value:.2f}x ({low:.2f} .. {high:.2f}) the --baseline-tree gateway's"
        print(line)
    for title, measure, most in _GATEWAY_ROWS:
        if (measure, "fullbase") in results and (measure, "full") in results:
            latency = most is not None
            figures = _paired(results, measure, "full", not latency, "fullbase")
            print(f"  {title:30} vs the --baseline-tree full path {_figure(figures, latency)}")


def load_results(saved: list[Path]) -> Results:
    """The per-round figures of `--save` files, each measure's rounds of every file in turn."""
    files = [json.loads(path.read_text()) for path in saved]
    common = set.intersection(*(set(figures) for figures in files))
    results: Results = {}
    for key in sorted(common):
        measure, hop = key.split(" ", 1)
        results[(measure, hop)] = [value for figures in files for value in figures[key]]
    return results


HOPS = ("floor", "relay", "grpcio", "chain", "full")
"""Every hop beside Triton directly: the bare relay, the two proxies, the proxy + a bare relay,
and the full path through the gateway."""


def main() -> int:
    parser = command_line(
        "proxy_latency",
        (
            "Measures what the proxy and the path through the node gateway add over Triton "
            "directly: added median latency at concurrency 1 and kept throughput at 16, REST "
            "and gRPC, in --rounds rounds of --seconds each beside a bare TCP relay; --paths "
            "picks the paths, --baseline-tree and --native compare builds."
        ),
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--seconds", type=int, default=2, help="whole seconds of each load run (wrk's unit)"
    )
    parser.add_argument(
        "--paths",
        default=",".join(HOPS),
        help=f"comma-separated hops to measure beside Triton directly, of {','.join(HOPS)}",
    )
    parser.add_argument("--hey", action="store_true", help="also time REST at c=1 with hey")
    parser.add_argument(
        "--save", type=Path, help="write every per-round figure here as JSON, to look at later"
    )
    parser.add_argument("--proxy-arg", action="append", default=[], help="extra proxy flag")
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        help="another source tree (e.g. `git archive` of an older commit): its proxy runs as one "
        "more hop (relay mode) in the same rounds, for a before/after the box's noise cannot skew",
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="run the proxy and the gateway from the native build (`python -m proxy.native`, "
        "built first when it is missing or older than the sources); a --baseline-tree of "
        "build/native is brought up to date the same way",
    )
    parser.add_argument(
        "--private-name",
        default="",
        help="the full path's gateway maps the model id to this private name in Triton, where "
        "the model is loaded under it too; default: none",
    )
    parser.add_argument(
        "--models",
        type=int,
        default=0,
        help="also measure a model host's proxy (relay mode) whose table holds add_one and "
        "N-1 idle models, and print both proxies' resident memory; default: none",
    )
    parser.add_argument(
        "--report",
        type=Path,
        nargs="+",
        metavar="SAVED",
        help="measure nothing: print the report of figures written by --save, the rounds of "
        "several files (runs of the same code) pooled; only measures every file has count",
    )
    results_page.add_flag(parser)
    goals.add_flag(parser)
    args = parser.parse_args()
    with results_page.captured() as printed:
        code = run(parser, args)
    if code in (0, 1) and args.write_results is not None:  # measured, met or not
        results_page.record("proxy_latency", printed.getvalue(), page=args.write_results)
    return code


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.report:
        saved = load_results(args.report)
        seen = report(saved, len(saved[("grpc1", "direct")]), args.seconds)
        return goals.exit_code(seen, args.no_goal)
    paths = [p for p in args.paths.split(",") if p]
    if not paths or set(paths) - set(HOPS):
        parser.error(f"--paths {args.paths!r}: name hops of {','.join(HOPS)}")
    for tool in ("wrk", "h2load", *(["hey"] if args.hey else [])):
        if shutil.which(tool) is None:
            print(f"{tool} is missing: apt-get install -y wrk nghttp2-client hey", file=sys.stderr)
            return 2
    measures = [m for m in MEASURES if args.hey or m != "hey1"]
    tree, baseline = source_trees(args.native, args.baseline_tree)
    results: Results = {}
    memory: list[bool] = []
    relay_mode = [*args.proxy_arg, "--grpc-mode", "relay"]
    with tempfile.TemporaryDirectory(prefix="proxy-bench-") as tmp:
        loads = Loads(Path(tmp), args.seconds)
        with (
            running_triton(Path(tmp), args.private_name) as triton,
            contextlib.ExitStack() as stack,
        ):
            triton_urls = (triton.http_url, triton.grpc_url)
            hops: dict[str, Hop] = {"direct": Hop(*triton_urls)}
            if "floor" in paths:
                hops["floor"] = stack.enter_context(
                    running_floor(triton_urls, compiled=args.native)
                )
                if args.native:
                    print("the bare relay (floor) runs compiled, as the proxy and gateway do")
            if "relay" in paths:
                hops["relay"] = stack.enter_context(running_proxy(triton_urls, relay_mode, tree))
            if "chain" in paths:
                hops["chain"] = stack.enter_context(running_chain(triton_urls, relay_mode, tree))
            if "full" in paths:
                hops["full"] = stack.enter_context(
                    running_full_path(
                        triton_urls, relay_mode, Path(tmp), tree, private_name=args.private_name
                    )
                )
            if "grpcio" in paths:
                grpcio = [*args.proxy_arg, "--grpc-mode", "grpcio"]
                hops["grpcio"] = stack.enter_context(running_proxy(triton_urls, grpcio, tree))
            if baseline is not None:
                hops["baseline"] = stack.enter_context(
                    running_proxy(triton_urls, relay_mode, baseline)
                )
            if baseline is not None and "full" in paths:
                base_work = Path(tmp) / "fullbase"
                base_work.mkdir()
                hops["fullbase"] = stack.enter_context(
                    running_full_path(
                        triton_urls,
                        relay_mode,
                        base_work,
                        baseline,
                        private_name=args.private_name,
                    )
                )
            if args.models > 0:
                table = Path(tmp) / "hosted-models"
                idle = [f"idle-{n}" for n in range(1, args.models)]
                table.write_text(json.dumps([{"model": m} for m in [MODEL, *idle]]))
                hops["host"] = stack.enter_context(
                    running_proxy(triton_urls, relay_mode, tree, models_file=table)
                )
            for name, hop in hops.items():
                loads.warm_up(hop, rest=name != "grpcio", with_hey=args.hey)
            for name in ("relay", "host"):
                if name in hops and args.models > 0:
                    models = 1 if name == "relay" else args.models
                    rss = resident_mib(hops[name].cpu[0][1])
                    print(f"{name}: {models} models, RSS {rss:.1f} MiB after warm-up")
                    if name == "host":
                        memory.append(goals.check(f"the host's proxy's RSS, {models} models",
                                                  rss, HOST_RSS_GOAL_MIB, unit=" MiB"))  # fmt: skip
            turn = 0
            for round_number in range(args.rounds):
                box, own = box_cpu_seconds()
                started = time.monotonic()
                for measure in measures:
                    order = list(hops.items())
                    if turn % 2:
                        order.reverse()  # no hop always runs first, or last
                    turn += 1
                    for name, hop in order:
                        rest = measure in ("rest1", "hey1", "rest16")
                        if rest and name == "grpcio":
                            continue  # its REST is the relay proxy's code
                        loads.measure(results, measure, name, hop)
                box_after, own_after = box_cpu_seconds()
                capacity = (time.monotonic() - started) * (os.cpu_count() or 1)
                others = max(0.0, (box_after - box) - (own_after - own)) / capacity
                results.setdefault(("others", "box"), []).append(others)
                print(f"round {round_number + 1}/{args.rounds} done", file=sys.stderr)
    if args.save is not None:
        figures = {f"{measure} {hop}": values for (measure, hop), values in results.items()}
        args.save.write_text(json.dumps(figures, indent=1))
    seen = report(results, args.rounds, args.seconds)
    return goals.exit_code([*memory, *seen], args.no_goal)


if __name__ == "__main__":
    sys.exit(main())
