"""The one condition setter (common/conditions.py): lastTransitionTime moves only when the status
does, in metav1.Time's format, whichever shape of write uses it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from common.conditions import (
    Condition,
    ConditionSet,
    condition_for,
    condition_patch,
    find,
    now_rfc3339,
    rfc3339,
    set_condition,
)

T0 = datetime(2026, 11, 26, 10, 0, 0, 750_000, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)


def test_times_are_utc_whole_seconds_with_a_z() -> None:
    assert rfc3339(T0) == "2026-11-26T10:00:00Z"
    assert rfc3339(datetime(2026, 11, 26, 12, 0, tzinfo=timezone(timedelta(hours=2)))) == (
        "2026-11-26T10:00:00Z"
    )
    stamp = now_rfc3339()
    assert datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").year >= 2026


def test_a_status_other_than_true_false_unknown_is_refused_saying_which() -> None:
    with pytest.raises(ValueError, match=r"Ready: status 'yes' is not one of False, True, Unknown"):
        Condition("Ready", "yes", "R", "m")


def test_a_first_condition_begins_now() -> None:
    written = condition_for(Condition("Ready", "False", "NotYet", "waiting"), None, now=T0)
    assert written == {
        "type": "Ready",
        "status": "False",
        "reason": "NotYet",
        "message": "waiting",
        "lastTransitionTime": "2026-11-26T10:00:00Z",
    }


def test_a_new_reason_under_the_same_status_keeps_the_transition_time() -> None:
    old = condition_for(Condition("Ready", "False", "NotYet", "waiting"), None, now=T0)
    new = condition_for(Condition("Ready", "False", "Failed", "it broke"), old, now=T1)
    assert (new["reason"], new["message"]) == ("Failed", "it broke")
    assert new["lastTransitionTime"] == "2026-11-26T10:00:00Z"


def test_a_new_status_moves_the_transition_time() -> None:
    old = condition_for(Condition("Ready", "False", "NotYet", "waiting"), None, now=T0)
    new = condition_for(Condition("Ready", "True", "Ready", "served"), old, now=T1)
    assert new["lastTransitionTime"] == "2026-11-26T10:05:00Z"


def test_an_old_condition_without_a_time_gets_one() -> None:
    old = {"type": "Ready", "status": "False", "reason": "NotYet", "message": "waiting"}
    new = condition_for(Condition("Ready", "False", "NotYet", "waiting"), old, now=T1)
    assert new["lastTransitionTime"] == "2026-11-26T10:05:00Z"


def test_nothing_changed_keeps_the_old_whole_but_the_generation() -> None:
    old = {
        "type": "Placed",
        "status": "True",
        "reason": "AllReplicasPlaced",
        "message": "2 of 2",
        "lastTransitionTime": "2026-11-26T09:00:00Z",
        "lastProbeTime": None,
        "observedGeneration": 3,
    }
    said = Condition("Placed", "True", "AllReplicasPlaced", "2 of 2", observed_generation=4)
    new = condition_for(said, old, now=T1)
    assert new == {**old, "observedGeneration": 4}
    assert old["observedGeneration"] == 3  # the caller's list is not changed under it


def test_set_condition_replaces_in_place_and_leaves_the_others() -> None:
    other = {"type": "Autoscaling", "status": "True", "reason": "R", "message": "m"}
    ready = condition_for(Condition("Ready", "True", "Ready", "served"), None, now=T0)
    after = set_condition(
        [ready, other, "not an object"],
        Condition("Ready", "True", "Ready", "served again", observed_generation=2),
        now=T1,
    )
    assert [c["type"] for c in after] == ["Ready", "Autoscaling"]
    assert after[0]["message"] == "served again"
    assert after[0]["lastTransitionTime"] == "2026-11-26T10:00:00Z"
    assert after[0]["observedGeneration"] == 2
    assert after[1] is other


def test_set_condition_adds_a_new_type_last() -> None:
    after = set_condition(None, Condition("Ready", "Unknown", "Agent", "gone"), now=T0)
    assert after == [condition_for(Condition("Ready", "Unknown", "Agent", "gone"), None, now=T0)]
    assert find(after, "Ready") is after[0]
    assert find(after, "Placed") is None


def test_a_patch_leaves_the_time_to_the_server_while_the_status_stays() -> None:
    said = Condition("PodScheduled", "False", "Unschedulable", "no room now")
    kept = condition_patch(said, "False", now=T1)
    assert "lastTransitionTime" not in kept
    assert kept == {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "no room now",
    }
    for was in (None, "True", "Unknown"):
        assert condition_patch(said, was, now=T1)["lastTransitionTime"] == "2026-11-26T10:05:00Z"
    with_generation = Condition("Ready", "True", "R", "m", observed_generation=7)
    assert condition_patch(with_generation, "True")["observedGeneration"] == 7


SET = ConditionSet(
    happy="Ready",
    dependents=("Loaded",),
    owners={"Placed": "turn", "Ready": "turn", "Loaded": "turn", "Autoscaling": "scaler"},
)


def test_the_happy_condition_follows_its_dependents() -> None:
    own = Condition("Ready", "True", "AllReplicasReady", "0 of 0 replicas ready")
    failed = Condition("Loaded", "False", "FetchFailed", "404")
    assert SET.happy_of(own, {"Loaded": failed}) == Condition(
        "Ready", "False", "FetchFailed", "404"
    )
    pending = Condition("Loaded", "Unknown", "NotLoadedYet", "not yet")
    assert SET.happy_of(own, {"Loaded": pending}).status == "Unknown"
    loaded = Condition("Loaded", "True", "FilesLoaded", "loaded")
    assert SET.happy_of(own, {"Loaded": loaded}) == own
    # Its own verdict, when not True, stands whatever the dependents say.
    not_ready = Condition("Ready", "False", "ReplicasNotReady", "0 of 1 replicas ready")
    assert SET.happy_of(not_ready, {"Loaded": failed}) == not_ready
    with pytest.raises(ValueError, match="not this set's happy one"):
        SET.happy_of(failed, {})


def test_a_set_composes_each_owners_latest_and_refuses_an_undeclared_type() -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    old = SET.compose([], {"Autoscaling": Condition("Autoscaling", "True", "BuiltIn", "x")}, now=at)
    later = at + timedelta(minutes=5)
    ready = Condition("Ready", "True", "AllReplicasReady", "1 of 1")
    written = SET.compose(
        [*old, {"type": "Foreign", "status": "True"}], {"Ready": ready}, now=later
    )
    assert [c["type"] for c in written] == ["Ready", "Autoscaling", "Foreign"]
    assert written[1] == old[0], "another owner's condition is kept whole"
    assert SET.compose(written, {"Autoscaling": None}, now=later)[1]["type"] == "Foreign"
    with pytest.raises(ValueError, match="not declared"):
        SET.compose(written, {"Invented": ready})
    with pytest.raises(ValueError, match="no owner"):
        ConditionSet(happy="Ready", dependents=("Loaded",), owners={"Ready": "turn"})
