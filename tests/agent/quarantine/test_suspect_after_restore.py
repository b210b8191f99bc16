"""A suspect's own load waits for the node's models to be back after Triton's restart, through a
real Triton and a real agent: a model whose load kills Triton, asked again by its pod the moment
Triton is back (as its loader does), loads only once the agent has loaded again the node's other
model (a slow one), so that the second exit does not cut that reload short. Before, the pod's
load went at once beside the reload and Triton died again with the other model still loading."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import kubernetes.client
import pytest

from agent.errors import TritonUnreachableError
from agent.triton import READY
from protos import agent_pb2
from sim.apiserver import RunningApiServer
from sim.triton import TritonServer
from tests.agent.conftest import StartAgent, bearer, eventually, name_in_triton
from tests.agent.quarantine.test_crash_blame import SLOW_LOAD
from tests.agent.quarantine.test_quarantine import deploy, killer_model, kubelet_restarts
from tests.conftest import copy_model

pytestmark = [pytest.mark.triton, pytest.mark.slow]


async def test_a_suspects_own_load_waits_until_the_nodes_models_are_back(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    # Loads counted only while in flight: the other model, loaded long before in a real node's
    # life, is no suspect of its own. With the gateway's table set, as on every node, the agent
    # holds its own sentinel on Triton and knows an exit at once; its liveness poll alone can
    # miss one Triton restarted from within its period on a busy machine.
    running = await start_custom_agent(
        crash_quarantine_after=3,
        lease_renew_seconds=0.5,
        crash_settle_seconds=0.0,
        gateway_table=tmp_path / "gateway" / "callers.json",
    )
    gpu = running.mock.gpus[0].uuid
    slow_source = copy_model("add_one", tmp_path / "src", as_name="slow")
    (slow_source / "1" / "model.py").write_text(SLOW_LOAD)
    slow_token = await deploy(apiserver, kube_api, running.stub, gpu, slow_source, "slow")
    loaded = await running.stub.LoadModel(
        agent_pb2.LoadModelRequest(model_id="slow"), metadata=bearer(slow_token)
    )
    assert loaded.state == agent_pb2.MODEL_STATE_READY, loaded.reason
    slow = name_in_triton(kube_api, "slow-pod", "slow")

    async def slow_ready() -> bool:
        try:
            entry = await running.agent.triton.state(slow)
        except TritonUnreachableError:
            return False
        return entry is not None and entry.state == READY

    async with kubelet_restarts(triton) as restarts:
        killer_token = await deploy(
            apiserver, kube_api, running.stub, gpu, killer_model(tmp_path / "src"), "killer"
        )
        ask = agent_pb2.LoadModelRequest(model_id="killer")
        with pytest.raises(grpc.aio.AioRpcError):
            await running.stub.LoadModel(ask, metadata=bearer(killer_token))
        await eventually(lambda: len(restarts) == 1, what="the first exit")
        await eventually(running.agent.triton.live, limit=60, what="Triton back")

        # Its pod asks again at once, as its loader does.
        async def load_again() -> object:
            return await running.stub.LoadModel(ask, metadata=bearer(killer_token))

        again = asyncio.create_task(load_again())
        slow_back = second_exit = 0.0
        deadline = time.monotonic() + 60
        while not second_exit and time.monotonic() < deadline:
            if not slow_back and await slow_ready():
                slow_back = time.monotonic()
            if len(restarts) >= 2:
                second_exit = time.monotonic()
            await asyncio.sleep(0.02)
        with pytest.raises(grpc.aio.AioRpcError):
            await again  # Triton died under it once more
    assert second_exit, "the suspect's load was tried again"
    assert slow_back, "the other model was loaded again before the suspect's second exit"
    assert slow_back < second_exit
