"""Pod events reach the agent's loop in turns by namespace, one waiting event per pod: a
namespace rewriting its pods as fast as it can has one pod's event taken per round, and the
neighbour's event is taken in the first round after it came."""

from __future__ import annotations

from typing import Any

from agent.pods.podturns import PodTurns


def pod(namespace: str, name: str, version: int = 0) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name, "resourceVersion": str(version)}}


def test_a_churning_namespace_takes_one_turn_a_round_and_its_rewrites_collapse() -> None:
    turns = PodTurns()
    assert turns.put("ADDED", pod("team-a", "host", 0)) is True  # the loop is asked once
    for version in range(1, 1000):
        assert turns.put("MODIFIED", pod("team-a", "host", version)) is False
    for number in range(50):
        turns.put("ADDED", pod("team-a", f"p{number}"))
    turns.put("MODIFIED", pod("team-b", "neighbour"))
    listed, events, more = turns.take(2)
    assert listed is None and more
    # A thousand writes of the host: one event, the latest state, still an addition.
    assert [(kind, obj["metadata"]["resourceVersion"]) for kind, obj in events[:1]] == [
        ("ADDED", "999")
    ]
    # The neighbour's turn comes next, before team-a's 50 other pods.
    assert events[1][1]["metadata"]["name"] == "neighbour"
    listed, events, more = turns.take(100)
    assert len(events) == 50 and not more
    # Nothing waits: the next event asks the loop again.
    assert turns.put("DELETED", pod("team-a", "host")) is True


def test_a_list_replaces_the_events_it_includes() -> None:
    turns = PodTurns()
    turns.put("MODIFIED", pod("team-a", "host", 1))
    assert turns.listed([pod("team-a", "host", 2)]) is False  # a take is already asked for
    turns.put("MODIFIED", pod("team-a", "host", 3))
    listed, events, more = turns.take(10)
    assert listed is not None and [p["metadata"]["resourceVersion"] for p in listed] == ["2"]
    assert [obj["metadata"]["resourceVersion"] for _, obj in events] == ["3"]
    assert not more
