"""A tenant tries to take a GPU's load slot from the others: many slow loads from one namespace,
a model whose load always fails, a load that never ends.

Through the agent's real gRPC API with tokens minted by sim/'s API server, a real Triton loading
Python-backend models whose `initialize` sleeps or raises, and the mock NVML's GPUs (each pod's
model takes its GPU's slot for its load, `agent.gpus.gpuqueue`).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from protos import agent_pb2
from sim.apiserver import RunningApiServer
from tests.agent.conftest import (
    RunningAgent,
    StartAgent,
    bearer,
    eventually,
    install_dir,
    make_pod,
    name_in_triton,
)
from tests.agent.test_attacks import events, namespaces
from tests.conftest import copy_model

pytestmark = pytest.mark.triton

READY = agent_pb2.MODEL_STATE_READY
FAILED = agent_pb2.MODEL_STATE_FAILED

SLEEPS = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep({seconds})

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[]) for _ in requests]
"""

RAISES = "raise RuntimeError('this model cannot start')\n"


def model(tmp_path: Path, name: str, code: str = "", padding: int = 0) -> Path:
    """add_one as `name`; `code` replaces its model.py, `padding` bytes of weights are added."""
    source = copy_model("add_one", tmp_path / name, as_name=name)
    if code:
        (source / "1" / "model.py").write_text(code)
    if padding:
        (source / "1" / "weights.bin").write_bytes(b"\0" * padding)
    return source


async def pod_with_model(
    running: RunningAgent,
    apiserver: RunningApiServer,
    api: kubernetes.client.ApiClient,
    source: Path,
    name: str,
    namespace: str = "default",
    phase: str | None = None,
) -> str:
    """A pod placed on GPU 0 with its model installed; its token."""
    gpu = running.mock.gpus[0].uuid
    make_pod(api, name, name, namespace=namespace, gpu_uuid=gpu, phase=phase)
    token = apiserver.mint_token(namespace, name)
    await install_dir(running.stub, token, source, name)
    return token


async def load(running: RunningAgent, name: str, token: str) -> Any:
    request = agent_pb2.LoadModelRequest(model_id=name)
    return await running.stub.LoadModel(request, metadata=bearer(token))


async def test_one_namespace_s_queued_loads_delay_another_s_by_one_load(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """team-a queues five loads of a second each on GPU 0; team-b's one load, asked while
    at least three of them wait, is granted the slot right after the one holding it (no load of
    team-a is granted between its ask and its grant). First come, first served made it wait for
    every one of them."""
    running = await start_custom_agent()
    namespaces(kube_api, "team-a", "team-b")
    slow = SLEEPS.format(seconds=1)
    tokens = {}
    for i in range(5):
        name = f"a{i}"
        source = model(tmp_path, name, slow)
        tokens[name] = await pod_with_model(running, apiserver, kube_api, source, name, "team-a")
    tokens["b0"] = await pod_with_model(
        running, apiserver, kube_api, model(tmp_path, "b0"), "b0", "team-b"
    )
    queue, gpu = running.agent.models.admission.queue, running.mock.gpus[0].uuid
    b0 = name_in_triton(kube_api, "b0", "b0", "team-b")
    # What the queue did, in order: ("ask", name), ("grant", name).
    log: list[tuple[str, str]] = []
    real_ask, real_done = queue.ask, queue.done_all

    def ask(*args: Any, **kwargs: Any) -> Any:
        turn = real_ask(*args, **kwargs)
        log.append(("ask", turn.name))
        if queue.holder(turn.gpu) == turn:
            log.append(("grant", turn.name))
        return turn

    def done(turn: Any, now: float) -> Any:
        following = real_done(turn, now)
        log.extend(("grant", t.name) for t in following)
        return following

    monkeypatch.setattr(queue, "ask", ask)
    monkeypatch.setattr(queue, "done_all", done)
    team_a = [asyncio.create_task(load(running, f"a{i}", tokens[f"a{i}"])) for i in range(5)]
    await eventually(lambda: len(queue.waiting(gpu)) >= 3, what="team-a's loads to queue")
    status = await load(running, "b0", tokens["b0"])
    assert status.state == READY, status.reason
    statuses = await asyncio.gather(*team_a)
    assert [s.state for s in statuses] == [READY] * 5, [s.reason for s in statuses]
    asked, granted = log.index(("ask", b0)), log.index(("grant", b0))
    between = [name for event, name in log[asked:granted] if event == "grant"]
    assert between == [], f"team-b's load waited for {between} after it asked: {log}"
    after = [name for event, name in log[granted:] if event == "grant" and name != b0]
    assert len(after) >= 2, log


async def test_a_load_that_always_fails_is_backed_off_then_given_up(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Running pod's model raises in `initialize`: Triton is asked to load it three times
    (--max-load-attempts 3), each gap at least twice the one before, then never again, whatever
    the pod asks; the pod's condition and a Warning Event say so with Triton's reason. A new
    install of other files starts afresh. Before, it was tried every resync period, for ever."""
    running = await start_custom_agent(
        resync_seconds=0.2, load_backoff_max_seconds=5.0, max_load_attempts=3
    )
    triton = running.agent.triton
    calls: list[float] = []
    real_load = triton.load

    async def counted(name: str, config_json: str | None = None) -> None:
        calls.append(time.monotonic())
        await real_load(name, config_json)

    monkeypatch.setattr(triton, "load", counted)
    source = model(tmp_path, "broken", RAISES)
    token = await pod_with_model(running, apiserver, kube_api, source, "broken", phase="Running")
    first = await load(running, "broken", token)
    assert first.state == FAILED and "this model cannot start" in first.reason

    await eventually(
        lambda: any(r == "ModelLoadGivenUp" for r, _ in events(kube_api, "default", "broken")),
        what="the ModelLoadGivenUp Event",
    )
    message = dict(events(kube_api, "default", "broken"))["ModelLoadGivenUp"]
    assert "3 times" in message and "this model cannot start" in message, message
    assert len(calls) == 3, calls
    gaps = [later - earlier for earlier, later in itertools.pairwise(calls)]
    assert gaps[0] >= 0.2 and gaps[1] >= 0.4, gaps

    core: Any = kubernetes.client.CoreV1Api(kube_api)

    def condition() -> Any:
        conditions = core.read_namespaced_pod("broken", "default").status.conditions or []
        return next((c for c in conditions if c.type == "tritonshare.io/ModelLoaded"), None)

    await eventually(
        lambda: (c := condition()) is not None and c.reason == "ModelLoadGivenUp",
        what="the ModelLoadGivenUp condition",
    )
    assert "--max-load-attempts" in condition().message

    # Passes go on, and the pod asks again itself: Triton is not asked again.
    passes = running.agent.reconciler.passes
    await eventually(lambda: running.agent.reconciler.passes >= passes + 5, what="five passes")
    again = await load(running, "broken", token)
    assert again.state == FAILED and "--max-load-attempts" in again.reason
    assert len(calls) == 3, calls

    # Other files, installed again by the pod: tried afresh, and they load.
    await install_dir(running.stub, token, model(tmp_path / "fixed", "broken"), "broken")
    fixed = await load(running, "broken", token)
    assert fixed.state == READY, fixed.reason
    assert len(calls) == 4


async def test_a_load_past_its_bound_is_abandoned_and_the_next_turn_proceeds(
    start_custom_agent: StartAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    tmp_path: Path,
) -> None:
    """A model of a few KiB whose load takes 4 s may hold its GPU 1 s (and 30 s per MiB of its
    files): its load is abandoned at its bound, the pod told which flags bound it, Triton told to
    unload it, and the next turn, a 1 MiB model allowed 31 s, loads. Before, every load could
    hold its GPU for 600 s."""
    running = await start_custom_agent(
        load_timeout_base_seconds=1.0,
        load_timeout_per_gib_seconds=30.0 * 1024,
        max_load_attempts=1,
    )
    slow_token = await pod_with_model(
        running, apiserver, kube_api, model(tmp_path, "slow", SLEEPS.format(seconds=4)), "slow"
    )
    quick_source = model(tmp_path, "quick", padding=1024**2)
    quick_token = await pod_with_model(running, apiserver, kube_api, quick_source, "quick")
    queue, gpu = running.agent.models.admission.queue, running.mock.gpus[0].uuid
    slow = asyncio.create_task(load(running, "slow", slow_token))
    slow_name = name_in_triton(kube_api, "slow", "slow")
    await eventually(
        lambda: (h := queue.holder(gpu)) is not None and h.name == slow_name,
        what="the slow load to hold the GPU",
    )
    quick = await load(running, "quick", quick_token)
    assert quick.state == READY, quick.reason
    abandoned = await slow
    assert abandoned.state == FAILED
    for flag in ("--load-timeout-base-seconds", "--load-timeout-per-gib-seconds"):
        assert flag in abandoned.reason, abandoned.reason

    async def unloaded() -> bool:
        entry = (await running.agent.triton.index()).get(slow_name)
        return entry is None or entry.state == "UNAVAILABLE"

    # Triton finishes the load it started, then honours the unload.
    await eventually(unloaded, what="Triton to unload the abandoned model")
    status = await running.stub.GetModel(
        agent_pb2.GetModelRequest(model_id="slow"), metadata=bearer(slow_token)
    )
    assert status.state == FAILED and "--max-load-attempts" in status.reason
