"""A model host's loader against a stand-in agent: a grpc.aio servicer of the real agent API that
lists the host's replicas (ListHosted) and keeps models by manifest digest as the agent does. The
files come over real HTTPS from the simulated model store; the real agent and Triton are the
end-to-end suite's.

The loop's decisions: a new replica is fetched, installed, loaded and listed in the models file
with its own limit; a draining or removed one leaves the file first and is unloaded only after
the drain; a failing replica does not hold up another; a restarted loader confirms what the
agent already has READY without sending its files again; SIGTERM ends the process with 0."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import grpc
import grpc.aio
import pytest

from agent.api.callgate import SMALL_MESSAGE_BYTES
from common.manifest import entries_from_proto, manifest_digest
from loader.agentclient import AgentClient
from loader.credentials import StorageCredential
from loader.errors import FetchError
from loader.host import Host, HostTiming
from loader.hostfiles import Fetch, fetch_off_loop
from loader.loading import Timing
from loader.retry import Backoff
from protos import agent_pb2, agent_pb2_grpc
from sim.modelstore import ModelStore
from sim.tls import self_signed
from tests.buckets import hostile_s3
from tests.conftest import MODELS_DIR

ROOT = Path(__file__).resolve().parents[2]
Context = grpc.aio.ServicerContext[object, object]


@dataclass
class StandInAgent(agent_pb2_grpc.AgentServicer):  # type: ignore[misc]
    """The agent's answers to a model host: its replicas, and the node's models by digest."""

    replicas: dict[str, agent_pb2.HostedReplica] = field(default_factory=dict)
    models: dict[str, tuple[agent_pb2.ModelState, str]] = field(default_factory=dict)
    """model id -> (state, manifest digest)."""
    rejects: set[str] = field(default_factory=set)
    """Models Triton refuses to load."""
    no_host_memory: set[str] = field(default_factory=set)
    """Models the agent refuses to load: they do not fit in Triton's host memory."""
    aborts: dict[str, tuple[str, grpc.StatusCode, str]] = field(default_factory=dict)
    """model id -> (the call, the code and the details it is refused with)."""
    strict: bool = False
    """Refuse calls about a model the host no longer lists, as the real agent does."""
    calls: list[tuple[str, str, float]] = field(default_factory=list)
    """(rpc, model id, wall-clock time): every call but ListHosted."""
    sleeping: set[str] = field(default_factory=set)
    """On-demand models unloaded while idle (INSTALLED, files kept)."""
    listings: int = 0
    reported: dict[str, tuple[str, str]] = field(default_factory=dict)
    """The failures the last ListHosted reported: model id -> (reason, message)."""
    largest: int = 0
    """The largest ListHosted request, in bytes."""
    parked: dict[str, int] = field(default_factory=dict)
    """The models parked on the host: model id -> maxConcurrency."""
    node_stopping: bool = False

    def host(
        self,
        model: str,
        uri: str,
        *,
        max_concurrency: int = 0,
        idle_seconds: int = 0,
        residency: str = "always",
        idempotent: bool | None = None,
    ) -> None:
        self.replicas[model] = agent_pb2.HostedReplica(
            model_id=model,
            replica=0,
            storage_uri=uri,
            residency=residency,
            max_concurrency=max_concurrency,
            idle_seconds=idle_seconds,
            idempotent=idempotent,
        )

    def count(self, rpc: str, model: str) -> int:
        return sum(1 for c in self.calls if c[:2] == (rpc, model))

    def when(self, rpc: str, model: str) -> float:
        return next(c[2] for c in self.calls if c[:2] == (rpc, model))

    def _status(self, model: str) -> agent_pb2.ModelStatus:
        state, digest = self.models.get(model, (agent_pb2.MODEL_STATE_ABSENT, ""))
        reason = "Triton refused it" if state == agent_pb2.MODEL_STATE_FAILED else ""
        return agent_pb2.ModelStatus(
            model_id=model,
            state=state,
            manifest_digest=digest,
            reason=reason,
            gpu_index=-1,
            sleeping=model in self.sleeping,
        )

    async def _note(self, rpc: str, model: str, context: Context) -> None:
        self.calls.append((rpc, model, time.time()))
        call, code, details = self.aborts.get(model, ("", grpc.StatusCode.OK, ""))
        if call == rpc:
            await context.abort(code, details)

    async def ListHosted(  # noqa: N802 - the generated servicer's name
        self, request: agent_pb2.ListHostedRequest, context: Context
    ) -> agent_pb2.ListHostedResponse:
        self.listings += 1
        self.reported = {f.model_id: (f.reason, f.message) for f in request.failures}
        self.largest = max(self.largest, request.ByteSize())
        listed = []
        for replica in self.replicas.values():
            copy = agent_pb2.HostedReplica()
            copy.CopyFrom(replica)
            copy.status.CopyFrom(self._status(replica.model_id))
            listed.append(copy)
        parked = [
            agent_pb2.HostedReplica(model_id=m, max_concurrency=c) for m, c in self.parked.items()
        ]
        return agent_pb2.ListHostedResponse(
            replicas=listed,
            refused=["other/0: no proof"],
            parked=parked,
            node_stopping=self.node_stopping,
        )

    async def GetModel(  # noqa: N802
        self, request: agent_pb2.GetModelRequest, context: Context
    ) -> agent_pb2.ModelStatus:
        await self._note("GetModel", request.model_id, context)
        if request.model_id not in self.models:
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such model")
        return self._status(request.model_id)

    async def InstallKept(  # noqa: N802
        self, request: agent_pb2.InstallHeader, context: Context
    ) -> agent_pb2.InstallModelResponse:
        await context.abort(grpc.StatusCode.NOT_FOUND, "no kept files")
        raise AssertionError("abort raises")

    async def InstallModel(  # noqa: N802
        self, request_iterator: AsyncIterator[agent_pb2.InstallModelRequest], context: Context
    ) -> agent_pb2.InstallModelResponse:
        header = None
        async for request in request_iterator:
            if request.HasField("header"):
                header = request.header
        assert header is not None
        await self._note("InstallModel", header.model_id, context)
        digest = manifest_digest(entries_from_proto(header.manifest))
        self.models[header.model_id] = (agent_pb2.MODEL_STATE_INSTALLED, digest)
        return agent_pb2.InstallModelResponse(model_id=header.model_id, manifest_digest=digest)

    async def LoadModel(  # noqa: N802
        self, request: agent_pb2.LoadModelRequest, context: Context
    ) -> agent_pb2.ModelStatus:
        await self._note("LoadModel", request.model_id, context)
        _, digest = self.models[request.model_id]
        if request.model_id in self.no_host_memory:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"model {request.model_id!r} of pod ns/{request.model_id}/0 does not fit in its "
                f"namespace's share of Triton's host memory: it needs 64 MiB",
            )
        rejected = request.model_id in self.rejects
        state = agent_pb2.MODEL_STATE_FAILED if rejected else agent_pb2.MODEL_STATE_READY
        self.models[request.model_id] = (state, digest)
        return self._status(request.model_id)

    async def UnloadModel(  # noqa: N802
        self, request: agent_pb2.UnloadModelRequest, context: Context
    ) -> agent_pb2.ModelStatus:
        await self._note("UnloadModel", request.model_id, context)
        if self.strict and request.model_id not in self.replicas:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "not this host's replica")
        if self.models.pop(request.model_id, None) is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such model")
        return self._status(request.model_id)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModelStore, Path]]:
    base = tmp_path_factory.mktemp("store")
    cert, key = self_signed(base / "tls")
    running = ModelStore(base / "files", cert, key)
    running.start()
    running.publish("add_one", MODELS_DIR / "add_one")
    running.publish("identity", MODELS_DIR / "identity")
    try:
        yield running, cert
    finally:
        running.stop()


@pytest.fixture
def models(store: tuple[ModelStore, Path], monkeypatch: pytest.MonkeyPatch) -> ModelStore:
    """The model store, its CA trusted as the host pod's SSL_CERT_FILE makes it."""
    monkeypatch.setenv("SSL_CERT_FILE", str(store[1]))
    return store[0]


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[tuple[StandInAgent, str]]:
    servicer = StandInAgent()
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    (tmp_path / "token").write_text("host-token")
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


class Counted:
    """The real fetcher, counting its calls by URI (or refusing to be called)."""

    def __init__(self, allowed: bool = True) -> None:
        self.calls: list[str] = []
        self.allowed = allowed

    async def __call__(
        self,
        uri: str,
        directory: Path,
        size: int,
        stop: threading.Event,
        credential: StorageCredential,
        seconds: float,
    ) -> str:
        self.calls.append(uri)
        assert self.allowed, f"{uri} was fetched again"
        return await fetch_off_loop(uri, directory, size, stop, credential, seconds)


class InFlight:
    """The real fetcher, counting the fetches of each URI under way, now and at most."""

    def __init__(self) -> None:
        self.now: dict[str, int] = {}
        self.peak: dict[str, int] = {}

    async def __call__(
        self,
        uri: str,
        directory: Path,
        size: int,
        stop: threading.Event,
        credential: StorageCredential,
        seconds: float,
    ) -> str:
        self.now[uri] = self.now.get(uri, 0) + 1
        self.peak[uri] = max(self.peak.get(uri, 0), self.now[uri])
        try:
            return await fetch_off_loop(uri, directory, size, stop, credential, seconds)
        finally:
            self.now[uri] -= 1


@contextlib.asynccontextmanager
async def following(
    address: str,
    tmp_path: Path,
    *,
    root: str = "models",
    drain_seconds: float = 0.0,
    unroute_seconds: float = 0.0,
    fetcher: Fetch = fetch_off_loop,
    parallel: int = 2,
    proxy_holds: Callable[[str], Awaitable[bool | None]] | None = None,
    secret_dir: Path | None = None,
    load_seconds: float = 30.0,
    fetch_seconds: float = 30.0,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
) -> AsyncIterator[Host]:
    client = AgentClient(
        address, tmp_path / "token", chunk_bytes=1 << 20, reconnect_max_seconds=1.0
    )
    backoff = Backoff(0.05, 0.2)
    timing = HostTiming(
        poll_seconds=0.05,
        drain_seconds=drain_seconds,
        call_seconds=10.0,
        load=Timing(
            total_seconds=load_seconds, attempt_seconds=10.0, poll_seconds=0.05, backoff=backoff
        ),
        unroute_seconds=unroute_seconds,
        drain_check_seconds=0.05,
        fetch_seconds=fetch_seconds,
    )
    host = Host(
        client,
        tmp_path / root,
        tmp_path / "ready" / "models.json",
        timing,
        parallel=parallel,
        max_bytes=1 << 30,
        proxy_holds=proxy_holds,
        fetcher=fetcher,
        secret_dir=secret_dir or tmp_path / "no-secrets",
        clock=clock,
        rng=rng,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(host.run(stop))
    try:
        yield host
    finally:
        stop.set()
        await task
        await client.close()


def listed(tmp_path: Path) -> list[dict[str, object]]:
    path = tmp_path / "ready" / "models.json"
    return json.loads(path.read_text()) if path.exists() else []


async def until(condition: Callable[[], object], what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        await asyncio.sleep(0.02)


def names(tmp_path: Path) -> list[object]:
    """Every model of the file, held (`parked`) ones too."""
    return [e["model"] for e in listed(tmp_path)]


def ready(tmp_path: Path) -> list[object]:
    """The models the file lists ready: loaded, not held while loading or parked."""
    return [e["model"] for e in listed(tmp_path) if not e.get("parked")]


async def test_a_new_replica_is_fetched_installed_loaded_and_listed_with_its_limits(
    agent: tuple[StandInAgent, str], models: ModelStore, tmp_path: Path
) -> None:
    servicer, address = agent
    # Listed first, fetched first (one at a time): done before add_one is listed.
    servicer.host("../escaped", models.url("add_one"))
    servicer.host(
        "add_one", models.url("add_one"), max_concurrency=3, idle_seconds=60, idempotent=True
    )
    async with following(address, tmp_path, parallel=1) as host:
        await until(lambda: ready(tmp_path) == ["add_one"], "add_one listed")
        assert listed(tmp_path) == [
            {"model": "add_one", "maxConcurrency": 3, "idleSeconds": 60, "idempotent": True}
        ]
        assert host.ready_models() == ["add_one"]
        assert [c[:2] for c in servicer.calls] == [
            ("GetModel", "add_one"),
            ("InstallModel", "add_one"),
            ("LoadModel", "add_one"),
        ]
        assert servicer.models["add_one"][0] == agent_pb2.MODEL_STATE_READY
        assert not (tmp_path / "escaped").exists(), "no model id names a path outside ROOT"
        assert (tmp_path / "models" / "add_one.0" / "1" / "model.py").is_file()
        # A limit changed on the TritonModel reaches the proxy's table with no reload.
        servicer.replicas["add_one"].max_concurrency = 5
        await until(lambda: listed(tmp_path)[0].get("maxConcurrency") == 5, "the new limit")
        assert servicer.count("LoadModel", "add_one") == 1


class Gated:
    """The real fetcher, once `release` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def __call__(
        self,
        uri: str,
        directory: Path,
        size: int,
        stop: threading.Event,
        credential: StorageCredential,
        seconds: float,
    ) -> str:
        await self.release.wait()
        return await fetch_off_loop(uri, directory, size, stop, credential, seconds)


async def test_a_replica_being_loaded_is_listed_held_until_it_is_ready(
    agent: tuple[StandInAgent, str], models: ModelStore, tmp_path: Path
) -> None:
    """The agent reports a replica loaded (and the binder puts the host behind its Service)
    before this loader lists it ready: meanwhile the proxy holds its requests (`parked`) rather
    than answering them as for an unknown model. A failed one is not held."""
    servicer, address = agent
    servicer.host("add_one", models.url("add_one"), max_concurrency=3)
    servicer.host("broken", models.url("add_one"))
    servicer.rejects.add("broken")
    gate = Gated()
    async with following(address, tmp_path, fetcher=gate):
        held = [{"model": "add_one", "parked": True, "maxConcurrency": 3}]
        await until(lambda: listed(tmp_path)[:1] == held, "held while it loads")
        gate.release.set()
        await until(
            lambda: listed(tmp_path) == [{"model": "add_one", "maxConcurrency": 3}],
            "ready; the rejected one not held",
        )


async def test_a_leaving_replica_leaves_the_file_first_and_is_unloaded_after_the_drain(
    agent: tuple[StandInAgent, str], models: ModelStore, tmp_path: Path
) -> None:
    servicer, address = agent
    servicer.host("add_one", models.url("add_one"))
    servicer.host("identity", models.url("identity"))
    drain, unroute = 0.5, 0.4
    async with following(address, tmp_path, drain_seconds=drain, unroute_seconds=unroute):
        await until(lambda: ready(tmp_path) == ["add_one", "identity"], "both listed")
        left = time.time()
        servicer.replicas["add_one"].draining = True
        del servicer.replicas["identity"]
        await until(lambda: names(tmp_path) == [], "both removed from the file")
        removed = (tmp_path / "ready" / "models.json").stat().st_mtime
        # Still served while the Service stops sending here.
        assert removed >= left + unroute - 0.05
        assert servicer.count("UnloadModel", "add_one") == 0, "not before the drain"
        await until(lambda: not servicer.models, "both unloaded")
        for model in ("add_one", "identity"):
            # The file's time has the filesystem's granularity: a few ms at most.
            assert servicer.when("UnloadModel", model) >= removed + drain - 0.05
        await until(lambda: not any((tmp_path / "models").glob("[!.]*")), "their files deleted")
        assert servicer.count("LoadModel", "add_one") == 1, "a draining replica stays down"


async def test_a_leaving_model_is_listed_leaving_while_its_service_moves(
    agent: tuple[StandInAgent, str], models: ModelStore, tmp_path: Path
) -> None:
    """While its Service stops routing here, a leaving model is still served and says so in the
    models file, so that the proxy sends its clients to the Service again; the others do not."""
    servicer, address = agent
    servicer.host("add_one", models.url("add_one"))
    servicer.host("identity", models.url("identity"))
    async with following(address, tmp_path, drain_seconds=0.5, unroute_seconds=1.0):
        await until(lambda: ready(tmp_path) == ["add_one", "identity"], "both listed")
        servicer.replicas["add_one"].draining = True
        await until(
            lambda: (
                {str(e["model"]): e.get("leaving", False) for e in listed(tmp_path)}
                == {"add_one": True, "identity": False}
            ),
            "add_one listed leaving, identity not",
        )
        await until(lambda: names(tmp_path) == ["identity"], "add_one removed from the file")


async def test_a_model_parked_where_its_last_replica_drains_is_not_listed_leaving(
    agent: tuple[StandInAgent, str], models: ModelStore, tmp_path: Path
) -> None:
    """Scaled to zero, a model whose last replica drains on the host it is parked on keeps its
    Service here: its clients are not sent away."""
    servicer, address = agent
    servicer.host("add_one", models.url("add_one"))
    async with following(address, tmp_path, drain_seconds=0.5, unroute_seconds=0.5):
        await until(lambda: ready(tmp_path) == ["add_one"], "listed")
        servicer.parked["add_one"] = 1
        servicer.replicas["add_one"].draining = True
        seen: list[list[dict[str, object]]] = []

        def parked() -> bool:
            seen.append(listed(tmp_path))
            return listed(tmp_path) == [{"model": "add_one", "parked": True, "maxConcurrency": 1}]

        await until(parked, "listed parked once its replica left")
        assert not any(entry.get("leaving") for entries in seen for entry in entries), seen


async def test_a_model_unparked_with_no_replica_here_stays_held_while_its_service_moves(
    agent: tuple[StandInAgent, str], tmp_path: Path
) -> None:
    """A parked model whose replica is served on another node leaves the annotation and the
    host's Service in one write: its proxy holds it `unroute_seconds` more, so a request routed
    before the endpoints caught up waits instead of finding an unknown model."""
    servicer, address = agent
    servicer.parked["zero"] = 2
    unroute = 0.4
    async with following(address, tmp_path, unroute_seconds=unroute):
        await until(
            lambda: listed(tmp_path) == [{"model": "zero", "parked": True, "maxConcurrency": 2}],
            "parked",
        )
        left = time.time()
        del servicer.parked["zero"]
        await until(lambda: names(tmp_path) == [], "removed from the file")
        removed = (tmp_path / "ready" / "models.json").stat().st_mtime
        assert removed >= left + unroute - 0.05
        servicer.parked["zero"] = 2
        await until(lambda: names(tmp_path) == ["zero"], "parked here again")
        del servicer.parked["zero"]
        await asyncio.sleep(0.1)  # within unroute_seconds: held again, for as long
        assert names(tmp_path) == ["zero"]
        await until(lambda: names(tmp_path) == [], "removed again")


async def test_a_leaving_replica_is_unloaded_once_the_proxy_has_drained_it(
    agent: tuple[StandInAgent, str], models: ModelStore, tmp_path: Path
) -> None:
    """The drain ends when the proxy drops the model (its requests finished), not at its bound;
    a proxy that cannot be asked leaves the whole bound."""
    servicer, address = agent
    servicer.host("add_one", models.url("add_one"))
    asked: list[str] = []

    async def proxy_holds(model: str) -> bool | None:
        asked.append(model)
        return len(asked) < 3  # still serving it twice, then drained

    async with following(address, tmp_path, drain_seconds=60.0, proxy_holds=proxy_holds):
        await until(lambda: ready(tmp_path) == ["add_one"], "listed")
        servicer.replicas["add_one"].draining = True
        await until(lambda: not servicer.models, "unloaded well before the 60 s bound")
        assert asked == ["add_one"] * 3


async def test_a_replica_taken_back_during_its_drain_stays_loaded_and_is_listed_again(
    agent: tuple[StandInAgent, str], models: ModelStore, tmp_path: Path
) -> None:
    """Scaled back up while it drains (the binder lists it not draining again): the drain ends
    where it is, before the unload, and the replica is listed again with nothing reloaded;
    taken back before it left the file, it never leaves it."""
    servicer, address = agent
    servicer.host("add_one", models.url("add_one"))

    async def proxy_holds(model: str) -> bool:
        return True  # the proxy holds the model's requests: the drain runs to its bound

    async with following(
        address, tmp_path, drain_seconds=60.0, unroute_seconds=0.3, proxy_holds=proxy_holds
    ):
        await until(lambda: ready(tmp_path) == ["add_one"], "listed")
        servicer.replicas["add_one"].draining = True
        await until(lambda: names(tmp_path) == [], "out of the file, draining")
        servicer.replicas["add_one"].draining = False
        await until(lambda: ready(tmp_path) == ["add_one"], "listed again", seconds=5.0)
        servicer.replicas["add_one"].draining = True
        await asyncio.sleep(0.1)  # within unroute_seconds: still in the file
        servicer.replicas["add_one"].draining = False
        await asyncio.sleep(0.5)
        assert ready(tmp_path) == ["add_one"]
        assert servicer.count("UnloadModel", "add_one") == 0
        assert servicer.count("LoadModel", "add_one") == 1
        assert servicer.models["add_one"][0] == agent_pb2.MODEL_STATE_READY


async def test_a_replica_taken_back_after_its_unload_is_loaded_again(
    agent: tuple[StandInAgent, str], models: ModelStore, tmp_path: Path
) -> None:
    servicer, address = agent
    servicer.host("add_one", models.url("add_one"))
    async with following(address, tmp_path, drain_seconds=0.1):
        await until(lambda: ready(tmp_path) == ["add_one"], "listed")
        servicer.replicas["add_one"].draining = True
        await until(lambda: not servicer.models, "unloaded")
        servicer.replicas["add_one"].draining = False
        await until(lambda: ready(tmp_path) == ["add_one"], "loaded and listed again")
        assert servicer.count("LoadModel", "add_one") == 2


async def test_a_failing_replica_does_not_hold_up_another(
    agent: tuple[StandInAgent, str], models: ModelStore, tmp_path: Path
) -> None:
    servicer, address = agent
    servicer.host("absent", models.url("absent"))
    servicer.host("identity", models.url("identity"))
    servicer.rejects.add("identity")
    servicer.host("add_one", models.url("add_one"))
    fetcher = Counted()
    async with following(address, tmp_path, fetcher=fetcher, parallel=1):
        await until(lambda: ready(tmp_path) == ["add_one"], "add_one listed")
        await until(lambda: fetcher.calls.count(models.url("absent")) >= 2, "404 retried")
        await until(lambda: servicer.count("LoadModel", "identity") >= 2, "rejection retried")
        assert ready(tmp_path) == ["add_one"]
        assert fetcher.calls.count(models.url("identity")) == 1, "fetched files are kept"
        # Each failure reaches the agent with a reason named after its cause, and the cause.
        await until(lambda: set(servicer.reported) == {"absent", "identity"}, "both reported")
        reason, message = servicer.reported["absent"]
        assert reason == "FetchFailed" and "HTTP 404" in message, servicer.reported
        reason, message = servicer.reported["identity"]
        assert reason == "ModelInvalid" and "Triton refused it" in message, servicer.reported
        # Fixed upstream: the next attempt serves it, and its failure is no longer reported.
        servicer.rejects.clear()
        await until(lambda: ready(tmp_path) == ["add_one", "identity"], "identity listed")
        await until(lambda: set(servicer.reported) == {"absent"}, "identity's failure cleared")


def _fetched(fetcher: Counted, times: int) -> bool:
    return len(fetcher.calls) >= times


class Longest(random.Random):
    """Jitter that always draws the longest delay its back-off allows."""

    def uniform(self, a: float, b: float) -> float:
        return b


async def test_a_replica_whose_store_is_down_is_tried_again_within_seconds_of_its_return(
    agent: tuple[StandInAgent, str], models: ModelStore, tmp_path: Path
) -> None:
    """A store that answers 503 (down for a while, or overloaded) serves the files a moment
    later: the replica's fetch is tried again at most 5 s apart, not up to a minute apart as
    for a model the store does not have, so that a wake or a stand-in waiting on the store
    loads within seconds of its return. Time runs ahead on the loader's clock while the store
    is down, so that ten failures take a moment."""
    servicer, address = agent
    servicer.host("add_one", models.url("add_one"))
    fetcher = Counted()
    ahead = [0.0]
    models.refuse()
    async with following(
        address,
        tmp_path,
        fetcher=fetcher,
        clock=lambda: time.monotonic() + ahead[0],
        rng=Longest(),
    ):
        for attempt in range(1, 11):
            await until(partial(_fetched, fetcher, attempt), f"fetch {attempt}")
            ahead[0] += 60.0  # the back-off of the failure before has passed
        await until(lambda: "add_one" in servicer.reported, "the failure reported")
        reason, message = servicer.reported["add_one"]
        assert reason == "FetchFailed" and "HTTP 503" in message, servicer.reported
        await asyncio.sleep(0.5)  # the tenth failure is counted, its next try set
        models.refuse(False)
        ahead[0] += 5.5
        await until(lambda: ready(tmp_path) == ["add_one"], "loaded once the store serves", 5.0)


def _unnamed(directory: Path) -> Path:
    """add_one's files with no name in config.pbtxt: served under any model id."""
    shutil.copytree(MODELS_DIR / "add_one", directory, ignore=shutil.ignore_patterns("__pycache__"))
    config = directory / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "add_one"\n', ""))
    return directory


def _config_only(directory: Path) -> Path:
    """A model directory with a config.pbtxt and no version directory."""
    directory.mkdir()
    shutil.copy(MODELS_DIR / "add_one" / "config.pbtxt", directory)
    return directory


FAILURES = {
    # model id: (where its files are, the call the agent refuses and how, reason, words said)
    "other_name": ("add_one", None, "ModelInvalid", ["'add_one'", "'other_name'"]),
    "absent": ("absent", None, "FetchFailed", ["answered HTTP 404"]),
    "no_version": ("no_version", None, "ModelInvalid", ["has no version directory"]),
    "triton_says_no": ("unnamed", None, "ModelInvalid", ["Triton refused it", "config.pbtxt"]),
    "files_refused": (
        "unnamed",
        ("InstallModel", grpc.StatusCode.INVALID_ARGUMENT, "1/model.py is not allowed"),
        "ModelInvalid",
        ["the agent refused the model files: 1/model.py is not allowed"],
    ),
    "no_room": (
        "unnamed",
        ("LoadModel", grpc.StatusCode.RESOURCE_EXHAUSTED, "GPU-1 has 512Mi free"),
        "ModelRejected",
        ["does not fit on its GPU now: GPU-1 has 512Mi free"],
    ),
    "quarantined": (
        "unnamed",
        ("LoadModel", grpc.StatusCode.FAILED_PRECONDITION, "these files are quarantined"),
        "ModelRejected",
        ["the agent refused to load the model: these files are quarantined"],
    ),
    "tenant_code": (
        "unnamed",
        ("LoadModel", grpc.StatusCode.PERMISSION_DENIED, "the python backend is not allowed"),
        "LoadRefused",
        ["the python backend is not allowed"],
    ),
    "never_ready": (
        "unnamed",
        ("LoadModel", grpc.StatusCode.ABORTED, "another load won"),
        "LoadTimedOut",
        ["was not READY after"],
    ),
    "agent_bug": (
        "unnamed",
        ("LoadModel", grpc.StatusCode.INTERNAL, "an internal error"),
        "ModelLoadFailed",
        ["the agent failed the LoadModel call with INTERNAL: an internal error"],
    ),
}


async def test_every_way_a_replica_fails_reaches_the_agent_with_its_reason_and_cause(
    agent: tuple[StandInAgent, str], models: ModelStore, tmp_path: Path
) -> None:
    """Each failure of a replica's fetch or load is reported to the agent (ListHosted) under
    the reason named after its cause, with the message a model pod's loader ends with: a
    config.pbtxt naming another model than the replica's id names both, Triton's refusal is
    ModelInvalid with Triton's words."""
    servicer, address = agent
    uris = {
        "add_one": models.url("add_one"),
        "absent": models.url("absent", release="nowhere"),
        "unnamed": models.publish("unnamed", _unnamed(tmp_path / "unnamed"), release="t"),
        "no_version": models.publish("no_version", _config_only(tmp_path / "config"), release="t"),
    }
    for model, (files, abort, _, _) in FAILURES.items():
        servicer.host(model, uris[files])
        if abort is not None:
            servicer.aborts[model] = abort
    servicer.rejects.add("triton_says_no")
    async with following(address, tmp_path, parallel=len(FAILURES), load_seconds=2.0):
        await until(lambda: set(servicer.reported) == set(FAILURES), "every failure reported")
        assert names(tmp_path) == []
    for model, (_, _, reason, words) in FAILURES.items():
        said, message = servicer.reported[model]
        assert said == reason and all(w in message for w in words), (model, said, message)


async def test_the_failures_reported_fit_in_what_the_agent_reads_of_a_listing(
    agent: tuple[StandInAgent, str], tmp_path: Path
) -> None:
    """Two hundred replicas failing with long reasons: each message is cut to one bounded line
    and the report stops before the listing grows past what the agent reads of it."""
    servicer, address = agent
    for n in range(200):
        servicer.host(f"m{n:03}", f"https://store.example/m{n:03}.tar.gz")

    tried: set[str] = set()

    async def refusing(uri: str, *_: object) -> str:
        tried.add(uri)
        raise FetchError(f"{uri} answered HTTP 404 Not Found\n" + "because " * 200)

    async with following(address, tmp_path, fetcher=refusing, parallel=8):
        await until(lambda: len(tried) == 200, "every replica tried")
        listings = servicer.listings
        await until(lambda: servicer.listings >= listings + 2, "a listing after every failure")
    assert 60 <= len(servicer.reported) < 200
    assert servicer.largest <= SMALL_MESSAGE_BYTES // 2, servicer.largest
    for reason, message in servicer.reported.values():
        assert reason == "FetchFailed" and "\n" not in message and len(message) <= 400


async def test_a_restarted_loader_confirms_what_the_agent_has_without_sending_it(
    agent: tuple[StandInAgent, str], models: ModelStore, tmp_path: Path
) -> None:
    servicer, address = agent
    servicer.host("add_one", models.url("add_one"))
    async with following(address, tmp_path):
        await until(lambda: ready(tmp_path) == ["add_one"], "add_one listed")
    assert ready(tmp_path) == ["add_one"], "stopping leaves the file to the proxy"
    servicer.calls.clear()
    written = (tmp_path / "ready" / "models.json").stat().st_ino
    # The container restarts: the emptyDir keeps the files, so nothing is fetched or sent.
    async with following(address, tmp_path, fetcher=Counted(allowed=False)) as host:
        await until(lambda: servicer.count("LoadModel", "add_one") == 1, "confirmed")
        await until(lambda: host.ready_models() == ["add_one"], "ready")
    assert servicer.count("InstallModel", "add_one") == 0
    assert (tmp_path / "ready" / "models.json").stat().st_ino == written, (
        "listed all along: the file was never rewritten"
    )
    # The pod is new (no files): fetched again, but the node's digest matches, nothing is sent.
    fetcher = Counted()
    async with following(address, tmp_path, root="fresh", fetcher=fetcher) as host:
        await until(lambda: servicer.count("LoadModel", "add_one") == 2, "confirmed again")
        await until(lambda: host.ready_models() == ["add_one"], "ready again")
    assert fetcher.calls == [models.url("add_one")]
    assert servicer.count("InstallModel", "add_one") == 0


async def test_new_files_replace_the_old_after_a_drain(
    agent: tuple[StandInAgent, str], models: ModelStore, tmp_path: Path
) -> None:
    servicer, address = agent
    servicer.host("add_one", models.url("add_one"))
    async with following(address, tmp_path, drain_seconds=0.2):
        await until(lambda: ready(tmp_path) == ["add_one"], "add_one listed")
        first = servicer.models["add_one"][1]
        v2 = models.publish("add_one", MODELS_DIR / "add_one", release="v2")
        servicer.replicas["add_one"].storage_uri = v2
        await until(lambda: names(tmp_path) == [], "removed while it changes")
        await until(lambda: servicer.count("LoadModel", "add_one") == 2, "loaded again")
        await until(lambda: ready(tmp_path) == ["add_one"], "listed again")
        assert servicer.count("UnloadModel", "add_one") == 1
        assert (tmp_path / "models" / ".sources" / "add_one.0").read_text() == v2
    assert servicer.models["add_one"][1] == first, "the same files: the same digest"


async def test_while_the_node_pod_stops_every_model_is_listed_leaving_and_stays_loaded(
    agent: tuple[StandInAgent, str], models: ModelStore, tmp_path: Path
) -> None:
    servicer, address = agent
    servicer.host("add_one", models.url("add_one"), max_concurrency=3)
    servicer.host("identity", models.url("identity"))
    async with following(address, tmp_path, drain_seconds=0.0, unroute_seconds=0.0):
        await until(lambda: ready(tmp_path) == ["add_one", "identity"], "both listed")
        assert not any(e.get("leaving") for e in listed(tmp_path))
        servicer.node_stopping = True
        await until(lambda: all(e.get("leaving") for e in listed(tmp_path)), "both leaving")
        assert listed(tmp_path) == [
            {"model": "add_one", "maxConcurrency": 3, "leaving": True},
            {"model": "identity", "leaving": True},
        ]
        seen = servicer.listings
        await until(lambda: servicer.listings >= seen + 5, "more polls")
        assert ready(tmp_path) == ["add_one", "identity"], "still served while it stops"
        assert not servicer.count("UnloadModel", "add_one"), "nothing is unloaded"
        # A new node pod's agent: listed as before (loaded again where its Triton lacks it).
        servicer.node_stopping = False
        await until(lambda: not any(e.get("leaving") for e in listed(tmp_path)), "listed again")
        assert ready(tmp_path) == ["add_one", "identity"]
    assert servicer.count("LoadModel", "add_one") == 1


async def test_a_model_the_node_lost_is_loaded_again_and_stays_listed(
    agent: tuple[StandInAgent, str], models: ModelStore, tmp_path: Path
) -> None:
    servicer, address = agent
    servicer.host("add_one", models.url("add_one"))
    fetcher = Counted()
    async with following(address, tmp_path, fetcher=fetcher):
        await until(lambda: ready(tmp_path) == ["add_one"], "add_one listed")
        del servicer.models["add_one"]  # the node lost it (its disk was wiped)
        await until(lambda: servicer.count("InstallModel", "add_one") == 2, "sent again")
        state = agent_pb2.MODEL_STATE_READY
        await until(lambda: servicer.models.get("add_one", (0,))[0] == state, "READY again")
        assert ready(tmp_path) == ["add_one"]
        assert fetcher.calls == [models.url("add_one")], "from the files kept under ROOT"


async def test_an_on_demand_replica_asleep_stays_listed_and_is_not_loaded_by_the_loader(
    agent: tuple[StandInAgent, str], models: ModelStore, tmp_path: Path
) -> None:
    servicer, address = agent
    servicer.host("add_one", models.url("add_one"), residency="on-demand", idle_seconds=1)

    async def polls(count: int) -> None:
        seen = servicer.listings
        await until(lambda: servicer.listings >= seen + count, f"{count} more polls")

    on_demand = [{"model": "add_one", "residency": "on-demand", "idleSeconds": 1}]
    async with following(address, tmp_path):
        await until(lambda: ready(tmp_path) == ["add_one"], "add_one listed")
        assert listed(tmp_path) == on_demand, "the proxy's table has its residency"
        # Its proxy puts it to sleep (UnloadModel idle): unloaded, its files kept.
        servicer.models["add_one"] = (
            agent_pb2.MODEL_STATE_INSTALLED,
            servicer.models["add_one"][1],
        )
        servicer.sleeping.add("add_one")
        await polls(3)
        assert ready(tmp_path) == ["add_one"], "served: its next request wakes it"
        assert servicer.count("LoadModel", "add_one") == 1
    # A restarted loader confirms it as it is, rather than waking it.
    async with following(address, tmp_path, fetcher=Counted(allowed=False)) as host:
        await polls(3)
        assert host.ready_models() == ["add_one"]
        assert listed(tmp_path) == on_demand
    assert servicer.count("LoadModel", "add_one") == 1, "still asleep"


async def test_a_replica_the_agent_forgot_is_deleted_even_if_it_cannot_be_unloaded(
    agent: tuple[StandInAgent, str], models: ModelStore, tmp_path: Path
) -> None:
    servicer, address = agent
    servicer.strict = True
    servicer.host("add_one", models.url("add_one"))
    async with following(address, tmp_path):
        await until(lambda: ready(tmp_path) == ["add_one"], "add_one listed")
        del servicer.replicas["add_one"]
        await until(lambda: servicer.count("UnloadModel", "add_one") == 1, "unload asked")
        await until(lambda: not (tmp_path / "models" / "add_one.0").exists(), "files deleted")
        assert not (tmp_path / "models" / ".sources" / "add_one.0").exists()
        assert names(tmp_path) == []


async def test_sigterm_stops_the_host_loader_with_exit_0(
    agent: tuple[StandInAgent, str], models: ModelStore, store: tuple[ModelStore, Path],
    tmp_path: Path,
) -> None:  # fmt: skip
    servicer, address = agent
    servicer.host("add_one", models.url("add_one"))
    models_file = tmp_path / "ready" / "models.json"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loader", "--host", "--agent-address", address,
        "--token-file", str(tmp_path / "token"), "--model-root", str(tmp_path / "models"),
        "--models-file", str(models_file), "--host-poll-seconds", "0.1",
        "--termination-log", str(tmp_path / "termination-log"),
        cwd=ROOT, env={**os.environ, "SSL_CERT_FILE": str(store[1])},
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        await until(lambda: ready(tmp_path) == ["add_one"], "add_one listed", 60.0)
        process.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()[-2000:]
    assert b"Received SIGTERM: stopping" in err
    assert servicer.count("UnloadModel", "add_one") == 0, "the proxy unloads as it drains"


async def test_a_replica_refused_for_triton_s_host_memory_is_reported_as_such(
    agent: tuple[StandInAgent, str], models: ModelStore, tmp_path: Path
) -> None:
    """The agent's refusal for host memory reaches the agent back under its own reason, in
    words that name host memory, not the GPU."""
    servicer, address = agent
    servicer.host("add_one", models.url("add_one"))
    servicer.no_host_memory.add("add_one")
    async with following(address, tmp_path):
        await until(lambda: "add_one" in servicer.reported, "the refusal reported")
        reason, message = servicer.reported["add_one"]
        assert reason == "InsufficientHostMemory", servicer.reported
        assert "does not fit in Triton's host memory now" in message, message
        assert "GPU" not in message, message


async def test_a_slow_bucket_holds_one_slot_at_most_and_fails_at_the_fetch_deadline(
    agent: tuple[StandInAgent, str],
    models: ModelStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two replicas of a model whose bucket trickles without end, listed before another model:
    they take turns at one of the host's two fetch slots, so the other model is fetched and
    served while the first trickle goes on; the slow fetch fails at the deadline, reported as
    FetchFailed with why. Then two such models, both retrying, hold one slot between them, and
    a model added later is served beside them."""
    servicer, address = agent
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "stand-in")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "stand-in")
    with hostile_s3() as hostile:

        def slow(model: str, ordinal: int = 0) -> agent_pb2.HostedReplica:
            return agent_pb2.HostedReplica(
                model_id=model,
                replica=ordinal,
                storage_uri=slow_uri,
                storage_options={"s3-endpoint": hostile.endpoint, "s3-usehttps": "0"},
            )

        slow_uri = "s3://models/slow/model.tar.gz"
        servicer.replicas["slow/0"], servicer.replicas["slow/1"] = slow("slow"), slow("slow", 1)
        servicer.host("add_one", models.url("add_one"))
        fetcher = InFlight()
        async with following(address, tmp_path, parallel=2, fetch_seconds=3.0, fetcher=fetcher):
            await until(lambda: hostile.reading == 1, "the slow model's first fetch")
            await until(lambda: ready(tmp_path) == ["add_one"], "add_one listed")
            assert fetcher.now[slow_uri] == 1, "the slow model is still being fetched"
            assert fetcher.peak[slow_uri] == 1, "one slot for the slow model"
            await until(lambda: "slow" in servicer.reported, "the slow fetch's failure")
            reason, message = servicer.reported["slow"]
            assert reason == "FetchFailed", message
            assert message.startswith(
                "s3://models/slow/model.tar.gz was not fetched within 3 s (--fetch-timeout)"
            ), message
            # A second slow model: once both have failed, their retries share one slot.
            servicer.replicas["slower"] = slow("slower")
            await until(lambda: "slower" in servicer.reported, "the second slow model failing")
            fetcher.peak[slow_uri] = fetcher.now[slow_uri]
            servicer.host("identity", models.url("identity"))
            await until(lambda: ready(tmp_path) == ["add_one", "identity"], "identity listed")
            assert fetcher.peak[slow_uri] <= 1, "failing models retry in one slot between them"
