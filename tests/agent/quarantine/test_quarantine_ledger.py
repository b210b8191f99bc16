"""The crash ledger (agent/quarantine/crashledger.py): markers, crashes in a row, quarantine, what
survives a restart, clearing, the Node annotations an operator clears through, and what the
reconciler tells a quarantined model's pod."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from agent.metrics import AgentMetrics
from agent.models.probationhold import ProbationHold
from agent.models.reconcile import Reconciler
from agent.pods.modelpods import pod_from_dict
from agent.pods.provenpods import Proven
from agent.quarantine.crashledger import COUNTS_FILE, CrashLedger, CrashRecord, Marker
from agent.quarantine.published import NodeAnnotations, NodeQuarantine
from common.contract import Keys
from common.crashwitness import Suspect

DIGEST = "ab" * 32
OTHER = "cd" * 32


def published(
    ledger: CrashLedger,
    node: NodeAnnotations,
    keys: Keys,
    on_cleared: Callable[[list[CrashRecord]], None],
) -> NodeQuarantine:
    """The Node's quarantine annotation for a node with no caller quarantined and no pod that
    wants any file."""
    return NodeQuarantine(
        ledger,
        node,
        "n1",
        keys,
        on_cleared,
        period=1.0,
        on_callers_cleared=lambda callers: None,
        wanting=lambda digest: [],
    )


def marker(name: str = "m-1", digest: str = DIGEST) -> Marker:
    return Marker(name, digest, "resnet", "team-a/resnet-0")


def test_a_marker_is_on_disk_until_its_load_is_answered(tmp_path: Path) -> None:
    ledger = CrashLedger(tmp_path, 2)
    ledger.load()
    ledger.loading(marker())
    assert CrashLedger(tmp_path, 2).markers() == {"m-1": marker()}, "durable, not in memory"
    ledger.answered("m-1")
    assert ledger.markers() == {}


def test_crashes_in_a_row_quarantine_the_files_and_survive_a_restart(tmp_path: Path) -> None:
    ledger = CrashLedger(tmp_path, 2)
    ledger.load()
    ledger.loading(marker())
    first = ledger.crashed(marker())
    assert (first.crashes, first.quarantined) == (1, False)
    assert ledger.markers() == {}, "a counted marker is gone"
    assert ledger.quarantined(DIGEST) is None
    second = ledger.crashed(marker("m-2"))  # another pod of the same files
    assert (second.crashes, second.quarantined, second.pod) == (2, True, "team-a/resnet-0")

    restarted = CrashLedger(tmp_path, 2)
    restarted.load()
    assert restarted.quarantined(DIGEST) == second
    assert restarted.quarantined(OTHER) is None
    restarted.loaded(DIGEST)
    assert restarted.quarantined(DIGEST) == second, "only an operator lifts a quarantine"


def test_a_load_answered_ready_ends_the_count(tmp_path: Path) -> None:
    ledger = CrashLedger(tmp_path, 2)
    ledger.load()
    ledger.crashed(marker())
    ledger.loaded(DIGEST)
    assert ledger.count(DIGEST) == 0
    assert ledger.crashed(marker()).crashes == 1, "counted afresh: crashes in a row"


@pytest.mark.parametrize(
    "selector", ["resnet", "team-a/resnet", "team-a/resnet-0", DIGEST[:12], DIGEST]
)
def test_an_operator_clears_by_model_pod_or_digest(tmp_path: Path, selector: str) -> None:
    ledger = CrashLedger(tmp_path, 1)
    ledger.load()
    ledger.crashed(marker())
    ledger.crashed(Marker("x", OTHER, "bert", "team-b/bert-0"))
    cleared = ledger.clear([selector])
    assert [r.digest for r in cleared] == [DIGEST]
    assert ledger.quarantined(DIGEST) is None
    assert ledger.quarantined(OTHER) is not None
    assert ledger.clear([DIGEST[:11], "team-b/resnet", ""]) == [], "too short, or not it"


def test_unreadable_counts_are_kept_aside_and_counting_starts_afresh(tmp_path: Path) -> None:
    (tmp_path / COUNTS_FILE).write_text("{not json")
    (tmp_path / "m-1.loading").write_text("[]")
    ledger = CrashLedger(tmp_path, 2)
    ledger.load()
    assert ledger.records() == []
    assert (tmp_path / f"{COUNTS_FILE}.unreadable").exists()
    assert ledger.markers() == {}, "an unreadable marker is removed"
    assert not (tmp_path / "m-1.loading").exists()


@pytest.mark.parametrize(
    "document",
    [
        [],  # not an object at all
        # Namespaces and pods read, then a file's record without its digest: none is kept.
        {
            "namespaces": [
                {"namespace": "team-a", "pod": "team-a/p", "crashes": 5, "quarantined": True}
            ],
            "callers": [
                {
                    "pod": "team-a/p",
                    "model_id": "m",
                    "uid": "u",
                    "crashes": 3,
                    "quarantined": True,
                }
            ],
            "records": [{"model_id": "m", "pod": "team-a/p", "crashes": 1, "quarantined": False}],
        },
    ],
)
def test_counts_unreadable_in_part_or_in_shape_start_afresh_whole(
    tmp_path: Path, document: object
) -> None:
    """Whatever part of the file could not be read, nothing of it is kept (the log says
    counting starts afresh; the quarantines come back from the Node), and the agent starts."""
    (tmp_path / COUNTS_FILE).write_text(json.dumps(document))
    ledger = CrashLedger(tmp_path, 2)
    ledger.load()
    assert (ledger.records(), ledger.callers(), ledger.namespaces()) == ([], [], [])
    assert not ledger.held("team-a")
    assert (tmp_path / f"{COUNTS_FILE}.unreadable").exists()


class FakeNode:
    """The Node's annotations, as the API server would keep them under merge patches."""

    def __init__(self, annotations: dict[str, str]) -> None:
        self.annotations = annotations
        self.reads = 0

    async def get_node(self, name: str) -> dict[str, Any] | None:
        self.reads += 1
        return {"metadata": {"name": name, "annotations": dict(self.annotations)}}

    async def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None]
    ) -> None:
        for key, value in annotations.items():
            if value is None:
                self.annotations.pop(key, None)
            else:
                self.annotations[key] = value


async def test_the_node_shows_quarantines_and_an_operator_lifts_them(tmp_path: Path) -> None:
    keys = Keys()
    ledger = CrashLedger(tmp_path, 1)
    ledger.load()
    node = FakeNode({"other": "kept"})
    lifted: list[list[CrashRecord]] = []
    wanting = {DIGEST: ["team-a/resnet-1"]}
    now = [1.0]
    quarantine = NodeQuarantine(
        ledger,
        node,
        "n1",
        keys,
        lifted.append,
        period=1.0,
        on_callers_cleared=lambda callers: None,
        wanting=lambda digest: wanting.get(digest, []),
        wall=lambda: now[0],
    )

    await quarantine.sync()
    assert keys.quarantined not in node.annotations, "nothing quarantined, nothing shown"
    record = ledger.crashed(marker())
    await quarantine.sync()
    shown = json.loads(node.annotations[keys.quarantined])
    assert shown == [
        {
            "model": "team-a/resnet",
            "pod": "team-a/resnet-0",
            "digest": DIGEST,
            "crashes": 1,
            "since": "1970-01-01T00:00:01Z",
            "wanted_by": ["team-a/resnet-1"],
        }
    ]
    # Later syncs keep when it began; the pods wanting the files follow the node's pods.
    wanting.clear()
    now[0] = 7200.0
    await quarantine.sync()
    assert json.loads(node.annotations[keys.quarantined]) == [
        {k: v for k, v in shown[0].items() if k != "wanted_by"}
    ]

    node.annotations[keys.quarantine_clear] = "team-a/resnet"
    await quarantine.sync()
    assert lifted == [[record]]
    assert ledger.records() == []
    assert node.annotations == {"other": "kept"}, "the request and the listing are removed"


class Recorder:
    """What the reconciler tells the pod: Warning Events and Failed marks."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.failed: list[tuple[str, str, str]] = []

    def warn(self, pod: str, uid: str, reason: str, message: str) -> None:
        self.events.append((pod, reason))

    async def fail_pod(self, namespace: str, name: str, reason: str, message: str) -> None:
        self.failed.append((namespace, name, reason))


def proven(owner_references: list[dict[str, Any]]) -> Proven:
    obj = {
        "metadata": {
            "name": "resnet-0",
            "namespace": "team-a",
            "uid": "u1",
            "annotations": {"tritonshare.io/model-id": "resnet"},
            "ownerReferences": owner_references,
        },
        "spec": {"nodeName": "n1", "schedulerName": "tritonshare"},
        "status": {"phase": "Running"},
    }
    return Proven(pod_from_dict(obj, Keys()), 1024)


@pytest.mark.parametrize(
    ("references", "failed"),
    [
        ([{"kind": "ReplicaSet", "name": "resnet", "uid": "r", "controller": True}], True),
        ([{"kind": "ConfigMap", "name": "x", "uid": "c"}], False),
        ([], False),
    ],
)
async def test_a_quarantined_pod_is_told_and_failed_when_a_controller_replaces_it(
    tmp_path: Path, references: list[dict[str, Any]], failed: bool
) -> None:
    ledger = CrashLedger(tmp_path, 1)
    ledger.load()
    told = Recorder()
    models: Any = SimpleNamespace(
        quarantine=SimpleNamespace(
            crash_suspected=lambda marker, alone=True: ledger.crashed(marker, alone=alone)
        ),
        crashes=ledger,
    )
    reconciler = Reconciler(
        models,
        cast(Any, None),
        AgentMetrics(),
        cast(Any, told),
        fail_pod=told.fail_pod,
        wake=asyncio.Event(),
    )
    await reconciler.after_crash.crashed(marker(), proven(references))
    assert told.events == [("team-a/resnet-0", "ModelCrashedTriton")]
    assert told.failed == ([("team-a", "resnet-0", "ModelCrashedTriton")] if failed else [])
    assert (
        reconciler.metrics.registry.get_sample_value(
            "tritonshare_agent_triton_crashes_suspected_total"
        )
        == 1
    )


class PlanModels:
    """What `Reconciler.plan` reads of `agent.models.nodemodels.Models`, for three wanted models
    after a crash: "a" and "b" under suspicion (a crash each), "c" not; Triton holds none of
    them."""

    def __init__(self, tmp_path: Path, busy: set[str]) -> None:
        self.crashes = CrashLedger(tmp_path, 3)
        self.crashes.load()
        self.owners = SimpleNamespace(
            all=lambda: {},
            get=lambda name: SimpleNamespace(digest=f"{name}-files"),
        )
        self.triton = SimpleNamespace(index=self._index)
        self.repository = SimpleNamespace(installed_models=lambda: ["a", "b", "c"])
        self.ledger = SimpleNamespace(over=list)
        self.hold = ProbationHold(0)  # no probation hold: trials wait for nothing
        self._busy = busy
        self.records = SimpleNamespace(
            is_busy=lambda name: name in self._busy,
            known=lambda: {},
            record=lambda name: SimpleNamespace(last_activity=0.0),
        )
        self.quarantine = SimpleNamespace(of=lambda name: None)
        for name in ("a", "b"):
            self.crashes.crashed(Marker(name, f"{name}-files", name, f"ns/{name}-pod"))

    async def _index(self) -> dict[str, Any]:
        return {}


def planner(models: PlanModels) -> Reconciler:
    reconciler = Reconciler(
        cast(Any, models),
        cast(Any, None),
        AgentMetrics(),
        cast(Any, None),
        fail_pod=Recorder().fail_pod,
        wake=asyncio.Event(),
    )
    wanted = {name: proven([]) for name in ("a", "b", "c")}
    reconciler.wanted = lambda: wanted  # type: ignore[method-assign]
    return reconciler


async def test_after_a_crash_suspects_load_last_and_one_at_a_time(tmp_path: Path) -> None:
    models = PlanModels(tmp_path, busy=set())
    reconciler = planner(models)
    plan = await reconciler.plan()
    assert sorted(plan) == ["c"], "the model under no suspicion loads first, alone"
    assert reconciler.after_crash.deferred, "and a pass follows it for the suspects"

    models.repository.installed_models = lambda: ["a", "b"]  # c is served again
    plan = await reconciler.plan()
    assert sorted(plan) == ["a"], "then one suspect"
    assert reconciler.after_crash.deferred, "and a pass follows it for the next"

    models._busy = {"c"}  # a load of another model under way (its pod's own)
    models.crashes.loading(Marker("c", "c-files", "c", "ns/c-pod"))
    plan = await reconciler.plan()
    assert plan == {}, "no suspect loads beside another load"


async def test_a_new_node_pod_takes_the_quarantines_back_from_the_node(tmp_path: Path) -> None:
    keys = Keys()
    shown = [
        {"model": "team-a/resnet", "pod": "team-a/resnet-0", "digest": DIGEST, "crashes": 2},
        {"model": "team-a/bert", "pod": "team-b/bert-0", "digest": OTHER, "crashes": 2},
        {"model": "team-a/x", "pod": "team-a/x-0", "digest": "ef" * 32, "crashes": "many"},
        "not an entry",
    ]
    node = FakeNode({keys.quarantined: json.dumps(shown)})
    ledger = CrashLedger(tmp_path, 2)
    ledger.load()
    lifted: list[list[CrashRecord]] = []
    await published(ledger, node, keys, lifted.append).sync()
    assert lifted == []
    restored = ledger.quarantined(DIGEST)
    assert restored is not None and (restored.pod, restored.crashes) == ("team-a/resnet-0", 2)
    assert [r.digest for r in ledger.records()] == [DIGEST], "entries that do not add up: none"
    reread = CrashLedger(tmp_path, 2)
    reread.load()
    assert reread.quarantined(DIGEST) == restored, "written to the state directory"


async def test_a_crash_names_the_loads_in_flight_before_those_settling(tmp_path: Path) -> None:
    models = PlanModels(tmp_path, busy=set())
    models.crashes.settle_seconds = 10.0
    models.crashes.loading(Marker("c", "c-files", "c", "ns/c-pod"))  # in flight
    models.crashes.loading(Marker("a", "a-files", "a", "ns/a-pod", finished_at=1.0))  # settling
    plan = await planner(models).plan()
    assert [n for n, a in plan.items() if a.marker is not None] == ["c"]
    assert "a" not in models.crashes.markers(), "the settling load is not counted"

    models.crashes.answered("c")  # counted by the pass that carried the plan out
    models.crashes.loading(Marker("a", "a-files", "a", "ns/a-pod", finished_at=1.0))
    plan = await planner(models).plan()
    assert [n for n, a in plan.items() if a.marker is not None] == ["a"], "alone, it is"


def test_an_exit_names_the_loads_in_flight_or_settling_then(tmp_path: Path) -> None:
    """Still on disk, or already counted or dismissed by the reconciler (the agent's two
    watchers of an exit run in either order); not a load sent to the Triton that came back, nor
    one settled before, nor a reload of what Triton held before it restarted."""
    now = [100.0]
    ledger = CrashLedger(tmp_path, 3, settle_seconds=60.0, wall=lambda: now[0])
    ledger.load()
    flying = Marker("a", "a-files", "a", "ns/a-pod", started_at=99.0)
    settling = Marker("b", "b-files", "b", "ns/b-pod", started_at=20.0, finished_at=50.0)
    settled = Marker("c", "c-files", "c", "ns/c-pod", started_at=10.0, finished_at=20.0)
    later = Marker("d", "d-files", "d", "ns/d-pod", started_at=105.0)
    restoring = Marker("r", "r-files", "r", "ns/r-pod", started_at=99.0, restore=True)
    for m in (flying, settling, settled, later, restoring):
        ledger.loading(m)
    assert ledger.loads_at(100.0, 1.0) == [flying, settling, restoring]
    now[0] = 106.0
    ledger.crashed(flying)
    ledger.witnessed = lambda m: ["ns/b-pod"]  # its own pod's requests explain it
    assert ledger.explained(settling) == ["ns/b-pod"]
    assert "b" not in ledger.markers() and ledger.count("b-files") == 0, "not counted"
    assert ledger.loads_at(100.0, 1.0) == [flying, settling, restoring], "remembered"
    ledger.answered("r")
    assert ledger.loads_at(200.0, 1.0) == [later], "decided before that exit, but this one"
    reload = Marker("e", "e-files", "e", "ns/e-pod", started_at=150.0)
    ledger.loading(reload)
    ledger.finished(reload, settle=False)
    assert "e" not in ledger.markers()
    ledger.finished(replace(reload, name="f"))
    assert ledger.markers()["f"].finished_at == 106.0, "a new load settles"


async def test_a_load_whose_exit_requests_explain_is_not_counted(tmp_path: Path) -> None:
    """Another pod's requests were at Triton when it died under the load: the exit is theirs
    to explain, so the load's files are not counted (an attacker cannot time its crash to a
    neighbour's load to quarantine the neighbour's files)."""
    models = PlanModels(tmp_path, busy=set())
    models.crashes.witnessed = lambda m: ["team-x/attacker"] if m.name == "c" else []
    models.crashes.loading(Marker("c", "c-files", "c", "ns/c-pod", started_at=1.0))
    plan = await planner(models).plan()
    assert all(a.marker is None for a in plan.values())
    assert "c" not in models.crashes.markers() and models.crashes.count("c-files") == 0


async def test_a_settling_load_beside_another_pods_requests_is_suspected_not_cleared(
    tmp_path: Path,
) -> None:
    """Its load had finished when Triton died with a neighbour's request at it: nothing tells
    the two apart, so the load is not counted but loads again alone, under watch. Before, the
    request cleared it, and a model that kills Triton seconds after each READY, reloaded
    unwatched, was never counted again."""
    models = PlanModels(tmp_path, busy=set())
    models.crashes.settle_seconds = 60.0
    models.crashes.witnessed = lambda m: ["team-b/neighbour"]
    models.crashes.loading(Marker("c", "c-files", "c", "ns/c-pod", finished_at=4.0, started_at=1.0))
    plan = await planner(models).plan()
    (action,) = [a for a in plan.values() if a.marker is not None]
    assert (action.name, action.alone) == ("c", False)


async def test_a_reload_of_what_triton_held_is_counted_only_when_nothing_else_explains_the_exit(
    tmp_path: Path,
) -> None:
    """After a restart the models Triton held load again; one such reload in flight when Triton
    dies again is no change, so a load that finished within its window is counted instead."""
    models = PlanModels(tmp_path, busy=set())
    models.crashes.settle_seconds = 60.0
    restoring = Marker("c", "c-files", "c", "ns/c-pod", started_at=5.0, restore=True)
    models.crashes.loading(restoring)
    models.crashes.loading(Marker("d", "d-files", "d", "ns/d-pod", finished_at=4.0, started_at=1.0))
    plan = await planner(models).plan()
    assert [n for n, a in plan.items() if a.marker is not None] == ["d"]
    assert "c" not in models.crashes.markers(), "the reload is not counted"

    models.crashes.answered("d")  # counted by the pass that carried the plan out
    models.crashes.loading(restoring)
    plan = await planner(models).plan()
    assert [n for n, a in plan.items() if a.marker is not None] == ["c"], "alone, it is"


async def test_a_quarantine_of_files_lapses_after_the_expiry_and_one_more_crash_renews_it(
    tmp_path: Path,
) -> None:
    """It rests on one node's evidence (an attacker may have timed its crashes to the model's
    loads): after `--crash-quarantine-expiry-seconds` the files may load again, one crash short
    of the limit; the Node stops showing it and the models are told."""
    now = [1000.0]
    ledger = CrashLedger(tmp_path, 2, expiry_seconds=3600.0, wall=lambda: now[0])
    ledger.load()
    ledger.crashed(marker())
    assert ledger.crashed(marker()).quarantined
    keys = Keys()
    node = FakeNode({})
    lifted: list[list[CrashRecord]] = []
    quarantine = published(ledger, node, keys, lifted.append)
    await quarantine.sync()
    assert keys.quarantined in node.annotations and lifted == []
    now[0] += 3599.0
    await quarantine.sync()
    assert ledger.quarantined(DIGEST) is not None, "not yet"
    now[0] += 1.0
    await quarantine.sync()
    assert [r.digest for r in lifted[0]] == [DIGEST]
    assert ledger.quarantined(DIGEST) is None and ledger.count(DIGEST) == 1
    assert keys.quarantined not in node.annotations
    reread = CrashLedger(tmp_path, 2, expiry_seconds=3600.0, wall=lambda: now[0])
    reread.load()
    assert reread.quarantined(DIGEST) is None, "lapsed on disk too"
    again = ledger.crashed(marker())
    assert again.quarantined and again.quarantined_at == now[0], "one more crash renews it"
    assert CrashLedger(tmp_path, 2).expire() == [], "0: never lapses"


async def test_an_exit_shared_by_several_files_counts_the_latest_and_each_loads_alone(
    tmp_path: Path,
) -> None:
    """Two models loaded within the window when Triton died with nothing else there: the one
    loaded last is counted, the other only suspected; each loads again alone, and counts once
    alone at an exit."""
    models = PlanModels(tmp_path, busy=set())
    models.crashes = CrashLedger(tmp_path / "fresh", 2, settle_seconds=60.0)
    models.crashes.load()
    models.crashes.loading(Marker("a", "a-files", "a", "ns/a-pod", 1.0, 1.0))
    models.crashes.loading(Marker("b", "b-files", "b", "ns/b-pod", 2.0, 2.0))
    reconciler = planner(models)
    plan = await reconciler.plan()
    crashes = {n: a for n, a in plan.items() if a.marker is not None}
    assert {n: a.alone for n, a in crashes.items()} == {"a": False, "b": True}
    for action in crashes.values():
        assert action.marker is not None
        models.crashes.crashed(action.marker, alone=action.alone)
    assert (models.crashes.count("a-files"), models.crashes.count("b-files")) == (0, 1)
    assert models.crashes.suspected("a-files") and models.crashes.suspected("b-files")
    plan = await reconciler.plan()
    assert sorted(plan) == ["c"], "the model under no suspicion first"
    models.repository.installed_models = lambda: ["a", "b"]
    plan = await reconciler.plan()
    assert sorted(plan) == ["a"], "then one suspect, alone"
    alone = models.crashes.crashed(Marker("a", "a-files", "a", "ns/a-pod", 1.0, 1.0))
    assert alone.crashes == 1, "alone at an exit, it counts"


def test_a_probation_given_beside_a_load_in_flight_ends_once_the_loads_files_are_counted(
    tmp_path: Path,
) -> None:
    """An exit with a neighbour's request at Triton while a load was in flight puts the
    neighbour on probation and counts against neither; once that load's files are counted for an
    exit of their own, the exit was theirs: the probation it gave ends. A clean load leaves it."""
    ledger = CrashLedger(tmp_path, 3, wall=lambda: 1000.0)
    ledger.load()
    neighbour = Suspect("team-b/good-0", "uid-b", "127.1.0.6", "good", 1)
    ledger.requests_crashed([neighbour], ambiguous=True, loading=[marker()])
    assert ledger.caller_probation("team-b/good-0") is not None
    ledger.crashed(marker())
    assert ledger.caller_probation("team-b/good-0") is None, "the load's exit, not its requests"

    ledger.requests_crashed([neighbour], ambiguous=True, loading=[marker("m-2", OTHER)])
    ledger.loaded(OTHER)  # stayed READY: the requests stay suspects
    ledger.crashed(marker("m-2", OTHER))
    assert ledger.caller_probation("team-b/good-0") is not None
