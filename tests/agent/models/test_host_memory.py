"""Triton's host memory, admitted like its GPU memory, on a real Triton: a load is measured by
the growth of Triton's process tree, and a load that would take Triton past its memory limit is
refused with the reason (an Event on the pod) before Triton sees it, instead of Triton being
OOM-killed with every model in it."""

from __future__ import annotations

import shutil
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import kubernetes.client
import pytest

from agent.errors import HostMemoryExhaustedError
from agent.gpus.processes import TritonProcesses, TritonTree
from agent.models.tritonram import HostMemory, HostMemoryRules
from protos import agent_pb2
from sim.apiserver import RunningApiServer
from sim.gpu.nvml import MockNvml
from sim.triton import TritonServer
from tests.agent.conftest import (
    agent_settings,
    bearer,
    eventually,
    install_dir,
    make_pod,
    name_in_triton,
    start_agent,
)
from tests.conftest import MODELS_DIR
from tests.fixtures_sim import core_v1

MIB = 1024 * 1024


def _events(api: kubernetes.client.ApiClient, pod: str) -> dict[str, str]:
    core: Any = kubernetes.client.CoreV1Api(api)
    found = core.list_namespaced_event("default", field_selector=f"involvedObject.name={pod}")
    return {e.reason: e.message for e in found.items}


def _pid_file(triton: TritonServer, tmp_path: Path) -> Path:
    """Triton's PID as its container writes it for the agent (`--triton-pid-file`)."""
    assert triton.process is not None
    pid_file = tmp_path / "triton.pid"
    pid_file.write_text(f"{triton.process.pid}\n")
    return pid_file


def _ready_in_triton(triton: TritonServer, name: str) -> bool:
    url = f"http://{triton.http_url}/v2/models/{name}/ready"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return int(answer.status) == 200
    except OSError:
        return False


async def test_a_load_past_triton_s_memory_limit_is_refused_and_a_load_is_measured(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    kubeconfig: Path,
    triton: TritonServer,
    model_repository: Path,
    node: str,
    mock_nvml: MockNvml,
    tmp_path: Path,
) -> None:
    assert triton.process is not None
    pid_file = _pid_file(triton, tmp_path)
    processes = TritonProcesses(pid_file)
    start = processes.tree()
    assert start is not None and triton.process.pid in start.pids and start.rss > 0

    async def serve(running: Any, pod: str) -> Any:
        make_pod(kube_api, pod, "add_one")
        token = apiserver.mint_token("default", pod)
        await install_dir(running.stub, token, MODELS_DIR / "add_one", "add_one")
        return await running.stub.LoadModel(
            agent_pb2.LoadModelRequest(model_id="add_one"), metadata=bearer(token)
        )

    # Room enough: loaded, and measured (the Python backend's stub is a process of its own).
    settings = agent_settings(
        kubeconfig, triton, model_repository, triton_pid_file=pid_file, triton_memory_limit=64 << 30
    )
    roomy = await start_agent(settings, mock_nvml)
    try:
        await eventually(lambda: not roomy.agent.not_ready(), what="the agent to be ready")
        status = await serve(roomy, "roomy")
        assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
        first = name_in_triton(kube_api, "roomy", "add_one")
        measured = roomy.agent.host_memory.models()[first]
        assert measured > MIB, measured
    finally:
        await roomy.stop()

    # Triton's limit a little above what it holds now: the next load would pass it.
    now = processes.tree()
    assert now is not None
    tight = await start_agent(
        agent_settings(
            kubeconfig,
            triton,
            model_repository,
            triton_pid_file=pid_file,
            triton_memory_limit=now.rss + 64 * MIB,
            triton_memory_reserve=0,
        ),
        mock_nvml,
    )
    try:
        await eventually(lambda: not tight.agent.not_ready(), what="the agent to be ready")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await serve(tight, "tight")
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        details = refused.value.details() or ""
        assert "does not fit in Triton's host memory" in details, details
        assert "--triton-memory-per-load" in details and "OOM-kill" in details, details
        await eventually(
            lambda: "InsufficientHostMemory" in _events(kube_api, "tight"),
            what="the refused pod's Event",
        )
        registry = tight.agent.metrics.registry
        assert registry.get_sample_value("tritonshare_agent_host_memory_refusals_total") == 1
    finally:
        await tight.stop()
    # Triton never saw the load, and serves on.
    assert not _ready_in_triton(triton, name_in_triton(kube_api, "tight", "add_one"))
    assert _ready_in_triton(triton, first)
    assert triton.process.poll() is None


class Readings(TritonProcesses):
    """Triton's tree as a test sets it."""

    def __init__(self, rss: int) -> None:
        super().__init__(Path("/nonexistent"))
        self.rss = rss

    def tree(self) -> TritonTree | None:
        return TritonTree(frozenset({1}), self.rss)


def test_loads_under_way_count_and_a_measured_figure_admits_the_same_files() -> None:
    readings = Readings(1000 * MIB)
    host = HostMemory(readings, HostMemoryRules(limit=3000 * MIB, reserve=500 * MIB))
    # Unmeasured: 512Mi each. Two fit beside each other (1000 + 512 + 512 <= 2500), not three.
    first = host.admit("a", "digest-a", 10, "a", "ns/a")
    second = host.admit("b", "digest-b", 10, "b", "ns/b")
    with pytest.raises(HostMemoryExhaustedError, match="loads under way 1024 MiB"):
        host.admit("c", "digest-c", 10, "c", "ns/c")
    # b fails: its share is free again; a loads and is measured at 100 MiB.
    host.finished(second, False)
    readings.rss = 1100 * MIB
    host.finished(first, True)
    assert host.models() == {"a": 100 * MIB}
    # The same files again: admitted on 100 MiB (but never below their size) where 512 would not.
    readings.rss = 2300 * MIB
    with pytest.raises(HostMemoryExhaustedError, match="not measured yet"):
        host.admit("c", "digest-c", 10, "c", "ns/c")
    assert host.admit("a2", "digest-a", 10, "a", "ns/a2") is not None
    with pytest.raises(HostMemoryExhaustedError, match="measured at an earlier load"):
        host.admit("a3", "digest-a", 300 * MIB, "a", "ns/a3")
    # No limit known: nothing is admitted here.
    assert HostMemory(Readings(0), HostMemoryRules(limit=0)).admit("x", "d", 1, "x", "p") is None


async def test_one_namespace_of_tiny_models_cannot_fill_triton_s_host_memory(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    kubeconfig: Path,
    triton: TritonServer,
    model_repository: Path,
    node: str,
    mock_nvml: MockNvml,
    tmp_path: Path,
) -> None:
    """The attack: a namespace loads model after model, each a byte different (its own files,
    so its own load) and asking next to no GPU memory, until Triton's host memory is full; then a
    neighbour's model does not fit. Each namespace holds at most its share of Triton's room, each
    model charged at least the floor, so the neighbour still loads, and the refusal says why."""
    assert triton.process is not None
    pid_file = _pid_file(triton, tmp_path)
    now = TritonProcesses(pid_file).tree()
    assert now is not None
    limit = now.rss + 512 * MIB
    settings = agent_settings(
        kubeconfig,
        triton,
        model_repository,
        triton_pid_file=pid_file,
        triton_memory_limit=limit,
        triton_memory_reserve=0,
        triton_memory_per_load=64 * MIB,
    )
    for name in ("team-a", "team-b"):
        core_v1(kube_api).create_namespace({"metadata": {"name": name}})
    running = await start_agent(settings, mock_nvml)

    async def serve(namespace: str, pod: str, number: int) -> Any:
        files = tmp_path / pod
        shutil.copytree(MODELS_DIR / "add_one", files)
        with (files / "1" / "model.py").open("a") as code:
            code.write(f"# {number}\n")  # other files: a load of their own, measured anew
        make_pod(kube_api, pod, "add_one", namespace=namespace, request=1)
        token = apiserver.mint_token(namespace, pod)
        await install_dir(running.stub, token, files, "add_one")
        return await running.stub.LoadModel(
            agent_pb2.LoadModelRequest(model_id="add_one"), metadata=bearer(token)
        )

    try:
        await eventually(lambda: not running.agent.not_ready(), what="the agent to be ready")
        refusal = ""
        loaded = 0
        for number in range(40):
            try:
                status = await serve("team-a", f"tiny-{number}", number)
            except grpc.aio.AioRpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
                refusal = e.details() or ""
                break
            assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
            loaded += 1
        assert refusal, "the namespace loaded 40 models and was never refused"
        assert loaded >= 1
        assert "its namespace's share of Triton's host memory" in refusal, refusal
        assert "--triton-memory-namespace-percent" in refusal, refusal
        # The neighbour's model loads beside them.
        status = await serve("team-b", "neighbour", 1000)
        assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
        # Every one of the attacker's models was charged at least the floor.
        charged = running.agent.host_memory.models()
        assert len(charged) == loaded + 1
    finally:
        await running.stop()
    assert triton.process.poll() is None


def test_a_namespace_holds_its_share_each_model_charged_at_least_the_floor() -> None:
    readings = Readings(100 * MIB)
    rules = HostMemoryRules(
        limit=1100 * MIB, reserve=100 * MIB, per_load=1, floor=100 * MIB, namespace_percent=50
    )
    host = HostMemory(readings, rules)
    # Room for models 1000 MiB; each namespace 500 MiB. Loads measured at 1 MiB are charged 100.
    for number in range(5):
        admitted = host.admit(f"a{number}", f"d{number}", 1, "tiny", f"team-a/tiny-{number}")
        readings.rss += MIB
        host.finished(admitted, True)
    with pytest.raises(HostMemoryExhaustedError, match="namespace team-a already holds 500 MiB"):
        host.admit("a5", "d5", 1, "tiny", "team-a/tiny-5")
    # A replica's key (namespace/model/ordinal) counts in its namespace; another namespace loads.
    with pytest.raises(HostMemoryExhaustedError, match="namespace team-a"):
        host.admit("r", "d-r", 1, "tiny", "team-a/tiny/0")
    assert host.admit("b", "d-b", 1, "other", "team-b/other") is not None
    # An unloaded model gives its namespace its charge back.
    host.forget("a0")
    assert host.admit("a5", "d5", 1, "tiny", "team-a/tiny-5") is not None
