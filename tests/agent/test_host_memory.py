"""Triton's host memory, admitted like its GPU memory, on a real Triton: a load is measured by
the growth of Triton's process tree, and a load that would take Triton past its memory limit is
refused with the reason (an Event on the pod) before Triton sees it, instead of Triton being
OOM-killed with every model in it."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import grpc
import kubernetes.client
import pytest

from agent.errors import HostMemoryExhaustedError
from agent.hostmemory import HostMemory, HostMemoryRules
from agent.processes import TritonProcesses, TritonTree
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

MIB = 1024 * 1024


def _events(api: kubernetes.client.ApiClient, pod: str) -> dict[str, str]:
    core: Any = kubernetes.client.CoreV1Api(api)
    found = core.list_namespaced_event("default", field_selector=f"involvedObject.name={pod}")
    return {e.reason: e.message for e in found.items}


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
    pid_file = tmp_path / "triton.pid"
    pid_file.write_text(f"{triton.process.pid}\n")
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
