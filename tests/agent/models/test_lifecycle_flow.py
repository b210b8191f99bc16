"""A model's life through the real agent and a real Triton: the events each operation raises, in
order, the phases they lead to, and what GetModel and the metrics read from them."""

from __future__ import annotations

from pathlib import Path

import kubernetes.client
import pytest

from agent.models.records import ModelRecord
from agent.phases import Event, Phase
from agent.triton import READY
from protos import agent_pb2
from sim.apiserver import RunningApiServer
from sim.triton import TritonServer
from tests.agent.conftest import RunningAgent, bearer, eventually
from tests.agent.models.test_reconcile import deploy, name_of, triton_state

pytestmark = [pytest.mark.triton, pytest.mark.slow]

LOADED = "tritonshare_agent_models_loaded"


async def test_a_triton_restart_is_an_event_of_the_pass_and_the_model_walks_back_to_ready(
    running: RunningAgent,
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    triton: TritonServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    models = running.agent.models
    steps: list[tuple[str, Event, Phase]] = []
    original = models.records.step

    def recording(name: str, record: ModelRecord, event: Event, reason: str = "") -> None:
        original(name, record, event, reason)
        steps.append((name, event, record.life.phase))

    monkeypatch.setattr(models.records, "step", recording)
    # The operator's restart, not the model's crash: no settling window to count it in.
    monkeypatch.setattr(running.agent.crashes, "settle_seconds", 0.0)
    token = await deploy(running, apiserver, kube_api, tmp_path, "m")
    name = name_of(kube_api, "m")
    mine = [(event, phase) for n, event, phase in steps if n == name]
    assert mine == [
        (Event.INSTALL_STARTED, Phase.INSTALLING),
        (Event.INSTALL_DONE, Phase.INSTALLED),
        (Event.LOAD_STARTED, Phase.LOADING),
        (Event.LOAD_OK, Phase.READY),
    ]
    gpu = running.mock.gpus[0].uuid
    registry = running.agent.metrics.registry
    assert registry.get_sample_value(LOADED, {"gpu": "0", "UUID": gpu}) == 1

    steps.clear()
    triton.kill()
    await eventually(lambda: not running.agent.reconciler.triton_live, what="Triton down")
    triton.start()

    async def ready_again() -> bool:
        in_triton = await triton_state(running, name)
        return in_triton == READY and models.records.record(name).life.phase is Phase.READY

    await eventually(ready_again, what="the model READY again after Triton restarted")
    mine = [(event, phase) for n, event, phase in steps if n == name]
    # A load tried while Triton was still starting may go unanswered first: the next pass
    # raises the event again and loads it.
    reloaded = mine[: mine.index((Event.LOAD_OK, Phase.READY)) + 1]
    assert reloaded[0] == (Event.TRITON_RESTARTED, Phase.LOST), mine
    assert reloaded[-2] == (Event.LOAD_STARTED, Phase.LOADING), mine
    assert {event for event, _ in reloaded} <= {
        Event.TRITON_RESTARTED,
        Event.LOAD_STARTED,
        Event.LOAD_UNANSWERED,
        Event.LOAD_OK,
    }, mine
    status = await running.stub.GetModel(
        agent_pb2.GetModelRequest(model_id="m"), metadata=bearer(token)
    )
    assert status.state == agent_pb2.MODEL_STATE_READY
    assert registry.get_sample_value(LOADED, {"gpu": "0", "UUID": gpu}) == 1

    steps.clear()
    status = await running.stub.UnloadModel(
        agent_pb2.UnloadModelRequest(model_id="m"), metadata=bearer(token)
    )
    assert status.state == agent_pb2.MODEL_STATE_ABSENT
    assert [(event, phase) for n, event, phase in steps if n == name] == [
        (Event.UNLOAD_STARTED, Phase.UNLOADING),
        (Event.REMOVED, Phase.ABSENT),
    ]
    assert name not in models.records.known()
    assert (registry.get_sample_value(LOADED, {"gpu": "0", "UUID": gpu}) or 0) == 0
