"""On-demand models through the agent's real API, a real Triton and the simulated GPUs: an idle
unload puts a model to sleep (files kept, not loaded back, not charged, the pod told why), its
next load wakes it, and nothing of it reaches an `always` pod, whatever its annotation says now.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import kubernetes.client
import pytest

from agent.phases import Phase
from common.activity import Activity, ActivityTable
from common.activity import write_table as write_activity
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
from tests.agent.gpus.test_gpu_memory import model_using

pytestmark = pytest.mark.triton

GI = 1024**3
CONDITION = "tritonshare.io/ModelLoaded"


@pytest.fixture
async def memory_agent(
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    model_repository: Path,
    mock_nvml: MockNvml,
    start_custom_agent: StartAgent,
) -> RunningAgent:
    """An agent whose simulated GPUs hold what Triton's loaded models declare."""
    return await start_memory_agent(
        kube_api, triton, model_repository, mock_nvml, start_custom_agent
    )


async def start_memory_agent(
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    model_repository: Path,
    mock_nvml: MockNvml,
    start_custom_agent: StartAgent,
    min_idle: float = 0.0,
) -> RunningAgent:
    """`memory_agent`, with `min_idle` as --evict-min-idle-seconds."""
    indexes = {g.uuid: i for i, g in enumerate(mock_nvml.gpus)}
    mock_nvml.set_workload(
        ModelFootprints(
            triton.http_url, model_repository, kube_api, NODE, indexes, cache_seconds=0.0
        )
    )
    return await start_custom_agent(
        usage_publish_seconds=0.2,
        activity_table=model_repository.parent / "gateway" / "activity.json",
        evict_min_idle_seconds=min_idle,
    )


async def serve(
    running: RunningAgent,
    apiserver: RunningApiServer,
    api: kubernetes.client.ApiClient,
    tmp_path: Path,
    name: str,
    *,
    request: int = GI,
    uses: str = "1Gi",
    residency: str = "on-demand",
    namespace: str = "default",
    loads: bool = True,
    model_py: str = "",
) -> str:
    """A pod placed by the binder with `residency`, its model installed (its `model.py` that
    one, if given) and (`loads`) loaded; its token."""
    make_pod(
        api,
        name,
        name,
        gpu_uuid=running.mock.gpus[0].uuid,
        request=request,
        namespace=namespace,
        residency=residency,
    )
    token = apiserver.mint_token(namespace, name)
    source = model_using(tmp_path, name, uses)
    if model_py:
        (source / "1" / "model.py").write_text(model_py)
    await install_dir(running.stub, token, source, name)
    if loads:
        status = await load(running, token, name)
        assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
    kubernetes.client.CoreV1Api(api).patch_namespaced_pod_status(
        name, namespace, {"status": {"phase": "Running"}}
    )
    return token


async def load(running: RunningAgent, token: str, model_id: str) -> Any:
    return await running.stub.LoadModel(
        agent_pb2.LoadModelRequest(model_id=model_id), metadata=bearer(token)
    )


async def sleep(running: RunningAgent, token: str, model_id: str) -> Any:
    return await running.stub.UnloadModel(
        agent_pb2.UnloadModelRequest(model_id=model_id, idle=True), metadata=bearer(token)
    )


async def triton_state(running: RunningAgent, name: str) -> str:
    entry = (await running.agent.triton.index()).get(name)
    return entry.state if entry else ""


def platform_token(apiserver: RunningApiServer, api: kubernetes.client.ApiClient) -> str:
    """A token of the platform's service account (the binder's), which may list the node."""
    make_pod(
        api,
        "binder",
        "-",
        namespace="tritonshare-system",
        service_account="tritonshare-binder",
        scheduler="default-scheduler",
    )
    return apiserver.mint_token("tritonshare-system", "binder")


def condition(api: kubernetes.client.ApiClient, pod: str) -> tuple[str, str, str]:
    core: Any = kubernetes.client.CoreV1Api(api)
    for c in core.read_namespaced_pod_status(pod, "default").status.conditions or []:
        if c.type == CONDITION:
            return c.status, c.reason, c.message
    return "", "", ""


async def test_an_idle_unload_sleeps_the_model_and_its_next_load_wakes_it(
    memory_agent: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    running = memory_agent
    gpu = running.mock.gpus[0].uuid
    token = await serve(running, apiserver, kube_api, tmp_path, "od")
    name = name_in_triton(kube_api, "od", "od")
    assert running.agent.ledger.measured(name) == GI

    asleep = await sleep(running, token, "od")
    assert (asleep.state, asleep.sleeping, asleep.residency) == (
        agent_pb2.MODEL_STATE_INSTALLED,
        True,
        "on-demand",
    )
    assert await triton_state(running, name) in ("", "UNAVAILABLE")
    assert running.agent.repository.installed_manifest(name) is not None
    assert running.agent.models.owners.get(name) is not None
    assert running.agent.ledger.measured(name) == 0  # no longer charged
    # Asleep, the same again changes nothing.
    assert (await sleep(running, token, "od")).sleeping

    # Passes go by: it is wanted but asleep, not loaded back, and the pod is told why.
    passes = running.agent.reconciler.passes
    await eventually(lambda: running.agent.reconciler.passes >= passes + 2, what="two passes")
    assert await triton_state(running, name) in ("", "UNAVAILABLE")
    await eventually(
        lambda: condition(kube_api, "od")[:2] == ("False", "ModelSleeping"),
        what="the ModelSleeping condition",
    )
    assert "idle unload" in condition(kube_api, "od")[2]
    platform = bearer(platform_token(apiserver, kube_api))
    listed = await running.stub.ListGpus(agent_pb2.ListGpusRequest(), metadata=platform)
    by_uuid = {g.uuid: g for g in listed.gpus}
    assert (by_uuid[gpu].loaded_bytes, by_uuid[gpu].sleeping_bytes) == (0, GI)
    models = await running.stub.ListModels(agent_pb2.ListModelsRequest(), metadata=platform)
    assert [(m.triton_name, m.sleeping, m.residency) for m in models.models] == [
        (name, True, "on-demand")
    ]

    woken = await load(running, token, "od")
    assert (woken.state, woken.sleeping, woken.residency) == (
        agent_pb2.MODEL_STATE_READY,
        False,
        "on-demand",
    )
    assert await triton_state(running, name) == "READY"
    listed = await running.stub.ListGpus(agent_pb2.ListGpusRequest(), metadata=platform)
    by_uuid = {g.uuid: g for g in listed.gpus}
    assert (by_uuid[gpu].loaded_bytes, by_uuid[gpu].sleeping_bytes) == (GI, 0)
    await eventually(
        lambda: condition(kube_api, "od")[:2] == ("True", "ModelReady"), what="ModelReady again"
    )


SLOW_UNLOAD = """
import time
from pathlib import Path

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[]) for _ in requests]

    def finalize(self):
        deadline = time.monotonic() + 120  # its unload ends when the test says
        while not Path("RELEASE").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
"""


async def test_a_wake_goes_to_triton_while_another_model_s_unload_is_under_way(
    memory_agent: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    running = memory_agent
    gpu = running.mock.gpus[0].uuid
    release = tmp_path / "release"
    slow = SLOW_UNLOAD.replace("RELEASE", str(release))
    token_a = await serve(running, apiserver, kube_api, tmp_path, "od-a", model_py=slow)
    token_b = await serve(running, apiserver, kube_api, tmp_path, "od-b")
    a, b = (name_in_triton(kube_api, pod, pod) for pod in ("od-a", "od-b"))
    assert (await sleep(running, token_b, "od-b")).sleeping
    queue = running.agent.models.admission.queue
    sleeping = asyncio.create_task(sleep(running, token_a, "od-a"))
    try:
        await eventually(
            lambda: getattr(queue.holder(gpu), "name", "") == a, what="a's unload holding the GPU"
        )
        # b fits beside a: its wake is not held behind a's unload, which ends only after it.
        woken = await asyncio.wait_for(load(running, token_b, "od-b"), 60)
        assert woken.state == agent_pb2.MODEL_STATE_READY, woken.reason
        assert await triton_state(running, a) == "UNLOADING"
    finally:
        release.touch()
        asleep = await sleeping
    assert asleep.sleeping and await triton_state(running, a) in ("", "UNAVAILABLE")
    # Measured as one window: b is billed its own GiB, a nothing, and no byte is unexplained.
    ledger = running.agent.ledger
    assert (ledger.measured(b), ledger.uncertainty(b), ledger.measured(a)) == (GI, 0, 0)
    assert ledger.unattributed(gpu) == 0


async def test_an_always_pod_is_never_put_to_sleep_even_with_its_annotation_flipped(
    memory_agent: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    running = memory_agent
    token = await serve(running, apiserver, kube_api, tmp_path, "steady", residency="")
    name = name_in_triton(kube_api, "steady", "steady")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await sleep(running, token, "steady")
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "residency 'always'" in (refused.value.details() or "")

    # The tenant edits its pod to on-demand after binding: the proof no longer holds.
    core: Any = kubernetes.client.CoreV1Api(kube_api)
    core.patch_namespaced_pod(
        "steady",
        "default",
        {"metadata": {"annotations": {"tritonshare.io/residency": "on-demand"}}},
    )
    with pytest.raises(grpc.aio.AioRpcError) as flipped:
        await sleep(running, token, "steady")
    assert flipped.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "residency class" in (flipped.value.details() or "")
    # Never slept: what happens to it now is what happens to any pod whose proof broke.
    registry = running.agent.metrics.registry
    assert not registry.get_sample_value("tritonshare_agent_model_sleeps_total", {"reason": "idle"})
    assert running.agent.models.records.record(name).life.phase is not Phase.IDLE_UNLOADED


def report_activity(
    running: RunningAgent, written_at: float | None = None, **in_flight: int
) -> None:
    """Write the node gateway's activity table as the gateway would: `in_flight` by name in
    Triton; every other model idle."""
    path = running.agent.settings.activity_path
    assert path is not None
    models = {name: Activity(count, time.time()) for name, count in in_flight.items()}
    write_activity(path, ActivityTable(time.time() if written_at is None else written_at, models))


def events(api: kubernetes.client.ApiClient, pod: str, namespace: str) -> dict[str, str]:
    core: Any = kubernetes.client.CoreV1Api(api)
    found = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}")
    return {e.reason: e.message for e in found.items}


async def test_a_namespace_waking_in_a_loop_evicts_only_its_own_idle_models(
    memory_agent: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    """team-a wakes its two models in turn on a GPU that holds one of them beside team-b's
    `always` model and team-b's on-demand one: each wake evicts team-a's other model, never
    team-b's; with nothing of its own idle, the wake fails and names nothing of team-b."""
    running = memory_agent
    core: Any = kubernetes.client.CoreV1Api(kube_api)
    for namespace in ("team-a", "team-b"):
        core.create_namespace({"metadata": {"name": namespace}})
    report_activity(running)
    await serve(
        running,
        apiserver,
        kube_api,
        tmp_path,
        "bsteady",
        request=7 * GI,
        uses="7Gi",
        residency="",
        namespace="team-b",
    )
    await serve(
        running,
        apiserver,
        kube_api,
        tmp_path,
        "bod",
        namespace="team-b",
        request=4 * GI,
        uses="4Gi",
    )
    tokens = {
        "a1": await serve(
            running,
            apiserver,
            kube_api,
            tmp_path,
            "a1",
            namespace="team-a",
            request=4 * GI,
            uses="4Gi",
        )
    }
    tokens["a2"] = await serve(
        running,
        apiserver,
        kube_api,
        tmp_path,
        "a2",
        namespace="team-a",
        loads=False,
        request=4 * GI,
        uses="4Gi",
    )
    names = {
        pod: name_in_triton(kube_api, pod, pod, ns)
        for pod, ns in (
            ("bsteady", "team-b"),
            ("bod", "team-b"),
            ("a1", "team-a"),
            ("a2", "team-a"),
        )
    }

    # a2's pod runs with its model at rest: asleep once the agent has seen it Running (its watch
    # may lag the status write on a busy machine), so its first load is a wake.
    async def a2_asleep() -> bool:
        status = await running.stub.GetModel(
            agent_pb2.GetModelRequest(model_id="a2"), metadata=bearer(tokens["a2"])
        )
        return bool(status.sleeping)

    await eventually(a2_asleep, what="a2 asleep")
    # The GPU is full (7 + 4 + 4 of 15 GiB): a2's first load evicts a1, then each wakes in turn.
    for waking, evicted in (("a2", "a1"), ("a1", "a2")):
        report_activity(running)
        status = await load(running, tokens[waking], waking)
        assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
        assert await triton_state(running, names[evicted]) in ("", "UNAVAILABLE")
        for steady in ("bsteady", "bod"):
            assert await triton_state(running, names[steady]) == "READY"
        asleep = await running.stub.GetModel(
            agent_pb2.GetModelRequest(model_id=evicted), metadata=bearer(tokens[evicted])
        )
        assert asleep.sleeping, asleep
    await eventually(
        lambda: "ModelEvicted" in events(kube_api, "a1", "team-a"), what="a1's ModelEvicted"
    )
    assert "ModelEvicted" not in events(kube_api, "bod", "team-b")
    # a2's pod ran with its model at rest before its first load: asleep, so that load woke it.
    sample = running.agent.metrics.registry.get_sample_value
    assert sample("tritonshare_agent_evictions_total", {"reason": "wake"}) == 2
    assert sample("tritonshare_agent_model_wakes_total", {"outcome": "woken"}) == 2

    # a1 (loaded) serves and team-b's on-demand model too: nothing of team-a is idle, and
    # team-b's always model is never a candidate. The wake fails in team-a's own terms.
    report_activity(running, **{names["a1"]: 1, names["bod"]: 1})
    with pytest.raises(grpc.aio.AioRpcError) as full:
        await load(running, tokens["a2"], "a2")
    assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = full.value.details() or ""
    assert "cannot wake" in details and "a1" in details
    assert "bod" not in details and "bsteady" not in details and "team-b" not in details
    for steady in ("bsteady", "bod", "a1"):
        assert await triton_state(running, names[steady]) == "READY"
    await eventually(
        lambda: "ModelWakeFailed" in events(kube_api, "a2", "team-a"), what="a2's wake Warning"
    )

    # A stale table (the gateway stopped writing) evicts nothing, even a1 idle.
    report_activity(running, written_at=time.time() - 60)
    with pytest.raises(grpc.aio.AioRpcError) as stale:
        await load(running, tokens["a2"], "a2")
    assert stale.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "activity table" in (stale.value.details() or "")
    assert await triton_state(running, names["a1"]) == "READY"


async def test_a_tenant_cannot_put_another_pods_model_to_sleep(
    memory_agent: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    running = memory_agent
    await serve(running, apiserver, kube_api, tmp_path, "victim")
    attacker = await serve(running, apiserver, kube_api, tmp_path, "attacker", loads=False)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await sleep(running, attacker, "victim")
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert await triton_state(running, name_in_triton(kube_api, "victim", "victim")) == "READY"


async def test_a_trickle_keeps_no_model_past_its_share_from_a_namespace_within_its_own(
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    model_repository: Path,
    mock_nvml: MockNvml,
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    tmp_path: Path,
) -> None:
    """team-b's on-demand model (within its share) sleeps; team-a's two on-demand models hold
    12 of the GPU's 15 GiB (over its share) and are kept used, one request each every half
    second (the gateway's activity table says so), so --evict-min-idle-seconds never lets them
    go. team-b's wake takes back what team-a holds past its share; team-a's wake of its model
    put to sleep fails, team-b's staying. Before, team-b's wakes failed every time."""
    running = await start_memory_agent(
        kube_api, triton, model_repository, mock_nvml, start_custom_agent, min_idle=30.0
    )
    core: Any = kubernetes.client.CoreV1Api(kube_api)
    for namespace in ("team-a", "team-b"):
        core.create_namespace({"metadata": {"name": namespace}})
    report_activity(running)
    neighbour = await serve(
        running,
        apiserver,
        kube_api,
        tmp_path,
        "nb",
        namespace="team-b",
        request=6 * GI,
        uses="6Gi",
    )
    asleep = await sleep(running, neighbour, "nb")
    assert asleep.sleeping, asleep
    tokens = {
        pod: await serve(
            running,
            apiserver,
            kube_api,
            tmp_path,
            pod,
            namespace="team-a",
            request=6 * GI,
            uses="6Gi",
        )
        for pod in ("a1", "a2")
    }
    names = {pod: name_in_triton(kube_api, pod, pod, "team-a") for pod in tokens}
    names["nb"] = name_in_triton(kube_api, "nb", "nb", "team-b")

    # The trickle: both used just now, a1 with a slow request in flight.
    report_activity(running, **{names["a1"]: 1, names["a2"]: 0})
    woken = await load(running, neighbour, "nb")
    assert woken.state == agent_pb2.MODEL_STATE_READY, woken.reason
    states = {pod: await triton_state(running, names[pod]) for pod in ("a1", "a2")}
    assert sorted(states.values()) in (["", "READY"], ["READY", "UNAVAILABLE"]), states
    evicted = next(pod for pod, state in states.items() if state != "READY")
    await eventually(
        lambda: (
            "more than its share" in events(kube_api, evicted, "team-a").get("ModelEvicted", "")
        ),
        what="the evicted pod told why",
    )

    # team-a, past its share, cannot take the room back from team-b.
    report_activity(running, **{names["nb"]: 0, names["a1"]: 0, names["a2"]: 0})
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await load(running, tokens[evicted], evicted)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert await triton_state(running, names["nb"]) == "READY"
