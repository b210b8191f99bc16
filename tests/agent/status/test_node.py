"""GPUs through the mock NVML, the Node annotations and Lease through sim/'s API server, in fake
time: an hour of a quiet node, and GPU faults reflected on the Node."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from agent.errors import AgentError, NvmlUnavailableError
from agent.gpus.inventory import GpuSnapshot, annotations_patch, node_annotations
from agent.gpus.nvml import GpuReader
from agent.kube.client import KubeClient
from agent.metrics import AgentMetrics
from agent.settings import Settings
from agent.status.node import Clocks, NodePublisher, NodeSettings
from common.contract import Keys
from sim.apiserver import RunningApiServer
from sim.gpu.nvml import Event, MockNvml, SpecError, load_events, parse_spec
from tests.agent.conftest import NODE, make_node, start_agent
from tests.executors import CallerThread
from tests.fixtures_sim import write_test_placement_key

T4 = 15360 * 1024 * 1024


class FakeTime:
    """A monotonic clock that `sleep` advances at once; stops the loop at `until`."""

    def __init__(self, until: float, stop: asyncio.Event) -> None:
        self.now = 0.0
        self.until = until
        self.stop = stop

    def clock(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return datetime.fromtimestamp(1_800_000_000 + self.now, UTC)

    async def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.001)
        if self.now >= self.until:
            self.stop.set()
        await asyncio.sleep(0)


def publisher(
    kube: KubeClient, mock: MockNvml, fake: FakeTime, *, sleep: Any = None, **settings: Any
) -> NodePublisher:
    """A publisher on fake time; `settings` are NodeSettings fields, `sleep` replaces the fake's."""
    return NodePublisher(
        kube,
        GpuReader(nvml=mock.as_module()),
        AgentMetrics(),
        NodeSettings(
            node_name=NODE,
            keys=Keys(),
            system_namespace="tritonshare-system",
            cpu_only=False,
            **settings,
        ),
        clocks=Clocks(monotonic=fake.clock, sleep=sleep or fake.sleep, wall=fake.wall),
        nvml_executor=CallerThread(),
        on_snapshot=lambda snapshot: None,
        usage=lambda snapshot: None,  # the measured memory is not published
    )


def node_view(kube_api: kubernetes.client.ApiClient) -> dict[str, str]:
    metadata = kubernetes.client.CoreV1Api(kube_api).read_node(NODE).metadata
    return dict((metadata.annotations if metadata else None) or {})


def test_mock_nvml_reports_presets_and_faults_with_pynvml_errors() -> None:
    mock = MockNvml(parse_spec("8xA100-80GB", seed="a"))
    reader = GpuReader(nvml=mock.as_module())
    snapshot = reader.read()
    assert len(snapshot.gpus) == 8
    assert {g.product for g in snapshot.gpus} == {"NVIDIA A100-SXM4-80GB"}
    assert len({g.uuid for g in snapshot.gpus}) == 8
    other = GpuReader(nvml=MockNvml(parse_spec("8xA100-80GB", seed="b")).as_module()).read()
    assert {g.uuid for g in other.gpus}.isdisjoint({g.uuid for g in snapshot.gpus})

    mock.set_used(2, 5 << 30)
    mock.lose_gpu(3)
    snapshot = reader.read()
    assert snapshot.gpus[2].memory_used == 5 << 30
    lost = snapshot.gpus[3]
    assert not lost.healthy and "GpuIsLost" in lost.reason
    assert lost.uuid and lost.memory_total == 81920 * 1024 * 1024, "identity is kept"
    assert snapshot.healthy_memory_total == 7 * 81920 * 1024 * 1024

    mock.set_library_loaded(False)
    with pytest.raises(NvmlUnavailableError, match="--cpu-only"):
        reader.read()
    mock.set_library_loaded(True)
    assert len(reader.read().gpus) == 8

    module = mock.as_module()
    error = module.NVMLError(module.NVML_ERROR_GPU_IS_LOST)
    assert type(error).__name__ == "NVMLError_GpuIsLost"
    assert isinstance(error, module.NVMLError_GpuIsLost)


def test_a_spec_file_with_a_timeline(tmp_path: Path) -> None:
    spec_file = tmp_path / "gpus.yaml"
    spec_file.write_text(
        "gpus:\n"
        "  - {product: Tesla T4, memory: 15Gi, used: 1Gi}\n"
        "  - {product: NVIDIA L4, memory: 22Gi}\n"
        "events:\n"
        "  - {at: 5, gpu: 1, used: 2Gi}\n"
        "  - {at: 10, gpu: 0, fault: lost}\n"
    )
    now = [0.0]
    mock = MockNvml(parse_spec(str(spec_file), seed="n"), clock=lambda: now[0])
    reader = GpuReader(nvml=mock.as_module())
    first = reader.read()
    assert [g.memory_total for g in first.gpus] == [15 << 30, 22 << 30]
    assert first.gpus[0].memory_used == 1 << 30
    now[0] = 6
    assert reader.read().gpus[1].memory_used == 2 << 30
    now[0] = 11
    assert not reader.read().gpus[0].healthy


def test_annotations_are_stable_and_only_changes_are_patched() -> None:
    mock = MockNvml(parse_spec("2xT4", seed=NODE))
    snapshot = GpuReader(nvml=mock.as_module()).read()
    keys = Keys()
    first = node_annotations(snapshot, keys)
    assert first[keys.gpu_mem_total] == str(2 * T4)
    gpus = json.loads(first[keys.gpus])
    assert gpus[0] == {
        "healthy": True,
        "index": 0,
        "memory": T4,
        "product": "Tesla T4",
        "uuid": snapshot.gpus[0].uuid,
    }
    assert annotations_patch(first, node_annotations(snapshot, keys)) == {}
    assert node_annotations(GpuSnapshot(), keys)[keys.gpu_mem_total] == "0"
    poc = node_annotations(snapshot, Keys("seldon.io/trtis-"))
    assert "seldon.io/trtis-gpu-mem-total" in poc


async def test_a_quiet_node_costs_about_one_write_per_lease_renewal(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    node: str,
    kubeconfig: Path,
) -> None:
    stop = asyncio.Event()
    fake = FakeTime(until=3600.0, stop=stop)
    mock = MockNvml(parse_spec("2xT4", seed=NODE), clock=fake.clock)
    # Used memory moves all hour long: it is not published, so it must cost no writes.
    mock._events = [Event(at=float(t), gpu=t % 2, used=(t % 7) << 30) for t in range(5, 3600, 45)]
    kube = KubeClient(str(kubeconfig))
    apiserver.audit.clear()
    try:
        await publisher(kube, mock, fake).run(stop)
    finally:
        await kube.close()
    writes = apiserver.audit.writes()
    assert writes, "the agent wrote nothing"
    assert all(r.user_agent.startswith("tritonshare-agent/") for r in writes)
    lease_writes = [r for r in writes if r.resource == "leases"]
    node_writes = [r for r in writes if r.resource == "nodes"]
    per_hour = len(writes) * 3600.0 / fake.now
    print(f"quiet node: {len(writes)} API writes in {fake.now:.0f} simulated s = {per_hour:.0f}/h")
    assert len(node_writes) == 1, "the annotations are written once and never again"
    # One renewal every 5 s (a failed patch and a create the first time).
    assert 720 <= len(lease_writes) <= 723
    lease = kubernetes.client.CoordinationV1Api(kube_api).read_namespaced_lease(
        f"tritonshare-agent-{NODE}", "tritonshare-system"
    )
    assert lease.spec is not None and lease.spec.lease_duration_seconds == 15
    assert lease.spec.renew_time is not None
    assert abs(lease.spec.renew_time.timestamp() - fake.wall().timestamp()) <= 6
    assert node_view(kube_api)["tritonshare.io/gpu-mem-total"] == str(2 * T4)


async def test_gpu_faults_are_reflected_on_the_node(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    node: str,
    kubeconfig: Path,
) -> None:
    stop = asyncio.Event()
    fake = FakeTime(until=400.0, stop=stop)
    mock = MockNvml(parse_spec("2xT4", seed=NODE), clock=fake.clock)
    mock._events = [
        Event(at=100, gpu=1, fault="lost"),
        Event(at=200, gpu=1, fault="recovered"),
        Event(at=300, fault="nvml_not_loaded"),
    ]
    kube = KubeClient(str(kubeconfig))
    seen: list[tuple[float, str, bool]] = []

    async def paced_sleep(seconds: float) -> None:
        # Look at the Node between steps, so every state it passes through is seen.
        found = await kube.get_node(NODE) or {}
        view = (found.get("metadata") or {}).get("annotations") or {}
        gpus = json.loads(view.get("tritonshare.io/gpus", "[]"))
        seen.append((fake.now, view.get("tritonshare.io/gpu-mem-total", ""), gpus[1]["healthy"]))
        await fake.sleep(seconds)

    node_publisher = publisher(kube, mock, fake, advertise_gpu_mem=True, sleep=paced_sleep)
    apiserver.audit.clear()
    try:
        await node_publisher.run(stop)
    finally:
        await kube.close()
    totals = seen
    assert any(total == str(2 * T4) and healthy for _, total, healthy in totals)
    assert any(total == str(T4) and not healthy and 100 <= t < 200 for t, total, healthy in totals)
    assert any(total == str(2 * T4) and healthy and 200 <= t < 300 for t, total, healthy in totals)
    # NVML gone: the node turns not ready and keeps the last published values.
    assert not node_publisher.gpus_read and "NVML" in node_publisher.nvml_error
    assert node_view(kube_api)["tritonshare.io/gpu-mem-total"] == str(2 * T4)
    node_writes = [r for r in apiserver.audit.writes() if r.resource == "nodes"]
    annotation_writes = [r for r in node_writes if r.subresource == ""]
    status_writes = [r for r in node_writes if r.subresource == "status"]
    assert len(annotation_writes) == 3, "initial, GPU lost, GPU back"
    assert len(status_writes) == 3
    capacity = kubernetes.client.CoreV1Api(kube_api).read_node(NODE).status
    assert capacity is not None and capacity.capacity is not None
    assert capacity.capacity["tritonshare.io/gpu-mem"] == str(2 * T4)


async def test_a_missing_node_does_not_stop_the_lease(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    kubeconfig: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = asyncio.Event()
    fake = FakeTime(until=100.0, stop=stop)
    mock = MockNvml(parse_spec("1xH100-80GB", seed=NODE), clock=fake.clock)
    kube = KubeClient(str(kubeconfig))
    try:
        await publisher(kube, mock, fake).run(stop)
    finally:
        await kube.close()
    lease = kubernetes.client.CoordinationV1Api(kube_api).read_namespaced_lease(
        f"tritonshare-agent-{NODE}", "tritonshare-system"
    )
    assert lease.spec is not None and lease.spec.renew_time is not None
    assert f"node {NODE} does not exist in the API; check --node-name" in caplog.text


def test_a_faults_file_and_bad_specs(tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    faults.write_text(
        '{"events": [{"at": 3, "gpu": 1, "fault": "lost"}, {"at": 1, "used": "1Gi"}]}'
    )
    events = load_events(faults)
    assert [(e.at, e.fault, e.used) for e in events] == [(1.0, None, 1 << 30), (3.0, "lost", None)]
    faults.write_text('{"events": [{"at": 3, "fault": "melted"}]}')
    with pytest.raises(SpecError, match="melted"):
        load_events(faults)
    result = subprocess.run(
        [sys.executable, "-m", "sim.gpu.agent_node", "--gpus", "3xNope", "--", "--node-name", "n"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "neither a preset" in result.stderr and "T4" in result.stderr


async def test_an_agent_allowing_tenant_code_starts_only_on_a_node_dedicated_to_it(
    kube_api: kubernetes.client.ApiClient, kubeconfig: Path, tmp_path: Path
) -> None:
    """Tenant code can call, read and unload every model in its Triton: an agent that lets a
    namespace run it refuses to start on a node the binder also gives other namespaces."""
    make_node(kube_api, tenant_code=False)
    mock = MockNvml(parse_spec("1xT4", seed=NODE))
    settings = Settings(
        node_name=NODE,
        model_repository=tmp_path / "models",
        kubeconfig=str(kubeconfig),
        # Never reached: the agent stops before it talks to Triton.
        triton_http_url="127.0.0.1:9",
        triton_grpc_url="127.0.0.1:9",
        listen_grpc="127.0.0.1:0",
        listen_http="127.0.0.1:0",
        cpu_only=True,
        placement_key_dir=write_test_placement_key(tmp_path / "placement-key"),
        tenant_code_namespaces=("lab",),
    )
    with pytest.raises(AgentError) as refused:
        await start_agent(settings, mock)
    message = str(refused.value)
    assert "namespaces lab run their own code" in message, message
    assert f"node {NODE} is not dedicated to tenant code" in message, message
    assert f"kubectl label node {NODE} {Keys().tenant_code}=true" in message, message

    # Without tenant code the node needs no label; labelled, the agent allowing it starts.
    for tenant_code, label in (((), False), (("lab",), True)):
        if label:
            kubernetes.client.CoreV1Api(kube_api).patch_node(
                NODE, {"metadata": {"labels": {Keys().tenant_code: "true"}}}
            )
        running = await start_agent(replace(settings, tenant_code_namespaces=tenant_code), mock)
        assert running.agent.grpc_address
        await running.stop()


async def test_an_agent_that_sees_fewer_gpus_than_its_node_advertises_refuses_to_start(
    kube_api: kubernetes.client.ApiClient, kubeconfig: Path, tmp_path: Path
) -> None:
    """The device plugin advertises 2 GPUs but the node pod was given (or sees) one: models
    placed on the other would never load, so the agent says why, on its Node too, and stops."""
    make_node(kube_api, tenant_code=False)
    core = kubernetes.client.CoreV1Api(kube_api)
    core.patch_node_status(
        NODE,
        {"status": {"capacity": {"nvidia.com/gpu": "2"}, "allocatable": {"nvidia.com/gpu": "2"}}},
    )
    settings = Settings(
        node_name=NODE,
        model_repository=tmp_path / "models",
        kubeconfig=str(kubeconfig),
        # Never reached: the agent stops before it talks to Triton.
        triton_http_url="127.0.0.1:9",
        triton_grpc_url="127.0.0.1:9",
        listen_grpc="127.0.0.1:0",
        listen_http="127.0.0.1:0",
        placement_key_dir=write_test_placement_key(tmp_path / "placement-key"),
    )
    with pytest.raises(AgentError) as refused:
        await start_agent(settings, MockNvml(parse_spec("1xT4", seed=NODE)))
    message = str(refused.value)
    assert f"node {NODE} advertises 2 GPUs (nvidia.com/gpu) but NVML shows 1" in message, message
    assert "request nvidia.com/gpu: 2" in message, message
    events = [
        e
        for e in core.list_namespaced_event("default").items
        if e.involved_object.kind == "Node" and e.involved_object.name == NODE
    ]
    assert [e.reason for e in events] == ["GpusMissing"], events
    assert events[0].type == "Warning" and "does not start" in (events[0].message or "")

    # NVML that cannot be loaded sees none; every advertised GPU seen, the agent starts.
    unloaded = MockNvml(parse_spec("2xT4", seed=NODE))
    unloaded.set_library_loaded(False)
    with pytest.raises(AgentError, match=r"advertises 2 GPUs .* but NVML is not usable"):
        await start_agent(settings, unloaded)
    running = await start_agent(settings, MockNvml(parse_spec("2xT4", seed=NODE)))
    assert running.agent.grpc_address
    await running.stop()


async def test_an_unexpected_error_reading_the_gpus_stops_neither_the_loop_nor_the_lease(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    node: str,
    kubeconfig: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """NVML's library raising something not its own (here the mock's workload, as a failing
    dependency of a real driver might): the node turns not ready and keeps its last reading, the
    Lease is still renewed, and the next good reading makes it ready again."""
    stop = asyncio.Event()
    fake = FakeTime(until=200.0, stop=stop)
    mock = MockNvml(parse_spec("1xT4", seed=NODE), clock=fake.clock)

    def workload() -> dict[int, int]:
        if 50 <= fake.now < 120:
            raise RuntimeError("the library's own dependency is away")
        return {}

    mock.set_workload(workload)
    kube = KubeClient(str(kubeconfig))
    seen: list[tuple[float, bool]] = []

    async def paced_sleep(seconds: float) -> None:
        seen.append((fake.now, node_publisher.gpus_read))
        await fake.sleep(seconds)

    node_publisher = publisher(kube, mock, fake, sleep=paced_sleep)
    try:
        await node_publisher.run(stop)
    finally:
        await kube.close()
    assert any(not read and 50 <= t < 120 for t, read in seen), seen
    assert all(read for t, read in seen if t >= 130), seen
    assert "Reading the GPUs failed unexpectedly" in caplog.text
    lease = kubernetes.client.CoordinationV1Api(kube_api).read_namespaced_lease(
        f"tritonshare-agent-{NODE}", "tritonshare-system"
    )
    assert lease.spec is not None and lease.spec.renew_time is not None
    renewed = lease.spec.renew_time.timestamp() - fake.wall().timestamp()
    assert renewed > -60, "renewed until the end, through the failing readings"
