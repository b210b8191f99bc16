"""A tenant tries to starve the other teams of the agent's memory and of the node's disk.

Through the agent's real gRPC API with real grpc clients, tokens
minted by sim/'s API server and a real Triton. The memory attack runs the agent as its own process
(`python -m sim.gpu.agent_node`), so its RSS is the agent's alone; the disk attack runs it in
process, where the test can shrink the disk the agent sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import kubernetes.client
import psutil
import pytest

from agent.api.callgate import MAX_MESSAGE_BYTES, UNAUTHENTICATED_CALL_BYTES
from protos import agent_pb2, agent_pb2_grpc
from sim.apiserver import RunningApiServer
from sim.triton import TritonServer
from tests.agent.conftest import (
    NODE,
    RunningAgent,
    StartAgent,
    bearer,
    eventually,
    install_dir,
    install_requests,
    make_pod,
    manifest_of,
)
from tests.agent.test_attacks import events, namespaces, refused, unnamed_model
from tests.fixtures_sim import write_test_placement_key

pytestmark = pytest.mark.triton

MIB = 1024**2
HEADROOM = 64 * MIB
SERVICE = "/tritonshare.agent.v1.Agent/"
# What grpc's client reports when the server ends a stream it is still writing (loader/errors.py).
CUT_STREAM_DETAILS = "Internal error from Core"


@pytest.fixture
def agent_process(
    kubeconfig: Path, node: str, triton: TritonServer, model_repository: Path, tmp_path: Path
) -> Iterator[tuple[str, psutil.Process]]:
    """The agent as a process of its own: its gRPC address and the process to measure."""
    ports, log_path = tmp_path / "ports.json", tmp_path / "agent.log"
    command = [
        sys.executable, "-m", "sim.gpu.agent_node", "--gpus", "2xT4", "--",
        "--node-name", NODE, "--kubeconfig", str(kubeconfig),
        "--triton-http-url", triton.http_url, "--triton-grpc-url", triton.grpc_url,
        "--model-repository", str(model_repository),
        "--listen-grpc", "127.0.0.1:0", "--listen-http", "127.0.0.1:0",
        "--ports-file", str(ports), "--cpu-only", "--tenant-code-namespaces", "default",
        "--placement-key-dir", str(write_test_placement_key(tmp_path / "key")),
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not ports.exists():
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "the agent did not write its ports file"
            time.sleep(0.05)
        yield json.loads(ports.read_text())["grpc"], psutil.Process(process.pid)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)


class PeakRss:
    """The highest RSS a process reaches while sampled every 10 ms on a thread."""

    def __init__(self, process: psutil.Process) -> None:
        self.process = process
        self.peak = process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="rss-sampler")

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


async def unauthenticated_caller(
    address: str, payload: bytes, token: str | None
) -> list[tuple[str, str, str]]:
    """One caller on its own connection: a large GetModel, then an install stream of messages
    just under the install limit, with no token or a bad one; (method, code, details) of each."""
    metadata = bearer(token) if token else ()
    options = [("grpc.max_send_message_length", -1)]
    answers = []
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        get = channel.unary_unary(SERVICE + "GetModel", None, None)
        try:
            await get(payload, metadata=metadata, timeout=60)
            answers.append(("GetModel", "OK", ""))
        except grpc.aio.AioRpcError as e:
            answers.append(("GetModel", e.code().name, e.details() or ""))
        chunk = agent_pb2.InstallModelRequest(
            chunk=agent_pb2.FileChunk(path="1/w.bin", offset=0, data=b"\1" * (4 * MIB - 1024))
        ).SerializeToString()

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(8):
                yield chunk

        install = channel.stream_unary(SERVICE + "InstallModel", None, None)
        try:
            await install(chunks(), metadata=metadata, timeout=60)
            answers.append(("InstallModel", "OK", ""))
        except grpc.aio.AioRpcError as e:
            answers.append(("InstallModel", e.code().name, e.details() or ""))
    return answers


async def test_callers_without_a_valid_token_cannot_grow_the_agents_memory(
    agent_process: tuple[str, psutil.Process],
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    """Sixteen callers on their own connections send 60 MiB GetModels and 4 MiB install chunks
    with no token or a forged one, all at once: each is refused, the agent's RSS grows by no
    more than UNAUTHENTICATED_CALL_BYTES per caller (docs/agent.md), and an honest loader's
    install succeeds meanwhile. Before the gate the agent read every message whole first."""
    address, process = agent_process
    make_pod(kube_api, "honest", "honest")
    make_pod(kube_api, "again", "again")
    token = apiserver.mint_token("default", "honest")
    source = unnamed_model(tmp_path)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = agent_pb2_grpc.AgentStub(channel)
        # One call first: grpc's own buffers and the TokenReview path are in the baseline.
        await refused(stub.GetModel(agent_pb2.GetModelRequest(model_id="honest")))
        await install_dir(stub, token, source, "honest")
        payload = agent_pb2.GetModelRequest(model_id="x" * (60 * MIB)).SerializeToString()
        callers = 16
        with PeakRss(process) as rss:
            baseline = process.memory_info().rss
            attack = asyncio.gather(
                *(
                    unauthenticated_caller(address, payload, None if i % 2 else f"forged.{i}.x")
                    for i in range(callers)
                )
            )
            again = apiserver.mint_token("default", "again")
            reply = await install_dir(stub, again, unnamed_model(tmp_path / "again"), "again")
            codes = await attack
    assert reply.bytes_written > 0
    grown = rss.peak - baseline
    assert grown <= callers * UNAUTHENTICATED_CALL_BYTES, (
        f"the agent grew by {grown / MIB:.0f} MiB under {callers} unauthenticated callers"
    )
    for method, code, details in (answer for answers in codes for answer in answers):
        # grpc's client drops the agent's status when it still has a write pending (a stream
        # refused before its first message was read); the agent refused it all the same.
        cut = method == "InstallModel" and (code, details) == ("INTERNAL", CUT_STREAM_DETAILS)
        assert code == "UNAUTHENTICATED" or cut, (method, code, details)


async def test_calls_with_a_token_hold_no_more_than_their_messages(
    agent_process: tuple[str, psutil.Process],
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
) -> None:
    """Eight pods with valid tokens each send twenty GetModels of almost 4 MiB, refused by the
    method's 64 KiB limit: the agent holds at most five messages per call in progress
    (docs/agent.md), not every message refused so far. Iterating grpc's request stream and
    leaving it early once kept each refused call's message until the cyclic garbage collector
    ran: +670 MiB here."""
    address, process = agent_process
    pods = [f"p{i}" for i in range(8)]
    for pod in pods:
        make_pod(kube_api, pod, pod)
    tokens = [apiserver.mint_token("default", pod) for pod in pods]
    payload = agent_pb2.GetModelRequest(model_id="x" * (MAX_MESSAGE_BYTES - 4096))
    raw = payload.SerializeToString()

    async def caller(token: str) -> set[str]:
        codes = set()
        async with grpc.aio.insecure_channel(address) as channel:
            get = channel.unary_unary(SERVICE + "GetModel", None, None)
            for _ in range(20):
                try:
                    await get(raw, metadata=bearer(token), timeout=60)
                    codes.add("OK")
                except grpc.aio.AioRpcError as e:
                    codes.add(f"{e.code().name}: {'over' in (e.details() or '')}")
        return codes

    with PeakRss(process) as rss:
        baseline = process.memory_info().rss
        answers = await asyncio.gather(*(caller(token) for token in tokens))
    assert set().union(*answers) == {"RESOURCE_EXHAUSTED: True"}
    grown = rss.peak - baseline
    assert grown <= len(pods) * 5 * MAX_MESSAGE_BYTES, f"the agent grew by {grown / MIB:.0f} MiB"


async def test_installs_refused_mid_stream_do_not_pile_up_in_memory(
    agent_process: tuple[str, psutil.Process],
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
) -> None:
    """Eight proven pods each start ten installs of 3 MiB chunks that are refused at the fourth
    chunk: the agent holds at most five messages per call in progress. With context.abort()
    grpc kept each refused call's frames (the chunks read and gathered) on the call, in a cycle
    only the cyclic collector frees: +720 MiB for 160 such installs."""
    address, process = agent_process
    pods = [f"p{i}" for i in range(8)]
    for pod in pods:
        make_pod(kube_api, pod, pod)
    tokens = [apiserver.mint_token("default", pod) for pod in pods]
    data = b"\4" * (3 * MIB)

    def requests(model_id: str) -> Iterator[Any]:
        files = [("config.pbtxt", 10), ("1/w.bin", 48 * MIB)]
        yield agent_pb2.InstallModelRequest(
            header=agent_pb2.InstallHeader(
                model_id=model_id,
                manifest=agent_pb2.Manifest(
                    files=[agent_pb2.FileEntry(path=p, size=s, sha256="0" * 64) for p, s in files]
                ),
            )
        )
        for offset in (0, 3 * MIB, 6 * MIB, 27 * MIB):  # the last one out of order
            yield agent_pb2.InstallModelRequest(
                chunk=agent_pb2.FileChunk(path="1/w.bin", offset=offset, data=data)
            )

    async def caller(pod: str, token: str) -> set[str]:
        codes = set()
        async with grpc.aio.insecure_channel(address) as channel:
            stub = agent_pb2_grpc.AgentStub(channel)
            for _ in range(10):
                try:
                    await stub.InstallModel(requests(pod), metadata=bearer(token))
                    codes.add("OK")
                except grpc.aio.AioRpcError as e:
                    codes.add(e.code().name)
        return codes

    with PeakRss(process) as rss:
        baseline = process.memory_info().rss
        answers = await asyncio.gather(*map(caller, pods, tokens))
    assert set().union(*answers) == {"INVALID_ARGUMENT"}
    grown = rss.peak - baseline
    assert grown <= len(pods) * 5 * MAX_MESSAGE_BYTES, f"the agent grew by {grown / MIB:.0f} MiB"


@pytest.fixture
async def ended() -> AsyncIterator[asyncio.Event]:
    """Set as the test ends: the moment header-only installs stop waiting. grpc.aio keeps reading
    a call's request iterator after the server has ended the call, so one that waited forever
    would outlive the test."""
    event = asyncio.Event()
    yield event
    event.set()


async def header_only(model_id: str, size: int, until: asyncio.Event) -> AsyncIterator[Any]:
    """An install that declares `size` bytes and then sends nothing until the test ends."""
    yield agent_pb2.InstallModelRequest(
        header=agent_pb2.InstallHeader(
            model_id=model_id,
            manifest=agent_pb2.Manifest(
                files=[
                    agent_pb2.FileEntry(path="config.pbtxt", size=16, sha256="0" * 64),
                    agent_pb2.FileEntry(path="1/w.bin", size=size - 16, sha256="0" * 64),
                ]
            ),
        )
    )
    await until.wait()


async def test_installs_that_send_nothing_hold_no_disk_and_a_namespace_has_a_bound(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    model_repository: Path,
    tmp_path: Path,
    start_custom_agent: StartAgent,
    ended: asyncio.Event,
) -> None:
    """Pods of team-a open installs that declare the per-model limit and send nothing, or send
    part of a model and stall: team-b's install still succeeds, team-a's staged bytes are what
    it sent, team-a cannot stage more than its bound, and no refusal names the free space."""
    running: RunningAgent = await start_custom_agent(
        max_model_bytes=8 * MIB,
        max_install_bytes_per_namespace=6 * MIB,
        install_first_chunk_seconds=60.0,
    )
    repository = running.agent.repository
    # The disk holds the headroom and 12 MiB: today's reservations of two 8 MiB headers fill it.
    repository.disk_free = lambda _: HEADROOM + 12 * MIB
    namespaces(kube_api, "team-a", "team-b")
    for name in ("a1", "a2", "a3", "a4"):
        make_pod(kube_api, name, name, namespace="team-a")
    make_pod(kube_api, "b1", "b1", namespace="team-b")
    make_pod(kube_api, "b2", "b2", namespace="team-b")
    token = {
        n: apiserver.mint_token("team-a" if n.startswith("a") else "team-b", n)
        for n in ("a1", "a2", "a3", "a4", "b1", "b2")
    }

    # Over the namespace's bound at the header: refused at once, naming the flag, not the disk.
    over = await refused(
        running.stub.InstallModel(header_only("a1", 7 * MIB, ended), metadata=bearer(token["a1"]))
    )
    assert over.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-install-bytes-per-namespace" in (over.details() or "")

    # Headers that send nothing hold nothing: not the disk, not the namespace's bound (before,
    # these two reserved the whole disk and team-b's install below was refused "0 are free").
    stalled = [
        running.stub.InstallModel(header_only(n, 6 * MIB, ended), metadata=bearer(token[n]))
        for n in ("a1", "a2")
    ]
    await eventually(lambda: len(list(repository.staging_root.iterdir())) == 2, what="staging")
    assert repository.staged_bytes("team-a") == 0

    # All of a model but its config.pbtxt (sent last), then silence: the namespace holds what
    # arrived, its bound less the config's few bytes.
    source = unnamed_model(tmp_path / "a")
    small = {path: size for path, size, _ in manifest_of(source)}
    weights = 6 * MIB - small["1/model.py"] - small["config.pbtxt"]
    (source / "1" / "weights.bin").write_bytes(b"\2" * weights)
    files = manifest_of(source)
    sent = asyncio.Event()

    async def partial() -> AsyncIterator[Any]:
        requests = install_requests("a3", files, lambda p: (source / p).read_bytes(), 3 * MIB)
        async for request in requests:
            if request.WhichOneof("part") == "chunk" and request.chunk.path == "config.pbtxt":
                sent.set()
                await asyncio.Event().wait()
            yield request

    stalled.append(running.stub.InstallModel(partial(), metadata=bearer(token["a3"])))
    await sent.wait()
    held = 6 * MIB - small["config.pbtxt"]
    await eventually(lambda: repository.staged_bytes("team-a") == held, what="a3's bytes")

    # Another pod of team-a would pass the namespace's bound with the bytes it sends: refused.
    crossing = await refused(install_dir(running.stub, token["a4"], unnamed_model(tmp_path), "a4"))
    assert crossing.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "namespace team-a" in (crossing.details() or "")
    assert "--max-install-bytes-per-namespace" in (crossing.details() or "")

    # Another team installs as if team-a were not there.
    other = unnamed_model(tmp_path / "b")
    (other / "1" / "weights.bin").write_bytes(b"\3" * (3 * MIB))
    reply = await install_dir(running.stub, token["b1"], other, "b1")
    assert reply.bytes_written >= 3 * MIB

    # A disk that really is full refuses without a figure: no free space to read off it.
    repository.disk_free = lambda _: HEADROOM + 97
    full = await refused(
        install_dir(running.stub, token["b2"], unnamed_model(tmp_path / "c"), "b2")
    )
    assert full.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = full.details() or ""
    assert "no room" in details and "try again" in details
    assert not re.search(r"\d", details.replace("'b2'", "")), details
    # The loader may see only grpc's "Internal error from Core" for a refusal mid-stream; the
    # pod's Events carry the agent's reason.
    await eventually(
        lambda: any(r == "ModelInstallNoRoom" for r, _ in events(kube_api, "team-b", "b2")),
        what="the Event on pod team-b/b2",
    )

    for call in stalled:
        call.cancel()
    await eventually(lambda: repository.staged_bytes("team-a") == 0, what="team-a's staging")
    await eventually(lambda: not list(repository.staging_root.iterdir()), what="staging emptied")


async def test_one_namespace_cannot_take_every_call_the_agent_serves(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    start_custom_agent: StartAgent,
    ended: asyncio.Event,
) -> None:
    """Pods of team-a open installs and leave them waiting: past --max-calls-per-namespace their
    next call is refused while team-b is served; past --max-calls every caller is told to retry
    (UNAVAILABLE, which loaders retry) until calls finish; a stream that sends only a header
    gives its slots back after --install-first-chunk-seconds."""
    running = await start_custom_agent(
        max_calls=3, max_calls_per_namespace=2, install_first_chunk_seconds=30.0
    )
    namespaces(kube_api, "team-a", "team-b")
    for name in ("a1", "a2", "a3"):
        make_pod(kube_api, name, name, namespace="team-a")
    for name in ("b1", "b2"):
        make_pod(kube_api, name, name, namespace="team-b")
    token = {
        n: apiserver.mint_token("team-a" if n.startswith("a") else "team-b", n)
        for n in ("a1", "a2", "a3", "b1", "b2")
    }

    def get(name: str) -> Any:
        request = agent_pb2.GetModelRequest(model_id=name)
        return running.stub.GetModel(request, metadata=bearer(token[name]))

    def held(name: str) -> Any:
        return running.stub.InstallModel(
            header_only(name, MIB, ended), metadata=bearer(token[name])
        )

    stalled = [held("a1"), held("a2")]
    await eventually(lambda: running.agent.gate._in_progress.get("namespace/team-a") == 2)
    over = await refused(get("a3"))
    assert over.code() == grpc.StatusCode.UNAVAILABLE
    assert "namespace team-a" in (over.details() or "")
    assert (await get("b1")).model_id == "b1"

    stalled.append(held("b1"))
    await eventually(lambda: running.agent.gate._in_progress.get("namespace/team-b") == 1)
    busy = await refused(get("b2"))
    assert busy.code() == grpc.StatusCode.UNAVAILABLE
    assert "--max-calls" in (busy.details() or "")
    for call in stalled:
        call.cancel()
    await eventually(lambda: not running.agent.gate._in_progress, what="the calls to end")
    assert (await get("b2")).model_id == "b2"


async def test_two_namespaces_holding_every_call_they_may_cannot_keep_a_third_out(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    start_custom_agent: StartAgent,
    ended: asyncio.Event,
) -> None:
    """With the default bounds (--max-calls 32, 16 per namespace, 8 per pod), team-a and team-b
    each open as many installs as the agent lets them, from two pods each, and leave them
    waiting: team-c, calling for the first time, is still served, and so is team-d after it.
    On the code before, 16 + 16 calls took all 32 slots and every other team was told to retry
    (UNAVAILABLE) until they ended."""
    running = await start_custom_agent(install_first_chunk_seconds=30.0)
    teams = {"a1": "team-a", "a2": "team-a", "b1": "team-b", "b2": "team-b"}
    teams |= {"c1": "team-c", "d1": "team-d"}
    namespaces(kube_api, *sorted(set(teams.values())))
    for name, namespace in teams.items():
        make_pod(kube_api, name, name, namespace=namespace)
    token = {name: apiserver.mint_token(namespace, name) for name, namespace in teams.items()}
    stalled = [
        running.stub.InstallModel(header_only(name, MIB, ended), metadata=bearer(token[name]))
        for name in ("a1", "a2", "b1", "b2")
        for _ in range(8)
    ]
    gate = running.agent.gate
    await eventually(
        lambda: gate._counts.get("in progress", 0) + sum(c.done() for c in stalled) == 32,
        what="every install of team-a and team-b to be held or refused",
    )
    held = {n: gate._in_progress.get(f"namespace/{n}", 0) for n in ("team-a", "team-b")}
    for name in ("c1", "d1"):
        request = agent_pb2.GetModelRequest(model_id=name)
        try:
            answer = await running.stub.GetModel(request, metadata=bearer(token[name]))
        except grpc.aio.AioRpcError as e:
            pytest.fail(f"{teams[name]} was refused ({e.code().name}: {e.details()}); held: {held}")
        assert answer.model_id == name
    # Each of the two holds no more than its share of what the newcomers' reserve leaves.
    assert max(held.values()) <= 16 and sum(held.values()) <= 32 - 4, held
    for call in stalled:
        call.cancel()
    await eventually(lambda: not gate._in_progress, what="the calls to end")


async def test_a_stream_that_sends_only_a_header_gives_its_slots_back_in_seconds(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    start_custom_agent: StartAgent,
    ended: asyncio.Event,
) -> None:
    running = await start_custom_agent(install_first_chunk_seconds=0.5)
    make_pod(kube_api, "quiet", "quiet")
    token = apiserver.mint_token("default", "quiet")
    call = running.stub.InstallModel(header_only("quiet", MIB, ended), metadata=bearer(token))
    error = await refused(call)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "--install-first-chunk-seconds" in (error.details() or "")
    assert not running.agent.gate._in_progress
    assert not list(running.agent.repository.staging_root.iterdir())


H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
GOAWAY = 7


async def test_an_idle_connection_is_ended_so_connections_cannot_pile_up(
    start_custom_agent: StartAgent,
) -> None:
    """grpc's server bounds no connection count, and each connection that sent the preface was
    kept for ever (about 15 KiB each: some 60,000 from a few pods' source ports pass the agent's
    limit). One with no call in progress is now ended after --idle-connection-seconds."""
    running = await start_custom_agent(idle_connection_seconds=1.0)
    host, _, port = running.agent.grpc_address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(H2_PREFACE + EMPTY_SETTINGS)
        await writer.drain()
        kinds: list[int] = []

        async def frames() -> None:
            while GOAWAY not in kinds:
                head = await reader.readexactly(9)
                kinds.append(head[3])
                await reader.readexactly(int.from_bytes(head[:3], "big"))

        # Before: no GOAWAY came (grpc ends only connections that never send the preface, after
        # 120 s); now one comes a second or so after the last call, with jitter.
        await asyncio.wait_for(frames(), timeout=15)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    assert GOAWAY in kinds
