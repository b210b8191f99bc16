"""Reconciliation against a real Triton: orphans removed, adoption after an agent restart, models
loaded again after a Triton restart, per-model serialization, bad uploads over gRPC."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import grpc
import kubernetes.client
import pytest

from agent.triton import READY
from protos import agent_pb2
from sim.apiserver import RunningApiServer
from sim.gpu.nvml import MockNvml
from sim.triton import TritonServer
from tests.agent.conftest import (
    RunningAgent,
    agent_settings,
    bearer,
    eventually,
    install_dir,
    install_requests,
    make_pod,
    manifest_of,
    name_in_triton,
    start_agent,
)
from tests.conftest import copy_model

pytestmark = [pytest.mark.triton, pytest.mark.slow]

RELOADED = "tritonshare_agent_reconcile_actions_total", {"action": "reloaded"}
ADOPTED = "tritonshare_agent_reconcile_actions_total", {"action": "adopted"}


async def deploy(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
    model_id: str,
) -> str:
    """Create a pod for `model_id`, install and load it as its loader would; return its token."""
    make_pod(kube_api, f"{model_id}-pod", model_id, gpu_uuid=running.mock.gpus[0].uuid)
    token = apiserver.mint_token("default", f"{model_id}-pod")
    source = copy_model("add_one", tmp_path / "src" / model_id, as_name=model_id)
    await install_dir(running.stub, token, source, model_id)
    status = await running.stub.LoadModel(
        agent_pb2.LoadModelRequest(model_id=model_id), metadata=bearer(token)
    )
    assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
    return token


async def triton_state(running: RunningAgent, name: str) -> str:
    entry = await running.agent.triton.state(name)
    return entry.state if entry else ""


def name_of(api: kubernetes.client.ApiClient, model_id: str) -> str:
    """The name in Triton of the model `deploy` deployed."""
    return name_in_triton(api, f"{model_id}-pod", model_id)


async def test_a_force_deleted_pod_leaks_nothing(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    model_repository: Path,
    tmp_path: Path,
) -> None:
    await deploy(running, apiserver, kube_api, tmp_path, "gone")
    await deploy(running, apiserver, kube_api, tmp_path, "kept")
    gone, kept = name_of(kube_api, "gone"), name_of(kube_api, "kept")
    assert await triton_state(running, gone) == READY
    kubernetes.client.CoreV1Api(kube_api).delete_namespaced_pod(
        "gone-pod", "default", grace_period_seconds=0
    )

    async def removed() -> bool:
        return not (model_repository / gone).exists() and await triton_state(running, gone) in (
            "",
            "UNAVAILABLE",
        )

    await eventually(removed, what="the orphan model to be unloaded and removed")
    assert await triton_state(running, kept) == READY
    assert (model_repository / kept).exists()


async def test_an_agent_restart_adopts_loaded_models_and_a_triton_restart_reloads_them(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    kubeconfig: Path,
    triton: TritonServer,
    model_repository: Path,
    mock_nvml: MockNvml,
    tmp_path: Path,
) -> None:
    token = await deploy(running, apiserver, kube_api, tmp_path, "m")
    await running.stop()

    second = await start_agent(agent_settings(kubeconfig, triton, model_repository), mock_nvml)
    try:
        await eventually(lambda: second.agent.reconciler.passes >= 2, what="two passes")
        status = await second.stub.GetModel(
            agent_pb2.GetModelRequest(model_id="m"), metadata=bearer(token)
        )
        assert status.state == agent_pb2.MODEL_STATE_READY
        assert status.gpu_uuid == mock_nvml.gpus[0].uuid, "adopted with the pod's GPU"
        assert status.pod == "default/m-pod"
        registry = second.agent.metrics.registry
        count = registry.get_sample_value("tritonshare_agent_load_duration_seconds_count")
        assert count == 0, "an adopted model is not loaded again"
        assert registry.get_sample_value(*ADOPTED) == 1

        triton.kill()
        await eventually(lambda: not second.agent.reconciler.triton_live, what="Triton down")
        triton.start()

        async def ready_again() -> bool:
            return await triton_state(second, name_of(kube_api, "m")) == READY

        await eventually(ready_again, what="the model READY again after Triton restarted")
        registry = second.agent.metrics.registry
        await eventually(
            lambda: (registry.get_sample_value(*RELOADED) or 0) >= 1, what="the reload counted"
        )
    finally:
        await second.stop()


async def test_one_model_waits_for_its_own_lock_only(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    token_a = await deploy(running, apiserver, kube_api, tmp_path, "a")
    token_b = await deploy(running, apiserver, kube_api, tmp_path, "b")
    models = running.agent.models
    async with models.records.lock(name_of(kube_api, "a")):
        # An operation on "a" is in progress: unloading "a" waits, "b" goes ahead.
        waiting = asyncio.ensure_future(
            running.stub.UnloadModel(
                agent_pb2.UnloadModelRequest(model_id="a"), metadata=bearer(token_a)
            )
        )
        other = await running.stub.UnloadModel(
            agent_pb2.UnloadModelRequest(model_id="b"), metadata=bearer(token_b)
        )
        assert other.state == agent_pb2.MODEL_STATE_ABSENT
        assert not waiting.done()
        assert await triton_state(running, name_of(kube_api, "a")) == READY
    unloaded = await waiting
    assert unloaded.state == agent_pb2.MODEL_STATE_ABSENT


async def test_bad_uploads_are_refused_and_leave_nothing(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    model_repository: Path,
    tmp_path: Path,
) -> None:
    make_pod(kube_api, "bad-pod", "bad")
    token = apiserver.mint_token("default", "bad-pod")
    source = copy_model("add_one", tmp_path / "src")  # config.pbtxt still says add_one

    with pytest.raises(grpc.aio.AioRpcError) as misnamed:
        await install_dir(running.stub, token, source, "bad")
    assert misnamed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "names the model 'add_one'" in (misnamed.value.details() or "")

    files = manifest_of(source)
    corrupt = [(p, s, hashlib.sha256(b"other").hexdigest() if p == "config.pbtxt" else h)
               for p, s, h in files]  # fmt: skip
    with pytest.raises(grpc.aio.AioRpcError) as mismatch:
        await running.stub.InstallModel(
            install_requests("bad", corrupt, lambda p: (source / p).read_bytes()),
            metadata=bearer(token),
        )
    assert mismatch.value.code() == grpc.StatusCode.DATA_LOSS

    # Refused on its header: the header alone is sent, so the client has ended its stream when
    # the answer comes (a client still writing may read the refusal as INTERNAL instead).
    escaping = [("../../escape", 1, hashlib.sha256(b"x").hexdigest()), *files]
    header = await anext(install_requests("bad", escaping, lambda p: b"x"))
    with pytest.raises(grpc.aio.AioRpcError) as escape:
        await running.stub.InstallModel(iter([header]), metadata=bearer(token))
    assert escape.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "escape" in (escape.value.details() or "")

    assert not (model_repository / "bad").exists()
    assert not (tmp_path.parent / "escape").exists()
    staging = model_repository.parent / ".tritonshare-staging"
    assert list(staging.iterdir()) == []

    with pytest.raises(grpc.aio.AioRpcError) as not_installed:
        await running.stub.LoadModel(
            agent_pb2.LoadModelRequest(model_id="bad"), metadata=bearer(token)
        )
    assert not_installed.value.code() == grpc.StatusCode.NOT_FOUND


async def test_triton_rejecting_a_model_is_reported_with_its_reason(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    make_pod(kube_api, "broken-pod", "broken")
    token = apiserver.mint_token("default", "broken-pod")
    source = copy_model("add_one", tmp_path / "src", as_name="broken")
    (source / "1" / "model.py").write_text("raise RuntimeError('this model cannot start')\n")
    await install_dir(running.stub, token, source, "broken")
    status = await running.stub.LoadModel(
        agent_pb2.LoadModelRequest(model_id="broken"), metadata=bearer(token)
    )
    assert status.state == agent_pb2.MODEL_STATE_FAILED
    assert "this model cannot start" in status.reason


async def test_without_cpu_only_the_model_is_pinned_to_the_pods_gpu(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    kubeconfig: Path,
    triton: TritonServer,
    model_repository: Path,
    node: str,
    mock_nvml: MockNvml,
    tmp_path: Path,
) -> None:
    settings = agent_settings(kubeconfig, triton, model_repository, cpu_only=False)
    running = await start_agent(settings, mock_nvml)
    try:
        pods = {
            "second-gpu": mock_nvml.gpus[1].uuid,
            "unknown-gpu": "GPU-00000000-0000-0000-0000-000000000000",
            "lost-gpu": mock_nvml.gpus[0].uuid,
        }
        tokens = {}
        for model, uuid in pods.items():
            make_pod(kube_api, f"{model}-pod", model, gpu_uuid=uuid)
            tokens[model] = apiserver.mint_token("default", f"{model}-pod")
            source = copy_model("add_one", tmp_path / model, as_name=model)
            await install_dir(running.stub, tokens[model], source, model)

        # This machine has no GPU: Triton refuses the pinned instance group, naming the index the
        # agent mapped from the pod's GPU UUID.
        status = await running.stub.LoadModel(
            agent_pb2.LoadModelRequest(model_id="second-gpu"), metadata=bearer(tokens["second-gpu"])
        )
        assert status.state == agent_pb2.MODEL_STATE_FAILED
        assert "gpu id 1" in status.reason, status.reason

        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await running.stub.LoadModel(
                agent_pb2.LoadModelRequest(model_id="unknown-gpu"),
                metadata=bearer(tokens["unknown-gpu"]),
            )
        assert unknown.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "is not on this node" in (unknown.value.details() or "")

        mock_nvml.lose_gpu(0)

        def gpu0_lost() -> bool:
            snapshot = running.agent.node.snapshot
            return snapshot is not None and not snapshot.gpus[0].healthy

        await eventually(gpu0_lost, what="the agent to see GPU 0 lost")
        with pytest.raises(grpc.aio.AioRpcError) as lost:
            await running.stub.LoadModel(
                agent_pb2.LoadModelRequest(model_id="lost-gpu"), metadata=bearer(tokens["lost-gpu"])
            )
        assert lost.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "unhealthy" in (lost.value.details() or "")
    finally:
        await running.stop()


async def test_after_agent_and_triton_both_restart_running_pods_get_their_models_back(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    kubeconfig: Path,
    triton: TritonServer,
    model_repository: Path,
    mock_nvml: MockNvml,
    tmp_path: Path,
) -> None:
    await deploy(running, apiserver, kube_api, tmp_path, "m")
    # Running means the pod's loader succeeded: the model must be loaded.
    kubernetes.client.CoreV1Api(kube_api).patch_namespaced_pod_status(
        "m-pod", "default", {"status": {"phase": "Running"}}
    )
    make_pod(kube_api, "pending-pod", "pending")
    token = apiserver.mint_token("default", "pending-pod")
    source = copy_model("add_one", tmp_path / "pending", as_name="pending")
    await install_dir(running.stub, token, source, "pending")
    await running.stop()
    triton.kill()
    triton.start()

    second = await start_agent(agent_settings(kubeconfig, triton, model_repository), mock_nvml)
    try:

        async def reloaded() -> bool:
            return await triton_state(second, name_of(kube_api, "m")) == READY

        await eventually(reloaded, what="the Running pod's model loaded again")
        # A pod whose loader has not finished is left to its loader: installed, not loaded.
        pending = name_of(kube_api, "pending")
        assert await triton_state(second, pending) != READY
        assert (model_repository / pending).exists()
    finally:
        await second.stop()


async def test_a_running_pod_unloads_only_once_it_is_being_deleted(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    model_repository: Path,
    tmp_path: Path,
) -> None:
    token = await deploy(running, apiserver, kube_api, tmp_path, "m")
    core = kubernetes.client.CoreV1Api(kube_api)
    core.patch_namespaced_pod_status("m-pod", "default", {"status": {"phase": "Running"}})
    unload = agent_pb2.UnloadModelRequest(model_id="m")
    # A proxy restarted by its liveness probe asks too: the model must stay.
    with pytest.raises(grpc.aio.AioRpcError) as restart:
        await running.stub.UnloadModel(unload, metadata=bearer(token))
    assert restart.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not being deleted" in (restart.value.details() or "")
    name = name_of(kube_api, "m")
    assert await triton_state(running, name) == READY

    # A graceful delete: the pod stays (terminating) while its proxy drains, then unloads.
    core.delete_namespaced_pod("m-pod", "default", grace_period_seconds=30)
    status = await running.stub.UnloadModel(unload, metadata=bearer(token))
    assert status.state == agent_pb2.MODEL_STATE_ABSENT
    assert not (model_repository / name).exists()
