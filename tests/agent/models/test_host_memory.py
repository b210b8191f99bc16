"""Triton's host memory, admitted like its GPU memory, on a real Triton: a load is measured by
the growth of Triton's process tree, and a load that would take Triton past its memory limit is
refused with the reason (an Event on the pod) before Triton sees it, instead of Triton being
OOM-killed with every model in it."""

from __future__ import annotations

import asyncio
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import kubernetes.client
import numpy as np
import pytest
import tritonclient.http as httpclient
from onnx import TensorProto, helper

from agent.errors import HostMemoryExhaustedError
from agent.gpus.processes import TritonProcesses, TritonTree
from agent.models.quietwindow import QuietWindow
from agent.models.tritonram import HostMemory, HostMemoryRules
from common.activity import Activity, ActivityTable
from common.activity import write_table as write_activity
from protos import agent_pb2
from sim.apiserver import RunningApiServer
from sim.gpu.nvml import MockNvml
from sim.triton import TritonInstall, TritonServer
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
NO_GATEWAY = QuietWindow(None, max_age=10.0)
"""A node without a gateway: no window is ever found quiet."""


def _events(
    api: kubernetes.client.ApiClient, pod: str, namespace: str = "default"
) -> dict[str, str]:
    core: Any = kubernetes.client.CoreV1Api(api)
    found = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}")
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
    """Triton's tree as a test sets it: Triton's own process (`rss`) and each model's own
    processes (`models`)."""

    def __init__(self, rss: int) -> None:
        super().__init__(Path("/nonexistent"))
        self.rss = rss
        self.models: dict[str, int] = {}

    def tree(self) -> TritonTree | None:
        return TritonTree(frozenset({1}), self.rss + sum(self.models.values()), dict(self.models))


class Windows:
    """The gateway's word on load windows, as a test sets it (`agent.models.quietwindow`)."""

    def __init__(self, answer: bool | None = True) -> None:
        self.answer = answer

    def __call__(self, name: str, since: float, until: float) -> bool | None:
        return self.answer


def test_loads_under_way_count_and_a_measured_figure_admits_the_same_files() -> None:
    readings = Readings(1000 * MIB)
    rules = HostMemoryRules(limit=3000 * MIB, reserve=500 * MIB)
    host = HostMemory(readings, rules, quiet=Windows())
    # Unmeasured: 512Mi each. Two fit beside each other (1000 + 512 + 512 <= 2500), not three.
    first = host.admit("a", "digest-a", 10, "a", "ns/a")
    second = host.admit("b", "digest-b", 10, "b", "ns/b")
    with pytest.raises(HostMemoryExhaustedError, match="loads under way 1024 MiB"):
        host.admit("c", "digest-c", 10, "c", "ns/c")
    # b fails: its share is free again; a loads and is measured at 100 MiB. b's load shared its
    # window, so the figure is billed (no more than a was admitted on) but not kept for its files.
    host.finished(second, False)
    readings.rss = 1100 * MIB
    host.finished(first, True)
    assert host.models() == {"a": 100 * MIB}
    assert host.by_digest == {}
    # Loaded again alone, in a quiet window: measured, and kept for its files.
    host.forget("a")
    again = host.admit("a", "digest-a", 10, "a", "ns/a")
    readings.rss = 1200 * MIB
    host.finished(again, True)
    assert host.models() == {"a": 100 * MIB} and host.by_digest == {"digest-a": 100 * MIB}
    # The same files again: admitted on 100 MiB (but never below their size) where 512 would not.
    readings.rss = 2300 * MIB
    with pytest.raises(HostMemoryExhaustedError, match="not measured yet"):
        host.admit("c", "digest-c", 10, "c", "ns/c")
    assert host.admit("a2", "digest-a", 10, "a", "ns/a2") is not None
    with pytest.raises(HostMemoryExhaustedError, match="measured at an earlier load"):
        host.admit("a3", "digest-a", 300 * MIB, "a", "ns/a3")
    # No limit known: nothing is admitted here.
    unlimited = HostMemory(Readings(0), HostMemoryRules(limit=0), quiet=NO_GATEWAY)
    assert unlimited.admit("x", "d", 1, "x", "p") is None


def test_triton_s_growth_beside_a_neighbour_s_requests_is_not_billed_to_the_load() -> None:
    readings = Readings(1000 * MIB)
    windows = Windows(False)
    rules = HostMemoryRules(limit=5000 * MIB, reserve=0, per_load=300 * MIB, floor=10 * MIB)
    host = HostMemory(readings, rules, quiet=windows)
    # A Python model (a stub of its own): while it loaded, a neighbour's request grew Triton by
    # 600 MiB. It is billed its stub alone, and nothing is kept for its files.
    admitted = host.admit("py", "d-py", 1, "m", "team-b/py")
    readings.models["py"] = 70 * MIB
    readings.rss += 600 * MIB
    host.finished(admitted, True)
    assert host.models() == {"py": 70 * MIB} and host.by_digest == {}
    # A model inside Triton's process: billed its window's growth up to what it was admitted on.
    admitted = host.admit("onnx", "d-onnx", 1, "m", "team-b/onnx")
    readings.rss += 600 * MIB
    host.finished(admitted, True)
    assert host.models()["onnx"] == 300 * MIB and host.by_digest == {}
    # Not known yet (the gateway's table does not reach the load's end): billed what no
    # neighbour could inflate until the window is found quiet, then the whole growth, kept.
    windows.answer = None
    admitted = host.admit("py2", "d-py2", 1, "m", "team-b/py2")
    readings.models["py2"] = 70 * MIB
    readings.rss += 5 * MIB
    host.finished(admitted, True)
    assert host.models()["py2"] == 70 * MIB
    windows.answer = True
    host.settle()
    assert host.models()["py2"] == 75 * MIB and host.by_digest == {"d-py2": 75 * MIB}
    # A model's own processes are its alone: their growth after load is billed to it, read again
    # at the next admission, and fills its own namespace's share, not a neighbour's.
    readings.models["py"] = 2000 * MIB
    assert host.admit("other", "d-o", 1, "m", "team-c/other") is not None
    assert host.models()["py"] == 2000 * MIB
    with pytest.raises(HostMemoryExhaustedError, match="namespace team-b already holds"):
        host.admit("py3", "d-py3", 1, "m", "team-b/py3")


def test_a_window_is_quiet_only_when_the_gateway_saw_no_other_model_served(
    tmp_path: Path,
) -> None:
    path = tmp_path / "activity.json"
    now = 1000.0
    quiet = QuietWindow(path, max_age=5, wall=lambda: now)
    assert quiet("m", 990, 995) is False  # no table: nothing can be told
    assert QuietWindow(None, max_age=5)("m", 990, 995) is False  # no gateway
    write_activity(path, ActivityTable(998, {"m": Activity(1, 997), "n": Activity(0, 900)}))
    assert quiet("m", 990, 995) is True
    assert quiet("m", 990, 999) is None  # written before the window's end: not yet
    write_activity(path, ActivityTable(998, {"n": Activity(0, 992)}))
    assert quiet("m", 990, 995) is False  # n was served during the window
    write_activity(path, ActivityTable(998, {"n": Activity(1, 900)}))
    assert quiet("m", 990, 995) is False  # n had a request in flight
    write_activity(path, ActivityTable(990, {}))
    assert quiet("m", 980, 985) is False  # stale


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
    host = HostMemory(readings, rules, quiet=NO_GATEWAY)
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


HOARDER = """
import numpy as np
import triton_python_backend_utils as pb_utils

KEPT = []


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            KEPT.append(np.ones(int(data.flat[0]) * 262144, dtype=np.float32))  # resident
            out = pb_utils.Tensor("OUTPUT0", (data + 1).astype(data.dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""
SLOW = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(3)

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (data + 1).astype(data.dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""


def _own_model(tmp_path: Path, pod: str, code: str) -> Path:
    files = tmp_path / pod
    shutil.copytree(MODELS_DIR / "add_one", files)
    (files / "1" / "model.py").write_text(code)
    return files


async def test_a_neighbours_request_during_a_load_is_not_billed_to_the_loading_model(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    kubeconfig: Path,
    triton: TritonServer,
    model_repository: Path,
    node: str,
    mock_nvml: MockNvml,
    tmp_path: Path,
) -> None:
    """The attack: while a neighbour's model loads, a tenant's request makes its own model hold
    600 MiB more. Measured as the growth of Triton's whole tree, it was billed to the loading
    model, which then held most of its namespace's share and refused the namespace's next
    model. Each model is billed what its own processes hold: the loading one its stub, the
    attacker its 600 MiB (read again at the next admission), and the neighbour's next model
    loads."""
    assert triton.process is not None
    pid_file = _pid_file(triton, tmp_path)
    now = TritonProcesses(pid_file).tree()
    assert now is not None
    limit = now.rss + 1600 * MIB
    settings = agent_settings(
        kubeconfig,
        triton,
        model_repository,
        triton_pid_file=pid_file,
        triton_memory_limit=limit,
        triton_memory_reserve=0,
        triton_memory_per_load=256 * MIB,
    )
    share = limit // 2
    for name in ("team-a", "team-b"):
        core_v1(kube_api).create_namespace({"metadata": {"name": name}})
    running = await start_agent(settings, mock_nvml)

    async def serve(namespace: str, pod: str, files: Path) -> Any:
        make_pod(kube_api, pod, "add_one", namespace=namespace, request=1)
        token = apiserver.mint_token(namespace, pod)
        await install_dir(running.stub, token, files, "add_one")
        return await running.stub.LoadModel(
            agent_pb2.LoadModelRequest(model_id="add_one"), metadata=bearer(token)
        )

    def hoard(name: str, mib: int) -> None:
        with httpclient.InferenceServerClient(triton.http_url, network_timeout=60) as client:
            tensor = httpclient.InferInput("INPUT0", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.array([[mib]], dtype=np.float32))
            client.infer(name, [tensor])

    try:
        await eventually(lambda: not running.agent.not_ready(), what="the agent to be ready")
        status = await serve("team-a", "attacker", _own_model(tmp_path, "attacker", HOARDER))
        assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
        attacker = name_in_triton(kube_api, "attacker", "add_one", "team-a")
        # The neighbour's model loads (3 s); the attacker's request lands in the middle.
        loading = asyncio.create_task(serve("team-b", "good-1", _own_model(tmp_path, "g1", SLOW)))
        await asyncio.sleep(1.0)
        assert not loading.done()
        await asyncio.to_thread(hoard, attacker, 600)
        status = await loading
        assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
        good = name_in_triton(kube_api, "good-1", "add_one", "team-b")
        billed = running.agent.host_memory.models()[good]
        stub = TritonProcesses(pid_file).tree()
        assert stub is not None
        assert 0 < billed <= stub.models[good] + 64 * MIB < 300 * MIB, (billed, stub.models)
        # The namespace's next model is admitted: its share holds its own stub only.
        status = await serve("team-b", "good-2", _own_model(tmp_path, "g2", SLOW))
        assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
        # The attacker is billed its own growth, read again at that admission.
        assert running.agent.host_memory.models()[attacker] >= 600 * MIB
        assert billed < share
    finally:
        await running.stop()
    assert triton.process.poll() is None


def test_a_namespace_past_its_share_loses_its_largest_models_that_run_apart() -> None:
    readings = Readings(100 * MIB)
    rules = HostMemoryRules(limit=2100 * MIB, reserve=100 * MIB, per_load=1, floor=10 * MIB)
    host = HostMemory(readings, rules, quiet=Windows())
    # Each namespace's share: 1000 MiB.
    for name, namespace, own in (
        ("big", "team-a", 50),
        ("small", "team-a", 50),
        ("inside", "team-a", 0),
        ("other", "team-b", 50),
    ):
        admitted = host.admit(name, f"d-{name}", 1, "m", f"{namespace}/{name}")
        if own:
            readings.models[name] = own * MIB
        host.finished(admitted, True)
    assert host.over_share() == []
    # team-a's models grow in their own processes, past its share by more than the floor.
    readings.models["big"] = 900 * MIB
    readings.models["small"] = 200 * MIB
    over = host.over_share()
    assert [(o.name, o.namespace, o.bytes) for o in over] == [("big", "team-a", 900 * MIB)]
    assert over[0].held == 1110 * MIB and over[0].share == 1000 * MIB
    # Growth within the floor's slack names no one.
    readings.models["big"] = 745 * MIB
    assert host.over_share() == []


async def test_a_model_whose_own_processes_grow_past_its_namespace_s_share_is_unloaded(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    kubeconfig: Path,
    triton: TritonServer,
    model_repository: Path,
    node: str,
    mock_nvml: MockNvml,
    tmp_path: Path,
) -> None:
    """A tenant's Python model grows after its load until it holds more than its namespace's
    share of Triton's host memory: the agent unloads it and fails its pod, with the reason, and a
    neighbour's model loads."""
    assert triton.process is not None
    pid_file = _pid_file(triton, tmp_path)
    now = TritonProcesses(pid_file).tree()
    assert now is not None
    limit = now.rss + 1600 * MIB
    settings = agent_settings(
        kubeconfig,
        triton,
        model_repository,
        triton_pid_file=pid_file,
        triton_memory_limit=limit,
        triton_memory_reserve=0,
        triton_memory_per_load=256 * MIB,
    )
    for name in ("team-a", "team-b"):
        core_v1(kube_api).create_namespace({"metadata": {"name": name}})
    running = await start_agent(settings, mock_nvml)

    async def serve(namespace: str, pod: str, files: Path) -> Any:
        make_pod(kube_api, pod, "add_one", namespace=namespace, request=1)
        token = apiserver.mint_token(namespace, pod)
        await install_dir(running.stub, token, files, "add_one")
        return await running.stub.LoadModel(
            agent_pb2.LoadModelRequest(model_id="add_one"), metadata=bearer(token)
        )

    def hoard(name: str, mib: int) -> None:
        with httpclient.InferenceServerClient(triton.http_url, network_timeout=60) as client:
            tensor = httpclient.InferInput("INPUT0", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.array([[mib]], dtype=np.float32))
            client.infer(name, [tensor])

    def failed() -> bool:
        core: Any = kubernetes.client.CoreV1Api(kube_api)
        return bool(core.read_namespaced_pod("hoarder", "team-a").status.phase == "Failed")

    try:
        await eventually(lambda: not running.agent.not_ready(), what="the agent to be ready")
        status = await serve("team-a", "hoarder", _own_model(tmp_path, "hoarder", HOARDER))
        assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
        hoarder = name_in_triton(kube_api, "hoarder", "add_one", "team-a")
        await asyncio.to_thread(hoard, hoarder, 900)
        await eventually(failed, what="the hoarder's pod to be failed")
        assert not _ready_in_triton(triton, hoarder)
        core: Any = kubernetes.client.CoreV1Api(kube_api)
        message = core.read_namespaced_pod("hoarder", "team-a").status.message or ""
        assert "more than the" in message and "--triton-memory-namespace-percent" in message
        await eventually(
            lambda: "HostMemoryExceeded" in _events(kube_api, "hoarder", "team-a"),
            what="the hoarder's Event",
        )
        # Its memory is back: the neighbour's model loads.
        status = await serve("team-b", "good", _own_model(tmp_path, "good", SLOW))
        assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
    finally:
        await running.stop()
    assert triton.process.poll() is None


SUMMER_CONFIG = """backend: "onnxruntime"
max_batch_size: 0
input [ { name: "N" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "S" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def _summer(directory: Path) -> Path:
    """An ONNX model of a few hundred bytes that allocates what it is asked for:
    ConstantOfShape(N) -> ReduceSum."""
    ones = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    graph = helper.make_graph(
        [
            helper.make_node("ConstantOfShape", ["N"], ["X"], value=ones),
            helper.make_node("ReduceSum", ["X"], ["S"], keepdims=1),
        ],
        "summer",
        [helper.make_tensor_value_info("N", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("S", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (directory / "1").mkdir(parents=True)
    (directory / "config.pbtxt").write_text(SUMMER_CONFIG)
    (directory / "1" / "model.onnx").write_bytes(model.SerializeToString())
    return directory


@pytest.fixture
def onnx_triton(triton_install: TritonInstall, model_repository: Path) -> Iterator[TritonServer]:
    """The simulated node's Triton: ONNX Runtime models run in Python backend stubs."""
    server = TritonServer(model_repository, onnx_standin=True)
    server.start()
    try:
        yield server
    finally:
        server.discard()


async def test_an_onnx_model_whose_arena_outgrows_its_namespace_s_share_is_unloaded(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    kubeconfig: Path,
    onnx_triton: TritonServer,
    model_repository: Path,
    node: str,
    mock_nvml: MockNvml,
    tmp_path: Path,
) -> None:
    """The attack: a tiny ONNX model asked for a large N keeps what ONNX Runtime allocated (its
    arena) after the request, more than its namespace's share of Triton's host memory. The
    simulated node runs ONNX Runtime in a process of the model's own, where it is billed to the
    model: it is unloaded, its pod failed, and a neighbour's model loads at once. (Inside a real
    Triton's process the agent loads ONNX Runtime models without an arena instead, which the
    stand-in does not honour.)"""
    triton = onnx_triton
    assert triton.process is not None
    pid_file = _pid_file(triton, tmp_path)
    now = TritonProcesses(pid_file).tree()
    assert now is not None
    limit = now.rss + 1600 * MIB
    settings = agent_settings(
        kubeconfig,
        triton,
        model_repository,
        triton_pid_file=pid_file,
        triton_memory_limit=limit,
        triton_memory_reserve=0,
        triton_memory_per_load=256 * MIB,
    )
    for name in ("team-a", "team-b"):
        core_v1(kube_api).create_namespace({"metadata": {"name": name}})
    running = await start_agent(settings, mock_nvml)

    async def serve(namespace: str, pod: str, files: Path, model_id: str) -> Any:
        make_pod(kube_api, pod, model_id, namespace=namespace, request=1)
        token = apiserver.mint_token(namespace, pod)
        await install_dir(running.stub, token, files, model_id)
        return await running.stub.LoadModel(
            agent_pb2.LoadModelRequest(model_id=model_id), metadata=bearer(token)
        )

    def ask(name: str, mib: int) -> None:
        with httpclient.InferenceServerClient(triton.http_url, network_timeout=120) as client:
            tensor = httpclient.InferInput("N", [1], "INT64")
            tensor.set_data_from_numpy(np.array([mib * 262144], dtype=np.int64))
            assert client.infer(name, [tensor]).as_numpy("S").shape == (1,)

    def failed() -> bool:
        core: Any = kubernetes.client.CoreV1Api(kube_api)
        return bool(core.read_namespaced_pod("summer", "team-a").status.phase == "Failed")

    try:
        await eventually(lambda: not running.agent.not_ready(), what="the agent to be ready")
        files = _summer(tmp_path / "summer")
        status = await serve("team-a", "summer", files, "summer")
        assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
        summer = name_in_triton(kube_api, "summer", "summer", "team-a")
        await asyncio.to_thread(ask, summer, 1000)
        await eventually(failed, what="the summer's pod to be failed")
        assert not _ready_in_triton(triton, summer)
        await eventually(
            lambda: "HostMemoryExceeded" in _events(kube_api, "summer", "team-a"),
            what="the summer's Event",
        )
        status = await serve("team-b", "good", _own_model(tmp_path, "good", SLOW), "add_one")
        assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
    finally:
        await running.stop()
    assert triton.process.poll() is None


async def test_triton_s_own_growth_during_a_load_is_billed_only_when_no_other_model_was_served(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    kubeconfig: Path,
    triton: TritonServer,
    model_repository: Path,
    node: str,
    mock_nvml: MockNvml,
    tmp_path: Path,
) -> None:
    """A neighbour's large request during a load grows Triton's own process (its HTTP buffers),
    which no process of a model's own explains. The node gateway's activity table (written here
    as the gateway writes it) shows the neighbour's model served during the load: the loading
    model is billed its own stub only, and nothing is kept for its files. A load in a quiet
    window is billed Triton's growth too, and its figure is kept."""
    assert triton.process is not None
    pid_file = _pid_file(triton, tmp_path)
    processes = TritonProcesses(pid_file)
    activity = tmp_path / "activity.json"
    settings = agent_settings(
        kubeconfig,
        triton,
        model_repository,
        triton_pid_file=pid_file,
        triton_memory_limit=64 << 30,
        activity_table=activity,
    )
    for name in ("team-a", "team-b"):
        core_v1(kube_api).create_namespace({"metadata": {"name": name}})
    served: dict[str, Activity] = {}
    stop = asyncio.Event()

    async def gateway() -> None:
        while not stop.is_set():
            write_activity(activity, ActivityTable(time.time(), dict(served)))
            await asyncio.sleep(0.1)

    writer = asyncio.create_task(gateway())
    running = await start_agent(settings, mock_nvml)

    async def serve(namespace: str, pod: str, files: Path) -> Any:
        make_pod(kube_api, pod, "add_one", namespace=namespace, request=1)
        token = apiserver.mint_token(namespace, pod)
        await install_dir(running.stub, token, files, "add_one")
        return await running.stub.LoadModel(
            agent_pb2.LoadModelRequest(model_id="add_one"), metadata=bearer(token)
        )

    def large(name: str) -> None:
        served[name] = Activity(1, time.time())
        data = np.ones((1, 75 * 262144), dtype=np.float32)  # 300 MiB
        with httpclient.InferenceServerClient(triton.http_url, network_timeout=120) as client:
            tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data)
            client.infer(name, [tensor])
        served[name] = Activity(0, time.time())

    try:
        await eventually(lambda: not running.agent.not_ready(), what="the agent to be ready")
        status = await serve("team-a", "neighbour", _own_model(tmp_path, "n", HOARDER))
        assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
        neighbour = name_in_triton(kube_api, "neighbour", "add_one", "team-a")
        host = running.agent.host_memory
        # The neighbour's own load was quiet: kept once the table reaches its end.
        await eventually(lambda: len(host.by_digest) == 1, what="the neighbour's figure kept")
        kept = dict(host.by_digest)
        # The neighbour's request lands in the middle of the load.
        before = processes.tree()
        loading = asyncio.create_task(serve("team-b", "good-1", _own_model(tmp_path, "g1", SLOW)))
        await asyncio.sleep(1.0)
        await asyncio.to_thread(large, neighbour)
        status = await loading
        assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
        after = processes.tree()
        assert before is not None and after is not None
        assert after.own - before.own > 64 * MIB, "the request grew Triton's own process"
        good = name_in_triton(kube_api, "good-1", "add_one", "team-b")
        assert host.models()[good] <= after.models[good] + 16 * MIB, (host.models(), after)
        assert host.by_digest == kept
        # The same files again, nothing else served meanwhile (the neighbour's last request
        # long over): billed Triton's growth too, once the gateway's table reaches its end.
        served[neighbour] = Activity(0, time.time() - 60)
        status = await serve("team-b", "good-2", _own_model(tmp_path, "g2", SLOW))
        assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
        await eventually(
            lambda: len(host.by_digest) == len(kept) + 1, what="a quiet window's figure kept"
        )
        quiet = host.models()[name_in_triton(kube_api, "good-2", "add_one", "team-b")]
        assert quiet > host.models()[good], "billed Triton's growth across its quiet load too"
    finally:
        await running.stop()
        stop.set()
        await writer
    assert triton.process.poll() is None
