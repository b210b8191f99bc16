"""GPU memory measured per model, admitted and enforced on the node: through the agent's real API
with a real Triton, the mock NVML standing in for pynvml, and `sim.gpu.load` playing the GPU (a
model READY in Triton occupies the bytes its config declares on its pod's GPU)."""

from __future__ import annotations

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
)
from tests.conftest import copy_model

pytestmark = pytest.mark.triton

GI = 1024**3


def model_using(tmp_path: Path, name: str, uses: str, grows: str = "") -> Path:
    """add_one renamed to `name`, declaring the GPU memory it occupies once loaded."""
    source = copy_model("add_one", tmp_path / name, as_name=name)
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
    *,
    request: int,
    uses: str,
    gpu: int = 0,
    grows: str = "",
) -> Any:
    make_pod(api, name, name, gpu_uuid=running.mock.gpus[gpu].uuid, request=request)
    token = apiserver.mint_token("default", name)
    await install_dir(running.stub, token, model_using(tmp_path, name, uses, grows), name)
    return await running.stub.LoadModel(
        agent_pb2.LoadModelRequest(model_id=name), metadata=bearer(token)
    )


@pytest.fixture
async def memory_agent(
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    model_repository: Path,
    mock_nvml: MockNvml,
    start_custom_agent: StartAgent,
    request: pytest.FixtureRequest,
) -> RunningAgent:
    """An agent whose simulated GPUs hold what Triton's loaded models declare."""
    footprints = ModelFootprints(
        triton.http_url,
        model_repository,
        kube_api,
        NODE,
        {g.uuid: i for i, g in enumerate(mock_nvml.gpus)},
        cache_seconds=0.0,
    )
    mock_nvml.set_workload(footprints)
    return await start_custom_agent(usage_publish_seconds=0.2, **getattr(request, "param", {}))


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


def events(api: kubernetes.client.ApiClient, pod: str) -> dict[str, str]:
    core: Any = kubernetes.client.CoreV1Api(api)
    found = core.list_namespaced_event("default", field_selector=f"involvedObject.name={pod}")
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
    assert running.agent.ledger.measured("m1") == GI
    metrics = await scrape(running)
    assert (
        f'tritonshare_agent_model_gpu_memory_bytes{{UUID="{gpu}",gpu="0",model="m1"}} '
        "1.073741824e+09" in metrics
    )
    assert (
        f'tritonshare_agent_model_gpu_memory_request_bytes{{UUID="{gpu}",gpu="0",model="m1"}}'
        in metrics
    )
    assert f'tritonshare_agent_gpu_unattributed_memory_bytes{{UUID="{gpu}",gpu="0"}} 0.0' in metrics

    def published(model_bytes: int | None) -> bool:
        entry = node_usage(kube_api).get(gpu, {})
        return bool(entry.get("models", {}).get("m1") == model_bytes)

    await eventually(lambda: published(GI), what="m1's 1Gi on the node's gpu-usage annotation")

    token = apiserver.mint_token("default", "m1")
    core: Any = kubernetes.client.CoreV1Api(kube_api)
    core.delete_namespaced_pod("m1", "default")  # deleting: its proxy may unload now
    await running.stub.UnloadModel(
        agent_pb2.UnloadModelRequest(model_id="m1"), metadata=bearer(token)
    )
    assert running.agent.ledger.measured("m1") == 0
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
    assert all(index.get(m) is None or index[m].state != "READY" for m in ("second", "third"))


async def test_an_over_user_is_warned_and_its_neighbour_within_its_request_is_not(
    memory_agent: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    running = memory_agent
    await serve(running, apiserver, kube_api, tmp_path, "modest", request=2 * GI, uses="1Gi")
    status = await serve(running, apiserver, kube_api, tmp_path, "greedy", request=GI, uses="3Gi")
    assert status.state == agent_pb2.MODEL_STATE_READY
    assert running.agent.ledger.measured("greedy") == 3 * GI
    await eventually(
        lambda: "GPUMemoryOverRequest" in events(kube_api, "greedy"),
        what="the over-user's warning",
    )
    assert "GPUMemoryOverRequest" not in events(kube_api, "modest")
    metrics = await scrape(running)
    assert 'tritonshare_agent_gpu_memory_over_request_total{action="warned"} 1.0' in metrics
    index = await running.agent.triton.index()
    assert index["greedy"].state == index["modest"].state == "READY"


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
    assert index.get("grower") is None or index["grower"].state == "UNAVAILABLE"
    assert index["modest"].state == "READY"
    # The Event is written after the pod's status, by a task of its own.
    await eventually(
        lambda: "GPUMemoryExceeded" in events(kube_api, "grower"), what="the eviction's Event"
    )
    assert "ModelNotVouched" not in events(kube_api, "grower")
