"""Benchmark: KServe's Python SDK as a model's client, through the model's Service on the simulated
cluster, to the pod's proxy, and to Triton directly.

Starts a real Triton serving add_one, a model pod's proxy for it (`python -m proxy`), and a
simulated API server holding the pod (Ready, the proxy's address) and a ClusterIP Service in front
of it, which `sim.service.ServiceProxy` puts on its cluster IP as kube-proxy does (as on `make
sim-up`). With `kserve` installed, every call of its inference clients (`InferenceRESTClient` with
the v2 protocol and `InferenceGRPCClient`: server live and ready, model ready, infer, and infer
naming another model, which must fail) runs through each path and must answer as the protocol
says; then `--requests` infer requests per path and protocol, interleaved in blocks, give each
path's median and 90th percentile per request, and the Service's cost over the proxy.

`kserve` is not among the project's test dependencies: it installs its model server too (FastAPI,
uvicorn, pandas, Pillow; about 130 MB beside the project's own). Without it, REST requests are
sent by a client that writes each request's head and body in two writes, as httpx (under
KServe's SDK) does, and gRPC ones by grpcio.

Goals, the SDK through the model's Service judged against the SDK straight to the pod's proxy
and straight to Triton, per protocol (medians of the same interleaved rounds): every call answers
as the protocol says; through the Service at most `SERVICE_OVER_PROXY_MS` over straight to the
proxy (the Service's own hop, here the simulated kube-proxy); through the Service at most
`SERVICE_OVER_TRITON_MS` over straight to Triton (all a user's SDK pays for the model being
served by tritonshare: the Service and the pod's proxy). Added milliseconds, not ratios: the SDK's
own time per request (or the plain client's without `kserve`) is the same on every path. Printed
as met or NOT MET, the run exits 1 when one is not (`--no-goal`: 0 anyway).

    python -m benchmarks.kserve_client [--requests 300] [--no-goal]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import kubernetes.client

from benchmarks import command_line, goals
from sim.apiserver import start_in_thread
from sim.processes import wait_until
from sim.service import ServiceProxy

MODEL = "add_one"
PATHS = ("triton", "proxy", "service")
"""The SDK straight to Triton, straight to the pod's proxy, and through the model's Service."""
CLUSTER_IP = "127.2.254.1"
"""The Service's address: written in its spec, away from those `make sim-up` allocates."""
BLOCK = 20
"""Requests sent on one path before the next path's turn: the box's speed drifts."""
REST_BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
).encode()
Paths = dict[str, tuple[str, str]]
"""Path name -> (REST host:port, gRPC host:port)."""
Figures = dict[str, dict[str, list[float]]]
"""Protocol -> path name (`triton`, `proxy`, `service`) -> seconds per infer request."""
SERVICE_OVER_PROXY_MS = 0.15
"""Milliseconds the SDK's median request through the Service may take over its median straight to
the pod's proxy."""
SERVICE_OVER_TRITON_MS = 0.4
"""Milliseconds the SDK's median request through the Service may take over its median straight to
Triton."""


def _free_port(address: str) -> int:
    with socket.create_server((address, 0)) as sock:
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def service_in_front_of(rest: str, grpc_address: str) -> Iterator[tuple[str, str]]:
    """A simulated cluster whose Service `add-one` reaches one Ready pod at the proxy's REST
    and gRPC ports; yields the Service's REST and gRPC addresses."""
    server = start_in_thread()
    api = server.api_client()
    services = ServiceProxy(api, period=0.2)
    try:
        core: Any = kubernetes.client.CoreV1Api(api)
        core.create_node({"metadata": {"name": "node-0"}})
        labels = {"app": "add-one"}
        pod = {
            "metadata": {"name": "add-one-0", "labels": labels},
            "spec": {"nodeName": "node-0", "containers": [{"name": "proxy", "image": "x"}]},
        }
        core.create_namespaced_pod("default", pod)
        ready = [{"type": "Ready", "status": "True"}]
        status = {"status": {"phase": "Running", "podIP": "127.0.0.1", "conditions": ready}}
        core.patch_namespaced_pod_status("add-one-0", "default", status)
        rest_port, grpc_port = _free_port(CLUSTER_IP), _free_port(CLUSTER_IP)
        ports = [
            {"name": "http", "port": rest_port, "targetPort": int(rest.rsplit(":", 1)[1])},
            {"name": "grpc", "port": grpc_port, "targetPort": int(grpc_address.rsplit(":", 1)[1])},
        ]
        spec = {"selector": labels, "clusterIP": CLUSTER_IP, "ports": ports}
        core.create_namespaced_service("default", {"metadata": {"name": "add-one"}, "spec": spec})
        services.start()
        address = f"{CLUSTER_IP}:{rest_port}"
        wait_until("the Service answers", lambda: _rest_infer(address, REST_BODY) > 0, 30)
        yield address, f"{CLUSTER_IP}:{grpc_port}"
    finally:
        services.stop()
        api.close()  # type: ignore[no-untyped-call]
        server.stop()


def _rest_infer(address: str, body: bytes) -> float:
    """One infer request on a new connection, head and body written apart: its seconds, or 0
    when nothing answered."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            return _RawRest(sock).infer(body)
    except OSError:
        return 0.0


class _RawRest:
    """A keep-alive REST client that writes each request's head and body apart (as httpx)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def infer(self, body: bytes) -> float:
        head = (
            f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        started = time.perf_counter()
        self.sock.sendall(head)
        self.sock.sendall(body)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += self._recv()
        top, _, rest = answer.partition(b"\r\n\r\n")
        length = int(top.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        while len(rest) < length:
            rest += self._recv()
        took = time.perf_counter() - started
        if not top.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"infer answered {top.splitlines()[0]!r}")
        return took

    def _recv(self) -> bytes:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the connection closed before the answer")
        return data


def _grpc_request() -> bytes:
    from tritonclient.grpc import service_pb2  # only without kserve: see `main`

    request = service_pb2.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 3])
    request.raw_input_contents.append(struct.pack("<3f", 1, 2, 3))
    data: bytes = request.SerializeToString()
    return data


def _timed_blocks(
    paths: Paths, requests: int, make: Callable[[str, str], Callable[[], Awaitable[None]]]
) -> dict[str, list[float]]:
    """Seconds per request on each path, `BLOCK` requests a turn, the order rotating."""

    async def measure() -> dict[str, list[float]]:
        calls = {name: make(*addresses) for name, addresses in paths.items()}
        times: dict[str, list[float]] = {name: [] for name in paths}
        for call in calls.values():  # warm: connections open, caches filled
            for _ in range(5):
                await call()
        order = list(paths)
        while min(len(t) for t in times.values()) < requests:
            for name in order:
                for _ in range(BLOCK):
                    started = time.perf_counter()
                    await calls[name]()
                    times[name].append(time.perf_counter() - started)
            order = order[1:] + order[:1]
        return times

    return asyncio.run(measure())


def _with_kserve(
    kserve: Any, paths: Paths, requests: int
) -> tuple[dict[str, dict[str, list[float]]], bool]:
    """Every call of KServe's inference clients on each path, then infer timed; and whether a
    call through the proxy or the Service answered wrong."""
    logging.getLogger("kserve").setLevel(logging.CRITICAL)  # a refusal is logged with its trace
    config = kserve.RESTConfig(protocol="v2", retries=0, timeout=30)

    def rest_request() -> Any:
        tensor = kserve.InferInput("INPUT0", [1, 3], "FP32", [1.0, 2.0, 3.0])
        return kserve.InferRequest(model_name=MODEL, infer_inputs=[tensor])

    async def refused(call: Awaitable[Any]) -> bool:
        """Whether `call` failed in Triton's words for a model it does not have."""
        try:
            await call
        except grpc.aio.AioRpcError as e:
            return "unknown model: 'identity'" in str(e.details())
        except Exception as e:  # httpx.HTTPStatusError: 404, Triton's words in text/plain
            response = getattr(e, "response", None)
            return response is not None and b"unknown model: 'identity'" in response.content
        return False

    async def check(rest: str, grpc_address: str) -> list[str]:
        """The calls that did not answer as the protocol says, each with why."""
        url = f"http://{rest}"
        client = kserve.InferenceRESTClient(config)
        channel = kserve.InferenceGRPCClient(grpc_address, timeout=30)
        other = kserve.InferRequest(model_name="identity", infer_inputs=rest_request().inputs)
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "REST is_server_live": lambda: client.is_server_live(url),
            "REST is_server_ready": lambda: client.is_server_ready(url),
            "REST is_model_ready": lambda: client.is_model_ready(url, MODEL),
            "REST infer": lambda: client.infer(url, rest_request(), model_name=MODEL),
            "REST another model refused": lambda: refused(
                client.infer(url, rest_request(), model_name="identity")
            ),
            "gRPC is_server_live": channel.is_server_live,
            "gRPC is_server_ready": channel.is_server_ready,
            "gRPC is_model_ready": lambda: channel.is_model_ready(MODEL),
            "gRPC infer": lambda: channel.infer(rest_request()),
            "gRPC another model refused": lambda: refused(channel.infer(other)),
        }
        failed = []
        try:
            for what, call in calls.items():
                try:
                    answer = await call()
                except Exception as e:
                    failed.append(f"{what}: {type(e).__name__} {e}".strip())
                    continue
                if what.endswith("infer"):
                    data = answer.outputs[0].as_numpy().ravel().tolist()
                    if data != [2.0, 3.0, 4.0]:
                        failed.append(f"{what}: answered {data}")
                elif answer is not True:
                    failed.append(f"{what}: answered {answer!r}")
        finally:
            await client.close()
            await channel.close()
        return failed

    wrong = False
    for name, addresses in paths.items():
        failed = asyncio.run(check(*addresses))
        if not failed:
            print(f"{name}: every call of KServe's REST and gRPC inference clients answered right")
        for line in failed:
            print(f"{name}: {line[:160]}")
        wrong = wrong or (bool(failed) and name != "triton")  # Triton sends no health bodies

    def rest(address: str, _: str) -> Callable[[], Awaitable[None]]:
        client = kserve.InferenceRESTClient(config)
        request = rest_request()

        async def call() -> None:
            await client.infer(f"http://{address}", request, model_name=MODEL)

        return call

    def grpc_call(_: str, address: str) -> Callable[[], Awaitable[None]]:
        client = kserve.InferenceGRPCClient(address, timeout=30)
        request = rest_request()

        async def call() -> None:
            await client.infer(request)

        return call

    figures = {
        "REST": _timed_blocks(paths, requests, rest),
        "gRPC": _timed_blocks(paths, requests, grpc_call),
    }
    return figures, wrong


def _without_kserve(paths: Paths, requests: int) -> dict[str, dict[str, list[float]]]:
    def rest(address: str, _: str) -> Callable[[], Awaitable[None]]:
        host, port = address.rsplit(":", 1)
        client = _RawRest(socket.create_connection((host, int(port)), timeout=10))

        async def call() -> None:
            client.infer(REST_BODY)

        return call

    def grpc_call(_: str, address: str) -> Callable[[], Awaitable[None]]:
        channel = grpc.insecure_channel(address)
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer", None, None)
        request = _grpc_request()

        async def call() -> None:
            infer(request, timeout=30)

        return call

    return {
        "REST": _timed_blocks(paths, requests, rest),
        "gRPC": _timed_blocks(paths, requests, grpc_call),
    }


def _ms(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> int:
    parser = command_line(
        "kserve_client",
        (
            "Measures KServe's Python SDK as a model's client (every call of its REST and gRPC "
            "inference clients, then --requests infer requests per path) through the model's "
            "Service on the simulated cluster, to the pod's proxy, and to Triton directly: "
            "each path's time per request, and the Service's cost over the proxy."
        ),
    )
    parser.add_argument("--requests", type=int, default=300, help="infer requests per path")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # the client's own process
    goals.add_flag(parser)
    args = parser.parse_args()
    if args.measure:
        return _measure(json.loads(args.measure), args.requests)
    # Triton, the proxy and the Service here; the clients in a process of their own: KServe's
    # generated protocol code and tritonclient's (which the proxy's benchmarks import) define
    # the same protobuf messages, and one process cannot load both.
    from benchmarks.proxy_latency import running_proxy, running_triton

    with tempfile.TemporaryDirectory() as work, running_triton(Path(work)) as triton:
        upstream = (triton.http_url, triton.grpc_url)
        with (
            running_proxy(upstream, []) as proxy,
            service_in_front_of(proxy.rest, proxy.grpc) as service,
        ):
            addresses = (upstream, (proxy.rest, proxy.grpc), service)
            paths: Paths = dict(zip(PATHS, addresses, strict=True))
            command = [sys.executable, "-m", "benchmarks.kserve_client"]
            command += ["--requests", str(args.requests), "--measure", json.dumps(paths)]
            done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    lines = done.stdout.splitlines()
    print("\n".join(lines[:-1]))
    if not lines or not lines[-1].startswith("{"):
        print(f"the clients failed (exit status {done.returncode})")
        return 1
    figures: Figures = json.loads(lines[-1])
    report(figures, args.requests)
    if done.returncode != 0:
        print("a call through the proxy or the Service answered wrong (above)")
    return goals.exit_code(check_goals(figures, done.returncode == 0), args.no_goal)


def report(figures: Figures, requests: int) -> None:
    """Each path's median and p90 per protocol, and what the Service and the proxy add."""
    print(f"\nms per infer request, median / p90, {requests} requests per path:")
    print(f"{'path':<10}" + "".join(f"{protocol:>18}" for protocol in figures))
    for name in PATHS:
        cells = "".join(
            f"{_ms(times[name], 0.5):>10.3f} / {_ms(times[name], 0.9):>5.3f}"
            for times in figures.values()
        )
        print(f"{name:<10}{cells}")
    for protocol, times in figures.items():
        median = {name: 1000 * statistics.median(times[name]) for name in PATHS}
        print(
            f"{protocol}: through the Service {median['service']:.3f} ms, "
            f"{median['service'] - median['proxy']:+.3f} over the pod's proxy, "
            f"{median['service'] - median['triton']:+.3f} over Triton "
            f"(the proxy {median['proxy'] - median['triton']:+.3f} over Triton)"
        )


def check_goals(figures: Figures, answered: bool) -> list[bool]:
    """Every call answered as the protocol says; per protocol, the SDK's median through the
    Service against its median straight to the pod's proxy and straight to Triton."""
    met = [goals.require("every call answers as the protocol says", answered)]
    for protocol, times in figures.items():
        median = {name: 1000 * statistics.median(times[name]) for name in PATHS}
        for path, goal in (("proxy", SERVICE_OVER_PROXY_MS), ("triton", SERVICE_OVER_TRITON_MS)):
            met.append(
                goals.check(
                    f"{protocol} through the Service over straight to {path}",
                    median["service"] - median[path],
                    goal,
                    unit=" ms",
                )
            )
    return met


def _measure(paths: dict[str, list[str]], requests: int) -> int:
    """The clients' process: checks and times, the figures as JSON on the last line."""
    by_name: Paths = {name: (rest, grpc_address) for name, (rest, grpc_address) in paths.items()}
    try:
        kserve: Any = importlib.import_module("kserve")
    except ImportError:
        print(
            "kserve is not installed: REST by a client that writes head and body apart (as "
            "httpx does), gRPC by grpcio"
        )
        figures, wrong = _without_kserve(by_name, requests), False
    else:
        figures, wrong = _with_kserve(kserve, by_name, requests)
    print(json.dumps(figures))
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
