"""GPU memory measured per model, admitted and enforced on the node: through the agent's real API
with a real Triton, the mock NVML standing in for pynvml, and `sim.gpu.load` playing the GPU (a
model READY in Triton occupies the bytes its config declares on its pod's GPU)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import kubernetes.client
import pytest

from protos import agent_pb2
from sim.apiserver import RunningApiServer
from sim.gpu.load import ModelFootprints
from sim.gpu.nvml import MockNvml
from sim.triton import TritonServer
from tests.agent.conftest import (
    NODE,
    RunningAgent,
    StartAgent,
    bearer,
    eventually,
    install_dir,
    make_pod,
    name_in_triton,
)
from tests.conftest import copy_model

pytestmark = pytest.mark.triton

GI = 1024**3


SLOW_LOAD = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(3)  # a large model: its load takes a while

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[]) for _ in requests]
"""


SLOW_UNLOAD = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[]) for _ in requests]

    def finalize(self):
        time.sleep(5)  # its stub leaves a while after Triton is asked to unload it
"""


def model_using(
    tmp_path: Path,
    name: str,
    uses: str,
    grows: str = "",
    *,
    slow: bool = False,
    slow_unload: bool = False,
) -> Path:
    """add_one renamed to `name`, declaring the GPU memory it occupies once loaded; `slow`: its
    load takes three seconds; `slow_unload`: its unload five."""
    source = copy_model("add_one", tmp_path / name, as_name=name)
    if slow or slow_unload:
        (source / "1" / "model.py").write_text(SLOW_LOAD if slow else SLOW_UNLOAD)
    parameters = f'parameters {{ key: "sim_gpu_memory" value: {{ string_value: "{uses}" }} }}\n'
    if grows:
        parameters += (
            f'parameters {{ key: "sim_gpu_memory_growth" value: {{ string_value: "{grows}" }} }}\n'
        )
    with (source / "config.pbtxt").open("a") as config:
        config.write(parameters)
    return source


async def serve(
    running: RunningAgent,
    apiserver: RunningApiServer,
    api: kubernetes.client.ApiClient,
    tmp_path: Path,
    name: str,
    **model: Any,
) -> Any:
    """The pod and the model `installed` makes (`model`: its arguments), loaded."""
    token = await installed(running, apiserver, api, tmp_path, name, **model)
    return await running.stub.LoadModel(
        agent_pb2.LoadModelRequest(model_id=name), metadata=bearer(token)
    )


async def installed(
    running: RunningAgent,
    apiserver: RunningApiServer,
    api: kubernetes.client.ApiClient,
    tmp_path: Path,
    name: str,
    *,
    request: int,
    uses: str,
    gpu: int = 0,
    grows: str = "",
    namespace: str = "default",
    slow: bool = False,
    slow_unload: bool = False,
) -> str:
    """A pod `name` on GPU `gpu` asking `request` bytes, and its model (`model_using`)
    installed, not loaded yet: the pod's token."""
    make_pod(
        api, name, name, gpu_uuid=running.mock.gpus[gpu].uuid, request=request, namespace=namespace
    )
    token = apiserver.mint_token(namespace, name)
    source = model_using(tmp_path, name, uses, grows, slow=slow, slow_unload=slow_unload)
    await install_dir(running.stub, token, source, name)
    return token


@pytest.fixture
def footprints(
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    model_repository: Path,
    mock_nvml: MockNvml,
) -> ModelFootprints:
    """The simulated GPUs hold what Triton's loaded models declare (and what tests allocate)."""
    footprints = ModelFootprints(
        triton.http_url,
        model_repository,
        kube_api,
        NODE,
        {g.uuid: i for i, g in enumerate(mock_nvml.gpus)},
        cache_seconds=0.0,
    )
    mock_nvml.set_workload(footprints)
    return footprints


@pytest.fixture
async def memory_agent(
    footprints: ModelFootprints,
    start_custom_agent: StartAgent,
    request: pytest.FixtureRequest,
) -> RunningAgent:
    """An agent whose simulated GPUs hold what Triton's loaded models declare."""
    return await start_custom_agent(usage_publish_seconds=0.2, **getattr(request, "param", {}))


def tn(api: kubernetes.client.ApiClient, name: str, namespace: str = "default") -> str:
    """The name in Triton of the model `serve` served for pod `name`."""
    return name_in_triton(api, name, name, namespace)


def node_usage(api: kubernetes.client.ApiClient) -> dict[str, Any]:
    core: Any = kubernetes.client.CoreV1Api(api)
    annotations = core.read_node(NODE).metadata.annotations or {}
    return dict(json.loads(annotations.get("tritonshare.io/gpu-usage", "{}")))


async def scrape(running: RunningAgent) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://{running.agent.http_address}/metrics") as response,
    ):
        return await response.text()


def events(
    api: kubernetes.client.ApiClient, pod: str, namespace: str = "default"
) -> dict[str, str]:
    core: Any = kubernetes.client.CoreV1Api(api)
    found = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}")
    return {e.reason: e.message for e in found.items}


async def test_measured_memory_is_published_and_an_unload_frees_it(
    memory_agent: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    running = memory_agent
    gpu = running.mock.gpus[0].uuid
    status = await serve(running, apiserver, kube_api, tmp_path, "m1", request=2 * GI, uses="1Gi")
    assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
    m1 = tn(kube_api, "m1")
    assert running.agent.ledger.measured(m1) == GI
    metrics = await scrape(running)
    assert (
        f'tritonshare_agent_model_gpu_memory_bytes{{UUID="{gpu}",gpu="0",model="{m1}"}} '
        "1.073741824e+09" in metrics
    )
    assert (
        f'tritonshare_agent_model_gpu_memory_request_bytes{{UUID="{gpu}",gpu="0",model="{m1}"}}'
        in metrics
    )
    assert f'tritonshare_agent_gpu_unattributed_memory_bytes{{UUID="{gpu}",gpu="0"}} 0.0' in metrics

    def published(model_bytes: int | None) -> bool:
        entry = node_usage(kube_api).get(gpu, {})
        return bool(entry.get("models", {}).get(m1) == model_bytes)

    await eventually(lambda: published(GI), what="m1's 1Gi on the node's gpu-usage annotation")

    token = apiserver.mint_token("default", "m1")
    core: Any = kubernetes.client.CoreV1Api(kube_api)
    core.delete_namespaced_pod("m1", "default")  # deleting: its proxy may unload now
    await running.stub.UnloadModel(
        agent_pb2.UnloadModelRequest(model_id="m1"), metadata=bearer(token)
    )
    assert running.agent.ledger.measured(m1) == 0
    await eventually(lambda: published(None), what="m1 gone from the gpu-usage annotation")
    await eventually(
        lambda: node_usage(kube_api)[gpu]["used"] == 0, what="the GPU's memory to be freed"
    )


async def test_a_load_that_does_not_fit_is_refused_with_an_event(
    memory_agent: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    """A double booking (a pod bound by hand, two binder leaders) is harmless: the node refuses
    what does not fit, by booking and by NVML."""
    running = memory_agent
    capacity = running.mock.gpus[0].memory
    # Booked but not loaded yet: a placement the agent must count.
    make_pod(kube_api, "first", "first", gpu_uuid=running.mock.gpus[0].uuid, request=capacity - GI)
    with pytest.raises(grpc.aio.AioRpcError) as booked:
        await serve(running, apiserver, kube_api, tmp_path, "second", request=2 * GI, uses="1Gi")
    assert booked.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "booked by the other pods placed on it" in (booked.value.details() or "")
    await eventually(
        lambda: "InsufficientGPUMemory" in events(kube_api, "second"), what="the pod's event"
    )

    # Something outside tritonshare fills GPU 1: NVML's free memory decides.
    running.mock.set_used(1, running.mock.gpus[1].memory - GI)
    with pytest.raises(grpc.aio.AioRpcError) as full:
        await serve(
            running, apiserver, kube_api, tmp_path, "third", request=2 * GI, uses="1Gi", gpu=1
        )
    assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "NVML shows" in (full.value.details() or "")
    index = await running.agent.triton.index()
    names = [tn(kube_api, m) for m in ("second", "third")]
    assert all(index.get(m) is None or index[m].state != "READY" for m in names)


async def test_an_over_user_is_warned_and_its_neighbour_within_its_request_is_not(
    memory_agent: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    """Measured alone on its GPU, the over-user's figure is its own; its neighbour, loaded
    beside it later, is measured exactly (nothing else changed during its load)."""
    running = memory_agent
    status = await serve(running, apiserver, kube_api, tmp_path, "greedy", request=GI, uses="3Gi")
    assert status.state == agent_pb2.MODEL_STATE_READY
    await serve(running, apiserver, kube_api, tmp_path, "modest", request=2 * GI, uses="1Gi")
    assert running.agent.ledger.measured(tn(kube_api, "greedy")) == 3 * GI
    assert running.agent.ledger.measured(tn(kube_api, "modest")) == GI
    await eventually(
        lambda: "GPUMemoryOverRequest" in events(kube_api, "greedy"),
        what="the over-user's warning",
    )
    assert "GPUMemoryOverRequest" not in events(kube_api, "modest")
    metrics = await scrape(running)
    assert 'tritonshare_agent_gpu_memory_over_request_total{action="warned"} 1.0' in metrics
    index = await running.agent.triton.index()
    assert index[tn(kube_api, "greedy")].state == index[tn(kube_api, "modest")].state == "READY"


@pytest.mark.parametrize("memory_agent", [{"gpu_mem_enforcement": "evict"}], indirect=True)
async def test_evict_mode_unloads_a_model_that_grows_past_its_request_and_fails_its_pod(
    memory_agent: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    running = memory_agent
    await serve(running, apiserver, kube_api, tmp_path, "modest", request=2 * GI, uses="1Gi")
    # Alone on GPU 1, within its request at load, then it grows: its GPU's growth is its own.
    status = await serve(
        running, apiserver, kube_api, tmp_path, "grower", request=GI, uses="512Mi",
        grows="2Gi@1", gpu=1,
    )  # fmt: skip
    assert status.state == agent_pb2.MODEL_STATE_READY
    core: Any = kubernetes.client.CoreV1Api(kube_api)

    def failed() -> bool:
        pod = core.read_namespaced_pod("grower", "default")
        return bool(pod.status.phase == "Failed" and pod.status.reason == "GPUMemoryExceeded")

    await eventually(failed, what="the grower's pod to end Failed (GPUMemoryExceeded)")
    index = await running.agent.triton.index()
    grower = tn(kube_api, "grower")
    assert index.get(grower) is None or index[grower].state == "UNAVAILABLE"
    assert index[tn(kube_api, "modest")].state == "READY"
    # The Event is written after the pod's status, by a task of its own.
    await eventually(
        lambda: "GPUMemoryExceeded" in events(kube_api, "grower"), what="the eviction's Event"
    )
    assert "ModelNotVouched" not in events(kube_api, "grower")


def pod_phase(api: kubernetes.client.ApiClient, name: str, namespace: str) -> tuple[str, str]:
    pod: Any = kubernetes.client.CoreV1Api(api).read_namespaced_pod(name, namespace)
    return pod.status.phase or "", pod.status.reason or ""


@pytest.fixture
def tenants(kube_api: kubernetes.client.ApiClient) -> None:
    core: Any = kubernetes.client.CoreV1Api(kube_api)
    for name in ("team-a", "team-b"):
        core.create_namespace({"metadata": {"name": name}})


ENFORCEMENTS = [{"gpu_mem_enforcement": "warn"}, {"gpu_mem_enforcement": "evict"}]


@pytest.mark.parametrize("memory_agent", ENFORCEMENTS, indirect=True, ids=["warn", "evict"])
async def test_a_neighbour_growing_during_a_load_is_not_billed_to_the_loading_model(
    memory_agent: RunningAgent,
    footprints: ModelFootprints,
    tenants: None,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    """Attack: team-a's model, loaded at 512Mi against a 1Gi request, allocates 4Gi more on the
    GPU while team-b's model loads there. The victim is neither billed, warned nor evicted for
    it; the growth stays visible on the GPU as unattributed, and once the attacker is alone on
    its GPU again it is the one over its request."""
    running = memory_agent
    gpu = running.mock.gpus[0].uuid
    attacker = await serve(
        running, apiserver, kube_api, tmp_path, "attacker",
        request=GI, uses="512Mi", namespace="team-a",
    )  # fmt: skip
    assert attacker.state == agent_pb2.MODEL_STATE_READY, attacker.reason
    victim_serve = serve(
        running, apiserver, kube_api, tmp_path, "victim",
        request=2 * GI, uses="1Gi", namespace="team-b", slow=True,
    )  # fmt: skip
    victim_load = asyncio.ensure_future(victim_serve)

    # The agent's window on GPU 0 opens (its reading before the load is taken) and the victim's
    # model takes three seconds to load: the attacker allocates inside the window.
    await eventually(
        lambda: victim_load.done() or gpu in running.agent.ledger.loading,
        what="the victim's load window to open",
    )
    if victim_load.done():  # its install or load failed: say why
        pytest.fail(f"the victim's load ended before the attack: {victim_load.result()}")
    footprints.allocate(tn(kube_api, "attacker", "team-a"), 4 * GI)
    victim = await victim_load
    assert victim.state == agent_pb2.MODEL_STATE_READY, victim.reason

    ledger = running.agent.ledger
    victim_name = tn(kube_api, "victim", "team-b")
    assert ledger.measured(victim_name) <= 2 * GI, "the victim was billed the attacker's growth"
    await eventually(
        lambda: node_usage(kube_api).get(gpu, {}).get("models", {}).get(victim_name) is not None,
        what="the victim's figure on the gpu-usage annotation",
    )
    assert node_usage(kube_api)[gpu]["models"][tn(kube_api, "victim", "team-b")] <= 2 * GI
    # The attacker's growth is not hidden: it stays on the GPU as unattributed memory.
    assert ledger.unattributed(gpu) >= 3 * GI
    metrics = await scrape(running)
    assert (
        f'tritonshare_agent_gpu_unattributed_memory_bytes{{UUID="{gpu}",gpu="0"}} 3.221225472e+09'
        in metrics
    )
    assert (
        f'tritonshare_agent_gpu_unexplained_growth_bytes_total{{UUID="{gpu}"}} 3.221225472e+09'
        in metrics
    )
    assert (
        "tritonshare_agent_model_gpu_memory_uncertainty_bytes"
        f'{{UUID="{gpu}",gpu="0",model="{victim_name}"}}' in (metrics)
    )
    # Several reconciliation passes later, nothing has happened to the victim.
    passes = running.agent.reconciler.passes
    await eventually(
        lambda: running.agent.reconciler.passes >= passes + 3, what="three reconciliations"
    )
    victim_events = events(kube_api, "victim", "team-b")
    assert "GPUMemoryOverRequest" not in victim_events, victim_events
    assert "GPUMemoryExceeded" not in victim_events, victim_events
    assert pod_phase(kube_api, "victim", "team-b") != ("Failed", "GPUMemoryExceeded")
    assert (await running.agent.triton.state(tn(kube_api, "victim", "team-b"))).state == "READY"  # type: ignore[union-attr]

    # The victim leaves: alone on its GPU again, the attacker is measured at its 4.5Gi and
    # warned. Not evicted: what grew during the victim's load could, as far as NVML can tell,
    # be what Triton kept of the victim's memory.
    core: Any = kubernetes.client.CoreV1Api(kube_api)
    core.delete_namespaced_pod("victim", "team-b")
    await running.stub.UnloadModel(
        agent_pb2.UnloadModelRequest(model_id="victim"),
        metadata=bearer(apiserver.mint_token("team-b", "victim")),
    )
    await eventually(
        lambda: "GPUMemoryOverRequest" in events(kube_api, "attacker", "team-a"),
        what="the attacker's warning once it is alone on its GPU",
    )
    assert ledger.measured(tn(kube_api, "attacker", "team-a")) >= 4 * GI
    warning = events(kube_api, "attacker", "team-a")["GPUMemoryOverRequest"]
    assert "while other models shared it" in warning, warning
    assert pod_phase(kube_api, "attacker", "team-a") != ("Failed", "GPUMemoryExceeded")


@pytest.mark.parametrize(
    "memory_agent",
    # No poll after the agent's first: the growth is seen first by the victim's load.
    [{**e, "gpu_poll_seconds": 3600.0} for e in ENFORCEMENTS],
    indirect=True,
    ids=["warn", "evict"],
)
async def test_a_neighbour_growing_between_polls_is_the_one_warned(
    memory_agent: RunningAgent,
    footprints: ModelFootprints,
    tenants: None,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    """Attack: team-a's model, alone on GPU 0, allocates 4Gi more after the agent's last poll;
    team-b's model then loads there. The load's first reading sees the growth: it is the
    attacker's (the only model on the GPU), not the victim's, and not swallowed as the GPU's
    baseline either."""
    running = memory_agent
    attacker = await serve(
        running, apiserver, kube_api, tmp_path, "attacker",
        request=GI, uses="512Mi", namespace="team-a",
    )  # fmt: skip
    assert attacker.state == agent_pb2.MODEL_STATE_READY, attacker.reason
    footprints.allocate(tn(kube_api, "attacker", "team-a"), 4 * GI)
    victim = await serve(
        running, apiserver, kube_api, tmp_path, "victim",
        request=2 * GI, uses="1Gi", namespace="team-b",
    )  # fmt: skip
    assert victim.state == agent_pb2.MODEL_STATE_READY, victim.reason
    assert running.agent.ledger.measured(tn(kube_api, "victim", "team-b")) == GI
    evicting = running.agent.settings.gpu_mem_enforcement == "evict"
    reason = "GPUMemoryExceeded" if evicting else "GPUMemoryOverRequest"
    await eventually(
        lambda: reason in events(kube_api, "attacker", "team-a"),
        what=f"the attacker's {reason}",
    )
    if evicting:
        assert pod_phase(kube_api, "attacker", "team-a") == ("Failed", "GPUMemoryExceeded")
    else:
        assert running.agent.ledger.measured(tn(kube_api, "attacker", "team-a")) >= 4 * GI
    victim_events = events(kube_api, "victim", "team-b")
    assert "GPUMemoryOverRequest" not in victim_events, victim_events
    assert "GPUMemoryExceeded" not in victim_events, victim_events
    assert (await running.agent.triton.state(tn(kube_api, "victim", "team-b"))).state == "READY"  # type: ignore[union-attr]


STUB_CONTEXT = 600 * 1024**2
"""A Python model's stub process's CUDA context (524 to 616 MiB on a real GPU)."""
DRIVER_SHARE = 6 * 1024**2
"""What each stub also costs its GPU outside NVML's per-process figure (5.5-5.75 MiB on an H200)."""
ALLOWANCE = 640 * 1024**2
"""The binder's default --gpu-mem-process-allowance, booked with a Python model's request."""


@pytest.mark.parametrize("memory_agent", [{"gpu_mem_enforcement": "evict"}], indirect=True)
async def test_a_python_model_booked_with_the_allowance_keeps_its_context(
    memory_agent: RunningAgent,
    footprints: ModelFootprints,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    """A Python model that allocates exactly its request holds its stub's CUDA context too: booked
    with the per-process allowance (the binder's default) it stays; booked at its request alone
    it is measured over it and evicted, which is why the binder books the allowance."""
    running = memory_agent
    footprints.process_context = STUB_CONTEXT
    await serve(
        running, apiserver, kube_api, tmp_path, "booked", request=GI + ALLOWANCE, uses="1Gi"
    )
    await serve(running, apiserver, kube_api, tmp_path, "unbooked", request=GI, uses="1Gi", gpu=1)
    core: Any = kubernetes.client.CoreV1Api(kube_api)

    def evicted(name: str) -> bool:
        pod = core.read_namespaced_pod(name, "default")
        return bool(pod.status.phase == "Failed" and pod.status.reason == "GPUMemoryExceeded")

    await eventually(lambda: evicted("unbooked"), what="the unbooked model to be evicted")
    assert running.agent.models.ledger.measured(tn(kube_api, "booked")) == GI + STUB_CONTEXT
    assert not evicted("booked")
    index = await running.agent.triton.index()
    assert index[tn(kube_api, "booked")].state == "READY"


async def test_a_python_model_whose_pod_declares_an_in_process_backend_is_refused(
    memory_agent: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    """The binder booked no allowance for a pod that declares onnxruntime; the agent reads the
    model's config.pbtxt and refuses to load a Python model for it, so the pod cannot hold its
    context on memory nobody booked."""
    running = memory_agent
    gpu = running.mock.gpus[0].uuid
    declared = {"tritonshare.io/backend": "onnxruntime"}
    make_pod(kube_api, "liar", "liar", gpu_uuid=gpu, request=GI, annotations=declared)
    token = apiserver.mint_token("default", "liar")
    await install_dir(running.stub, token, model_using(tmp_path, "liar", "512Mi"), "liar")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await running.stub.LoadModel(
            agent_pb2.LoadModelRequest(model_id="liar"), metadata=bearer(token)
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = refused.value.details() or ""
    assert "runs in a process of its own (backend 'python')" in details, details
    assert "declares backend 'onnxruntime'" in details


async def agent_measuring_apart(
    footprints: ModelFootprints,
    mock_nvml: MockNvml,
    triton: TritonServer,
    start_custom_agent: StartAgent,
    tmp_path: Path,
) -> RunningAgent:
    """An agent that measures Python models apart: their stubs listed by the mock NVML with
    their CUDA contexts, each costing the GPU a driver's share beyond its figure."""
    footprints.process_context, footprints.listed = STUB_CONTEXT, True
    footprints.driver_share = DRIVER_SHARE
    mock_nvml.set_workload(footprints, footprints.processes)
    pid_file = tmp_path / "triton.pid"
    assert triton.process is not None
    pid_file.write_text(f"{triton.process.pid}\n")
    return await start_custom_agent(triton_pid_file=pid_file, usage_publish_seconds=0.2)


async def test_python_models_load_at_once_each_billed_its_own_process(
    footprints: ModelFootprints,
    mock_nvml: MockNvml,
    triton: TritonServer,
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    """Three Python models whose loads take 3 s each, asked at once on one GPU: they load side
    by side (the GPU's slot shared), and each is billed exactly what its own stub process
    holds (its allocation and its CUDA context, NVML's per-process figure) and the driver's
    share of its context that the GPU's used memory shows beyond that figure, none of the GPU
    left unattributed; their unloads return it all."""
    running = await agent_measuring_apart(
        footprints, mock_nvml, triton, start_custom_agent, tmp_path
    )
    gpu = running.mock.gpus[0].uuid
    uses = {"p1": "256Mi", "p2": "512Mi", "p3": "1Gi"}
    sharing = [0]

    async def watch() -> None:
        while True:
            sharing[0] = max(sharing[0], len(running.agent.models.admission.queue.shared(gpu)))
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch())
    try:
        statuses = await asyncio.gather(
            *(
                serve(
                    running,
                    apiserver,
                    kube_api,
                    tmp_path,
                    name,
                    request=2 * GI + ALLOWANCE,
                    uses=size,
                    slow=True,
                )
                for name, size in uses.items()
            )
        )
    finally:
        watcher.cancel()
    for status in statuses:
        assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
    assert sharing[0] >= 2, "the loads never shared the GPU"
    ledger = running.agent.models.ledger
    for name, size in uses.items():
        entry = ledger.models[tn(kube_api, name)]
        expected = {"256Mi": GI // 4, "512Mi": GI // 2, "1Gi": GI}[size] + STUB_CONTEXT
        assert (entry.source, entry.bytes) == ("process", expected + DRIVER_SHARE), name
        assert ledger.uncertainty(entry.model_id) == DRIVER_SHARE
    assert ledger.unattributed(gpu) == 0
    metrics = await scrape(running)
    assert f'tritonshare_agent_gpu_unattributed_memory_bytes{{UUID="{gpu}",gpu="0"}} 0.0' in metrics
    # A poll after the loads keeps each figure (what its process holds, and its share).
    await running.agent.node.refresh_gpus()
    for name in uses:
        assert ledger.models[tn(kube_api, name)].share == DRIVER_SHARE
    assert ledger.unattributed(gpu) == 0


async def test_a_python_models_unload_goes_beside_a_load_and_the_bill_stays_exact(
    footprints: ModelFootprints,
    mock_nvml: MockNvml,
    triton: TritonServer,
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    """A Python model's unload (its stub takes 5 s to leave) and another Python model's load
    asked meanwhile share the GPU's slot, so the load does not wait for the unload (as a burst
    of wakes during a scale-down must not); the models left are each billed exactly their own
    process and the driver's share of its context, none of the GPU unattributed."""
    running = await agent_measuring_apart(
        footprints, mock_nvml, triton, start_custom_agent, tmp_path
    )
    gpu = running.mock.gpus[0].uuid
    request = 2 * GI + ALLOWANCE
    for name, slow_unload in (("leaving", True), ("kept", False)):
        status = await serve(
            running, apiserver, kube_api, tmp_path, name, request=request, uses="512Mi",
            slow_unload=slow_unload,
        )  # fmt: skip
        assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
    token = await installed(
        running, apiserver, kube_api, tmp_path, "waking", request=request, uses="1Gi"
    )
    models = running.agent.models
    queue = models.admission.queue
    leaving = tn(kube_api, "leaving")
    unload = asyncio.create_task(models.unload(leaving, reason="the test scales it down"))

    def unloading() -> bool:
        holder = queue.holder(gpu)
        granted = [t.name for t in queue.shared(gpu)] + ([holder.name] if holder else [])
        return granted == [leaving]

    await eventually(unloading, what="the unload's turn")
    beside: set[str] = set()

    async def watch() -> None:
        while True:
            names = {t.name for t in queue.shared(gpu)}
            holder, with_it = queue.holder(gpu), queue.beside(gpu)
            names |= {t.name for t in (holder, with_it) if t is not None}
            if leaving in names and len(names) > 1:
                beside.update(names - {leaving})
            await asyncio.sleep(0.01)

    watcher = asyncio.create_task(watch())
    try:
        status = await running.stub.LoadModel(
            agent_pb2.LoadModelRequest(model_id="waking"), metadata=bearer(token)
        )
        assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
        await unload
    finally:
        watcher.cancel()
    assert beside == {tn(kube_api, "waking")}, "the load waited for the unload to end"
    ledger = models.ledger
    assert leaving not in ledger.models
    for name, allocated in (("kept", GI // 2), ("waking", GI)):
        entry = ledger.models[tn(kube_api, name)]
        assert (entry.source, entry.bytes) == ("process", allocated + STUB_CONTEXT + DRIVER_SHARE)
        assert entry.share == DRIVER_SHARE, name
    assert ledger.unattributed(gpu) == 0
    await running.agent.node.refresh_gpus()
    assert ledger.unattributed(gpu) == 0
