"""Who is blamed for an unexpected exit of Triton, through a real Triton, a real agent and a real
node gateway: a neighbour another namespace's clients keep calling is never counted for a load
that kills Triton (as it loads, or seconds after its READY), and a load is never counted for an
exit another pod's requests caused while it loaded. Python models in a namespace allowed tenant
code stand in for a backend's crash bug."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import kubernetes.client
import pytest

from agent.errors import AgentError, TritonUnreachableError
from agent.triton import LOADING, READY
from common.crashwitness import Suspect, read_witnesses
from protos import agent_pb2
from sim.apiserver import RunningApiServer
from sim.crashers import load_killer
from sim.triton import TritonServer
from tests.agent.conftest import (
    RunningAgent,
    StartAgent,
    bearer,
    eventually,
    install_dir,
    make_pod,
    name_in_triton,
)
from tests.agent.quarantine.test_quarantine import KILLER as LOAD_KILLER
from tests.agent.quarantine.test_quarantine import kubelet_restarts
from tests.agent.quarantine.test_request_quarantine import (
    ATTACKER,
    MAGIC,
    NEIGHBOUR,
    SLOW,
    infer,
    set_address,
)
from tests.agent.quarantine.test_request_quarantine import KILLER as REQUEST_KILLER
from tests.conftest import copy_model
from tests.proxy.gateway.conftest import gateway_settings, running_gateway

pytestmark = [pytest.mark.triton, pytest.mark.slow]

DELAYED_KILLER = load_killer(4.0)
LATE_KILLER = load_killer(3.0)

SLOW_LOAD = """import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(3.0)  # a large model's load: seconds in flight

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (data + 1).astype(data.dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""


DELAYED_HARM = f"""import os
import signal
import threading
import time

import triton_python_backend_utils as pb_utils


def _kill_later(parent):
    time.sleep(1.0)  # its answer has gone out: the harm lands on whoever is at Triton then
    os.kill(parent, signal.SIGKILL)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if data.max() >= {MAGIC}:
                threading.Thread(target=_kill_later, args=(os.getppid(),), daemon=True).start()
            out = pb_utils.Tensor("OUTPUT0", (data + 1).astype(data.dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""


class Node:
    """One agent with the gateway's table, its pods by model id, and what each model is named
    in Triton."""

    def __init__(self, running: RunningAgent, kube_api: kubernetes.client.ApiClient, table: Path):
        self.running = running
        self.kube_api = kube_api
        self.table = table
        self.names: dict[str, str] = {}
        self.tokens: dict[str, str] = {}

    async def add(
        self,
        apiserver: RunningApiServer,
        tmp_path: Path,
        namespace: str,
        model_id: str,
        address: str,
        code: str | None = None,
        phase: str = "Running",
    ) -> None:
        """A pod of `namespace` at `address` (Running, or `phase`: Pending while its loader
        runs) whose loader installed `model_id` (its `model.py` replaced by `code`), not loaded
        yet."""
        source = copy_model("add_one", tmp_path / "src" / namespace, as_name=model_id)
        if code is not None:
            (source / "1" / "model.py").write_text(code)
        core: Any = kubernetes.client.CoreV1Api(self.kube_api)
        if namespace not in {n.metadata.name for n in core.list_namespace().items}:
            core.create_namespace({"metadata": {"name": namespace}})
        pod = f"{model_id}-pod"
        gpu = self.running.mock.gpus[0].uuid
        make_pod(self.kube_api, pod, model_id, gpu_uuid=gpu, phase=phase, namespace=namespace)
        set_address(self.kube_api, pod, namespace, address)
        self.tokens[model_id] = apiserver.mint_token(namespace, pod)
        await install_dir(self.running.stub, self.tokens[model_id], source, model_id)
        self.names[model_id] = name_in_triton(self.kube_api, pod, model_id, namespace)

    async def load(self, model_id: str) -> Any:
        return await self.running.stub.LoadModel(
            agent_pb2.LoadModelRequest(model_id=model_id), metadata=bearer(self.tokens[model_id])
        )

    async def ready(self, model_id: str) -> bool:
        try:
            entry = await self.running.agent.triton.state(self.names[model_id])
        except TritonUnreachableError:
            return False  # restarting: not yet
        return entry is not None and entry.state == READY

    def loading(self, model_id: str) -> bool:
        """A load of the model is in flight (its crash marker written, not yet answered)."""
        marker = self.running.agent.crashes.markers().get(self.names[model_id])
        return marker is not None and not marker.finished_at

    def callers(self) -> dict[str, dict[str, Any]]:
        """The gateway's caller table by address."""
        try:
            return {c["address"]: c for c in json.loads(self.table.read_text())["callers"]}
        except (OSError, ValueError):
            return {}

    def files_quarantined(self, model_id: str) -> bool:
        owned = self.running.agent.owners.get(self.names[model_id])
        assert owned is not None
        return self.running.agent.crashes.quarantined(owned.digest) is not None

    def files_count(self, model_id: str) -> int:
        owned = self.running.agent.owners.get(self.names[model_id])
        assert owned is not None
        return self.running.agent.crashes.count(owned.digest)


async def start_node(
    start_custom_agent: StartAgent,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
    **overrides: Any,
) -> Node:
    table = tmp_path / "gateway" / "callers.json"
    running = await start_custom_agent(
        crash_quarantine_after=2,
        lease_renew_seconds=0.5,
        gateway_table=table,
        gateway_table_refresh_seconds=0.5,
        **overrides,
    )
    return Node(running, kube_api, table)


@contextmanager
def probing(url: str) -> Iterator[list[float]]:
    """The neighbour's clients: an inference every 0.2 s; yields when each was answered 200."""
    served: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.wait(0.2):
            if infer(url, NEIGHBOUR, "good", 1.0)[0] == 200:
                served.append(time.monotonic())

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        stop.set()
        thread.join(30)


async def a_load_that_kills_triton_is_counted_and_the_neighbour_is_not(
    node: Node, apiserver: RunningApiServer, triton: TritonServer, tmp_path: Path, code: str
) -> None:
    """The neighbour (team-b) is served and called every 0.2 s; the crasher (team-a) loads
    `code`. Its files are quarantined after 2 exits; the neighbour is never counted, and is
    served again after the last exit."""
    await node.add(apiserver, tmp_path, "team-b", "good", NEIGHBOUR)
    loaded = await node.load("good")
    assert loaded.state == agent_pb2.MODEL_STATE_READY, loaded.reason
    await node.add(apiserver, tmp_path, "team-a", "crasher", ATTACKER, code)
    await eventually(lambda: set(node.callers()) == {ATTACKER, NEIGHBOUR}, what="both callers")
    ledger = node.running.agent.crashes
    settings = gateway_settings(triton, node.table)
    with running_gateway(settings) as gateway, probing(gateway.http_url) as served:
        await eventually(lambda: bool(served), what="the neighbour served")
        async with kubelet_restarts(triton) as restarts:
            # Triton dies under its load, or just after.
            with contextlib.suppress(grpc.aio.AioRpcError):
                await node.load("crasher")
            await eventually(
                lambda: node.files_quarantined("crasher"),
                limit=150,
                what="the crasher's files quarantined",
            )
            # An exit with the neighbour's request in flight too counts against neither.
            assert len(restarts) <= 4, "at most two exits more than the limit"
            assert not node.callers()[NEIGHBOUR].get("quarantined")
            assert all(r.crashes == 0 for r in ledger.callers()), ledger.callers()
            await eventually(node.running.agent.triton.live, limit=60, what="Triton back")
            back = time.monotonic()
            await eventually(
                lambda: bool(served) and served[-1] > back,
                limit=60,
                what="the neighbour served again",
            )
            assert not node.callers()[NEIGHBOUR].get("quarantined")


async def test_a_load_crash_counts_against_no_pod_whose_request_was_answered(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    """The crasher kills Triton as it loads; the neighbour, called a moment before each exit,
    was the gateway's last sender. Before, each exit also counted against the neighbour's
    requests, and it was quarantined with the crasher."""
    node = await start_node(start_custom_agent, kube_api, tmp_path)
    await a_load_that_kills_triton_is_counted_and_the_neighbour_is_not(
        node, apiserver, triton, tmp_path, LOAD_KILLER
    )


async def test_a_model_that_kills_triton_seconds_after_its_load_is_blamed_not_the_neighbour(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    """The crasher's loads are READY; Triton dies 4 s later, with no load in flight and no
    request at it. With the default settings the load that changed is the suspect: it comes
    back after the others, alone, and is quarantined. Before, such an exit never counted
    against the load, and the neighbour, the last sender each time, was quarantined."""
    node = await start_node(start_custom_agent, kube_api, tmp_path)
    await a_load_that_kills_triton_is_counted_and_the_neighbour_is_not(
        node, apiserver, triton, tmp_path, DELAYED_KILLER
    )


async def test_requests_timed_to_a_neighbours_load_never_count_against_its_files(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    """The attacker's request kills Triton while the neighbour's model loads: its first load,
    then its reload after the restart. The exit is the requests' to explain: the neighbour's
    files are not counted and it is served in the end. Before, each such exit counted against
    the neighbour's files, quarantined on the node at the second."""
    node = await start_node(start_custom_agent, kube_api, tmp_path)
    await node.add(apiserver, tmp_path, "team-a", "killer", ATTACKER, REQUEST_KILLER)
    loaded = await node.load("killer")
    assert loaded.state == agent_pb2.MODEL_STATE_READY, loaded.reason
    await node.add(apiserver, tmp_path, "team-b", "good", NEIGHBOUR, SLOW_LOAD)
    await eventually(lambda: set(node.callers()) == {ATTACKER, NEIGHBOUR}, what="both callers")
    with running_gateway(gateway_settings(triton, node.table)) as gateway:
        url = gateway.http_url
        async with kubelet_restarts(triton) as restarts:
            first = asyncio.create_task(node.load("good"))
            for crash in (1, 2):
                await eventually(lambda: node.loading("good"), limit=60, what="good loading")
                await eventually(lambda: node.ready("killer"), limit=60, what="killer ready")
                status, _ = await asyncio.to_thread(infer, url, ATTACKER, "killer", MAGIC)
                assert status in (0, 502), status  # Triton died under it
                await eventually(lambda n=crash: len(restarts) == n, what=f"crash {crash}")
                await eventually(node.running.agent.triton.live, limit=60, what="Triton back")
            await asyncio.gather(first, return_exceptions=True)
            await eventually(lambda: node.ready("good"), limit=60, what="the neighbour loaded")
            assert node.files_count("good") == 0 and not node.files_quarantined("good")
            assert len(restarts) == 2
            status, body = await asyncio.to_thread(infer, url, NEIGHBOUR, "good", 1.0)
            assert status == 200, body


async def test_a_request_whose_harm_lands_after_its_answer_never_blames_the_busy_neighbour(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    """The attacker's request is answered at once and Triton dies a second later, while the
    neighbour (another namespace) always has a request at Triton. An exit with the neighbour at
    Triton and the attacker's request just answered counts against neither and puts both on
    probation; the lane then leaves a quiet gap between their turns, so the harm lands with the
    neighbour's requests waiting and the next exits are the attacker's alone (or its model's,
    loaded again alone). Before, the gateway named the neighbour alone at each exit: it was
    counted each time and quarantined at the second, the attacker never counted. (Its model's
    load settles briefly here: the requests' rule is tested, not a suspect's trial.)"""
    node = await start_node(start_custom_agent, kube_api, tmp_path, crash_settle_seconds=3.0)
    await node.add(apiserver, tmp_path, "team-b", "busy", NEIGHBOUR, SLOW)
    assert (await node.load("busy")).state == agent_pb2.MODEL_STATE_READY
    await node.add(apiserver, tmp_path, "team-a", "delayed", ATTACKER, DELAYED_HARM)
    assert (await node.load("delayed")).state == agent_pb2.MODEL_STATE_READY
    await eventually(lambda: set(node.callers()) == {ATTACKER, NEIGHBOUR}, what="both callers")
    ledger = node.running.agent.crashes
    registry = node.running.agent.metrics.registry
    neighbour, attacker = "team-b/busy-pod", "team-a/delayed-pod"
    served: list[float] = []
    stop = threading.Event()

    def neighbour_sends() -> None:
        while not stop.is_set():
            if infer(url, NEIGHBOUR, "busy", 1.0)[0] == 200:
                served.append(time.monotonic())

    def stopped() -> bool:
        return node.files_quarantined("delayed") or ledger.caller_quarantine(attacker) is not None

    with running_gateway(gateway_settings(triton, node.table)) as gateway:
        url = gateway.http_url
        tenants = gateway.gateway.tenants

        def neighbour_at_triton() -> bool:
            return any(t.caller.address == NEIGHBOUR and t.limiter.in_flight for t in tenants)

        sender = threading.Thread(target=neighbour_sends, daemon=True)
        sender.start()
        try:
            async with kubelet_restarts(triton) as restarts:
                # Two exits find both (the first; the one after the neighbour's clean turns took
                # it off the lane), then 2 the attacker alone.
                while not stopped():
                    crash = len(restarts) + 1
                    assert crash <= 5, "the attacker was not stopped"
                    await eventually(lambda: node.ready("delayed"), limit=90, what="loaded")
                    await eventually(neighbour_at_triton, what="the neighbour at Triton")
                    status, _ = await asyncio.to_thread(infer, url, ATTACKER, "delayed", MAGIC)
                    assert status == 200, status  # answered: the harm comes after
                    await eventually(lambda n=crash: len(restarts) == n, what=f"crash {crash}")
                    await eventually(
                        lambda n=crash: (
                            registry.get_sample_value(
                                "tritonshare_agent_triton_exits_witnessed_total"
                            )
                            == n
                        ),
                        what=f"exit {crash} counted",
                    )

                    async def decided() -> bool:
                        return stopped() or await node.ready("delayed")

                    await eventually(decided, limit=90, what=f"exit {crash} decided")
                    counts = {r.pod: r.crashes for r in ledger.callers()}
                    assert not counts.get(neighbour), f"the neighbour counted at exit {crash}"
                    assert ledger.caller_quarantine(neighbour) is None
            back = time.monotonic()
            await eventually(lambda: bool(served) and served[-1] > back, what="neighbour served")
            assert not node.callers()[NEIGHBOUR].get("quarantined")
        finally:
            stop.set()
            await asyncio.to_thread(sender.join, 30)


async def test_requests_that_kill_triton_while_a_neighbours_model_settles_are_counted(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    """The attacker's requests kill Triton each time a neighbour's model has just loaded (its
    first load, then each reload): the first exit is shared (the attacker on probation, the
    neighbour's model loaded again alone, as a trial); the trial refuses the probationer's
    requests until the reload has settled (4 s here), so its next exits find no load settling
    and count against its requests: it is quarantined one exit later than alone, and the
    neighbour's files are never counted. Before, every exit was shared, the attacker never
    counted."""
    node = await start_node(start_custom_agent, kube_api, tmp_path, crash_settle_seconds=4.0)
    await node.add(apiserver, tmp_path, "team-a", "killer", ATTACKER, REQUEST_KILLER)
    assert (await node.load("killer")).state == agent_pb2.MODEL_STATE_READY
    await node.add(apiserver, tmp_path, "team-b", "good", NEIGHBOUR)
    assert (await node.load("good")).state == agent_pb2.MODEL_STATE_READY
    await eventually(lambda: set(node.callers()) == {ATTACKER, NEIGHBOUR}, what="both callers")

    async def both_ready() -> bool:
        return await node.ready("killer") and await node.ready("good")

    with running_gateway(gateway_settings(triton, node.table)) as gateway:
        url = gateway.http_url
        async with kubelet_restarts(triton) as restarts:

            async def attack() -> bool:
                status, _ = await asyncio.to_thread(infer, url, ATTACKER, "killer", MAGIC)
                assert status in (0, 502, 503), status
                return status != 503  # refused during the neighbour's trial; else Triton died

            for crash in (1, 2, 3):
                await eventually(both_ready, limit=90, what=f"both loaded before attack {crash}")
                await eventually(attack, limit=60, what=f"attack {crash} at Triton")
                await eventually(lambda n=crash: len(restarts) == n, what=f"crash {crash}")
                await eventually(node.running.agent.triton.live, limit=60, what="Triton back")
            await eventually(
                lambda: bool(node.callers()[ATTACKER].get("quarantined")),
                what="the attacker quarantined",
            )
            assert node.files_count("good") == 0 and not node.files_quarantined("good")
            assert not node.callers()[NEIGHBOUR].get("quarantined")
            assert len(restarts) == 3


async def busy_neighbour_on_probation(
    node: Node, apiserver: RunningApiServer, tmp_path: Path
) -> str:
    """The neighbour's slow model loaded and its pod put on probation, as an earlier exit it
    shared with a pod now gone would; returns the pod's name."""
    await node.add(apiserver, tmp_path, "team-b", "busy", NEIGHBOUR, SLOW)
    assert (await node.load("busy")).state == agent_pb2.MODEL_STATE_READY
    agent = node.running.agent
    neighbour = "team-b/busy-pod"
    other = Suspect("team-c/gone-pod", "uid-gone", "127.1.0.9", "gone", 1)
    agent.crashes.requests_crashed([Suspect(neighbour, "uid", NEIGHBOUR, "busy", 1), other])
    assert agent.callers is not None
    agent.callers.changed()
    await eventually(lambda: bool(node.callers().get(NEIGHBOUR, {}).get("probation")))
    return neighbour


async def test_a_busy_probationer_is_held_while_a_load_settles_so_the_exit_is_the_loads(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    """The neighbour, on probation from an earlier exit, always has a request at Triton (each
    takes 0.5 s there); a model that kills Triton as it loads is loaded. The gateway holds the
    probationer's new requests while the load is under way, so each exit is the load's alone:
    its files are quarantined after exactly 2 exits and the neighbour is never at Triton at one.
    Before, each exit with the neighbour's request at Triton counted against neither: 5 exits
    instead of 2 in a run."""
    node = await start_node(start_custom_agent, kube_api, tmp_path)
    await busy_neighbour_on_probation(node, apiserver, tmp_path)
    agent = node.running.agent
    served: list[float] = []
    waited: list[float] = []
    stop = threading.Event()

    def neighbour_sends() -> None:
        while not stop.is_set():
            sent = time.monotonic()
            if infer(url, NEIGHBOUR, "busy", 1.0)[0] == 200:
                served.append(time.monotonic())
                waited.append(served[-1] - sent)

    with running_gateway(gateway_settings(triton, node.table)) as gateway:
        url = gateway.http_url
        sender = threading.Thread(target=neighbour_sends, daemon=True)
        sender.start()
        try:
            await eventually(lambda: bool(served), what="the neighbour served")
            async with kubelet_restarts(triton) as restarts:
                # Its pod runs: the agent may load it on its own before the loader asks.
                await node.add(apiserver, tmp_path, "team-a", "crasher", ATTACKER, LOAD_KILLER)
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await node.load("crasher")
                await eventually(
                    lambda: node.files_quarantined("crasher"),
                    limit=120,
                    what="the crasher's files quarantined",
                )
                assert len(restarts) == 2, "each exit counted against the load"
                assert agent.request_crashes is not None
                witnessed = read_witnesses(agent.request_crashes.witness_file)
                at_triton = [s.pod for w in witnessed for s in w.suspects if s.in_flight]
                assert not at_triton, f"held, the neighbour was at no exit: {at_triton}"
                assert all(r.crashes == 0 for r in agent.crashes.callers()), "no pod counted"
                await eventually(agent.triton.live, limit=60, what="Triton back")
                back = time.monotonic()
                await eventually(
                    lambda: bool(served) and served[-1] > back, limit=60, what="served again"
                )
            # Held through each exit's restore, then through the next load at most: no hold
            # ran out its bound. Before, a load that ended with Triton's exit held the
            # neighbour 10 s more, so a request held through the restore was held again to its
            # bound (about 10.5 s, against about 5 s now).
            held = gateway.gateway.tenants.probation.held.requests
            assert held.get(("team-b", "timed_out"), 0) == 0, (held, max(waited))
        finally:
            stop.set()
            await asyncio.to_thread(sender.join, 30)


async def test_a_busy_probationer_is_never_counted_for_a_model_that_kills_triton_late(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    """The neighbour, on probation, always has a request at Triton; a model kills Triton
    seconds after its READY, later than the hold after it (0.5 s here), within its settling
    window (6 s). Its first exit finds the neighbour there (shared); each reload of the suspect
    is a trial that keeps the probationer from Triton until it settles, so the next exits are
    the model's alone and its files are quarantined; the neighbour is never counted and is
    served again. Before, the neighbour shared every exit, the second and third in a row
    counted against its requests, and it was quarantined while the model went on."""
    node = await start_node(
        start_custom_agent, kube_api, tmp_path, crash_hold_seconds=0.5, crash_settle_seconds=6.0
    )
    neighbour = await busy_neighbour_on_probation(node, apiserver, tmp_path)
    agent = node.running.agent
    served: list[float] = []
    stop = threading.Event()

    def neighbour_sends() -> None:
        while not stop.is_set():
            if infer(url, NEIGHBOUR, "busy", 1.0)[0] == 200:
                served.append(time.monotonic())
            else:
                stop.wait(0.2)  # refused during a trial: its client retries shortly

    def decided() -> bool:
        counted = {r.pod: r.crashes for r in agent.crashes.callers()}
        assert not counted.get(neighbour), f"the neighbour counted: {counted}"
        assert agent.crashes.caller_quarantine(neighbour) is None
        return node.files_quarantined("late")

    with running_gateway(gateway_settings(triton, node.table)) as gateway:
        url = gateway.http_url
        sender = threading.Thread(target=neighbour_sends, daemon=True)
        sender.start()
        try:
            await eventually(lambda: bool(served), what="the neighbour served")
            async with kubelet_restarts(triton) as restarts:
                await node.add(apiserver, tmp_path, "team-a", "late", ATTACKER, LATE_KILLER)
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await node.load("late")
                await eventually(decided, limit=150, what="the late killer's files quarantined")
                assert len(restarts) <= 3, "at most one exit shared, then the model's own"
                await eventually(agent.triton.live, limit=60, what="Triton back")
                back = time.monotonic()
                await eventually(
                    lambda: bool(served) and served[-1] > back, limit=60, what="served again"
                )
                assert decided()
        finally:
            stop.set()
            await asyncio.to_thread(sender.join, 30)


async def test_an_exit_the_agents_watch_missed_is_counted_from_the_gateways_record(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    """The agent's loop stalls from Triton's death until Triton is back (a busy node): its own
    connection sees only a drop, and its new one is accepted by the new Triton. The gateway
    recorded the death: the agent counts it from that record, once, and the attacker's next
    exit quarantines it (2 in a row). Before, the stalled exit was never counted."""
    table = tmp_path / "gateway" / "callers.json"
    running = await start_custom_agent(
        crash_quarantine_after=2,
        lease_renew_seconds=0.5,
        gateway_table=table,
        gateway_table_refresh_seconds=0.5,
        crash_settle_seconds=0.0,  # the requests' rule alone, as in test_request_quarantine
    )
    node = Node(running, kube_api, table)
    await node.add(apiserver, tmp_path, "team-a", "killer", ATTACKER, REQUEST_KILLER)
    assert (await node.load("killer")).state == agent_pb2.MODEL_STATE_READY
    await eventually(lambda: set(node.callers()) == {ATTACKER}, what="the caller")
    watch = running.agent.request_crashes
    assert watch is not None
    registry = running.agent.metrics.registry

    def exits() -> float | None:
        return registry.get_sample_value("tritonshare_agent_triton_exits_witnessed_total")

    sentinel = watch.sentinel
    seen_late = sentinel._on_lost

    def stalled() -> float:
        """The agent's loop, stalled from the death until the new Triton is live; the gateway,
        in its own thread, records the death meanwhile."""
        sentinel._on_lost = seen_late
        deadline = time.monotonic() + 60
        while not read_witnesses(watch.witness_file) and time.monotonic() < deadline:
            time.sleep(0.05)
        while not live(triton.http_url) and time.monotonic() < deadline:
            time.sleep(0.05)
        return seen_late()

    with running_gateway(gateway_settings(triton, table)) as gateway:
        url = gateway.http_url
        async with kubelet_restarts(triton) as restarts:
            sentinel._on_lost = stalled
            for crash in (1, 2):
                await eventually(lambda: node.ready("killer"), limit=60, what="killer loaded")
                status, _ = await asyncio.to_thread(infer, url, ATTACKER, "killer", MAGIC)
                assert status in (0, 502), status  # Triton died under it
                await eventually(lambda n=crash: len(restarts) == n, what=f"crash {crash}")
                await eventually(lambda n=crash: exits() == n, what=f"exit {crash} counted")
                if crash == 1:
                    assert sentinel.deaths == 0, "the agent's own watch saw no death"
                    assert [(r.pod, r.crashes) for r in running.agent.crashes.callers()] == [
                        ("team-a/killer-pod", 1)
                    ]
            await eventually(
                lambda: bool(node.callers()[ATTACKER].get("quarantined")),
                what="the attacker quarantined",
            )
        assert sentinel.deaths == 1 and exits() == 2, "each exit counted once"


def live(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{url}/v2/health/live", timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


async def test_a_crasher_asked_again_at_once_leaves_a_neighbour_that_just_loaded_unsuspected(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    """The crasher's pod asks for its load again the moment Triton is back, before the agent's
    pass over the exit: that pass no longer finds the crasher's marker (its new load took it),
    only the neighbour's, READY seconds before and settling. A load was in flight at the exit,
    so the settling neighbour is no suspect: never counted, it is loaded again at once, not
    alone after the others' settling windows (60 s each)."""
    node = await start_node(start_custom_agent, kube_api, tmp_path)
    await node.add(apiserver, tmp_path, "team-b", "good", NEIGHBOUR)
    loaded = await node.load("good")
    assert loaded.state == agent_pb2.MODEL_STATE_READY, loaded.reason
    await node.add(apiserver, tmp_path, "team-a", "crasher", ATTACKER, LOAD_KILLER)
    ledger = node.running.agent.crashes
    owned = node.running.agent.owners.get(node.names["good"])
    assert owned is not None
    async with kubelet_restarts(triton):
        while not node.files_quarantined("crasher"):
            # As a loader retrying: again as soon as the agent answers (Triton back or not).
            with contextlib.suppress(grpc.aio.AioRpcError):
                await node.load("crasher")
            assert not ledger.suspected(owned.digest), "the neighbour is a suspect"
            assert ledger.count(owned.digest) == 0
        await eventually(lambda: node.ready("good"), limit=30, what="the neighbour loaded again")
    assert not ledger.suspected(owned.digest)


BUSY_SLOW_LOAD = SLOW.replace(
    "class TritonPythonModel:\n",
    "class TritonPythonModel:\n    def initialize(self, args):\n        time.sleep(3.0)\n\n",
)
"""A busy model (each request 0.5 s at Triton) whose load takes 3 s."""


async def test_a_load_triton_died_under_asked_again_at_once_waits_for_what_triton_held(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
) -> None:
    """Triton dies (killed here) while a pod's model loads, with a busy neighbour's request at
    it: the exit is shared, counted against neither. Triton restarts empty, and the pod's loader
    asks for its load again the moment the agent answers. That load waits until the agent has
    loaded the neighbour again (a 3 s load), so it cannot take Triton down again in the middle
    of the neighbour's restore, whose requests the gateway holds meanwhile. In Triton's index
    after the exit: whenever the pod's model is loading or loaded, the neighbour is READY.
    Before, the load went to Triton first, the neighbour's reload after it."""
    node = await start_node(start_custom_agent, kube_api, tmp_path)
    await node.add(apiserver, tmp_path, "team-b", "good", NEIGHBOUR, BUSY_SLOW_LOAD)
    loaded = await node.load("good")
    assert loaded.state == agent_pb2.MODEL_STATE_READY, loaded.reason
    # Its pod's loader runs (the pod is Pending): the agent loads it only when the pod asks.
    await node.add(apiserver, tmp_path, "team-a", "late", ATTACKER, SLOW_LOAD, phase="Pending")
    await eventually(lambda: NEIGHBOUR in node.callers(), what="the neighbour a caller")
    index = node.running.agent.models.triton.index
    good, late = node.names["good"], node.names["late"]
    beside: list[str] = []
    """The neighbour's state in Triton at each look after the exit that found `late` there."""
    killed = asyncio.Event()

    async def watch() -> None:
        while True:
            with contextlib.suppress(AgentError):  # Triton restarting
                entries = await index()
                entry = entries.get(late)  # its files are in the repository from the start
                if killed.is_set() and entry is not None and entry.state in (LOADING, READY):
                    neighbour = entries.get(good)
                    beside.append("absent" if neighbour is None else neighbour.state)
            await asyncio.sleep(0.02)

    async def loading() -> bool:
        entry = (await index()).get(late)
        return entry is not None and entry.state == LOADING

    watching = asyncio.ensure_future(watch())
    settings = gateway_settings(triton, node.table)
    served: list[float] = []
    stop = threading.Event()

    def neighbour_sends() -> None:  # two of them: one request or the other is always at Triton
        while not stop.is_set():
            if infer(gateway.http_url, NEIGHBOUR, "good", 10.0)[0] == 200:
                served.append(time.monotonic())

    senders = [threading.Thread(target=neighbour_sends, daemon=True) for _ in range(2)]
    try:
        with running_gateway(settings) as gateway:
            for sender in senders:
                sender.start()
            await eventually(lambda: bool(served), what="the neighbour served")
            async with kubelet_restarts(triton) as exits:
                first = asyncio.ensure_future(node.load("late"))
                await eventually(loading, what="the pod's model loading")
                await asyncio.to_thread(triton.kill)
                killed.set()
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await first
                while True:
                    # As its loader retrying: again as soon as the agent answers.
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        if (await node.load("late")).state == agent_pb2.MODEL_STATE_READY:
                            break
                    await asyncio.sleep(0.01)
                await eventually(lambda: node.ready("good"), limit=30, what="the neighbour back")
    finally:
        stop.set()
        for sender in senders:
            if sender.is_alive():
                await asyncio.to_thread(sender.join, 30)
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
    assert exits, "Triton was restarted"
    assert beside, "the pod's model was never seen in Triton after the exit"
    assert set(beside) == {READY}, beside
