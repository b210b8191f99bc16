"""Awake first, with room: whether a model's sleeping replicas join its Service because its
awake replicas have no room left.

A sleeping `on-demand` replica stays out of its model's Service while another replica is awake
(`binder.tritonmodels.controller`), so a request wakes one only when needed. "Needed" includes a
burst: once the awake replicas hold as many requests as they have room for, a sleeping replica
with its files on its node serves sooner (Triton's load) than the queue behind a full one
drains. So, per model:

- capacity = spec.maxConcurrency (the proxy's limit per replica, Knative's
  containerConcurrency) when set, else spec.autoscaling's concurrency `target`; without either
  there is nothing to compare with, and the sleeping replicas stay out while one is awake;
- at each reading of the proxies' counts (the built-in autoscaler's, `binder.autoscaler.loop`: the
  cumulative seconds each host's requests of the model were held, in flight or queued), the
  awake replicas' held requests averaged since the last reading;
- the sleeping replicas are admitted as soon as that average reaches capacity x the awake
  replicas' hosts (no room: a host's proxy has one limit and queue a model, whatever number of
  its replicas it serves), and leave again once it has stayed below for ROOM_SECONDS.

Pure: times are passed in; no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from binder.autoscaler.kpa import ScalingError, scaling_from
from binder.cluster.modelviews import ModelInfo

ROOM_SECONDS = 6.0
"""How long the awake replicas must have had room before the sleeping ones leave the Service
again: Knative's default panic window, the span over which its autoscaler judges a burst. Much
shorter would follow the gaps of bursty traffic read once a second (a label write each way every
few seconds, and a request sent to a replica just taken out); the stable window (60 s) would keep
waking sleeping replicas for a minute after the burst. It also bounds the label writes: a model's
sleeping hosts are relabelled at most twice per ROOM_SECONDS plus one reading."""


def capacity(model: ModelInfo) -> float:
    """Requests one replica of `model` holds before it has no room: spec.maxConcurrency, else
    spec.autoscaling's concurrency target; 0 when neither is given (or the settings cannot be
    acted on, or scale on rps)."""
    if model.concurrency:
        return float(model.concurrency)
    if model.autoscaling is None:
        return 0.0
    try:
        scaling = scaling_from(model.autoscaling)
    except ScalingError:
        return 0.0
    return scaling.target if scaling.metric == "concurrency" else 0.0


def needs_room(model: ModelInfo) -> bool:
    """Whether the model's hosts are read for room: on-demand (replicas sleep), more than one
    replica placed, and a capacity."""
    return model.template.on_demand and len(model.placed) > 1 and capacity(model) > 0


@dataclass(slots=True)
class _Seen:
    at: float
    counters: dict[str, float]
    admitted: bool = False
    room_since: float | None = None
    busy: float = 0.0


@dataclass
class Room:
    """The models whose sleeping replicas are admitted, and the readings they were judged on."""

    seconds: float = ROOM_SECONDS
    _models: dict[str, _Seen] = field(default_factory=dict)

    def admits(self, uid: str) -> bool:
        seen = self._models.get(uid)
        return seen is not None and seen.admitted

    def busy(self, uid: str) -> float:
        """The awake replicas' held requests at the last judged reading."""
        seen = self._models.get(uid)
        return seen.busy if seen is not None else 0.0

    def observe(
        self,
        uid: str,
        now: float,
        counters: Mapping[str, float],
        awake: Collection[str],
        room: float,
    ) -> bool:
        """One reading of model `uid`: `counters` (source -> cumulative held seconds), `awake`
        (the sources with an awake replica), `room` (capacity per source). Returns whether
        the sleeping replicas' admission changed. No judgement while an awake source was not
        read, this time or the last (its proxy did not answer, or it just woke)."""
        seen = self._models.get(uid)
        if seen is None:
            self._models[uid] = _Seen(now, dict(counters))
            return False
        before, elapsed = seen.counters, now - seen.at
        seen.at, seen.counters = now, dict(counters)
        if not awake or room <= 0:
            changed, seen.admitted, seen.room_since = seen.admitted, False, None
            return changed  # none awake: every sleeping replica is in the Service anyway
        if elapsed <= 0 or any(s not in counters or s not in before for s in awake):
            return False
        held = 0.0
        for source in awake:
            value, last = counters[source], before[source]
            held += value - last if value >= last else value  # a restarted proxy counts anew
        seen.busy = held / elapsed
        full = seen.busy >= room * len(awake) * (1 - 1e-9)
        if full:
            seen.room_since = None
            if not seen.admitted:
                seen.admitted = True
                return True
            return False
        if not seen.admitted:
            return False
        if seen.room_since is None:
            seen.room_since = now - elapsed  # room since the start of the span read
        if now - seen.room_since >= self.seconds:
            seen.admitted, seen.room_since = False, None
            return True
        return False

    def forget(self, uid: str) -> None:
        self._models.pop(uid, None)

    def keep(self, uids: set[str]) -> list[str]:
        """Forget the models no longer read; returns those of them that were admitted."""
        gone = [u for u in self._models if u not in uids]
        admitted = [u for u in gone if self._models[u].admitted]
        for uid in gone:
            del self._models[uid]
        return admitted
