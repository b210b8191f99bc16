"""A neighbour's requests while Triton comes back from an exit another pod's request caused
(`gateway.restore`), through a real Triton, a real agent and a real node gateway: sent after the
exit, REST and gRPC, each waits until the agent has loaded its model into the restarted Triton and
is answered; none meets Triton without its model (404 / NOT_FOUND) or not yet listening (502 /
UNAVAILABLE), as they did before. The hold's bounds: tests/proxy/gateway/test_restore.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import cast

import kubernetes.client
import pytest
from tritonclient.grpc import service_pb2

from sim.apiserver import RunningApiServer
from sim.triton import TritonServer
from tests.agent.conftest import StartAgent, eventually
from tests.agent.quarantine.test_quarantine import kubelet_restarts
from tests.agent.quarantine.test_request_quarantine import (
    ATTACKER,
    KILLER,
    MAGIC,
    NEIGHBOUR,
    attacker_and_neighbour,
    infer,
)
from tests.conftest import copy_model
from tests.proxy.gateway.conftest import gateway_settings, running_gateway
from tests.proxy.gateway.test_inflate_attacks import grpc_call

pytestmark = [pytest.mark.triton, pytest.mark.slow]

INFER = "/inference.GRPCInferenceService/ModelInfer"


def grpc_infer(url: str, model_id: str) -> str:
    """One gRPC ModelInfer from the neighbour's address: its grpc-status and message."""
    request = service_pb2.ModelInferRequest(model_name=model_id)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
    request.raw_input_contents.append(b"\x00\x00\x80\x3f")
    trailers = grpc_call(url, NEIGHBOUR, INFER, request.SerializeToString(), "identity")
    return f"{trailers.get('grpc-status')} {trailers.get('grpc-message', '')}"


async def test_a_neighbours_requests_wait_for_its_model_while_triton_restarts(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    table = tmp_path / "gateway" / "callers.json"
    running = await start_custom_agent(
        gateway_table=table, gateway_table_refresh_seconds=0.5, crash_settle_seconds=0.0
    )
    killer = copy_model("add_one", tmp_path / "src", as_name="killer")
    (killer / "1" / "model.py").write_text(KILLER)  # its requests with MAGIC kill Triton
    good = copy_model("add_one", tmp_path / "src", as_name="good")
    names = await attacker_and_neighbour(running, apiserver, kube_api, killer, ("good", good))
    settings = gateway_settings(triton, table)
    assert settings.restore_hold_seconds == 20, "the default"
    with running_gateway(settings) as gateway:
        url, grpc_url = gateway.http_url, gateway.grpc_url

        async def served() -> bool:
            return (await asyncio.to_thread(infer, url, NEIGHBOUR, "good", 1.0))[0] == 200

        await eventually(served, what="the neighbour served")
        async with kubelet_restarts(triton) as restarts:
            status, _ = await asyncio.to_thread(infer, url, ATTACKER, "killer", MAGIC)
            assert status in (0, 502), status  # Triton died under it
            await eventually(lambda: len(restarts) == 1, what="Triton's exit")
            sent = time.monotonic()
            answers = await asyncio.gather(
                *(asyncio.to_thread(infer, url, NEIGHBOUR, "good", 1.0) for _ in range(4)),
                *(asyncio.to_thread(grpc_infer, grpc_url, "good") for _ in range(2)),
            )
            took = time.monotonic() - sent
        rest = [status for status, _ in cast(list[tuple[int, bytes]], answers[:4])]
        assert rest == [200] * 4, answers[:4]
        assert answers[4:] == ["0 ", "0 "], answers[4:]
        assert took < 20, f"answered once the model was back, not at the hold's bound: {took:.1f}"
        assert gateway.gateway.restore.restores >= 1
        state = await running.agent.triton.state(names["good"])
        assert state is not None, "the model was loaded again meanwhile"
