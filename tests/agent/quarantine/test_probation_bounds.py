"""What a probation costs a neighbour, through a real Triton, a real agent and a real node gateway.

An exit a crashing load shared with a busy neighbour's requests is the load's once the load is
found guilty alone: its files are counted for it (quarantined after `--crash-quarantine-after`
exits in all, not one more) and the neighbour's probation from it ends. Before, the first shared
exit was nobody's: one exit more, and the neighbour on probation for 600 s.

A trial of files already counted for an exit alone holds every pod's requests while it loads, not
only the probationers': a busy neighbour never on probation is not at Triton at the exit, so the
exit is the files' own. Before, the neighbour's request at Triton shared it: one exit more, and
the neighbour on probation (its requests refused through the files' next trial).

A held namespace's trials take at most half of a probationer's time. A namespace one of whose files
was quarantined loads one benign new model after another: each load is a suspect's trial, through
which the gateway refuses the probationers' requests. Before, back-to-back trials refused a
neighbour on probation all the time (0 answers a second for as long as the loads went on); now a
trial begins only as long after the last one's refusal as that refusal lasted, and the neighbour is
served in between.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import kubernetes.client
import pytest

from agent.quarantine.crashledger import Marker
from protos import agent_pb2
from sim.apiserver import RunningApiServer
from sim.triton import TritonServer
from tests.agent.conftest import StartAgent, eventually
from tests.agent.quarantine.test_crash_blame import busy_neighbour_on_probation, start_node
from tests.agent.quarantine.test_quarantine import KILLER as LOAD_KILLER
from tests.agent.quarantine.test_quarantine import kubelet_restarts
from tests.agent.quarantine.test_request_quarantine import ATTACKER, NEIGHBOUR, SLOW, infer
from tests.proxy.gateway.conftest import gateway_settings, running_gateway

pytestmark = [pytest.mark.triton, pytest.mark.slow]


@contextlib.contextmanager
def sending(url: list[str], model_id: str) -> Iterator[list[float]]:
    """The neighbour's client, one request after another (to `url[0]`, once set); yields when
    each was answered 200."""
    served: list[float] = []
    stop = threading.Event()

    def sends() -> None:
        while not stop.is_set():
            if url and infer(url[0], NEIGHBOUR, model_id, 1.0)[0] == 200:
                served.append(time.monotonic())
            else:
                stop.wait(0.05)

    sender = threading.Thread(target=sends, daemon=True)
    sender.start()
    try:
        yield served
    finally:
        stop.set()
        sender.join(30)


async def test_an_exit_a_load_shared_with_a_busy_neighbour_is_the_loads_once_it_is_found(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    node = await start_node(start_custom_agent, kube_api, tmp_path)  # quarantine after 2
    agent = node.running.agent
    await node.add(apiserver, tmp_path, "team-b", "busy", NEIGHBOUR, SLOW)
    assert (await node.load("busy")).state == agent_pb2.MODEL_STATE_READY
    url: list[str] = []
    with (
        running_gateway(gateway_settings(triton, node.table)) as gateway,
        sending(url, "busy") as served,
        sending(url, "busy"),
    ):
        url.append(gateway.http_url)
        await eventually(lambda: bool(served), what="the neighbour served")
        async with kubelet_restarts(triton) as restarts:
            # Two clients of 0.5 s requests: one of the neighbour's is at Triton at the first
            # exit; from then on, on probation, it is held while the crasher loads.
            await node.add(apiserver, tmp_path, "team-a", "crasher", ATTACKER, LOAD_KILLER)
            with contextlib.suppress(grpc.aio.AioRpcError):
                await node.load("crasher")
            await eventually(
                lambda: node.files_quarantined("crasher"),
                limit=120,
                what="the crasher's files quarantined",
            )
            assert len(restarts) == agent.crashes.quarantine_after, "no exit past the limit"
            assert agent.crashes.caller_probation("team-b/busy-pod") is None
            assert all(r.crashes == 0 for r in agent.crashes.callers()), "no pod counted"


async def test_a_suspected_files_trial_holds_a_busy_neighbour_not_on_probation_so_the_exit_is_its(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    # The node-wide hold lasts --crash-hold-seconds from the trial's begin at most: long here,
    # so that a busy machine's slow load asserts the hold, not its bound.
    node = await start_node(
        start_custom_agent, kube_api, tmp_path, crash_hold_seconds=60.0
    )  # quarantine after 2
    agent = node.running.agent
    await node.add(apiserver, tmp_path, "team-b", "busy", NEIGHBOUR, SLOW)
    assert (await node.load("busy")).state == agent_pb2.MODEL_STATE_READY
    await node.add(apiserver, tmp_path, "team-a", "crasher", ATTACKER, LOAD_KILLER)
    owned = agent.owners.get(node.names["crasher"])
    assert owned is not None
    # Its files killed Triton once, alone, before the neighbour was busy: a suspect.
    agent.crashes.crashed(Marker(node.names["crasher"], owned.digest, "crasher", "team-a/x"))
    assert agent.crashes.suspected(owned.digest)
    # What is asserted is the hold itself, not its fallback: a gateway that has not shown the
    # neighbour held and drained within the bound (5 s) lets the load go unheld, and a busy
    # machine can take that long to write its activity table.
    agent.hold.drain_seconds = 60.0
    url: list[str] = []
    with (
        running_gateway(gateway_settings(triton, node.table)) as gateway,
        sending(url, "busy") as served,
        sending(url, "busy"),
    ):
        url.append(gateway.http_url)
        await eventually(lambda: bool(served), what="the neighbour served")
        async with kubelet_restarts(triton) as restarts:
            # Two clients of 0.5 s requests: one of the neighbour's is at Triton at any moment,
            # unless the trial holds it.
            with contextlib.suppress(grpc.aio.AioRpcError):
                await node.load("crasher")
            await eventually(
                lambda: node.files_quarantined("crasher"),
                limit=120,
                what="the crasher's files quarantined",
            )
            assert len(restarts) == 1, "the trial's exit was the files' own"
            assert agent.crashes.caller_probation("team-b/busy-pod") is None
            assert all(r.crashes == 0 for r in agent.crashes.callers()), "no pod counted"
        served_before = len(served)
        await eventually(lambda: len(served) > served_before, what="the neighbour served after")


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
    url: list[str] = []
    with (
        running_gateway(gateway_settings(triton, node.table)) as gateway,
        sending(url, "busy") as served,
    ):
        url.append(gateway.http_url)
        await eventually(lambda: bool(served), what="the neighbour served")
        answered = []
        for i in range(2):  # back to back, each a trial of the held namespace
            loaded = await node.load(f"benign-{i}")
            assert loaded.state == agent_pb2.MODEL_STATE_READY, loaded.reason
            answered.append(time.monotonic())
        between = [t for t in served if answered[0] < t < answered[1]]
        assert between, "the neighbour was refused through both trials and between them"
