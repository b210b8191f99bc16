"""Benchmark: a model with real compute through a model pod's proxy, beside Triton directly.

Starts a real Triton on the CPU serving two models: add_one (the Python backend, almost no
compute) and `sim.onnxmodels`' convolutional network (the simulated node's ONNX Runtime backend,
a 3x32x32 image of 12 KiB in, about 11 million multiply-adds). For each model it starts, as its
own processes from this tree, the proxy as a model pod runs it in front of Triton (`proxy`) and a
model pod's full path, that proxy sending from its pod address through the node gateway
(`full`), as `proxy_latency` starts them. One client at a time (tritonclient's REST with binary
tensors, and gRPC) sends single-image requests, `--requests` to each hop in turn and to Triton
directly, the hop order reversed every other round; every answer is checked.

Printed per model and protocol: the median time per request directly and through each hop over
`--rounds` rounds, and the median of the per-round differences (what the hop adds). On a shared
box only figures of one run compare.

The goals (checked unless `--no-goal`), for the model with real compute: the proxy adds at most
`PROXY_GOAL` of Triton's own time directly, the full path at most `FULL_GOAL`, over REST and gRPC.

    .venv/bin/python -m benchmarks.onnx_latency [--rounds 5] [--requests 200] [--no-goal]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from numpy.typing import NDArray

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import command_line, goals  # noqa: E402
from benchmarks.proxy_latency import running_full_path, running_proxy  # noqa: E402
from sim.onnxmodels import (  # noqa: E402
    CONV_IMAGE,
    CONV_INPUT,
    CONV_NAME,
    CONV_OUTPUT,
    write_conv_model,
)
from sim.triton import TritonServer  # noqa: E402

MODELS = ("add_one", CONV_NAME)
HOPS = ("direct", "proxy", "full")
Send = Callable[[], None]
Figures = dict[tuple[str, str, str], list[float]]
"""(model, protocol, hop) -> the median ms per request of each round."""
PROXY_GOAL = 0.25
"""What the proxy adds to the ONNX model's time directly, as a share of that time."""
FULL_GOAL = 0.5
"""What the full path (proxy and node gateway) adds, as a share of the time directly."""


def _payload(model: str) -> tuple[str, str, NDArray[Any]]:
    """(input, output, one request's tensor) of `model`."""
    if model == CONV_NAME:
        image = np.random.default_rng(0).random((1, *CONV_IMAGE), dtype=np.float32)
        return CONV_INPUT, CONV_OUTPUT, image
    return "INPUT0", "OUTPUT0", np.arange(4, dtype=np.float32).reshape(1, 4)


def _senders(model: str, rest: str, grpc: str, stack: contextlib.ExitStack) -> dict[str, Send]:
    """A REST and a gRPC sender of one request to `model` at the given addresses."""
    name, output, data = _payload(model)
    http = httpclient.InferenceServerClient(rest)
    stack.callback(http.close)
    channel = grpcclient.InferenceServerClient(grpc)
    stack.callback(channel.close)
    expected: list[NDArray[Any]] = []

    def check(answer: NDArray[Any]) -> None:
        if not expected:
            expected.append(answer)
        elif not np.allclose(answer, expected[0], rtol=1e-5):
            raise RuntimeError(f"{model} answered {answer} through {rest}, {expected[0]} before")

    def send_rest() -> None:
        tensor = httpclient.InferInput(name, list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        check(http.infer(model, [tensor]).as_numpy(output))

    def send_grpc() -> None:
        tensor = grpcclient.InferInput(name, list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        check(channel.infer(model, [tensor]).as_numpy(output))

    return {"REST": send_rest, "gRPC": send_grpc}


def _per_request_ms(send: Send, requests: int) -> float:
    for _ in range(max(requests // 10, 5)):
        send()
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        send()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def _load(server: TritonServer, model: str) -> None:
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/repository/models/{model}/load", method="POST"
    )
    with urllib.request.urlopen(request, timeout=120):
        pass


def added(figures: Figures, model: str, protocol: str, hop: str) -> float:
    """The median over rounds of what `hop` adds to the time directly, in ms."""
    direct, through = figures[(model, protocol, "direct")], figures[(model, protocol, hop)]
    return statistics.median(t - d for t, d in zip(through, direct, strict=True))


def check_goals(figures: Figures) -> list[bool]:
    """For the ONNX model, each hop's added time over its time directly against its goal."""
    verdicts = []
    for protocol in ("REST", "gRPC"):
        direct = statistics.median(figures[(CONV_NAME, protocol, "direct")])
        for hop, goal in (("proxy", PROXY_GOAL), ("full", FULL_GOAL)):
            verdicts.append(
                goals.check(
                    f"{CONV_NAME} {protocol} {hop} added / direct",
                    added(figures, CONV_NAME, protocol, hop) / direct,
                    goal,
                    unit="x",
                )
            )
    return verdicts


def measure(rounds: int, requests: int) -> Figures:
    """(model, protocol, hop) -> the median ms per request of each round."""
    figures: Figures = {}
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="onnx-latency-")))
        repository = work / "repository"
        repository.mkdir()
        shutil.copytree(ROOT / "tests" / "models" / "add_one", repository / "add_one")
        write_conv_model(repository / CONV_NAME)
        triton = stack.enter_context(TritonServer(repository, onnx_standin=True))
        upstream = (triton.http_url, triton.grpc_url)
        senders: dict[tuple[str, str], dict[str, Send]] = {}
        for model in MODELS:
            _load(triton, model)
            proxy = stack.enter_context(running_proxy(upstream, [], model_id=model))
            (work / model).mkdir()
            full = stack.enter_context(
                running_full_path(upstream, [], work / model, model_id=model)
            )
            addresses = {"direct": upstream, "proxy": (proxy.rest, proxy.grpc)}
            addresses["full"] = (full.rest, full.grpc)
            for hop, (rest, grpc) in addresses.items():
                for protocol, send in _senders(model, rest, grpc, stack).items():
                    senders.setdefault((model, protocol), {})[hop] = send
        for turn in range(rounds):
            order = HOPS if turn % 2 == 0 else HOPS[::-1]
            for (model, protocol), by_hop in senders.items():
                for hop in order:
                    figure = _per_request_ms(by_hop[hop], requests)
                    figures.setdefault((model, protocol, hop), []).append(figure)
    return figures


def report(figures: Figures, rounds: int, requests: int) -> None:
    print(f"Median ms per request at concurrency 1 ({rounds} rounds of {requests} each):")
    print(f"{'model':<8} {'protocol':<8} {'direct':>8} {'proxy':>16} {'full path':>16}")
    last = []
    for model in MODELS:
        for protocol in ("REST", "gRPC"):
            direct = figures[(model, protocol, "direct")]
            cells = [f"{statistics.median(direct):8.3f}"]
            for hop in HOPS[1:]:
                through = figures[(model, protocol, hop)]
                more = added(figures, model, protocol, hop)
                cells.append(f"{statistics.median(through):8.3f} ({more:+.3f})")
            print(f"{model:<8} {protocol:<8} {cells[0]} {cells[1]:>16} {cells[2]:>16}")
            last.append(f"{model} {protocol} " + " / ".join(c.strip() for c in cells))
    print("onnx_latency: direct / proxy (added) / full path (added), ms: " + "; ".join(last))


def main() -> int:
    parser = command_line(
        "onnx_latency",
        (
            "Measures the per-request latency of a convolutional ONNX model and of add_one "
            "through a model pod's proxy and its full path (proxy and node gateway) beside "
            "Triton directly, REST and gRPC at concurrency 1, in --rounds rounds of --requests "
            "requests."
        ),
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=200, help="requests per hop per round")
    goals.add_flag(parser)
    args: argparse.Namespace = parser.parse_args()
    figures = measure(args.rounds, args.requests)
    report(figures, args.rounds, args.requests)
    return goals.exit_code(check_goals(figures), args.no_goal)


if __name__ == "__main__":
    raise SystemExit(main())
