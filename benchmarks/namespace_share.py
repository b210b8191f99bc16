"""Benchmark: many small pods of one namespace against one pod of another, at the node gateway.

Starts a real Triton serving `sleepy` (one instance: each request holds it for `--delay-ms`, so
Triton, not the clients' CPU, is what the pods share) and, in turn, a gateway process from this
tree and one from `--baseline-tree` (e.g. `git archive <commit> | tar -x -C DIR`), both with
`--max-in-flight-node=--budget` and `--max-in-flight-per-pod=--budget`. Against each, the victim
(team-b's one pod, its own source address) sends with `--concurrency` keep-alive connections,
each one request after another, first alone and then while `--pods` pods of team-a (each its own
127.3.0.x address) do the same. Printed per gateway: the victim's p50 / p99 and answers per
second alone and beside the crowd, its errors, the crowd's answers per second, and the victim's
share of Triton's answers beside the crowd (a split by namespace: half). The victim keeps
Triton's one instance busy alone, so at its fair half its p50 beside is about twice alone's.

A gateway that splits the node's in-flight budget among pods gives the victim one slot in
`--pods + 1`; one that splits it by namespace first gives it half, so its p99 beside the crowd
and its throughput are what tell them apart.

The goals, for this tree's gateway (checked unless `--no-goal`): the victim's share of Triton's
answers beside the crowd at least `SHARE_GOAL` % (its fair half, less noise), its p99 beside at
most `P99_GOAL` times alone's (what its fair half costs a closed loop), and no error.

    .venv/bin/python -m benchmarks.namespace_share [--pods 7] [--concurrency 4] [--budget 8]
        [--delay-ms 5] [--seconds 6] [--baseline-tree DIR] [--no-goal]

About a minute on a 2-core box with the defaults and a baseline tree.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import goals
from benchmarks.proxy_latency import ROOT, _stop, _wait_http
from common.callers import Caller, CallerTable, write_table
from sim.triton import TritonServer, free_port

MODEL = "sleepy"
VICTIM = "127.3.1.1"
SHARE_GOAL = 45.0
"""Percent of Triton's answers the victim's namespace gets beside the crowd: half, less noise."""
P99_GOAL = 2.0
"""The victim's p99 beside the crowd over its p99 alone: at its fair half a closed loop that kept
Triton busy alone waits about twice as long."""


@contextlib.contextmanager
def running_triton(work: Path) -> Iterator[TritonServer]:
    repository = work / "repository"
    repository.mkdir()
    shutil.copytree(ROOT / "tests" / "proxy" / "models" / MODEL, repository / MODEL)
    with TritonServer(repository) as server:
        load = urllib.request.Request(
            f"http://{server.http_url}/v2/repository/models/{MODEL}/load", method="POST"
        )
        with urllib.request.urlopen(load, timeout=60):
            pass
        yield server


@contextlib.contextmanager
def running_gateway(
    work: Path, triton: TritonServer, crowd: list[str], budget: int, tree: Path
) -> Iterator[str]:
    """A gateway process of `tree` whose table holds the victim (team-b) and the crowd (team-a);
    its REST address."""
    table = work / f"callers-{abs(hash(tree))}.json"
    callers = [Caller(VICTIM, MODEL, "team-b/victim", "uid-victim")]
    callers += [Caller(a, MODEL, f"team-a/crowd-{i}", f"uid-{a}") for i, a in enumerate(crowd)]
    write_table(table, CallerTable("bench-node", time.time(), tuple(callers)))
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    command = [sys.executable, "-m", "proxy.gateway", "--caller-table", str(table)]
    command += ["--triton-http-url", triton.http_url, "--triton-grpc-url", triton.grpc_url]
    command += ["--listen-http", f"127.0.0.1:{http_port}", "--listen-grpc"]
    command += [f"127.0.0.1:{grpc_port}", "--listen-metrics", f"127.0.0.1:{metrics_port}"]
    command += ["--table-max-age", "100000", "--log-level", "ERROR"]
    command += ["--max-in-flight-node", str(budget), "--max-in-flight-per-pod", str(budget)]
    process = subprocess.Popen(command, cwd=tree)  # `-m proxy.gateway` from under `tree`
    try:
        _wait_http(f"http://127.0.0.1:{metrics_port}/readyz", 60)
        yield f"127.0.0.1:{http_port}"
    finally:
        _stop(process, 30)


@dataclass
class Sender:
    """`connections` keep-alive connections from `source`, each one request after another."""

    url: str
    source: str
    connections: int
    body: bytes
    model: str = MODEL
    stop: threading.Event = field(default_factory=threading.Event)
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Sender:
        for _ in range(self.connections):
            thread = threading.Thread(target=self._run, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _run(self) -> None:
        host, port = self.url.split(":")
        connection = http.client.HTTPConnection(host, int(port), 60, (self.source, 0))
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                connection.request("POST", f"/v2/models/{self.model}/infer", body=self.body)
                response = connection.getresponse()
                response.read()
                if response.status != 200:
                    self.errors += 1
                    continue
            except OSError:
                self.errors += 1
                connection.close()
                continue
            self.latencies.append(time.monotonic() - started)
        connection.close()

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(60)


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else float("nan")


def window(sender: Sender, seconds: float) -> tuple[list[float], int]:
    """The sender's latencies and errors over the next `seconds`."""
    start, errors = len(sender.latencies), sender.errors
    time.sleep(seconds)
    return sender.latencies[start:], sender.errors - errors


def measure(url: str, args: argparse.Namespace, crowd: list[str]) -> dict[str, float]:
    delay = {"name": "DELAY_MS", "shape": [1], "datatype": "INT32", "data": [args.delay_ms]}
    body = json.dumps({"inputs": [delay]}).encode()
    with Sender(url, VICTIM, args.concurrency, body) as victim:
        window(victim, 1.0)  # warm-up: connections made, the model's first calls
        alone, alone_errors = window(victim, args.seconds)
        senders = [Sender(url, a, args.concurrency, body) for a in crowd]
        with contextlib.ExitStack() as stack:
            for sender in senders:
                stack.enter_context(sender)
            window(victim, 2.0)  # every pod sending, the split settled
            before = sum(len(s.latencies) for s in senders)
            beside, beside_errors = window(victim, args.seconds)
            crowd_answers = sum(len(s.latencies) for s in senders) - before
    return {
        "p50 alone ms": 1e3 * percentile(alone, 50),
        "p99 alone ms": 1e3 * percentile(alone, 99),
        "answers/s alone": len(alone) / args.seconds,
        "p50 beside ms": 1e3 * percentile(beside, 50),
        "p99 beside ms": 1e3 * percentile(beside, 99),
        "answers/s beside": len(beside) / args.seconds,
        "errors": alone_errors + beside_errors,
        "crowd answers/s": crowd_answers / args.seconds,
        # Its fair share is half (one namespace of two); a closed loop that kept Triton busy
        # alone then waits twice as long per answer, so its p50 beside is about 2x alone.
        "victim share %": 100 * len(beside) / max(1, len(beside) + crowd_answers),
    }


def check_goals(figures: dict[str, float]) -> list[bool]:
    """This tree's gateway's figures (`measure`'s) against the goals."""
    return [
        goals.check("victim's share of answers", figures["victim share %"], SHARE_GOAL, ">=", " %"),
        goals.check(
            "victim's p99 beside / alone",
            figures["p99 beside ms"] / figures["p99 alone ms"],
            P99_GOAL,
            unit="x",
        ),
        goals.check("victim errors", figures["errors"], 0),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=7, help="team-a's pods")
    parser.add_argument("--concurrency", type=int, default=4, help="connections per pod")
    parser.add_argument("--budget", type=int, default=8, help="--max-in-flight-node")
    parser.add_argument("--delay-ms", type=int, default=5, help="what each request holds Triton")
    parser.add_argument("--seconds", type=float, default=6.0, help="each measured window")
    parser.add_argument("--baseline-tree", type=Path, help="another source tree's gateway")
    goals.add_flag(parser)
    args = parser.parse_args()
    crowd = [f"127.3.0.{n}" for n in range(1, args.pods + 1)]
    trees = [("this tree", ROOT)]
    if args.baseline_tree is not None:
        trees.append(("baseline", args.baseline_tree.resolve()))
    rows = []
    with tempfile.TemporaryDirectory(prefix="namespace-share-") as tmp:
        work = Path(tmp)
        with running_triton(work) as triton:
            for name, tree in trees:
                with running_gateway(work, triton, crowd, args.budget, tree) as url:
                    rows.append((name, measure(url, args, crowd)))
    print(
        f"team-b's one pod beside {args.pods} pods of team-a, {args.concurrency} connections "
        f"each, --max-in-flight-node={args.budget}, {MODEL} holding Triton {args.delay_ms} ms "
        "a request"
    )
    for name, figures in rows:
        print(f"  {name}: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))
    return goals.exit_code(check_goals(rows[0][1]), args.no_goal)


if __name__ == "__main__":
    sys.exit(main())
