"""The agent gRPC API end to end: a real Triton, sim/'s API server, tokens minted as the kubelet
does, tritonclient for inference."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import grpc
import kubernetes.client
import numpy as np
import pytest
import tritonclient.http as triton_http

from common.contract import TENANT_CODE_NODE, Keys
from protos import agent_pb2
from sim.apiserver import RunningApiServer
from sim.gpu.nvml import MockNvml
from sim.triton import TritonServer
from tests.agent.conftest import (
    NODE,
    RunningAgent,
    agent_settings,
    bearer,
    eventually,
    install_dir,
    make_pod,
    name_in_triton,
    start_agent,
)
from tests.conftest import copy_model

pytestmark = pytest.mark.triton


def infer_add_one(triton: TritonServer, model: str) -> list[float]:
    client = triton_http.InferenceServerClient(triton.http_url)
    try:
        data = np.array([[1.0, 2.5]], dtype=np.float32)
        tensor = triton_http.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        result = client.infer(model, [tensor])
        output = result.as_numpy("OUTPUT0")
        assert output is not None
        return [float(v) for v in output.ravel()]
    finally:
        client.close()


async def test_install_load_infer_unload(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    model_repository: Path,
    tmp_path: Path,
) -> None:
    gpu = running.mock.gpus[1].uuid
    make_pod(kube_api, "m1-pod", "m1", gpu_uuid=gpu)
    token = apiserver.mint_token("default", "m1-pod")
    name = name_in_triton(kube_api, "m1-pod", "m1")
    source = copy_model("add_one", tmp_path / "src", as_name="m1")

    reply = await install_dir(running.stub, token, source, "m1")
    assert not reply.unchanged
    assert reply.bytes_written == sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
    assert (model_repository / name / "1" / "model.py").read_bytes() == (
        source / "1" / "model.py"
    ).read_bytes()
    staging = model_repository.parent / ".tritonshare-staging"
    assert list(staging.iterdir()) == [], "staging must be empty after an install"

    status = await running.stub.GetModel(
        agent_pb2.GetModelRequest(model_id="m1"), metadata=bearer(token)
    )
    assert status.state == agent_pb2.MODEL_STATE_INSTALLED
    assert status.manifest_digest == reply.manifest_digest

    # A load wakes the condition pass: the pod's ModelLoaded says so at once, not a period later.
    assert running.agent.service.on_loaded == running.agent.conditions.loaded
    loads: list[str] = []
    running.agent.service.on_loaded = lambda: loads.append("m1")
    status = await running.stub.LoadModel(
        agent_pb2.LoadModelRequest(model_id="m1"), metadata=bearer(token)
    )
    assert status.state == agent_pb2.MODEL_STATE_READY, status.reason
    assert loads == ["m1"]
    assert status.gpu_uuid == gpu
    assert status.pod == "default/m1-pod"
    assert infer_add_one(triton, name) == [2.0, 3.5]

    # A restarted pod sends the same manifest: nothing is written.
    again = await install_dir(running.stub, token, source, "m1")
    assert again.unchanged and again.bytes_written == 0
    assert again.manifest_digest == reply.manifest_digest

    status = await running.stub.UnloadModel(
        agent_pb2.UnloadModelRequest(model_id="m1"), metadata=bearer(token)
    )
    assert status.state == agent_pb2.MODEL_STATE_ABSENT
    assert not (model_repository / name).exists()
    index = triton_http.InferenceServerClient(triton.http_url)
    try:
        states = {m["name"]: m.get("state") for m in index.get_model_repository_index()}
    finally:
        index.close()
    assert states.get(name) in (None, "UNAVAILABLE")


async def test_refused_callers(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    make_pod(kube_api, "a-pod", "model-a")
    make_pod(kube_api, "elsewhere", "model-b", node="other-node")
    make_pod(kube_api, "plain", "model-c", scheduler="default-scheduler")
    make_pod(kube_api, "done", "model-d", phase="Failed")
    stub = running.stub
    request = agent_pb2.GetModelRequest(model_id="model-a")

    with pytest.raises(grpc.aio.AioRpcError) as no_token:
        await stub.GetModel(request)
    assert no_token.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "authorization" in (no_token.value.details() or "")

    with pytest.raises(grpc.aio.AioRpcError) as forged:
        await stub.GetModel(request, metadata=bearer("not-a-token"))
    assert forged.value.code() == grpc.StatusCode.UNAUTHENTICATED

    wrong_audience = apiserver.mint_token("default", "a-pod", audience="something-else")
    with pytest.raises(grpc.aio.AioRpcError) as audience:
        await stub.GetModel(request, metadata=bearer(wrong_audience))
    assert audience.value.code() == grpc.StatusCode.UNAUTHENTICATED

    token_a = apiserver.mint_token("default", "a-pod")
    other_model = agent_pb2.LoadModelRequest(model_id="model-c")
    with pytest.raises(grpc.aio.AioRpcError) as wrong_model:
        await stub.LoadModel(other_model, metadata=bearer(token_a))
    assert wrong_model.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "model-a" in (wrong_model.value.details() or "")

    token_b = apiserver.mint_token("default", "elsewhere")
    with pytest.raises(grpc.aio.AioRpcError) as wrong_node:
        await stub.GetModel(agent_pb2.GetModelRequest(model_id="model-b"), metadata=bearer(token_b))
    assert wrong_node.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "other-node" in (wrong_node.value.details() or "")

    token_c = apiserver.mint_token("default", "plain")
    with pytest.raises(grpc.aio.AioRpcError) as not_ours:
        await stub.GetModel(agent_pb2.GetModelRequest(model_id="model-c"), metadata=bearer(token_c))
    assert not_ours.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "default-scheduler" in (not_ours.value.details() or "")

    token_d = apiserver.mint_token("default", "done")
    with pytest.raises(grpc.aio.AioRpcError) as terminated:
        await stub.GetModel(agent_pb2.GetModelRequest(model_id="model-d"), metadata=bearer(token_d))
    assert terminated.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "terminated" in (terminated.value.details() or "")

    with pytest.raises(grpc.aio.AioRpcError) as not_platform:
        await stub.ListModels(agent_pb2.ListModelsRequest(), metadata=bearer(token_a))
    assert not_platform.value.code() == grpc.StatusCode.PERMISSION_DENIED

    # A pod deleted and recreated under the same name: the old token must not speak for it.
    core = kubernetes.client.CoreV1Api(kube_api)
    core.delete_namespaced_pod("a-pod", "default", grace_period_seconds=0)
    make_pod(kube_api, "a-pod", "model-a")
    with pytest.raises(grpc.aio.AioRpcError) as stale:
        await stub.GetModel(request, metadata=bearer(token_a))
    # The TokenReview answer is cached, so the agent's own uid check is what refuses it.
    assert stale.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "earlier pod" in (stale.value.details() or "")

    # The platform's service account may list.
    make_pod(
        kube_api,
        "binder",
        "-",
        namespace="tritonshare-system",
        service_account="tritonshare-binder",
        scheduler="default-scheduler",
    )
    platform = apiserver.mint_token("tritonshare-system", "binder")
    gpus = await stub.ListGpus(agent_pb2.ListGpusRequest(), metadata=bearer(platform))
    assert [g.uuid for g in gpus.gpus] == [g.uuid for g in running.mock.gpus]
    assert gpus.node == "gpu-node-1"
    models = await stub.ListModels(agent_pb2.ListModelsRequest(), metadata=bearer(platform))
    assert list(models.models) == []


async def test_metrics_and_readiness(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    gpu = running.mock.gpus[0].uuid
    make_pod(kube_api, "m-pod", "m", gpu_uuid=gpu)
    token = apiserver.mint_token("default", "m-pod")
    await install_dir(running.stub, token, copy_model("add_one", tmp_path, as_name="m"), "m")
    await running.stub.LoadModel(agent_pb2.LoadModelRequest(model_id="m"), metadata=bearer(token))
    base = f"http://{running.agent.http_address}"
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{base}/metrics") as response:
            text = await response.text()
        assert f'tritonshare_agent_models_loaded{{UUID="{gpu}",gpu="0"}} 1.0' in text
        assert "tritonshare_agent_load_duration_seconds_count 1.0" in text
        assert 'tritonshare_agent_requests_total{code="OK",method="LoadModel"} 1.0' in text
        assert 'tritonshare_agent_installs_total{outcome="installed"} 1.0' in text
        gpu0 = running.mock.gpus[0].uuid
        assert f'tritonshare_agent_gpu_healthy{{UUID="{gpu0}",gpu="0",product="Tesla T4"}}' in text
        async with session.get(f"{base}/readyz") as response:
            assert response.status == 200
        async with session.get(f"{base}/healthz") as response:
            assert response.status == 200

        triton.kill()

        async def not_ready() -> bool:
            async with session.get(f"{base}/readyz") as response:
                return response.status == 503 and "Triton" in await response.text()

        await eventually(not_ready, what="/readyz to report Triton unreachable")


async def test_the_proof_of_concepts_key_prefix(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    kubeconfig: Path,
    triton: TritonServer,
    model_repository: Path,
    node: str,
    mock_nvml: MockNvml,
) -> None:
    core = kubernetes.client.CoreV1Api(kube_api)
    # The node's dedication to tenant code is a key of the prefix too.
    dedicated = {Keys("seldon.io/trtis-").tenant_code: TENANT_CODE_NODE}
    core.patch_node(NODE, {"metadata": {"labels": dedicated}})
    settings = agent_settings(kubeconfig, triton, model_repository, key_prefix="seldon.io/trtis-")
    running = await start_agent(settings, mock_nvml)
    try:
        make_pod(kube_api, "poc", "m", prefix="seldon.io/trtis-")
        make_pod(kube_api, "new-keys", "m2")

        def annotated() -> bool:
            metadata = core.read_node(NODE).metadata
            return "seldon.io/trtis-gpu-mem-total" in ((metadata and metadata.annotations) or {})

        await eventually(annotated, what="the node annotated with the proof of concept's keys")
        token = apiserver.mint_token("default", "poc")
        status = await running.stub.GetModel(
            agent_pb2.GetModelRequest(model_id="m"), metadata=bearer(token)
        )
        assert status.state == agent_pb2.MODEL_STATE_ABSENT
        other = apiserver.mint_token("default", "new-keys")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await running.stub.GetModel(
                agent_pb2.GetModelRequest(model_id="m2"), metadata=bearer(other)
            )
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "seldon.io/trtis-model-id=''" in (refused.value.details() or "")
    finally:
        await running.stop()
