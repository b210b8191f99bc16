"""The proxy's unload-on-termination against the real agent (in-process, as the agent's own tests
run it) with tokens minted by sim's API server, as the kubelet mints projected tokens."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import kubernetes.client
import pytest

from protos import agent_pb2
from sim.apiserver import RunningApiServer
from sim.triton import TritonServer
from tests.agent.conftest import (  # noqa: F401 - fixtures used by name
    RunningAgent,
    bearer,
    install_dir,
    make_pod,
    mock_nvml,
    name_in_triton,
    node,
    running,
)
from tests.conftest import copy_model
from tests.proxy.conftest import RunningProxy, proxy_settings

pytestmark = [pytest.mark.triton, pytest.mark.slow]


async def test_stopping_the_proxy_unloads_its_model_through_the_agent(
    running: RunningAgent,  # noqa: F811 - the fixture imported above
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    make_pod(kube_api, "m1-pod", "m1", gpu_uuid=running.mock.gpus[0].uuid)
    token = apiserver.mint_token("default", "m1-pod")
    source = copy_model("add_one", tmp_path / "src", as_name="m1")
    await install_dir(running.stub, token, source, "m1")
    loaded = await running.stub.LoadModel(
        agent_pb2.LoadModelRequest(model_id="m1"), metadata=bearer(token)
    )
    assert loaded.state == agent_pb2.MODEL_STATE_READY, loaded.reason
    token_file = tmp_path / "token"
    token_file.write_text(token)
    settings = proxy_settings(
        triton,
        model_id="m1",
        # Straight to Triton (no gateway here): the proxy itself maps m1 to the pod's private name.
        triton_name=name_in_triton(kube_api, "m1-pod", "m1"),
        agent_address=running.agent.grpc_address,
        token_file=token_file,
    )
    proxy = await asyncio.to_thread(RunningProxy, settings)
    try:
        body = json.dumps(
            {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}
        ).encode()
        request = urllib.request.Request(
            f"http://{proxy.http_url}/v2/models/m1/infer", data=body, method="POST"
        )

        def infer() -> bytes:
            with urllib.request.urlopen(request, timeout=30) as response:
                return bytes(response.read())

        assert json.loads(await asyncio.to_thread(infer))["outputs"][0]["data"] == [2.0]
    finally:
        # The agent runs on this test's loop: stop the proxy without blocking it.
        await asyncio.to_thread(proxy.stop)
    status = await running.stub.GetModel(
        agent_pb2.GetModelRequest(model_id="m1"), metadata=bearer(token)
    )
    assert status.state == agent_pb2.MODEL_STATE_ABSENT
