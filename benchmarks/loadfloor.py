"""The floor a wake from zero is held to: a Triton of the node's build and flags loading the same
model files with the same configs over gRPC, the way the node's agent loads them.

`capture` copies the files the node's Triton holds for each model and the config Triton runs it
with (the agent's load override, as Triton reports it). `measure` then loads them into a Triton
of its own (`floor_server`: the node's Triton's settings but its repository and ports), after one
warm-up load, in each way asked, over several rounds: each model's figure is the seconds from the
round's start until Triton answered its load, and every model is unloaded before the next load
of a round. Two ways matter: at most the agent's `--parallel-loads` at once (its limit for one
GPU), and all at once (Triton's `--model-load-thread-count` then bounds it).

Loads go over gRPC, as the agent's do: Triton's HTTP front end keeps one of its few threads for
each load, so loads asked over HTTP past that many finish one after another.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import shutil
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from agent.triton import GRPC_HEADER_PREFIX
from sim.cluster import TRITON_ADMIN_HEADER
from sim.triton import TritonServer

BUSY = ("READY", "LOADING", "UNLOADING")
"""Index states of a model Triton holds or is still loading or unloading."""


def admin_metadata(header: str = TRITON_ADMIN_HEADER) -> tuple[tuple[str, str], ...]:
    """The gRPC metadata of the node's restricted repository API (`name:value`), as the agent
    sends it."""
    name, _, value = header.partition(":")
    return ((GRPC_HEADER_PREFIX + name.lower(), value),)


@dataclass(frozen=True)
class FloorModel:
    """One model as the floor loads it: its name in Triton (its directory's) and the config
    override its load carries (None: the files' own config)."""

    name: str
    config: str | None = None


@dataclass(frozen=True)
class Way:
    """How a floor asks for its loads: `at_once` at most at a time (None: all at once)."""

    label: str
    at_once: int | None


@dataclass(frozen=True)
class Floor:
    """One way's rounds: each round's seconds from its start until each model loaded."""

    way: Way
    rounds: tuple[tuple[float, ...], ...]

    @property
    def p95(self) -> float:
        """The median over rounds of each round's p95."""
        return statistics.median(percentile(list(r), 0.95) for r in self.rounds)

    @property
    def top(self) -> float:
        """The median over rounds of each round's last load."""
        return statistics.median(max(r) for r in self.rounds)

    def line(self) -> str:
        return (
            f"Triton over gRPC, {self.way.label}: p95 {self.p95:.2f} s, max {self.top:.2f} s "
            f"(medians of {len(self.rounds)} rounds)"
        )


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile by the nearest-rank rule (the largest for 1.0)."""
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def ways(parallel_loads: int) -> tuple[Way, Way]:
    """The agent's limit for one GPU, and all at once."""
    return Way(f"{parallel_loads} at a time", parallel_loads), Way("all at once", None)


def floor_server(node: TritonServer, repository: Path, log_path: Path | None) -> TritonServer:
    """A Triton with the node's Triton's settings (flags, load threads, backends, keeper) but
    `repository`, ports of its own and `log_path`: not started."""
    return dataclasses.replace(
        node,
        model_repository=repository,
        http_port=0,
        grpc_port=0,
        metrics_port=0,
        log_path=log_path,
    )


def capture(
    node: TritonServer,
    states: Mapping[str, str],
    models: Sequence[str],
    into: Path,
    header: str = TRITON_ADMIN_HEADER,
) -> list[FloorModel]:
    """For each of `models` (TritonModel or model ids), one of its replicas READY in the node's
    Triton: its files copied under `into` and the config Triton runs it with. A replica that
    leaves meanwhile (unloaded, its files removed) gives way to the next; KeyError when none is
    left."""
    ready = sorted(name for name, state in states.items() if state == "READY")
    name, _, value = header.partition(":")
    found = []
    for model in models:
        for entry in (n for n in ready if n.rpartition("-")[0] == model):
            request = urllib.request.Request(
                f"http://{node.http_url}/v2/models/{entry}/config", headers={name: value}
            )
            try:
                shutil.copytree(node.model_repository / entry, into / entry)
                with urllib.request.urlopen(request, timeout=30) as answer:
                    config = json.loads(answer.read())
            except OSError:
                continue
            found.append(FloorModel(entry, json.dumps(config, separators=(",", ":"))))
            break
        else:
            raise KeyError(f"model {model!r} has no replica READY in the node's Triton")
    return found


async def load_all(
    grpc_url: str,
    models: Sequence[FloorModel],
    at_once: int | None,
    metadata: tuple[tuple[str, str], ...] = admin_metadata(),
) -> tuple[float, ...]:
    """Ask Triton at `grpc_url` to load every model, at most `at_once` at a time (None: all at
    once), over one channel; each model's seconds from the start until its load answered."""
    turns = asyncio.Semaphore(at_once or max(len(models), 1))
    started = time.monotonic()
    async with grpc.aio.insecure_channel(grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

        async def load(model: FloorModel) -> float:
            request = service_pb2.RepositoryModelLoadRequest(model_name=model.name)
            if model.config is not None:
                request.parameters["config"].string_param = model.config
            async with turns:
                await stub.RepositoryModelLoad(request, metadata=metadata, timeout=600)
            return time.monotonic() - started

        return tuple(await asyncio.gather(*(load(m) for m in models)))


async def unload_all(
    grpc_url: str,
    names: Sequence[str],
    metadata: tuple[tuple[str, str], ...] = admin_metadata(),
    time_limit: float = 300.0,
) -> None:
    """Unload every model named and wait until Triton's index holds none of them."""
    async with grpc.aio.insecure_channel(grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for name in names:
            request = service_pb2.RepositoryModelUnloadRequest(model_name=name)
            await stub.RepositoryModelUnload(request, metadata=metadata, timeout=60)
        deadline = time.monotonic() + time_limit
        wanted = set(names)
        while True:
            index = await stub.RepositoryIndex(
                service_pb2.RepositoryIndexRequest(), metadata=metadata, timeout=60
            )
            if not any(m.name in wanted and m.state in BUSY for m in index.models):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"Triton still holds some of {len(names)} models")
            await asyncio.sleep(0.1)


async def _answering(grpc_url: str, metadata: tuple[tuple[str, str], ...], within: float) -> None:
    """Wait until Triton answers its repository index again (its keeper starts it again)."""
    deadline = time.monotonic() + within
    while True:
        try:
            async with grpc.aio.insecure_channel(grpc_url) as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                request = service_pb2.RepositoryIndexRequest()
                await stub.RepositoryIndex(request, metadata=metadata, timeout=5)
                return
        except grpc.aio.AioRpcError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def measure(
    grpc_url: str,
    models: Sequence[FloorModel],
    asked: Sequence[Way],
    rounds: int,
    metadata: tuple[tuple[str, str], ...] = admin_metadata(),
    *,
    retries: int = 2,
    log_tail: Callable[[], str] = lambda: "",
) -> list[Floor]:
    """One warm-up load of the first model, then `rounds` rounds of every way in turn (so that
    the machine's noise falls on each alike), every model unloaded after each. A round whose
    load Triton did not answer (it exited: its keeper starts it again) is said, with Triton's
    log, and run again, at most `retries` times in all."""
    names = [m.name for m in models]
    await load_all(grpc_url, models[:1], 1, metadata)
    await unload_all(grpc_url, names[:1], metadata)
    seen: dict[Way, list[tuple[float, ...]]] = {way: [] for way in asked}
    for _ in range(rounds):
        for way in asked:
            while True:
                try:
                    seen[way].append(await load_all(grpc_url, models, way.at_once, metadata))
                    break
                except grpc.aio.AioRpcError as e:
                    if retries < 1:
                        raise
                    retries -= 1
                    print(
                        f"a floor round ({way.label}) failed: {e.code().name} {e.details()}; "
                        f"running it again. Triton's log:\n{log_tail()}",
                        file=sys.stderr,
                        flush=True,
                    )
                    await _answering(grpc_url, metadata, 120)
                    await unload_all(grpc_url, names, metadata)
            await unload_all(grpc_url, names, metadata)
    return [Floor(way, tuple(seen[way])) for way in asked]


def run_floor(
    node: TritonServer, models: Sequence[FloorModel], repository: Path, asked: Sequence[Way],
    rounds: int,
) -> list[Floor]:  # fmt: skip
    """`measure` in a Triton of the node's settings over `repository` (the captured files)."""
    with floor_server(node, repository, repository.parent / "floor-triton.log") as triton:
        measured = measure(triton.grpc_url, models, asked, rounds, log_tail=triton.log_tail)
        return asyncio.run(measured)
