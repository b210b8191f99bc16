"""The agent's config override bounds what holds an unload, through a real Triton and a real
agent: a model whose config asks its dynamic batcher to keep a lone request 20 s is loaded with
the node's bound (`--max-model-queue-seconds`, 1 s by default), as Triton's own config of it
says; its pod gets a Warning Event saying so; and its unload with a request kept in its queue
ends within about the bound, not the delay it asked."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import kubernetes.client
import numpy as np
import pytest
import tritonclient.http as triton_http

from protos import agent_pb2
from sim.apiserver import RunningApiServer
from sim.triton import TritonServer
from tests.agent.conftest import RunningAgent, bearer, eventually, install_dir, make_pod
from tests.agent.models.test_residency import events
from tests.conftest import copy_model

pytestmark = [pytest.mark.triton, pytest.mark.slow]

ASKED_US = 20_000_000


def kept_request(triton: TritonServer, model: str) -> float:
    """One request, which the batcher keeps for its queue delay; the seconds it took."""
    client = triton_http.InferenceServerClient(triton.http_url, network_timeout=60)
    try:
        tensor = triton_http.InferInput("INPUT0", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[1.0]], dtype=np.float32))
        began = time.monotonic()
        client.infer(model, [tensor])
        return time.monotonic() - began
    finally:
        client.close()


async def test_a_long_queue_delay_is_loaded_with_the_bound_and_its_unload_ends_within_it(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    source = copy_model("add_one", tmp_path / "queued", as_name="queued")
    with (source / "config.pbtxt").open("a") as pbtxt:
        pbtxt.write(f"dynamic_batching {{ max_queue_delay_microseconds: {ASKED_US} }}\n")
    make_pod(kube_api, "queued", "queued", gpu_uuid=running.mock.gpus[0].uuid)
    token = apiserver.mint_token("default", "queued")
    await install_dir(running.stub, token, source, "queued")
    loaded = await running.stub.LoadModel(
        agent_pb2.LoadModelRequest(model_id="queued"), metadata=bearer(token)
    )
    assert loaded.state == agent_pb2.MODEL_STATE_READY, loaded.reason
    name = loaded.triton_name
    config = await running.agent.triton.config(name)
    assert config is not None
    assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == 1_000_000
    await eventually(
        lambda: "ModelQueueBounded" in events(kube_api, "queued", "default"),
        what="the pod told of the bound",
    )
    said = events(kube_api, "queued", "default")["ModelQueueBounded"]
    assert f"max_queue_delay_microseconds: {ASKED_US} -> 1000000" in said

    request = asyncio.ensure_future(asyncio.to_thread(kept_request, triton, name))
    await asyncio.sleep(0.3)  # in the batcher's queue
    began = time.monotonic()
    unloaded = await running.stub.UnloadModel(
        agent_pb2.UnloadModelRequest(model_id="queued"), metadata=bearer(token)
    )
    took = time.monotonic() - began
    assert await request <= 5.0, "the request was kept no longer than the bound"
    assert unloaded.state == agent_pb2.MODEL_STATE_ABSENT
    assert took < 5.0, f"the unload took {took:.1f} s"
