"""The one rule by which every part records Events (common/events.py), kube's own: Events about
one object with one reason and message are one Event, its count and last time growing; repeats
within the period are counted and go out with the next write."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from common.events import EventAggregator, node_event, pod_event


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


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


def test_a_repeat_raises_the_count_of_the_first_event_at_most_once_per_period() -> None:
    clock = Clock()
    wall = datetime(2026, 11, 26, 5, 0, 0, tzinfo=UTC)
    events = EventAggregator(repeat_seconds=60.0, clock=clock, now=lambda: wall)
    first = events.write_for(_event())
    assert first is not None and first.create
    assert first.namespace == "team-a" and first.name.startswith("p.")
    assert first.body["metadata"] == {"name": first.name, "namespace": "team-a"}
    assert first.body["count"] == 1 and first.body["reason"] == "FailedScheduling"
    clock.now += 10
    assert events.write_for(_event()) is None, "within the period: counted, not written"
    clock.now += 50
    repeat = events.write_for(_event())
    assert repeat is not None and not repeat.create
    assert repeat.name == first.name, "the same Event object"
    assert repeat.body == {"count": 3, "lastTimestamp": "2026-11-26T05:00:00Z"}


def test_another_message_reason_or_object_is_another_event() -> None:
    events = EventAggregator(repeat_seconds=0.0, clock=Clock())
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
    assert all(w is not None and w.create for w in writes)
    assert len({w.name for w in writes if w is not None}) == 4


def test_a_lost_event_or_a_failed_create_starts_again() -> None:
    events = EventAggregator(repeat_seconds=0.0, clock=Clock())
    first = events.write_for(_event())
    assert first is not None
    events.failed(first)
    again = events.write_for(_event())
    assert again is not None and again.create, "the create failed: the next one creates"
    repeat = events.write_for(_event())
    assert repeat is not None and not repeat.create and repeat.body["count"] == 2
    events.failed(repeat)
    kept = events.write_for(_event())
    assert kept is not None and kept.body["count"] == 3, "a failed count patch keeps the count"
    events.lost(kept)
    fresh = events.write_for(_event())
    assert fresh is not None and fresh.create and fresh.body["count"] == 1


def test_the_remembered_events_are_bounded() -> None:
    events = EventAggregator(repeat_seconds=0.0, remembered=2, clock=Clock())
    for message in ("a", "b", "c"):
        assert events.write_for(_event(message)) is not None
    again = events.write_for(_event("a"))
    assert again is not None and again.create, "forgotten past the bound: a new Event"
