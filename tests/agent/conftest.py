"""Fixtures for the agent's tests: a Node and pods in sim/, an in-process agent with a mock NVML
beside a real Triton, a gRPC stub, and a helper that installs a model directory as a loader would.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import kubernetes.client
import pytest

from agent.app import Agent
from agent.settings import Settings
from common.contract import TENANT_CODE_NODE, Keys
from common.lifecycle import Lifecycle
from common.tritonname import private_triton_name
from protos import agent_pb2, agent_pb2_grpc
from sim.gpu.nvml import MockNvml, parse_spec
from sim.triton import TritonServer
from tests.fixtures_sim import sign_placement, write_test_placement_key

NODE = "gpu-node-1"
SCHEDULER = "tritonshare"
CHUNK = 256 * 1024


def make_node(
    api: kubernetes.client.ApiClient, name: str = NODE, *, tenant_code: bool = True
) -> None:
    """A Node, labelled as dedicated to tenant code unless `tenant_code` is False: the tests'
    agents let their namespaces run the Python backend, which only such a node may."""
    labels = {Keys().tenant_code: TENANT_CODE_NODE} if tenant_code else {}
    body: Any = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
    kubernetes.client.CoreV1Api(api).create_node(body)


def make_pod(
    api: kubernetes.client.ApiClient,
    name: str,
    model_id: str,
    *,
    node: str = NODE,
    gpu_uuid: str = "",
    scheduler: str = SCHEDULER,
    namespace: str = "default",
    service_account: str = "default",
    phase: str | None = None,
    prefix: str = "tritonshare.io/",
    proven: bool = True,
    request: int = 1024**3,
    residency: str = "",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod bound to `node`; `proven` also writes the binder's placement proof (signed with the
    tests' key, as the binder signs with the cluster's); `residency`, when given, is its
    residency annotation; `annotations`: more of them."""
    annotations = {**(annotations or {}), f"{prefix}model-id": model_id}
    if residency:
        annotations[f"{prefix}residency"] = residency
    if gpu_uuid:
        annotations[f"{prefix}gpu"] = gpu_uuid
    core = kubernetes.client.CoreV1Api(api)
    body: Any = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "nodeName": node,
            "schedulerName": scheduler,
            "serviceAccountName": service_account,
            "containers": [{"name": "proxy", "image": "tritonshare/proxy"}],
        },
    }
    core.create_namespaced_pod(namespace, body)
    if proven:
        sign_placement(api, namespace, name, request=request, prefix=prefix)
    if phase is not None:
        core.patch_namespaced_pod_status(name, namespace, {"status": {"phase": phase}})
    read = core.read_namespaced_pod(name, namespace)
    pod: dict[str, Any] = api.sanitize_for_serialization(read)  # type: ignore[no-untyped-call]
    return pod


def name_in_triton(
    api: kubernetes.client.ApiClient, pod: str, model_id: str, namespace: str = "default"
) -> str:
    """The name the agent gives the model of `pod` in Triton: its private name."""
    core: Any = kubernetes.client.CoreV1Api(api)
    uid = core.read_namespaced_pod(pod, namespace).metadata.uid
    return private_triton_name(namespace, model_id, uid)


def manifest_of(directory: Path) -> list[tuple[str, int, str]]:
    files = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        data = path.read_bytes()
        files.append(
            (path.relative_to(directory).as_posix(), len(data), hashlib.sha256(data).hexdigest())
        )
    return files


async def install_requests(
    model_id: str,
    files: list[tuple[str, int, str]],
    contents: Callable[[str], bytes],
    chunk: int = CHUNK,
) -> AsyncIterator[Any]:
    yield agent_pb2.InstallModelRequest(
        header=agent_pb2.InstallHeader(
            model_id=model_id,
            manifest=agent_pb2.Manifest(
                files=[agent_pb2.FileEntry(path=p, size=s, sha256=h) for p, s, h in files]
            ),
        )
    )
    for path, _, _ in files:
        data = contents(path)
        for offset in range(0, max(len(data), 1), chunk):
            yield agent_pb2.InstallModelRequest(
                chunk=agent_pb2.FileChunk(
                    path=path, offset=offset, data=data[offset : offset + chunk]
                )
            )


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def install_dir(
    stub: Any, token: str, directory: Path, model_id: str, chunk: int = CHUNK
) -> Any:
    files = manifest_of(directory)
    return await stub.InstallModel(
        install_requests(model_id, files, lambda p: (directory / p).read_bytes(), chunk),
        metadata=bearer(token),
    )


async def eventually(
    check: Callable[[], Awaitable[bool]] | Callable[[], bool], limit: float = 30.0, what: str = ""
) -> None:
    """Poll `check` until true or fail after `limit` seconds."""
    deadline = time.monotonic() + limit
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {limit:.0f} s waiting for {what or check}")
        await asyncio.sleep(0.05)


@dataclass
class RunningAgent:
    agent: Agent
    lifecycle: Lifecycle
    channel: grpc.aio.Channel
    stub: Any
    mock: MockNvml

    async def stop(self) -> None:
        await self.channel.close(None)
        self.lifecycle.request_stop("test over")
        await self.lifecycle.shutdown()


def agent_settings(
    kubeconfig: Path, triton: TritonServer, repository: Path, **overrides: Any
) -> Settings:
    settings = Settings(
        node_name=NODE,
        model_repository=repository,
        kubeconfig=str(kubeconfig),
        triton_http_url=triton.http_url,
        triton_grpc_url=triton.grpc_url,
        listen_grpc="127.0.0.1:0",
        listen_http="127.0.0.1:0",
        cpu_only=True,
        triton_poll_seconds=0.2,
        resync_seconds=1.0,
        orphan_grace_seconds=1.0,
        gpu_poll_seconds=0.2,
        unload_timeout_seconds=30.0,
        placement_key_dir=write_test_placement_key(repository.parent / "placement-key"),
        # The tests' tiny models use the Python backend: code of the tenant, allowed here.
        tenant_code_namespaces=("default", "team-a", "team-b"),
    )
    return replace(settings, **overrides)


async def start_agent(settings: Settings, mock: MockNvml) -> RunningAgent:
    agent = Agent(settings, nvml=mock.as_module())
    lifecycle = Lifecycle(cleanup_timeout=20)
    try:
        await agent.start(lifecycle)
    except BaseException:
        await lifecycle.shutdown()
        raise
    channel = grpc.aio.insecure_channel(agent.grpc_address)
    return RunningAgent(agent, lifecycle, channel, agent_pb2_grpc.AgentStub(channel), mock)


@pytest.fixture
def mock_nvml() -> MockNvml:
    return MockNvml(parse_spec("2xT4", seed=NODE))


@pytest.fixture
def node(kube_api: kubernetes.client.ApiClient) -> str:
    make_node(kube_api)
    return NODE


@pytest.fixture
def started_triton(triton: TritonServer) -> Iterator[TritonServer]:
    yield triton


StartAgent = Callable[..., Awaitable[RunningAgent]]


@pytest.fixture
async def start_custom_agent(
    kubeconfig: Path,
    triton: TritonServer,
    model_repository: Path,
    node: str,
    mock_nvml: MockNvml,
) -> AsyncIterator[StartAgent]:
    """Start an agent with settings overridden (`agent_settings`' keywords), ready; every agent
    started is stopped after the test."""
    started: list[RunningAgent] = []

    async def start(**overrides: Any) -> RunningAgent:
        settings = agent_settings(kubeconfig, triton, model_repository, **overrides)
        agent = await start_agent(settings, mock_nvml)
        started.append(agent)
        await eventually(lambda: not agent.agent.not_ready(), what="the agent to be ready")
        return agent

    try:
        yield start
    finally:
        for agent in started:
            await agent.stop()


@pytest.fixture
async def running(
    kubeconfig: Path,
    triton: TritonServer,
    model_repository: Path,
    node: str,
    mock_nvml: MockNvml,
) -> AsyncIterator[RunningAgent]:
    running = await start_agent(agent_settings(kubeconfig, triton, model_repository), mock_nvml)
    try:
        await eventually(lambda: not running.agent.not_ready(), what="the agent to be ready")
        yield running
    finally:
        await running.stop()
