"""The ModelLoaded condition (agent/status/conditions.py): what it says for each state of a model,
that it is written only when its status or reason changes, with a Warning Event when the model is
not served, and that a tenant installing in a loop gets at most one write per period; a quarantined
pod is told whatever its phase, and a controller's is marked Failed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest

from agent.errors import KubeError
from agent.models.loadquarantine import PodQuarantine
from agent.models.nodemodels import ModelState
from agent.models.statuses import ModelStatus
from agent.pods.loadfailures import LoadFailure
from agent.pods.modelpods import PodInfo
from agent.pods.provenpods import Proven
from agent.quarantine.crashledger import CrashRecord
from agent.status.conditions import (
    NO_REFUSALS,
    REINSTALL_WRITE_SECONDS,
    ModelConditions,
    verdict,
)
from common.conditions import Condition
from tests.agent.conftest import eventually

CONDITION = "tritonshare.io/ModelLoaded"


def proven(name: str = "a", phase: str = "Running", loaded: tuple[str, str] = ("", "")) -> Proven:
    pod = PodInfo(
        namespace="models",
        name=name,
        uid=f"uid-{name}",
        node_name="gpu-1",
        scheduler_name="tritonshare",
        phase=phase,
        model_id=f"model_{name}",
        gpu_uuid="GPU-1",
        model_loaded=loaded,
    )
    return Proven(pod, 1024)


class Writer:
    def __init__(self, fail: bool = False) -> None:
        self.written: list[tuple[str, str, str]] = []
        self.was: list[str | None] = []
        self.fail = fail

    async def set_pod_condition(
        self, namespace: str, name: str, condition: Condition, *, was: str | None = None
    ) -> None:
        if self.fail:
            raise KubeError("the Kubernetes API is unreachable")
        self.written.append((name, condition.status, condition.reason))
        self.was.append(was)


class Events:
    def __init__(self) -> None:
        self.warned: list[tuple[str, str]] = []

    def warn(self, pod_key: str, uid: str, reason: str, message: str) -> None:
        self.warned.append((pod_key, reason))


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


class NoHosts:
    """A node with no model hosts."""

    by_key: dict[str, Any] = {}

    def unproven(self) -> list[Any]:
        return []

    def stale(self) -> list[Any]:
        return []


def conditions(
    states: dict[str, ModelStatus],
    writer: Writer,
    events: Events,
    clock: Clock | None = None,
    *,
    status_of: Callable[[Proven], Awaitable[ModelStatus]] | None = None,
    **collaborators: Any,
) -> ModelConditions:
    """The conditions' watcher over `states` (or `status_of`), its collaborators doubles that
    refuse, quarantine and fail nothing, on a node of no hosts, but those given."""

    async def from_states(p: Proven) -> ModelStatus:
        return states[p.pod.name]

    async def nothing(*args: Any) -> None:
        return None

    given: dict[str, Any] = {
        "refused": NO_REFUSALS,
        "quarantine": lambda proven: None,
        "fail_pod": nothing,
        "hosts": NoHosts(),
        "remove": nothing,
        "load_failure": lambda pod: None,
        "replica_condition": lambda model, ordinal: ("host", f"{CONDITION}-{model}-{ordinal}"),
    }
    return ModelConditions(
        writer,
        events,  # type: ignore[arg-type]
        CONDITION,
        status_of or from_states,
        **(given | collaborators),
        clock=clock or Clock(),
    )


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (ModelState.READY, ("True", "ModelReady")),
        (ModelState.ABSENT, ("False", "ModelMissing")),
        (ModelState.INSTALLED, ("False", "ModelNotLoaded")),
        (ModelState.FAILED, ("False", "ModelFailed")),
        (ModelState.LOADING, None),
        (ModelState.UNLOADING, None),
    ],
)
def test_each_state_reads_as_a_condition_or_changes_nothing(
    state: ModelState, expected: tuple[str, str] | None
) -> None:
    said = verdict("m", ModelStatus("m", state, reason="bad config"), triton_live=True)
    assert (said.status, said.reason) == expected if said else expected is None
    down = verdict("m", None, triton_live=False)
    assert down is not None and (down.status, down.reason) == ("False", "TritonUnavailable")


async def test_a_missing_model_gets_the_condition_and_an_event_once_then_true_when_back() -> None:
    writer, events = Writer(), Events()
    states = {"a": ModelStatus("model_a", ModelState.ABSENT)}
    watcher = conditions(states, writer, events)
    await watcher.sync([proven("a")], triton_live=True)
    assert writer.written == [("a", "False", "ModelMissing")]
    assert events.warned == [("models/a", "ModelNotServed")]
    # The watch shows the pod with the condition: nothing more is written.
    await watcher.sync([proven("a", loaded=("False", "ModelMissing"))], triton_live=True)
    assert len(writer.written) == 1
    states["a"] = replace(states["a"], state=ModelState.READY, gpu_uuid="GPU-1")
    await watcher.sync([proven("a", loaded=("False", "ModelMissing"))], triton_live=True)
    assert writer.written[-1] == ("a", "True", "ModelReady")
    assert events.warned == [("models/a", "ModelNotServed")]


async def test_a_load_is_said_at_once_not_a_period_later() -> None:
    # A pass a day apart: only `loaded` can bring the second one in this test's time.
    writer, events = Writer(), Events()
    states = {"a": ModelStatus("model_a", ModelState.ABSENT)}
    watcher = conditions(states, writer, events)
    stop = asyncio.Event()
    runner = asyncio.create_task(watcher.run(stop, lambda: [proven("a")], lambda: True, 86400))
    try:
        await eventually(lambda: writer.written == [("a", "False", "ModelMissing")], 10, "pass 1")
        states["a"] = replace(states["a"], state=ModelState.READY, gpu_uuid="GPU-1")
        watcher.loaded()
        await eventually(lambda: writer.written[-1] == ("a", "True", "ModelReady"), 10, "pass 2")
    finally:
        stop.set()
        await asyncio.wait_for(runner, 10)


async def test_pods_in_their_loader_or_being_deleted_are_not_judged() -> None:
    writer, events = Writer(), Events()
    states = {"a": ModelStatus("model_a", ModelState.ABSENT)}
    watcher = conditions(states, writer, events)
    deleting = proven("a")
    deleting = Proven(replace(deleting.pod, deleting=True), 1024)
    await watcher.sync([proven("a", phase="Pending"), deleting], triton_live=True)
    assert writer.written == [] and events.warned == []


async def test_a_failed_write_is_tried_again_next_pass() -> None:
    writer, events = Writer(fail=True), Events()
    watcher = conditions({"a": ModelStatus("model_a", ModelState.ABSENT)}, writer, events)
    await watcher.sync([proven("a")], triton_live=True)
    assert writer.written == [] and events.warned == []
    writer.fail = False
    await watcher.sync([proven("a")], triton_live=True)
    assert writer.written == [("a", "False", "ModelMissing")]


async def test_installing_in_a_loop_writes_at_most_once_per_period() -> None:
    writer, events, clock = Writer(), Events(), Clock()
    watcher = conditions({}, writer, events, clock)
    for _ in range(50):
        watcher.reinstalling(proven("a"))
        clock.now += 0.1
    await asyncio.sleep(0)
    await watcher.close()
    assert writer.written == [("a", "False", "ModelMissing")]
    clock.now += REINSTALL_WRITE_SECONDS
    watcher.reinstalling(proven("a"))
    await watcher.close()
    assert len(writer.written) == 2


async def test_a_pod_refused_its_model_id_is_told_why_without_the_owner() -> None:
    from agent.errors import OwnedByAnotherPodError

    writer, events = Writer(), Events()

    async def status_of(p: Proven) -> ModelStatus:
        raise OwnedByAnotherPodError(
            "model id 'm' on this node belongs to another pod",
            event_reason="ModelOwnedByAnotherPod",
        )

    watcher = conditions({}, writer, events, status_of=status_of)
    await watcher.sync([proven("a")], triton_live=True)
    await watcher.sync([proven("a", loaded=("False", "ModelOwnedByAnotherPod"))], triton_live=True)
    assert writer.written == [("a", "False", "ModelOwnedByAnotherPod")]
    assert events.warned == [("models/a", "ModelNotServed")]


async def test_one_call_triton_did_not_answer_changes_no_pods_condition() -> None:
    """A pass whose read of Triton's index timed out (a slow load over HTTP did that) says
    nothing of any pod's model: before, every pod's condition turned False "ModelRefused" with a
    Warning Event, and back True on the next pass. A Triton that stays away is the liveness
    watch's to tell (`triton_live=False`)."""
    from agent.errors import TritonUnreachableError

    writer, events = Writer(), Events()

    async def status_of(p: Proven) -> ModelStatus:
        raise TritonUnreachableError("Triton at http://127.0.0.1:8000 does not answer")

    watcher = conditions({}, writer, events, status_of=status_of)
    await watcher.sync([proven("a", loaded=("True", "ModelReady")), proven("b")], triton_live=True)
    assert writer.written == [] and events.warned == []


async def test_a_quarantined_pod_is_told_in_its_loader_and_failed_once_when_controlled() -> None:
    """Files quarantined: the pod in its loader gets the condition and the Event; a controller's
    pod whose own install holds them is marked Failed once (again after a failed write); a pod
    refused at install for them is told, never failed; a pod's own requests quarantined: told."""
    writer, events = Writer(), Events()
    record = CrashRecord("ab" * 32, "model_a", "models/a", 3, quarantined=True)
    held = {
        "a": PodQuarantine(record, installed=True),
        "b": PodQuarantine(record, installed=False),
    }
    failed: list[str] = []
    down = [True]

    async def fail_pod(namespace: str, name: str, reason: str, message: str) -> None:
        if down[0]:
            down[0] = False
            raise KubeError("the Kubernetes API is unreachable")
        assert reason == "ModelCrashedTriton" and "quarantined on this node" in message
        failed.append(name)

    async def status_of(p: Proven) -> ModelStatus:
        raise AssertionError("a pod in its loader is not asked about")

    watcher = conditions(
        {},
        writer,
        events,
        status_of=status_of,
        refused=lambda key: "its requests crashed Triton" if key == "models/c" else "",
        quarantine=lambda p: held.get(p.pod.name),
        fail_pod=fail_pod,
    )

    def owned(p: Proven) -> Proven:
        return Proven(replace(p.pod, controlled=True), p.request)

    pods = [owned(proven(n, phase="Pending")) for n in ("a", "b", "c", "d")]
    await watcher.sync(pods, triton_live=True)
    assert writer.written == [
        ("a", "False", "ModelCrashedTriton"),
        ("b", "False", "ModelCrashedTriton"),
        ("c", "False", "RequestsCrashedTriton"),
    ]
    assert events.warned == [(f"models/{n}", "ModelNotServed") for n in "abc"]
    assert failed == [], "the write failed: tried again next pass"
    await watcher.sync(pods, triton_live=True)
    await watcher.sync(pods, triton_live=True)
    assert failed == ["a"]
    # Without a controller: told, not failed.
    await watcher.sync([proven("a", phase="Pending")], triton_live=True)
    assert failed == ["a"]


async def test_a_replica_triton_refused_reads_its_loaders_reason_as_soon_as_reported() -> None:
    """Before its host's loader first makes it READY, a replica Triton refused is pending (no
    ModelFailed, no Event) until its loader reports why, then reads the loader's reason and
    message, and an Event; a report wakes the pass at once (a pass a day apart here)."""
    writer, events = Writer(), Events()
    states = {"m/0": ModelStatus("model_m", ModelState.FAILED, reason="Triton refused it")}
    reported: dict[str, LoadFailure] = {}
    watcher = conditions(
        {},
        writer,
        events,
        Clock(),
        status_of=lambda p: asyncio.sleep(0, states[p.pod.name]),
        load_failure=lambda pod: reported.get(pod.uid),
    )
    replica = replace(
        proven("m/0", loaded=("False", "ModelPending")).pod,
        host="tritonshare-host-1",
        host_uid="host-uid",
    )
    stop = asyncio.Event()
    runner = asyncio.create_task(
        watcher.run(stop, lambda: [Proven(replica, 1024)], lambda: True, 86400)
    )
    try:
        await asyncio.sleep(0.05)
        assert writer.written == [] and events.warned == [], "pending until the loader says"
        said = "Triton refused it; fix config.pbtxt or the model files"
        reported[replica.uid] = LoadFailure("ModelInvalid", said)
        watcher.failures_reported()
        await eventually(
            lambda: writer.written == [("tritonshare-host-1", "False", "ModelInvalid")],
            10,
            "the loader's word",
        )
        assert events.warned == [("models/m/0", "ModelNotServed")]
    finally:
        stop.set()
        await asyncio.wait_for(runner, 10)


async def test_a_replica_given_files_it_cannot_load_reads_its_loaders_reason() -> None:
    """A replica that served its earlier files (its condition True) and whose new files Triton
    will not take (gone from Triton, its loader reporting why) reads the loader's reason, as a
    first load's failure does, not ModelMissing: the binder tells a failed roll by it."""
    writer, events = Writer(), Events()
    states = {"m/0": ModelStatus("model_m", ModelState.ABSENT)}
    reported: dict[str, LoadFailure] = {}
    watcher = conditions(
        {},
        writer,
        events,
        Clock(),
        status_of=lambda p: asyncio.sleep(0, states[p.pod.name]),
        load_failure=lambda pod: reported.get(pod.uid),
    )
    replica = replace(
        proven("m/0", loaded=("True", "ModelReady")).pod,
        host="tritonshare-host-1",
        host_uid="host-uid",
    )
    said = "1/model.onnx of model 'm' is not an ONNX model; install the file onnxruntime loads"
    reported[replica.uid] = LoadFailure("ModelInvalid", said)
    await watcher.sync([Proven(replica, 1024)], triton_live=True)
    assert writer.written == [("tritonshare-host-1", "False", "ModelInvalid")]
    # Without a report (the node pod was replaced: its loader installs it again), as before.
    del reported[replica.uid]
    await watcher.sync([Proven(replica, 1024)], triton_live=True)
    assert writer.written[-1] == ("tritonshare-host-1", "False", "ModelMissing")


async def test_each_write_says_the_status_it_replaces_so_its_transition_time_can_stay() -> None:
    writer, events = Writer(), Events()
    states = {"a": ModelStatus("model_a", ModelState.FAILED, reason="bad config")}
    watcher = conditions(states, writer, events)
    await watcher.sync([proven("a")], triton_live=True)
    await watcher.sync([proven("a", loaded=("False", "ModelMissing"))], triton_live=True)
    assert writer.written == [("a", "False", "ModelFailed")] * 2
    assert writer.was == [None, "False"]


async def test_while_the_node_pod_stops_every_host_replica_reads_node_pod_stopping() -> None:
    """The replicas of model hosts read False NodePodStopping whatever Triton has of them (the
    binder takes their hosts out of their Services), with no Event; a model pod is judged as
    before (its readiness is its own proxy's) unless the stop takes it out of its Service."""
    writer, events = Writer(), Events()
    ready = ModelStatus("model_m", ModelState.READY)
    states = {"m/0": ready, "pod": ready}
    replica = replace(
        proven("m/0", loaded=("True", "ModelReady")).pod,
        host="tritonshare-host-1",
        host_uid="host-uid",
    )
    pod = proven("pod", loaded=("True", "ModelReady"))
    watcher = conditions(states, writer, events)
    await watcher.sync([Proven(replica, 1024), pod], triton_live=True)
    assert writer.written == [], "both already say so"
    watcher.stopping = "the node pod is stopping"
    await watcher.sync([Proven(replica, 1024), pod], triton_live=True)
    assert writer.written == [("tritonshare-host-1", "False", "NodePodStopping")]
    assert events.warned == []
    # A model pod the stop takes out of its Service says so too.
    watcher.leaving = {pod.pod.key: "this pod leaves its Service"}
    await watcher.sync([Proven(replica, 1024), pod], triton_live=True)
    assert writer.written[-1] == (pod.pod.name, "False", "NodePodStopping")
    assert events.warned == []


async def test_a_pod_failed_says_why_on_its_condition_first_and_a_replica_only_says_so() -> None:
    """The one place the condition is decided also writes it for a pod the agent fails: on the
    pod, then the pod Failed; a host's replica on its host only (the host serves the others),
    whether the agent knows the replica yet or not."""
    writer, events = Writer(), Events()
    failed: list[tuple[str, str]] = []

    async def fail_pod(namespace: str, name: str, reason: str, message: str) -> None:
        failed.append((name, reason))

    watcher = conditions({}, writer, events, fail_pod=fail_pod)
    await watcher.fail("models", "a", "ModelOverRequest", "used 3Gi of its 1Gi")
    await watcher.fail("models", "resnet/2", "ModelCrashedTriton", "Triton exited")
    assert writer.written == [
        ("a", "False", "ModelOverRequest"),
        ("host", "False", "ModelCrashedTriton"),
    ]
    assert failed == [("a", "ModelOverRequest")]
