"""Benchmark: what the proxy adds over going to Triton directly, REST and gRPC.

Starts a real Triton serving the small Python-backend model add_one and two proxies as their own
processes (`python -m proxy`, as in a pod): one with `--grpc-mode grpcio`, one with `--grpc-mode
relay` (REST is the same code in both, so it is measured through the first). It runs the SAME
load generator against Triton and the proxies in interleaved rounds: wrk for REST (a JSON infer
request), h2load for gRPC (a framed ModelInfer request on HTTP/2), plus a blocking python grpc
client for gRPC at concurrency 1. For each round it takes the median latency at concurrency 1 and
the throughput at concurrency 16, and prints the medians over rounds, the added latency and the
kept throughput next to the targets (<= 0.25 ms / 0.2 ms added at c=1, >= 85% / 70% kept at
c=16). The machine is shared: quote the printed medians, not a single round.

    .venv/bin/python benchmarks/proxy_latency.py [--rounds 5] [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
from tritonclient.grpc import service_pb2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.triton import TritonServer, free_port  # noqa: E402

MODEL = "add_one"
REST_BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
)


def _grpc_request() -> bytes:
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
def running_triton(workdir: Path) -> Iterator[TritonServer]:
    repository = workdir / "repository"
    repository.mkdir()
    shutil.copytree(ROOT / "tests" / "models" / MODEL, repository / MODEL)
    with TritonServer(repository) as server:
        load = urllib.request.Request(
            f"http://{server.http_url}/v2/repository/models/{MODEL}/load", method="POST"
        )
        with urllib.request.urlopen(load, timeout=60):
            pass
        yield server


@contextmanager
def running_proxy(triton: TritonServer, extra: list[str]) -> Iterator[tuple[str, str]]:
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    command = [
        sys.executable,
        "-m",
        "proxy",
        "--model-id",
        MODEL,
        "--triton-http-url",
        triton.http_url,
        "--triton-grpc-url",
        triton.grpc_url,
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
    process = subprocess.Popen(command, cwd=ROOT)
    try:
        _wait_http(f"http://127.0.0.1:{http_port}/v2/health/ready")
        yield f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


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


def grpc_client_latency(address: str, request: bytes, seconds: float) -> float:
    """Median latency in ms of back-to-back ModelInfer calls from one blocking grpc client: a
    second view of gRPC at concurrency 1, since h2load times HTTP/2 streams, not gRPC calls."""
    times = []
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer", None, None)
        call(request, timeout=10)
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            call(request, timeout=10)
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def check_grpc(address: str, request: bytes) -> None:
    """Send the benchmark's gRPC request once and make sure it succeeds."""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer", None, None)
        response = service_pb2.ModelInferResponse.FromString(call(request, timeout=10))
        assert response.model_name == MODEL, response


def _report(
    results: dict[tuple[str, str, int], list[tuple[float, float]]],
    protocol: str,
    mode: str,
    added_target: float,
    kept_target: float,
) -> None:
    """Print one protocol's c=1 added latency and c=16 kept throughput for one proxy mode."""
    direct1 = statistics.median(r[0] for r in results[(protocol, "direct", 1)])
    proxy1 = statistics.median(r[0] for r in results[(protocol, mode, 1)])
    direct16 = statistics.median(r[1] for r in results[(protocol, "direct", 16)])
    proxy16 = statistics.median(r[1] for r in results[(protocol, mode, 16)])
    added = proxy1 - direct1
    kept = proxy16 / direct16
    label = f"{protocol.upper():4} ({mode})"
    verdict = "OK" if added <= added_target else "MISSED"
    print(
        f"{label} c=1  median latency: direct {direct1:.3f} ms, proxy {proxy1:.3f} ms, added "
        f"{added:+.3f} ms (target <= {added_target} ms) {verdict}"
    )
    print(
        f"{label} c=16 throughput: direct {direct16:.0f} req/s, proxy {proxy16:.0f} req/s, kept "
        f"{kept:.1%} (target >= {kept_target:.0%}) {'OK' if kept >= kept_target else 'MISSED'}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--proxy-arg", action="append", default=[], help="extra proxy flag")
    args = parser.parse_args()
    for tool in ("wrk", "h2load"):
        if shutil.which(tool) is None:
            print(f"{tool} is missing: apt-get install -y wrk nghttp2-client", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="proxy-bench-") as tmp:
        work = Path(tmp)
        script = work / "post.lua"
        script.write_text(
            'wrk.method = "POST"\n'
            f"wrk.body = {json.dumps(REST_BODY)}\n"
            'wrk.headers["Content-Type"] = "application/json"\n'
        )
        message = _grpc_request()
        framed = work / "infer.grpc"
        framed.write_bytes(b"\x00" + struct.pack(">I", len(message)) + message)
        log = work / "h2load.log"
        with (
            running_triton(work) as triton,
            running_proxy(triton, [*args.proxy_arg, "--grpc-mode", "grpcio"]) as proxy,
            running_proxy(triton, [*args.proxy_arg, "--grpc-mode", "relay"]) as relay,
        ):
            for address in (triton.grpc_url, proxy[1], relay[1]):
                check_grpc(address, message)
            # REST is the same code in both modes: measured through the first proxy only.
            targets = {
                "direct": (triton.http_url, triton.grpc_url),
                "grpcio": proxy,
                "relay": ("", relay[1]),
            }
            results: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
            for target in targets.values():  # warm up connections and caches
                if target[0]:
                    wrk(target[0], 1, 1, script)
                h2load(target[1], 1, 1, framed, log)
            for round_number in range(args.rounds):
                for protocol in ("rest", "grpc"):
                    for concurrency in (1, 16):
                        for name, (http_address, grpc_address) in targets.items():
                            if protocol == "rest":
                                if not http_address:
                                    continue
                                result = wrk(http_address, concurrency, args.seconds, script)
                            else:
                                result = h2load(
                                    grpc_address, concurrency, args.seconds, framed, log
                                )
                            results.setdefault((protocol, name, concurrency), []).append(result)
                for name, (_, grpc_address) in targets.items():
                    latency = grpc_client_latency(grpc_address, message, args.seconds)
                    results.setdefault(("grpc-client", name, 1), []).append((latency, 0.0))
                print(f"round {round_number + 1}/{args.rounds} done", file=sys.stderr)
    print(
        f"proxy benchmark: {args.rounds} interleaved rounds of {args.seconds:g} s, "
        f"cpus={os.cpu_count()}"
    )
    _report(results, "rest", "grpcio", 0.25, 0.85)
    for mode in ("grpcio", "relay"):
        _report(results, "grpc", mode, 0.20, 0.70)
    for mode in ("grpcio", "relay"):
        direct = statistics.median(r[0] for r in results[("grpc-client", "direct", 1)])
        proxied = statistics.median(r[0] for r in results[("grpc-client", mode, 1)])
        print(
            f"GRPC c=1  median latency, python grpc client: direct {direct:.3f} ms, {mode} "
            f"{proxied:.3f} ms, added {proxied - direct:+.3f} ms (target <= 0.2 ms) "
            f"{'OK' if proxied - direct <= 0.2 else 'MISSED'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
