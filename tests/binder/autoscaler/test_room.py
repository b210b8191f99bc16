"""Awake first, with room (binder/autoscaler/room.py) on fake time: a model's sleeping replicas join
its Service once its awake replicas hold their capacity, and leave again only after ROOM_SECONDS
with room; the capacity comes from maxConcurrency, else the autoscaler's concurrency target."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from binder.autoscaler.room import ROOM_SECONDS, Room, capacity, needs_room
from binder.autoscaler.targets import host_sources
from binder.cluster.modelviews import ModelInfo, model_from_api
from common.contract import Keys

KEYS = Keys()


def model(**spec: Any) -> ModelInfo:
    obj = {
        "apiVersion": "tritonshare.io/v1alpha1",
        "kind": "TritonModel",
        "metadata": {"name": "m", "namespace": "team-a", "uid": "u1", "generation": 1},
        "spec": {"storageUri": "s3://b/m", "gpuMemory": "1Gi", "replicas": 2} | spec,
    }
    return model_from_api(obj, KEYS, "tritonshare")


class Readings:
    """Model u1 with an awake replica on node a (capacity 2) and a sleeping one on b, read once
    a second: `tick` holds `concurrency` requests at a for `seconds` readings and says, at each,
    whether the sleeping one is admitted."""

    def __init__(self, room: float = 2.0) -> None:
        self.room = Room()
        self.capacity = room
        self.now = 0.0
        self.held = 0.0
        self.flips = 0
        self.room.observe("u1", self.now, {"a": 0.0, "b": 0.0}, {"a"}, room)

    def tick(self, concurrency: float, seconds: int = 1) -> list[bool]:
        admitted = []
        for _ in range(seconds):
            self.now += 1.0
            self.held += concurrency
            counters = {"a": self.held, "b": 0.0}
            self.flips += self.room.observe("u1", self.now, counters, {"a"}, self.capacity)
            admitted.append(self.room.admits("u1"))
        return admitted


def test_a_full_awake_replica_admits_the_sleeping_one_at_the_next_reading() -> None:
    readings = Readings()
    assert readings.tick(1.0, seconds=10) == [False] * 10, "room: stays out"
    assert readings.tick(1.99) == [False], "below capacity"
    assert readings.tick(2.0) == [True], "capacity reached: admitted at once"
    assert readings.room.busy("u1") == 2.0


def test_it_leaves_only_after_room_seconds_with_room_so_label_writes_are_bounded() -> None:
    readings = Readings()
    readings.tick(5.0)
    # Bursty traffic: full one second in three stays admitted all along, with one flip.
    assert all(readings.tick(c)[0] for c in [0.5, 0.5, 3.0] * 10)
    assert readings.flips == 1
    seconds = int(ROOM_SECONDS)
    assert readings.tick(0.5, seconds=seconds) == [True] * (seconds - 1) + [False]
    assert readings.flips == 2
    # A second of idling then a burst again: at most two flips per ROOM_SECONDS + a reading.
    for _ in range(5):
        readings.tick(0.0)
        readings.tick(4.0)
        readings.tick(0.0, seconds=seconds)
    assert readings.flips == 2 + 2 * 5


def test_no_judgement_without_a_reading_of_every_awake_host() -> None:
    room = Room()
    room.observe("u1", 0.0, {"a": 0.0}, {"a"}, 1.0)
    # a did not answer: nothing judged however busy b looks.
    assert not room.observe("u1", 1.0, {"b": 50.0}, {"a"}, 1.0)
    assert not room.observe("u1", 2.0, {"a": 10.0}, {"a"}, 1.0), "a's last reading missing"
    assert room.observe("u1", 3.0, {"a": 20.0}, {"a"}, 1.0) and room.admits("u1")
    # Its proxy restarted (its counter went down): it counts anew, not negatively.
    assert not room.observe("u1", 4.0, {"a": 3.0}, {"a"}, 1.0) and room.admits("u1")
    # None awake: every sleeping replica is in the Service anyway; nothing is left admitted.
    assert room.observe("u1", 5.0, {"a": 30.0}, set(), 1.0) and not room.admits("u1")


def test_two_awake_hosts_have_room_until_both_are_full() -> None:
    room = Room()
    room.observe("u1", 0.0, {"a": 0.0, "b": 0.0}, {"a", "b"}, 2.0)
    assert not room.observe("u1", 1.0, {"a": 3.0, "b": 0.5}, {"a", "b"}, 2.0)
    assert room.observe("u1", 2.0, {"a": 6.0, "b": 1.5}, {"a", "b"}, 2.0)


def test_models_no_longer_read_are_forgotten_and_the_admitted_ones_said() -> None:
    room = Room()
    for uid in ("u1", "u2"):
        room.observe(uid, 0.0, {"a": 0.0}, {"a"}, 1.0)
    room.observe("u1", 1.0, {"a": 5.0}, {"a"}, 1.0)
    assert room.keep({"u2"}) == ["u1"]
    assert not room.admits("u1")
    assert room.keep(set()) == []


def test_capacity_is_max_concurrency_else_the_concurrency_target() -> None:
    assert capacity(model()) == 0.0
    assert capacity(model(maxConcurrency=4)) == 4.0
    assert capacity(model(autoscaling={"target": 3})) == 3.0
    assert capacity(model(maxConcurrency=4, autoscaling={"target": 3})) == 4.0
    assert capacity(model(autoscaling={"target": 3, "metric": "rps"})) == 0.0
    assert capacity(model(autoscaling={"target": "many"})) == 0.0


def test_only_on_demand_models_with_replicas_to_spare_and_a_capacity_are_read() -> None:
    placed = {0: ("a", "GPU-a", "p"), 1: ("b", "GPU-b", "p")}
    found = replace(model(residency="on-demand", maxConcurrency=2), placed=placed)
    assert needs_room(found)
    assert not needs_room(replace(found, placed={0: placed[0]}))
    assert not needs_room(replace(model(residency="on-demand"), placed=placed))
    assert not needs_room(replace(model(maxConcurrency=2), placed=placed))


def test_a_host_with_two_replicas_of_the_model_is_read_once() -> None:
    placed = {0: ("a", "GPU-a", "p"), 1: ("a", "GPU-a", "p"), 2: ("b", "GPU-b", "p")}
    found = replace(model(replicas=3), placed=placed)
    hosts: dict[str, dict[str, Any]] = {"a": {"status": {"podIP": "10.0.0.1"}}, "b": {}}
    assert list(host_sources(found, hosts)) == [("a", "10.0.0.1", "m")]
