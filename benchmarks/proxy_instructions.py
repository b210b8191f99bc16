"""Benchmark: user-space instructions per request in a real proxy or gateway process, counted by
valgrind's callgrind, for the pure tree and the native build (`python -m proxy.native`).

A real Triton serves add_one; each hop runs as its own process under callgrind; h2load sends 300
requests to warm up, the counters are zeroed, then `--requests` more at c=16 (REST: a JSON infer
over HTTP/1.1; gRPC: a framed ModelInfer, one stream per connection), and the instructions
counted in between, divided by the requests, are the hop's figure. Instruction counts are what a
busy shared box does not move (time is); system time is not counted. The proxy is set against the
bare TCP relay (`benchmarks/tcp_relay.py`) of the same run; with `--gateway` the node gateway
(`python -m proxy.gateway`) is counted instead, behind a pure proxy (not counted) sending from the
caller table's address, as in a node.

    .venv/bin/python -m benchmarks.proxy_instructions [--requests 2000] [--gateway]
        [--tree DIR ...]

The trees default to this one (pure) and build/native (built first when stale). Needs valgrind
and h2load. Under callgrind a hop runs about 50x slower: a run takes a few minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tritonclient.grpc import service_pb2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common.callers import Caller, CallerTable, write_table  # noqa: E402
from proxy import native  # noqa: E402
from sim.triton import TritonServer, free_port  # noqa: E402

WARM_UP = 300
MODEL = "add_one"
POD_ADDRESS = "127.1.0.7"
"""The pod's address in the gateway's caller table (as in proxy_latency.py's full path)."""
REST_BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
)


def grpc_message() -> bytes:
    """A ModelInfer request for add_one, framed as one gRPC message."""
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(struct.pack("<4f", 1, 2, 3, 4))
    message: bytes = request.SerializeToString()
    return b"\x00" + len(message).to_bytes(4, "big") + message


@contextmanager
def running_triton(work: Path) -> Iterator[TritonServer]:
    repository = work / "repository"
    repository.mkdir()
    shutil.copytree(ROOT / "tests" / "models" / MODEL, repository / MODEL)
    with TritonServer(repository) as server:
        load = urllib.request.Request(
            f"http://{server.http_url}/v2/repository/models/{MODEL}/load", method="POST"
        )
        with urllib.request.urlopen(load, timeout=60):
            pass
        yield server


def _wait_ready(address: str, timeout: float = 300) -> None:
    """Until the proxy at `address` answers its readiness (through whatever is behind it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{address}/v2/health/ready", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"the proxy at {address} was not ready after {timeout:.0f} s")


def _wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listens on port {port} after {timeout:.0f} s")


class Counted:
    """A process under callgrind and the addresses h2load sends to."""

    def __init__(self, name: str, process: subprocess.Popen[bytes], out: Path) -> None:
        self.name = name
        self.process = process
        self.out = out
        self.rest = ""
        self.grpc = ""

    def zero(self) -> None:
        subprocess.run(
            ["callgrind_control", "--zero", str(self.process.pid)], check=True, capture_output=True
        )

    def instructions(self) -> int:
        """Instructions since the last `zero`, from a dump taken now."""
        subprocess.run(
            ["callgrind_control", "--dump", str(self.process.pid)], check=True, capture_output=True
        )
        dumps = sorted(self.out.parent.glob(self.out.name + ".*"), key=os.path.getmtime)
        text = dumps[-1].read_text(errors="replace")
        found = re.search(r"^(?:summary|totals): (\d+)", text, re.MULTILINE)
        assert found, f"no totals in {dumps[-1]}"
        return int(found[1])


@contextmanager
def running(
    name: str,
    command: list[str],
    tree: Path,
    work: Path,
    ports: tuple[int, int],
    counted: bool = True,
) -> Iterator[Counted]:
    """`python <command>` run from `tree` (under callgrind when `counted`), once its two ports
    listen."""
    out = work / f"callgrind.{name.replace('/', '_')}"
    valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"] if counted else []
    process = subprocess.Popen(
        [*valgrind, sys.executable, *command],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    hop = Counted(name, process, out)
    try:
        for port in ports:
            _wait_port(port, 600)
        hop.rest, hop.grpc = (f"127.0.0.1:{port}" for port in ports)
        yield hop
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def send(kind: str, hop: Counted, framed: Path, body: Path, count: int) -> None:
    """`count` requests at c=16 with h2load; all must succeed."""
    if kind == "REST":
        command = [
            "h2load",
            "--h1",
            "-d",
            str(body),
            "-H",
            "content-type: application/json",
            f"http://{hop.rest}/v2/models/{MODEL}/infer",
        ]
    else:
        command = [
            "h2load",
            "-m",
            "1",
            "-d",
            str(framed),
            "-H",
            "content-type: application/grpc",
            "-H",
            "te: trailers",
            f"http://{hop.grpc}/inference.GRPCInferenceService/ModelInfer",
        ]
    command[1:1] = ["-n", str(count), "-c", "16", "-t", "1"]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    assert f"{count} succeeded, 0 failed" in output, output
    assert kind != "REST" or f"status codes: {count} 2xx" in output, output


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="counted per hop and protocol")
    parser.add_argument("--gateway", action="store_true", help="count the gateway, not the proxy")
    parser.add_argument("--tree", type=Path, action="append", help="a tree to run from (repeat)")
    args = parser.parse_args()
    for tool in ("valgrind", "callgrind_control", "h2load"):
        if shutil.which(tool) is None:
            print(f"{tool} is missing: apt-get install -y valgrind nghttp2-client", file=sys.stderr)
            return 2
    trees: list[Path] = [t.resolve() for t in args.tree or [ROOT, native.DEFAULT_OUT]]
    if native.DEFAULT_OUT in trees:
        native.build()
    with tempfile.TemporaryDirectory(prefix="proxy-instructions-") as tmp:
        work = Path(tmp)
        framed, body = work / "infer.grpc", work / "infer.json"
        framed.write_bytes(grpc_message())
        body.write_text(REST_BODY)
        table = work / "callers.json"
        pod = Caller(POD_ADDRESS, MODEL, "bench/add-one", "bench-uid")
        write_table(table, CallerTable("bench-node", time.time(), (pod,)))
        with running_triton(work) as triton, contextlib.ExitStack() as stack:
            hops: list[Counted] = []
            if not args.gateway:
                ports = (free_port(), free_port())
                command = [
                    "-m",
                    "benchmarks.tcp_relay",
                    triton.http_url,
                    f"127.0.0.1:{ports[0]}",
                    triton.grpc_url,
                    f"127.0.0.1:{ports[1]}",
                ]
                hops.append(stack.enter_context(running("bare relay", command, ROOT, work, ports)))
            for tree in trees:
                ports = (free_port(), free_port())
                listen = [
                    "--listen-http",
                    f"127.0.0.1:{ports[0]}",
                    "--listen-grpc",
                    f"127.0.0.1:{ports[1]}",
                    "--listen-metrics",
                    f"127.0.0.1:{free_port()}",
                    "--triton-http-url",
                    triton.http_url,
                    "--triton-grpc-url",
                    triton.grpc_url,
                    "--log-level",
                    "WARNING",
                ]
                if args.gateway:
                    command = [
                        "-m",
                        "proxy.gateway",
                        "--caller-table",
                        str(table),
                        "--table-max-age",
                        "100000",
                        *listen,
                    ]
                    hop = stack.enter_context(running(str(tree), command, tree, work, ports))
                    front_ports = (free_port(), free_port())
                    front = [
                        "-m", "proxy", "--model-id", MODEL, "--source-address", POD_ADDRESS,
                        "--triton-http-url", hop.rest, "--triton-grpc-url", hop.grpc,
                        "--listen-http", f"127.0.0.1:{front_ports[0]}",
                        "--listen-grpc", f"127.0.0.1:{front_ports[1]}",
                        "--listen-metrics", f"127.0.0.1:{free_port()}",
                        "--drain-seconds", "0", "--log-level", "WARNING",
                    ]  # fmt: skip
                    pod_proxy = stack.enter_context(
                        running("pod proxy", front, ROOT, work, front_ports, counted=False)
                    )
                    _wait_ready(pod_proxy.rest)
                    hop.rest, hop.grpc = (
                        pod_proxy.rest,
                        pod_proxy.grpc,
                    )  # the gateway counted behind it
                else:
                    command = ["-m", "proxy", "--model-id", MODEL, "--drain-seconds", "0", *listen]
                    hop = stack.enter_context(running(str(tree), command, tree, work, ports))
                hops.append(hop)
            what = "gateway" if args.gateway else "proxy"
            print(
                f"User-space instructions per request in the {what} process (callgrind), "
                f"{args.requests} requests at c=16 after {WARM_UP} of warm-up:"
            )
            for hop in hops:
                for kind in ("REST", "gRPC"):
                    send(kind, hop, framed, body, WARM_UP)
                    hop.zero()
                    send(kind, hop, framed, body, args.requests)
                    per_request = hop.instructions() / args.requests
                    print(f"  {kind:4} {hop.name}: {per_request / 1000:.1f}k", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
