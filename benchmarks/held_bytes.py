"""Benchmark: the node gateway's memory under many pods holding partial messages, with and without
its byte budget (`--max-buffered-bytes`), in one run.

Starts a real Triton serving add_one and, in turn, two gateway processes from this tree (`python -m
proxy.gateway`, the manifests' `--max-connections-per-pod=64`): one with no budget
(`--max-buffered-bytes=0`, as with no budget) and one with `--budget`. Against each, a
victim pod (its own source address) calls add_one over REST one request after another, alone for
a few seconds and then while `--pods` attacker pods (each its own 127.2.0.x address) each open
`--connections` connections of `--streams` ModelInfer streams, every stream sending all of a
16 KiB message but its last 384 bytes, and keep them open for `--seconds`. Printed per gateway:
its RSS before and its peak during the attack (sampled every 5 ms), what the attack would hold
unbounded, the victim's p50/p99 alone and under attack and its errors, and how many attacker
streams were answered RESOURCE_EXHAUSTED by the budget.

The goals (checked unless `--no-goal`): the budgeted gateway grows by at most twice its budget
(what it holds, plus what it reads before it pauses), and the victim gets no error from either.

    .venv/bin/python -m benchmarks.held_bytes [--pods 8] [--connections 8] [--streams 128]
        [--budget 32Mi] [--seconds 5] [--tree DIR] [--no-goal]

About a minute on a 2-core box with the defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import hpack
import psutil

from benchmarks import command_line, goals
from benchmarks import results as results_page
from benchmarks.proxy_latency import ROOT, _stop, _wait_http, running_triton
from common.callers import Caller, CallerTable, write_table
from common.quantity import parse_quantity
from sim.triton import free_port

MODEL = "add_one"
VICTIM = "127.2.0.1"
MESSAGE = 16 * 1024
SHORT = 384
INFER = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
).encode()


def _frame(kind: int, flags: int, sid: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + sid.to_bytes(4, "big") + payload


def held_streams(authority: str, streams: int) -> bytes:
    """The HTTP/2 preface and `streams` ModelInfer calls, each all of a MESSAGE-byte message but
    its last SHORT bytes."""
    block = hpack.Encoder().encode(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/inference.GRPCInferenceService/ModelInfer"),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
    )
    body = MESSAGE - 5
    name = b"\x0a" + bytes([len(MODEL)]) + MODEL.encode()
    fill = body - len(name) - 3
    message = name + b"\x3a" + bytes([fill & 0x7F | 0x80, fill >> 7]) + bytes(fill)
    sent = (b"\x00" + body.to_bytes(4, "big") + message)[: MESSAGE - SHORT]
    frames = [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", _frame(4, 0, 0, b"")]
    for sid in range(1, 2 * streams, 2):
        frames += [_frame(1, 4, sid, block), _frame(0, 0, sid, sent)]
    return b"".join(frames)


@dataclass
class Gateway:
    process: subprocess.Popen[bytes]
    http_url: str
    grpc_url: str


@contextlib.contextmanager
def running_gateway(
    work: Path, upstream: tuple[str, str], attackers: list[str], budget: int, tree: Path
) -> Iterator[Gateway]:
    table = work / f"callers-{budget}.json"
    callers = [Caller(VICTIM, MODEL, "bench/victim", "uid-victim")]
    callers += [
        Caller(a, MODEL, f"bench/attacker-{i}", f"uid-{a}") for i, a in enumerate(attackers)
    ]
    write_table(table, CallerTable("bench-node", time.time(), tuple(callers)))
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    command = [sys.executable, "-m", "proxy.gateway", "--caller-table", str(table)]
    command += ["--triton-http-url", upstream[0], "--triton-grpc-url", upstream[1]]
    command += ["--listen-http", f"127.0.0.1:{http_port}", "--listen-grpc"]
    command += [f"127.0.0.1:{grpc_port}", "--listen-metrics", f"127.0.0.1:{metrics_port}"]
    command += ["--table-max-age", "100000", "--log-level", "ERROR"]
    command += ["--max-connections-per-pod", "64", "--max-buffered-bytes", str(budget)]
    process = subprocess.Popen(command, cwd=tree)  # `-m proxy.gateway` from under `tree`
    try:
        _wait_http(f"http://127.0.0.1:{metrics_port}/readyz", 60)
        yield Gateway(process, f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}")
    finally:
        _stop(process, 30)


@dataclass
class Victim:
    url: str
    stop: threading.Event = field(default_factory=threading.Event)
    latencies: list[float] = field(default_factory=list)
    errors: int = 0

    def run(self) -> None:
        host, port = self.url.split(":")
        connection = http.client.HTTPConnection(host, int(port), 30, source_address=(VICTIM, 0))
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                connection.request("POST", f"/v2/models/{MODEL}/infer", body=INFER)
                response = connection.getresponse()
                response.read()
                ok = response.status == 200
            except OSError:
                connection.close()
                ok = False
            if ok:
                self.latencies.append(time.monotonic() - started)
            else:
                self.errors += 1


def attacker(
    url: str, source: str, streams: int, stop: threading.Event, refused: list[int]
) -> None:
    """One attacker connection: send the held streams, then read (and count refusals) until
    `stop`."""
    host, port = url.split(":")
    try:
        sock = socket.create_connection((host, int(port)), 30, source_address=(source, 0))
    except OSError:
        return
    with sock:
        try:
            sock.sendall(held_streams(url, streams))
            sock.settimeout(0.1)
            while not stop.is_set():
                try:
                    data = sock.recv(1 << 16)
                except TimeoutError:
                    continue
                if not data:
                    return
                refused[0] += data.count(b"max-buffered-bytes")
        except OSError:
            return


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else float("nan")


def measure(gateway: Gateway, args: argparse.Namespace, attackers: list[str]) -> dict[str, float]:
    process = psutil.Process(gateway.process.pid)
    victim = Victim(gateway.http_url)
    thread = threading.Thread(target=victim.run, daemon=True)
    thread.start()
    time.sleep(args.seconds)
    alone = list(victim.latencies)
    victim.latencies.clear()
    base = process.memory_info().rss
    peak = base
    stop = threading.Event()
    refused = [0]
    threads = [
        threading.Thread(
            target=attacker,
            args=(gateway.grpc_url, source, args.streams, stop, refused),
            daemon=True,
        )
        for source in attackers
        for _ in range(args.connections)
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        peak = max(peak, process.memory_info().rss)
        time.sleep(0.005)
    attacked = list(victim.latencies)
    errors = victim.errors
    stop.set()
    victim.stop.set()
    for t in [*threads, thread]:
        t.join(30)
    return {
        "base": base / 2**20,
        "growth": (peak - base) / 2**20,
        "p50 alone": 1e3 * percentile(alone, 50),
        "p99 alone": 1e3 * percentile(alone, 99),
        "p50 attacked": 1e3 * percentile(attacked, 50),
        "p99 attacked": 1e3 * percentile(attacked, 99),
        "victim answers": len(attacked),
        "victim errors": errors,
        "streams refused": refused[0],
    }


def check_goals(rows: list[tuple[int, dict[str, float]]]) -> list[bool]:
    """Each gateway's (budget in bytes, figures): a budgeted one's growth at most twice its
    budget; no victim error from any."""
    verdicts = []
    for budget, figures in rows:
        name = f"--max-buffered-bytes={budget}"
        if budget:
            verdicts.append(
                goals.check(f"{name}: growth", figures["growth"], 2 * budget / 2**20, unit=" MiB")
            )
        verdicts.append(goals.check(f"{name}: victim errors", figures["victim errors"], 0))
    return verdicts


def main() -> int:
    parser = command_line(
        "held_bytes",
        (
            "Measures the node gateway's memory while --pods attacker pods hold --connections "
            "connections of --streams partial gRPC messages for --seconds, with no byte "
            "budget and with --budget, and a victim pod's latency and errors beside it, "
            "against a real Triton."
        ),
    )
    parser.add_argument("--pods", type=int, default=8)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--streams", type=int, default=128)
    parser.add_argument("--budget", default="32Mi", help="the budgeted gateway's flag")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument(
        "--tree",
        type=Path,
        default=ROOT,
        help="the source tree whose gateway runs (build/native: the native build, as built)",
    )
    results_page.add_flag(parser)
    goals.add_flag(parser)
    args = parser.parse_args()
    with results_page.captured() as printed:
        code = run(args)
    if code == 0 and args.write_results is not None:
        results_page.record("held_bytes", printed.getvalue(), page=args.write_results)
    return code


def run(args: argparse.Namespace) -> int:
    budget = parse_quantity(args.budget)
    attackers = [f"127.2.1.{n}" for n in range(1, args.pods + 1)]
    attack = args.pods * args.connections * args.streams * (MESSAGE - SHORT)
    rows = []
    with tempfile.TemporaryDirectory(prefix="held-bytes-") as tmp:
        work = Path(tmp)
        with running_triton(work) as triton:
            upstream = (triton.http_url, triton.grpc_url)
            for flag in (0, budget):
                with running_gateway(work, upstream, attackers, flag, args.tree) as gateway:
                    rows.append((flag, measure(gateway, args, attackers)))
    print(
        f"{args.pods} pods x {args.connections} connections x {args.streams} streams holding "
        f"{MESSAGE - SHORT} bytes each: {attack / 2**20:.0f} MiB unbounded; victim over REST"
    )
    for flag, figures in rows:
        name = f"--max-buffered-bytes={flag}" + (" (none)" if not flag else "")
        print(f"  {name}: 2 x budget = {2 * flag / 2**20:.0f} MiB")
        print("    " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))
    return goals.exit_code(check_goals(rows), args.no_goal)


if __name__ == "__main__":
    sys.exit(main())
