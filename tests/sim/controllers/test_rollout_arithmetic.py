"""The Deployment and ReplicaSet controllers' arithmetic, as kube-controller-manager's: pure
functions over objects written here, so each rule is checked exactly."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from sim.controllers import deployment, replicaset
from sim.controllers.podtemplate import HASH_LABEL, rfc3339, template_hash

Obj = dict[str, Any]
NOW = 1_800_000_000.0
TEMPLATE: Obj = {
    "metadata": {"labels": {"app": "web"}, "annotations": {"model-uri": "v1"}},
    "spec": {"containers": [{"name": "c", "image": "x"}]},
}


def make_deployment(
    replicas: int = 1,
    surge: int | str = "25%",
    unavailable: int | str = "25%",
    *,
    strategy: str = "RollingUpdate",
    template: Obj | None = None,
    status: Obj | None = None,
    deadline: int = 600,
) -> Obj:
    spec: Obj = {
        "replicas": replicas,
        "selector": {"matchLabels": {"app": "web"}},
        "template": copy.deepcopy(template or TEMPLATE),
        "strategy": {"type": strategy},
        "revisionHistoryLimit": 10,
        "progressDeadlineSeconds": deadline,
    }
    if strategy == "RollingUpdate":
        spec["strategy"]["rollingUpdate"] = {"maxSurge": surge, "maxUnavailable": unavailable}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "ns", "uid": "d-uid", "generation": 1},
        "spec": spec,
        "status": status or {},
    }


def make_rs(
    d: Obj, template: Obj, replicas: int, available: int, *, revision: int, age: int
) -> Obj:
    """A ReplicaSet of `d` as the controller makes them, with its status as given."""
    rs = deployment.new_replica_set(dict(d, spec=dict(d["spec"], template=template)), revision, 0)
    rs["metadata"]["uid"] = f"rs-{revision}"
    rs["metadata"]["creationTimestamp"] = rfc3339(NOW - 1000 + age)
    rs["metadata"]["generation"] = 1
    rs["spec"]["replicas"] = replicas
    rs["status"] = {
        "replicas": replicas,
        "readyReplicas": available,
        "availableReplicas": available,
        "observedGeneration": 1,
    }
    return rs


def new_template(version: str) -> Obj:
    template = copy.deepcopy(TEMPLATE)
    template["metadata"]["annotations"]["model-uri"] = version
    return template


@pytest.mark.parametrize(
    ("replicas", "surge", "unavailable", "expected"),
    [
        (1, "25%", "25%", (1, 0)),  # the default on one replica: surge rounds up, unavailable down
        (10, "25%", "25%", (3, 2)),
        (4, "50%", "0%", (2, 0)),
        (3, 0, "10%", (0, 1)),  # both round to 0: unavailable becomes 1
        (5, 2, 1, (2, 1)),
        (7, "100%", "100%", (7, 7)),
    ],
)
def test_max_surge_rounds_up_and_max_unavailable_rounds_down(
    replicas: int, surge: int | str, unavailable: int | str, expected: tuple[int, int]
) -> None:
    assert deployment.fenceposts(make_deployment(replicas, surge, unavailable)) == expected


def test_max_unavailable_is_capped_at_replicas_and_zero_for_recreate() -> None:
    assert deployment.max_unavailable(make_deployment(2, 0, 5)) == 2
    assert deployment.max_unavailable(make_deployment(0)) == 0
    assert deployment.max_unavailable(make_deployment(3, strategy="Recreate")) == 0


def test_the_template_hash_follows_the_template_and_the_collision_count() -> None:
    digest = template_hash(TEMPLATE)
    assert digest == template_hash(copy.deepcopy(TEMPLATE))
    assert set(digest) <= set("bcdfghjklmnpqrstvwxz2456789") and 1 <= len(digest) <= 10
    assert template_hash(new_template("v2")) != digest
    assert template_hash(TEMPLATE, 1) not in (digest, template_hash(TEMPLATE, 2))


def test_a_new_template_gets_a_replica_set_named_by_its_hash_with_the_next_revision() -> None:
    d = make_deployment(1, template=new_template("v2"))
    old = make_rs(d, TEMPLATE, 1, 1, revision=4, age=0)
    step = deployment.sync(d, [old], {}, NOW)
    created = step.create
    assert created is not None
    digest = template_hash(d["spec"]["template"])
    assert created["metadata"]["name"] == f"web-{digest}"
    assert created["spec"]["template"]["metadata"]["labels"][HASH_LABEL] == digest
    assert created["spec"]["selector"]["matchLabels"] == {"app": "web", HASH_LABEL: digest}
    assert created["metadata"]["annotations"][deployment.REVISION] == "5"
    assert created["metadata"]["ownerReferences"][0]["uid"] == "d-uid"
    # The default strategy on one replica: the surge pod comes at once, next to the old one.
    assert created["spec"]["replicas"] == 1
    assert step.annotations == {deployment.REVISION: "5"}
    assert step.status is not None
    progressing = [c for c in step.status["conditions"] if c["type"] == "Progressing"]
    assert progressing[0]["reason"] == "NewReplicaSetCreated"


def _apply(rss: list[Obj], step: deployment.Rollout) -> list[Obj]:
    by_name = {rs["metadata"]["name"]: rs for rs in rss}
    by_name.update(step.updates)
    return list(by_name.values())


def test_one_replica_with_the_default_strategy_keeps_the_old_pod_until_the_new_is_available() -> (
    None
):
    d = make_deployment(1, template=new_template("v2"))
    old = make_rs(d, TEMPLATE, 1, 1, revision=1, age=0)
    new = make_rs(d, new_template("v2"), 1, 0, revision=2, age=10)
    # New pod not available yet: maxUnavailable 0 keeps the old one.
    step = deployment.sync(d, [old, new], {}, NOW)
    assert step.create is None and all(
        rs["spec"]["replicas"] == 1 for rs in _apply([old, new], step)
    )
    # Available: the old ReplicaSet goes to 0.
    new["status"]["availableReplicas"] = new["status"]["readyReplicas"] = 1
    step = deployment.sync(d, [old, new], {}, NOW)
    assert step.updates[old["metadata"]["name"]]["spec"]["replicas"] == 0
    annotations = step.updates[old["metadata"]["name"]]["metadata"]["annotations"]
    assert annotations[deployment.DESIRED_REPLICAS] == "1"
    assert annotations[deployment.MAX_REPLICAS] == "2"


def test_ten_replicas_roll_within_surge_and_unavailable_step_by_step() -> None:
    d = make_deployment(10, template=new_template("v2"))
    old = make_rs(d, TEMPLATE, 10, 10, revision=1, age=0)
    created = deployment.sync(d, [old], {}, NOW).create
    assert created is not None and created["spec"]["replicas"] == 3  # 10 + 3 surge
    new = make_rs(d, new_template("v2"), 3, 0, revision=2, age=10)
    # 13 pods, 3 of them unavailable, at least 8 available: old may lose 2.
    step = deployment.sync(d, [old, new], {}, NOW)
    assert {n: rs["spec"]["replicas"] for n, rs in step.updates.items()} == {
        old["metadata"]["name"]: 8
    }
    old = step.updates[old["metadata"]["name"]]
    old["status"]["replicas"] = old["status"]["availableReplicas"] = 8
    # Then the new one grows back to the surge limit: 8 + 5 = 13.
    step = deployment.sync(d, [old, new], {}, NOW)
    assert step.updates[new["metadata"]["name"]]["spec"]["replicas"] == 5


def test_old_replica_sets_lose_their_unhealthy_replicas_first() -> None:
    d = make_deployment(4, 1, 1, template=new_template("v3"))
    oldest = make_rs(d, TEMPLATE, 2, 2, revision=1, age=0)
    older = make_rs(d, new_template("v2"), 2, 0, revision=2, age=5)  # its 2 pods crash
    new = make_rs(d, new_template("v3"), 1, 0, revision=3, age=10)
    step = deployment.sync(d, [oldest, older, new], {}, NOW)
    # 5 pods, at least 3 available, the new one unavailable: 1 may go; the broken ones cost no
    # availability, so they go first (oldest ReplicaSet first among unhealthy ones).
    replicas = {n: rs["spec"]["replicas"] for n, rs in step.updates.items()}
    assert replicas == {older["metadata"]["name"]: 1}


def test_recreate_removes_every_old_pod_before_creating_the_new_replica_set() -> None:
    d = make_deployment(2, strategy="Recreate", template=new_template("v2"))
    old = make_rs(d, TEMPLATE, 2, 2, revision=1, age=0)
    step = deployment.sync(d, [old], {}, NOW)
    assert step.create is None and step.updates[old["metadata"]["name"]]["spec"]["replicas"] == 0
    old = step.updates[old["metadata"]["name"]]
    old["status"] = {"replicas": 0, "availableReplicas": 0, "observedGeneration": 1}
    terminating = {
        "metadata": {"name": "web-x", "deletionTimestamp": rfc3339(NOW)},
        "status": {"phase": "Running"},
    }
    step = deployment.sync(d, [old], {old["metadata"]["uid"]: [terminating]}, NOW)
    assert step.create is None, "a terminating old pod still holds the new ReplicaSet back"
    created = deployment.sync(d, [old], {old["metadata"]["uid"]: []}, NOW).create
    assert created is not None and created["spec"]["replicas"] == 2


def _progressing(status: Obj | None) -> Obj:
    assert status is not None
    return next(c for c in status["conditions"] if c["type"] == "Progressing")


def test_no_progress_for_progress_deadline_seconds_is_progress_deadline_exceeded() -> None:
    started = NOW - 100
    condition = {
        "type": "Progressing",
        "status": "True",
        "reason": "ReplicaSetUpdated",
        "message": "",
        "lastUpdateTime": rfc3339(started),
        "lastTransitionTime": rfc3339(started),
    }
    status = {
        "observedGeneration": 1,
        "replicas": 2,
        "updatedReplicas": 1,
        "readyReplicas": 1,
        "availableReplicas": 1,
        "unavailableReplicas": 1,
        "conditions": [condition],
    }
    d = make_deployment(1, template=new_template("v2"), status=status, deadline=60)
    old = make_rs(d, TEMPLATE, 1, 1, revision=1, age=0)
    new = make_rs(d, new_template("v2"), 1, 0, revision=2, age=10)
    # Before the deadline nothing changes, and the controller comes back once it has passed.
    before = deployment.sync(d, [old, new], {}, started + 59)
    assert before.status is None or _progressing(before.status)["reason"] == "ReplicaSetUpdated"
    assert before.recheck_at == started + 61
    after = deployment.sync(d, [old, new], {}, started + 61)
    timed_out = _progressing(after.status)
    assert (timed_out["status"], timed_out["reason"]) == ("False", "ProgressDeadlineExceeded")
    assert (
        timed_out["message"] == f'ReplicaSet "{new["metadata"]["name"]}" has timed out progressing.'
    )
    # Progress at any time moves lastUpdateTime (the deadline counts from the last progress).
    new["status"]["readyReplicas"] = 1
    moved = _progressing(deployment.sync(d, [old, new], {}, started + 61).status)
    assert moved["reason"] == "ReplicaSetUpdated" and moved["lastUpdateTime"] == rfc3339(
        started + 61
    )


def test_a_complete_rollout_is_new_replica_set_available_and_prunes_history() -> None:
    d = make_deployment(1, template=new_template("v9"))
    d["spec"]["revisionHistoryLimit"] = 1
    olds = [make_rs(d, new_template(f"v{i}"), 0, 0, revision=i, age=i) for i in range(1, 4)]
    new = make_rs(d, new_template("v9"), 1, 1, revision=9, age=20)
    d["status"] = {
        "observedGeneration": 1,
        "replicas": 1,
        "updatedReplicas": 1,
        "availableReplicas": 1,
    }
    step = deployment.sync(d, [*olds, new], {}, NOW)
    assert step.delete == [olds[0]["metadata"]["name"], olds[1]["metadata"]["name"]]
    done = _progressing(step.status)
    assert (done["status"], done["reason"]) == ("True", "NewReplicaSetAvailable")
    assert step.recheck_at is None


def test_rolling_back_to_an_old_template_gives_its_replica_set_the_next_revision() -> None:
    d = make_deployment(1, template=TEMPLATE)
    first = make_rs(d, TEMPLATE, 0, 0, revision=1, age=0)
    second = make_rs(d, new_template("v2"), 1, 1, revision=2, age=10)
    step = deployment.sync(d, [first, second], {}, NOW)
    assert step.create is None
    revived = step.updates[first["metadata"]["name"]]
    assert revived["metadata"]["annotations"][deployment.REVISION] == "3"
    assert revived["spec"]["replicas"] == 1
    assert step.annotations == {deployment.REVISION: "3"}


def _pod(name: str, *, ready_at: float | None, node: str = "n1", **meta: Any) -> Obj:
    conditions = (
        [{"type": "Ready", "status": "True", "lastTransitionTime": rfc3339(ready_at)}]
        if ready_at is not None
        else []
    )
    return {
        "metadata": {
            "name": name,
            "creationTimestamp": rfc3339(NOW - 500),
            "ownerReferences": [{"kind": "ReplicaSet", "uid": "rs-1", "controller": True}],
            **meta,
        },
        "spec": {"nodeName": node},
        "status": {"phase": "Running" if node else "Pending", "conditions": conditions},
    }


def test_a_replica_set_counts_neither_terminating_nor_finished_pods() -> None:
    d = make_deployment(2)
    rs = make_rs(d, TEMPLATE, 2, 2, revision=1, age=0)
    rs["metadata"]["uid"] = "rs-1"
    pods = [
        _pod("a", ready_at=NOW - 100),
        _pod("b", ready_at=NOW - 100, deletionTimestamp=rfc3339(NOW + 30)),
        _pod("c", ready_at=None),
    ]
    pods[2]["status"]["phase"] = "Failed"
    plan = replicaset.plan(rs, pods, NOW)
    assert plan.create == 1 and plan.delete == ()
    assert plan.status["replicas"] == 1
    assert plan.status["readyReplicas"] == plan.status["availableReplicas"] == 1


def test_min_ready_seconds_delays_availability_and_says_when_to_look_again() -> None:
    d = make_deployment(1)
    rs = make_rs(d, TEMPLATE, 1, 0, revision=1, age=0)
    rs["metadata"]["uid"] = "rs-1"
    rs["spec"]["minReadySeconds"] = 30
    pods = [_pod("a", ready_at=NOW - 10)]
    plan = replicaset.plan(rs, pods, NOW)
    assert (plan.status["readyReplicas"], plan.status["availableReplicas"]) == (1, 0)
    assert plan.recheck_at == NOW + 20
    assert replicaset.plan(rs, pods, NOW + 21).status["availableReplicas"] == 1


def test_a_replica_set_deletes_the_least_useful_pods_first() -> None:
    d = make_deployment(1)
    rs = make_rs(d, TEMPLATE, 1, 1, revision=1, age=0)
    rs["metadata"]["uid"] = "rs-1"
    pods = [
        _pod("ready-long", ready_at=NOW - 1000),
        _pod("ready-recently", ready_at=NOW - 10),
        _pod("not-ready", ready_at=None),
        _pod("unscheduled", ready_at=None, node=""),
        _pod(
            "cheap",
            ready_at=NOW - 1000,
            annotations={replicaset.DELETION_COST: "-5"},
        ),
    ]
    rs["spec"]["replicas"] = 1
    plan = replicaset.plan(rs, pods, NOW)
    assert plan.delete == ("unscheduled", "not-ready", "cheap", "ready-recently")
