"""The binder's side of a dead agent (binder/pods/agentdown.py): which pods are marked, which
deleted and when, at what rate, and only while leading."""

from __future__ import annotations

from typing import Any

from binder.pods.agentdown import EVENT_REASON, PERIOD_SECONDS, REASON, AgentDown, Rules, judge

CONDITION = "tritonshare.io/ModelLoaded"
RULES = Rules("tritonshare", CONDITION, grace_seconds=300.0)


def pod(
    name: str = "m",
    *,
    owned: bool = True,
    phase: str = "Running",
    scheduler: str = "tritonshare",
    marked: bool = False,
    deleting: bool = False,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"namespace": "models", "name": name, "uid": f"uid-{name}"}
    if owned:
        metadata["ownerReferences"] = [
            {"kind": "ReplicaSet", "name": "rs", "uid": "rs-1", "controller": True}
        ]
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    conditions = []
    if marked:
        conditions.append({"type": CONDITION, "status": "Unknown", "reason": REASON})
    return {
        "metadata": metadata,
        "spec": {"schedulerName": scheduler, "nodeName": "gpu-1"},
        "status": {"phase": phase, "conditions": conditions},
    }


def test_a_pod_is_marked_at_once_and_deleted_only_after_the_grace() -> None:
    assert judge(pod(), 1.0, RULES) == ["mark"]
    assert judge(pod(marked=True), 299.0, RULES) == []
    assert judge(pod(marked=True), 300.0, RULES) == ["delete"]
    assert judge(pod(), 400.0, RULES) == ["mark", "delete"]


def test_what_is_never_deleted() -> None:
    # Nothing would replace a pod no controller owns.
    assert judge(pod(owned=False), 1e6, RULES) == ["mark"]
    # Not ours, already ending, or already gone: nothing at all.
    assert judge(pod(scheduler="default-scheduler"), 1e6, RULES) == []
    assert judge(pod(phase="Failed"), 1e6, RULES) == []
    assert judge(pod(deleting=True), 1e6, RULES) == []
    # A grace of 0 turns deletion off.
    assert judge(pod(marked=True), 1e6, Rules("tritonshare", CONDITION, 0.0)) == []


class Kube:
    def __init__(self, pods: dict[str, list[dict[str, Any]]]) -> None:
        self.pods = pods
        self.conditions: list[tuple[str, dict[str, Any]]] = []
        self.deleted: list[tuple[str, str]] = []
        self.events: list[tuple[str, str]] = []
        self.failed: list[tuple[str, str, str, dict[str, Any]]] = []

    def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        return self.pods.get(node, [])

    def set_pod_condition(self, namespace: str, name: str, condition: dict[str, Any]) -> None:
        self.conditions.append((name, condition))

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        self.deleted.append((name, uid))
        for pods in self.pods.values():
            for obj in pods:
                if obj["metadata"]["uid"] == uid:
                    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"

    def fail_pod(
        self, namespace: str, name: str, reason: str, message: str, condition: dict[str, Any]
    ) -> None:
        self.failed.append((name, reason, message, condition))

    def record_event(
        self, namespace: str, name: str, uid: str, *, reason: str, message: str, **_: Any
    ) -> None:
        self.events.append((name, reason))


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_down_since_is_the_lease_expiry_or_when_a_gone_lease_was_first_seen() -> None:
    clock = Clock()
    watcher = AgentDown(Kube({}), RULES, deletions_per_second=0.1, identity="b", clock=clock)
    leases = {"alive": 2000.0, "expired": 900.0, "gone": 0.0}
    assert watcher.down_nodes(leases, clock.now) == {"expired": 900.0, "gone": 1000.0}
    clock.now = 1100.0
    assert watcher.down_nodes(leases, clock.now)["gone"] == 1000.0
    # Back: forgotten, and a later loss counts from then.
    assert watcher.down_nodes({**leases, "gone": 5000.0}, clock.now).get("gone") is None
    assert watcher.down_nodes(leases, 1200.0)["gone"] == 1200.0


def test_deletions_are_rate_limited_and_each_pod_gets_its_event() -> None:
    clock = Clock()
    pods = [pod(f"m{i}", marked=True) for i in range(5)]
    kube = Kube({"gpu-1": pods})
    watcher = AgentDown(kube, RULES, deletions_per_second=0.1, identity="b", clock=clock)
    watcher.pass_once({"gpu-1": clock.now - 400}, lambda: True)
    assert [name for name, _ in kube.deleted] == ["m0"]
    clock.now += 5.0
    watcher.pass_once({"gpu-1": clock.now - 400}, lambda: True)
    assert len(kube.deleted) == 1, "0.1 a second: the next token comes 10 s later"
    clock.now += 5.0
    watcher.pass_once({"gpu-1": clock.now - 400}, lambda: True)
    assert len(kube.deleted) == 2
    assert kube.events.count(("m0", EVENT_REASON)) == 1


def test_marking_writes_the_condition_and_an_event_and_a_follower_does_nothing() -> None:
    clock = Clock()
    kube = Kube({"gpu-1": [pod("a"), pod("b", owned=False)]})
    watcher = AgentDown(kube, RULES, deletions_per_second=0.1, identity="b", clock=clock)
    watcher.pass_once({"gpu-1": clock.now - 10}, lambda: False)
    assert kube.conditions == [] and kube.events == []
    watcher.pass_once({"gpu-1": clock.now - 10}, lambda: True)
    assert [(n, c["status"], c["reason"]) for n, c in kube.conditions] == [
        ("a", "Unknown", REASON),
        ("b", "Unknown", REASON),
    ]
    assert "has not renewed its Lease" in kube.conditions[0][1]["message"]
    assert kube.events == [("a", EVENT_REASON), ("b", EVENT_REASON)]
    assert kube.deleted == []


def test_a_pending_pod_a_controller_owns_is_failed_at_once_with_its_loader_s_reason() -> None:
    """Still in its loader, nothing of it is served: it is failed for its controller to replace
    it elsewhere, without waiting for the grace or a deletion token."""
    waiting = pod("w", phase="Pending")
    waiting["status"]["initContainerStatuses"] = [
        {
            "name": "loader",
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {
                "terminated": {
                    "exitCode": 7,
                    "message": "the node's agent at 10.0.0.1:8100 is unreachable",
                }
            },
        }
    ]
    assert judge(waiting, 0.0, RULES) == ["fail"]
    # Not started yet at all: the same; no controller: only marked, nothing would replace it.
    assert judge(pod("new", phase="Pending"), 0.0, RULES) == ["fail"]
    assert judge(pod("bare", phase="Pending", owned=False), 0.0, RULES) == ["mark"]

    clock = Clock()
    kube = Kube({"gpu-1": [waiting, pod("new", phase="Pending"), pod("r")]})
    watcher = AgentDown(kube, RULES, deletions_per_second=0.1, identity="b", clock=clock)
    watcher.pass_once({"gpu-1": clock.now - 1}, lambda: True)
    failed = kube.failed
    assert [(n, r) for n, r, _, _ in failed] == [("w", REASON), ("new", REASON)]
    message = failed[0][2]
    assert "node gpu-1 has not renewed its Lease" in message
    assert "its loader: the node's agent at 10.0.0.1:8100 is unreachable" in message
    assert failed[0][3]["type"] == CONDITION and failed[0][3]["status"] == "False"
    assert watcher.failed == ["models/w", "models/new"]
    assert kube.events == [("w", EVENT_REASON), ("new", EVENT_REASON), ("r", EVENT_REASON)]
    assert kube.deleted == []


def test_the_condition_keeps_its_transition_time_while_its_status_stays() -> None:
    """A pod whose condition is already Unknown (for another reason) keeps the time it became
    so; one that was True gets a new time."""
    clock = Clock()
    unknown, ready = pod("unknown"), pod("ready")
    unknown["status"]["conditions"] = [
        {"type": CONDITION, "status": "Unknown", "reason": "Other", "lastTransitionTime": "T0"}
    ]
    ready["status"]["conditions"] = [
        {"type": CONDITION, "status": "True", "reason": "ModelReady", "lastTransitionTime": "T0"}
    ]
    kube = Kube({"gpu-1": [unknown, ready]})
    watcher = AgentDown(kube, RULES, deletions_per_second=0.1, identity="b", clock=clock)
    watcher.pass_once({"gpu-1": clock.now - 10}, lambda: True)
    since = {n: (c["reason"], c["lastTransitionTime"]) for n, c in kube.conditions}
    assert since["unknown"] == (REASON, "T0")
    assert since["ready"][0] == REASON and since["ready"][1].endswith("Z")


def passes_until_all_deleted(
    watcher: AgentDown, kube: Kube, clock: Clock, down: dict[str, float], count: int
) -> float:
    """Passes every PERIOD_SECONDS from now (each node's agent down since `down[node]`, past the
    grace); the seconds until `count` pods were deleted (a bound past which it stops)."""
    start = clock.now
    while len(kube.deleted) < count and clock.now - start < 3600:
        watcher.pass_once(down, lambda: True)
        if len(kube.deleted) >= count:
            break
        clock.now += PERIOD_SECONDS
    return clock.now - start


def test_a_whole_nodes_pods_are_deleted_within_the_replace_time_whatever_their_count() -> None:
    for count in (5, 80, 400):
        clock = Clock()
        kube = Kube({"gpu-1": [pod(f"m{i}", marked=True) for i in range(count)]})
        watcher = AgentDown(
            kube, RULES, deletions_per_second=0.1, identity="b", clock=clock, replace_seconds=60
        )
        watcher.down_nodes({f"gpu-{n}": 2000.0 for n in range(2, 11)} | {"gpu-1": 0.0}, 1.0)
        took = passes_until_all_deleted(watcher, kube, clock, {"gpu-1": clock.now - 300}, count)
        assert len(kube.deleted) == count
        # 5 pods at the floor's 0.1 a second; more within the minute (a pass before it ends).
        assert took <= (40 if count == 5 else 55), (count, took)
        assert len({uid for _, uid in kube.deleted}) == count, "each pod once"


def test_when_most_agents_are_down_at_once_only_the_cluster_wide_rate_deletes() -> None:
    clock = Clock()
    down_nodes = [f"gpu-{n}" for n in range(1, 5)]
    kube = Kube({n: [pod(f"{n}-m{i}", marked=True) for i in range(20)] for n in down_nodes})
    watcher = AgentDown(
        kube, RULES, deletions_per_second=0.1, identity="b", clock=clock, replace_seconds=60
    )
    leases = {n: 0.0 for n in down_nodes} | {"gpu-5": 5000.0}  # 4 of 5 down
    down = watcher.down_nodes(leases, clock.now)
    assert watcher.widespread(len(down))
    since = {n: clock.now - 300 for n in down_nodes}
    for _ in range(12):  # a minute of passes
        watcher.pass_once(since, lambda: True)
        clock.now += PERIOD_SECONDS
    assert len(kube.deleted) == 6, "0.1 a second cluster-wide: 1 at once, then 1 each 10 s"
    # One node of five down is a node's loss: scaled again.
    assert not watcher.widespread(1)
    assert not watcher.widespread(2), "two nodes are never an outage (kube's > 2)"
