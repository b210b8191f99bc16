"""The one rule by which every part records Events (common/events.py), kube's own: Events about
one object with one reason and message are one Event, its count and last time growing."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from common.events import EventAggregator, event, node_event, node_ref, pod_event


def _event(
    message: str = "0/3 nodes are available", reason: str = "FailedScheduling"
) -> dict[str, Any]:
    return pod_event(
        "team-a",
        "p",
        "uid-1",
        reason=reason,
        message=message,
        component="tritonshare",
        instance="binder-0",
        action="Scheduling",
    )


def test_a_repeat_raises_the_count_and_last_time_of_the_first_event() -> None:
    wall = [datetime(2026, 11, 26, 5, 0, 0, tzinfo=UTC)]
    events = EventAggregator(now=lambda: wall[0])
    first = events.write_for(_event())
    assert first.create
    assert first.namespace == "team-a" and first.name.startswith("p.")
    assert first.body["metadata"] == {"name": first.name, "namespace": "team-a"}
    assert first.body["count"] == 1 and first.body["reason"] == "FailedScheduling"
    wall[0] = datetime(2026, 11, 26, 5, 1, 0, tzinfo=UTC)
    repeat = events.write_for(_event())
    assert not repeat.create
    assert repeat.name == first.name, "the same Event object"
    assert repeat.body == {"count": 2, "lastTimestamp": "2026-11-26T05:01:00Z"}
    assert events.write_for(_event()).body["count"] == 3


def test_another_message_reason_or_object_is_another_event() -> None:
    events = EventAggregator()
    first = events.write_for(_event())
    other_message = events.write_for(_event("1/3 nodes are available"))
    other_reason = events.write_for(_event(reason="Preempted"))
    node = events.write_for(
        node_event(
            "p",
            reason="FailedScheduling",
            message="0/3 nodes are available",
            component="tritonshare",
            instance="binder-0",
            action="Scheduling",
        )
    )
    writes = [first, other_message, other_reason, node]
    assert all(w.create for w in writes)
    assert len({w.name for w in writes}) == 4


def test_a_lost_event_or_a_failed_create_starts_again() -> None:
    events = EventAggregator()
    first = events.write_for(_event())
    events.failed(first)
    again = events.write_for(_event())
    assert again.create, "the create failed: the next one creates"
    repeat = events.write_for(_event())
    assert not repeat.create and repeat.body["count"] == 2
    events.failed(repeat)
    kept = events.write_for(_event())
    assert kept.body["count"] == 3, "a failed count patch keeps the count"
    events.lost(kept)
    fresh = events.write_for(_event())
    assert fresh.create and fresh.body["count"] == 1


def test_the_remembered_events_are_bounded() -> None:
    events = EventAggregator(remembered=2)
    for message in ("a", "b", "c"):
        assert events.write_for(_event(message)).create
    again = events.write_for(_event("a"))
    assert again.create, "forgotten past the bound: a new Event"


def test_any_object_s_event_has_one_shape_and_a_node_s_goes_to_default() -> None:
    when = datetime(2026, 11, 26, 5, 0, 0, tzinfo=UTC)
    model = {"apiVersion": "tritonshare.io/v1alpha1", "kind": "TritonModel"}
    model |= {"namespace": "team-a", "name": "m", "uid": "uid-m"}
    body = event(
        model,
        reason="Preempted",
        message="x" * 2000,
        event_type="Normal",
        component="tritonshare",
        instance="binder-0",
        action="Scheduling",
        now=when,
    )
    assert body["involvedObject"] == model and body["metadata"]["namespace"] == "team-a"
    assert (body["type"], len(body["message"]), body["lastTimestamp"]) == (
        "Normal",
        1024,
        "2026-11-26T05:00:00Z",
    )
    fields: dict[str, Any] = {"component": "c", "instance": "i", "action": "a"}
    node = event(node_ref("gpu-1"), reason="R", message="m", **fields)
    assert node["metadata"]["namespace"] == "default" and node["type"] == "Warning"
    assert node == node_event("gpu-1", reason="R", message="m", now=None, **fields) | {
        "firstTimestamp": node["firstTimestamp"],
        "lastTimestamp": node["lastTimestamp"],
    }


def test_after_an_answer_only_a_gone_repeat_is_written_again_as_new() -> None:
    events = EventAggregator()
    first = events.write_for(_event())
    assert events.answered(first, found=True) is None
    repeat = events.write_for(_event())
    assert not repeat.create
    again = events.answered(repeat, found=False)
    assert again is not None and again.create and again.body["count"] == 1
    assert again.body["reason"] == "FailedScheduling"
    assert events.answered(again, found=True) is None
    # A create answered 404 (its namespace gone) is forgotten, not tried again.
    gone = events.write_for(_event("other"))
    assert events.answered(gone, found=False) is None
    assert events.write_for(_event("other")).create
