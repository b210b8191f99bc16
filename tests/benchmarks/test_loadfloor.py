"""The floor a wake from zero is held to is fair by its method, not only by its flags: against a
Triton gRPC server whose loads take a fixed time, it loads as many at once as the node's agent
may (and all at once in its other way), with the config and admin header the agent sends, so its
time is that of the loads in parallel; a floor whose loads finish one after another (as loads
asked over Triton's HTTP front end do past its threads) is refused by the same check. And it runs
in a Triton of the node's own settings, loading the files and config the product loaded."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from agent.triton import GRPC_HEADER_PREFIX
from benchmarks import loadfloor
from benchmarks.loadfloor import FloorModel
from sim.cluster import TRITON_ADMIN_HEADER
from sim.triton import PARALLEL_LOADS, TritonInstall, TritonServer
from tests.conftest import copy_model

LOAD_SECONDS = 0.1
MODELS = 24
NAME, _, KEY = TRITON_ADMIN_HEADER.partition(":")
HEADER = GRPC_HEADER_PREFIX + NAME  # as the agent sends it, and Triton wants it

Context = grpc.aio.ServicerContext[object, object]
FloorFn = Callable[[str, Sequence[FloorModel]], Awaitable[object]]


class FakeTriton(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """Triton's repository API over gRPC: each load takes LOAD_SECONDS; it records how many
    loads ran at once, and what each load carried."""

    def __init__(self) -> None:
        self.loading = 0
        self.peak = 0
        self.loaded: set[str] = set()
        self.configs: dict[str, str] = {}
        self.keys: list[str] = []
        self.loads = 0
        self.failing: set[int] = set()
        """Loads (by number, from 1) refused as a Triton exiting under them refuses them."""

    async def RepositoryModelLoad(  # noqa: N802 (the generated servicer's name)
        self, request: service_pb2.RepositoryModelLoadRequest, context: Context
    ) -> service_pb2.RepositoryModelLoadResponse:
        self.loads += 1
        if self.loads in self.failing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "Stream removed (Socket closed)")
        self.keys.append(dict(context.invocation_metadata() or ()).get(HEADER, ""))
        if "config" in request.parameters:
            self.configs[request.model_name] = request.parameters["config"].string_param
        self.loading += 1
        self.peak = max(self.peak, self.loading)
        try:
            await asyncio.sleep(LOAD_SECONDS)
        finally:
            self.loading -= 1
        self.loaded.add(request.model_name)
        return service_pb2.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(  # noqa: N802
        self, request: service_pb2.RepositoryModelUnloadRequest, context: Context
    ) -> service_pb2.RepositoryModelUnloadResponse:
        self.loaded.discard(request.model_name)
        return service_pb2.RepositoryModelUnloadResponse()

    async def RepositoryIndex(  # noqa: N802
        self, request: service_pb2.RepositoryIndexRequest, context: Context
    ) -> service_pb2.RepositoryIndexResponse:
        index = service_pb2.RepositoryIndexResponse()
        for name in sorted(self.loaded):
            index.models.add(name=name, state="READY")
        return index


@pytest.fixture
async def fake() -> AsyncIterator[tuple[str, FakeTriton]]:
    servicer = FakeTriton()
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        await server.stop(None)


def _models(count: int = MODELS) -> list[FloorModel]:
    return [FloorModel(f"m{i}-{i:024x}", f'{{"name":"m{i}-{i:024x}"}}') for i in range(count)]


async def method_problems(floor: FloorFn, url: str, fake: FakeTriton, at_once: int) -> list[str]:
    """What makes `floor` unfair as a floor that should load `at_once` at a time: fewer at once,
    a time longer than its loads in parallel take, or loads without the config or the header."""
    models = _models()
    started = time.monotonic()
    await floor(url, models)
    took = time.monotonic() - started
    problems = []
    if fake.peak < at_once:
        problems.append(f"it loaded at most {fake.peak} at once, not {at_once}")
    parallel = math.ceil(len(models) / at_once) * LOAD_SECONDS
    if took > 2 * parallel + 0.5:
        problems.append(f"{len(models)} loads took {took:.2f} s, {at_once} at once take {parallel}")
    if {m.name: m.config for m in models} != fake.configs:
        problems.append("its loads did not carry the product's configs")
    if set(fake.keys) != {KEY}:
        problems.append("its loads did not carry the node's admin header")
    return problems


async def test_the_fair_floor_loads_as_many_at_once_as_the_agent_may(
    fake: tuple[str, FakeTriton],
) -> None:
    url, servicer = fake
    bounded, _ = loadfloor.ways(PARALLEL_LOADS)

    async def floor(url: str, models: Sequence[FloorModel]) -> object:
        return await loadfloor.load_all(url, models, bounded.at_once)

    assert await method_problems(floor, url, servicer, PARALLEL_LOADS) == []
    assert servicer.peak == PARALLEL_LOADS  # and never more than the agent's limit


async def test_the_unbounded_floor_asks_for_every_load_at_once(
    fake: tuple[str, FakeTriton],
) -> None:
    url, servicer = fake
    _, unbounded = loadfloor.ways(PARALLEL_LOADS)

    async def floor(url: str, models: Sequence[FloorModel]) -> object:
        return await loadfloor.load_all(url, models, unbounded.at_once)

    assert await method_problems(floor, url, servicer, MODELS) == []


async def test_a_floor_whose_loads_finish_one_after_another_is_refused(
    fake: tuple[str, FakeTriton],
) -> None:
    """Loads asked over Triton's HTTP front end past its threads each hold a thread until done:
    they finish one after another, whatever `--model-load-thread-count` says."""
    url, servicer = fake

    async def serialised(url: str, models: Sequence[FloorModel]) -> object:
        return [await loadfloor.load_all(url, [m], None) for m in models]

    problems = await method_problems(serialised, url, servicer, PARALLEL_LOADS)
    assert problems[0] == f"it loaded at most 1 at once, not {PARALLEL_LOADS}"
    assert "loads took" in problems[1]


async def test_rounds_warm_up_once_and_unload_between_rounds(
    fake: tuple[str, FakeTriton],
) -> None:
    url, servicer = fake
    models = _models(10)
    floors = await loadfloor.measure(url, models, loadfloor.ways(4), rounds=2)
    assert [f.way.at_once for f in floors] == [4, None]
    for floor in floors:
        assert len(floor.rounds) == 2 and all(len(r) == 10 for r in floor.rounds)
    bounded, unbounded = floors
    # 3 turns of 4 against 1 of 10.
    assert bounded.top >= 3 * LOAD_SECONDS > unbounded.top
    assert servicer.loaded == set()
    assert servicer.peak == 10


async def test_a_round_triton_did_not_answer_is_said_and_run_again(
    fake: tuple[str, FakeTriton], capsys: pytest.CaptureFixture[str]
) -> None:
    url, servicer = fake
    models = _models(4)
    servicer.failing = {2}  # the warm-up is load 1: the round's first load fails

    def measured(retries: int) -> Awaitable[list[loadfloor.Floor]]:
        ways = loadfloor.ways(2)[:1]
        return loadfloor.measure(url, models, ways, 1, retries=retries, log_tail=lambda: "E1 log")

    [floor] = await measured(retries=1)
    assert len(floor.rounds) == 1 and len(floor.rounds[0]) == 4
    said = capsys.readouterr().err
    assert "a floor round (2 at a time) failed: UNAVAILABLE" in said and "E1 log" in said
    servicer.loads, servicer.failing = 0, {2}
    with pytest.raises(grpc.aio.AioRpcError):
        await measured(retries=0)


def test_a_floor_reports_the_medians_of_its_rounds() -> None:
    way = loadfloor.Way("8 at a time", 8)
    floor = loadfloor.Floor(way, ((1.0, 2.0, 3.0), (1.0, 5.0, 9.0), (2.0, 2.0, 4.0)))
    assert (floor.p95, floor.top) == (4.0, 4.0)
    assert floor.line() == (
        "Triton over gRPC, 8 at a time: p95 4.00 s, max 4.00 s (medians of 3 rounds)"
    )


def test_the_floors_triton_has_the_nodes_settings_but_its_files_and_ports(
    tmp_path: Path,
) -> None:
    # As the simulated cluster starts a node's Triton (`SimCluster._new_triton`).
    node = TritonServer(
        tmp_path / "node", restricted=True, onnx_standin=True, kept=True, parallel_loads=16
    )
    node.grpc_port = 8001
    floor = loadfloor.floor_server(node, tmp_path / "floor", tmp_path / "floor.log")
    install, backends = TritonInstall.find(), tmp_path / "backends"
    want = [
        a.replace(str(tmp_path / "node"), str(tmp_path / "floor")).replace("=8001", "=0")
        for a in node.command(install, backends)
    ]
    got = floor.command(install, backends)
    assert [a for a in got if "shm-region" not in a] == [a for a in want if "shm-region" not in a]
    assert "--model-load-thread-count=16" in got and floor.kept and floor.onnx_standin
    assert floor.shm_prefix != node.shm_prefix and floor.process is None


@pytest.mark.triton
def test_the_floor_loads_the_files_and_config_the_product_loaded(
    triton_install: TritonInstall, tmp_path: Path
) -> None:
    """A real Triton of the node's kind holds a replica; the floor copies its files and config
    (passing over a replica gone since the index was read) and loads them in a Triton of its
    own, 2 rounds of each way."""
    name = f"zero-1-0-{'ab' * 12}"
    node = TritonServer(tmp_path / "node", restricted=True, parallel_loads=2)
    node.model_repository.mkdir()
    copy_model("add_one", node.model_repository, name)
    with node:
        asyncio.run(loadfloor.load_all(node.grpc_url, [FloorModel(name)], 1))
        gone = f"zero-1-0-{'00' * 12}"  # READY in the index read, unloaded since
        states = {gone: "READY", name: "READY", f"zero-1-1-{'cd' * 12}": "UNAVAILABLE"}
        models = loadfloor.capture(node, states, ["zero-1-0"], tmp_path / "floor" / "models")
        with pytest.raises(KeyError, match="'zero-1-1' has no replica READY"):
            loadfloor.capture(node, states, ["zero-1-1"], tmp_path / "other")
    assert [m.name for m in models] == [name]
    assert models[0].config is not None and f'"name":"{name}"' in models[0].config
    floors = loadfloor.run_floor(
        node, models, tmp_path / "floor" / "models", loadfloor.ways(2), rounds=2
    )
    assert [len(f.rounds) for f in floors] == [2, 2]
    assert all(0 < f.p95 <= f.top for f in floors)
