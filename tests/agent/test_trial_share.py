"""A held namespace's trials take at most half of a probationer's time, through a real Triton, a
real agent and a real node gateway. A namespace one of whose files was quarantined loads one
benign new model after another: each load is a suspect's trial, through which the gateway
refuses the probationers' requests. Before, back-to-back trials refused a neighbour on
probation all the time (0 answers a second for as long as the loads went on); now a trial begins
only as long after the last one's refusal as that refusal lasted, and the neighbour is served in
between."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import kubernetes.client
import pytest

from agent.quarantine import Marker
from protos import agent_pb2
from sim.apiserver import RunningApiServer
from sim.triton import TritonServer
from tests.agent.conftest import StartAgent, eventually
from tests.agent.test_crash_blame import busy_neighbour_on_probation, start_node
from tests.agent.test_request_quarantine import NEIGHBOUR, infer
from tests.proxy.gateway.conftest import gateway_settings, running_gateway

pytestmark = [pytest.mark.triton, pytest.mark.slow]


async def test_a_held_namespaces_back_to_back_trials_leave_a_probationer_served_between(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    node = await start_node(
        start_custom_agent, kube_api, tmp_path, crash_settle_seconds=1.0, crash_hold_seconds=2.0
    )
    await busy_neighbour_on_probation(node, apiserver, tmp_path)
    agent = node.running.agent
    quarantined = Marker("gone", "ab" * 32, "old", "team-a/old-pod")
    for _ in range(agent.crashes.quarantine_after):
        agent.crashes.crashed(quarantined)
    assert agent.crashes.held("team-a")
    for i in range(2):
        await node.add(apiserver, tmp_path / str(i), "team-a", f"benign-{i}", f"127.1.0.{20 + i}")
    served: list[float] = []
    stop = threading.Event()

    def neighbour_sends() -> None:
        while not stop.is_set():
            if infer(url, NEIGHBOUR, "busy", 1.0)[0] == 200:
                served.append(time.monotonic())
            else:
                stop.wait(0.05)

    with running_gateway(gateway_settings(triton, node.table)) as gateway:
        url = gateway.http_url
        sender = threading.Thread(target=neighbour_sends, daemon=True)
        sender.start()
        try:
            await eventually(lambda: bool(served), what="the neighbour served")
            answered = []
            for i in range(2):  # back to back, each a trial of the held namespace
                loaded = await node.load(f"benign-{i}")
                assert loaded.state == agent_pb2.MODEL_STATE_READY, loaded.reason
                answered.append(time.monotonic())
            between = [t for t in served if answered[0] < t < answered[1]]
            assert between, "the neighbour was refused through both trials and between them"
        finally:
            stop.set()
            sender.join(30)
