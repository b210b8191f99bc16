"""The built-in autoscaler's arithmetic: Knative's KPA (stable and panic windows) for one scaled
object, as a function of counter samples and time.

A scaled object (a TritonModel, or a Deployment of model pods) is fed, at each tick, the
cumulative counters its proxies report (`Decider.observe`): per source (a model host or a model
pod), the seconds its requests were held (in flight or queued: the integral of concurrency) and
the requests it answered. Summed over sources, reset-safe, they make one cumulative series per
object, whose difference over a window is exact:

- observed concurrency over a window W = (held(now) - held(now - W)) / W, summed over replicas;
- observed rps over W = (requests(now) - requests(now - W)) / W.

Before a full window has passed the average is over the time observed so far. Then, as KPA does
(`Decider.decide`), with ready = max(1, ready replicas) and T = target x utilization:

- desired stable = ceil(stable average / T), desired panic = ceil(panic average / T), each
  within [floor(ready / max-scale-down-rate), ceil(ready x max-scale-up-rate)];
- panic begins (or is extended) when desired panic / ready >= panic threshold (2.0: twice the
  target); it ends once a whole stable window has passed since it was last over the threshold;
- while panicking the object scales to the largest desired panic seen since the panic began
  (never down); otherwise to desired stable; then within [minReplicas, maxReplicas]. Zero
  (minReplicas 0) only after a whole stable window without a request.

The panic window is window x panic-window-percentage / 100, at least one second (the proxies'
counters are read once a second). Keys and their Knative names: `SCALING_KEYS`.

Pure: no clock (times are passed in), no I/O.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

METRICS = ("concurrency", "rps")
KNATIVE = "autoscaling.knative.dev/"
SCALING_KEYS = {
    "metric": "metric",
    "target": "target",
    "targetUtilizationPercentage": "target-utilization-percentage",
    "minReplicas": "min-scale",
    "maxReplicas": "max-scale",
    "window": "window",
    "panicWindowPercentage": "panic-window-percentage",
    "panicThresholdPercentage": "panic-threshold-percentage",
}
"""spec.autoscaling's fields and the `autoscaling.knative.dev/` annotation of each."""
MAX_SCALE_UP_RATE = 1000.0
"""Knative's max-scale-up-rate: at most ready x this replicas in one decision."""
MAX_SCALE_DOWN_RATE = 2.0
"""Knative's max-scale-down-rate: at least ready / this replicas after one decision."""
_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?$")


class ScalingError(ValueError):
    """An autoscaling setting the autoscaler cannot act on; the message says what to change."""


@dataclass(frozen=True, slots=True)
class Scaling:
    """One object's autoscaling settings (Knative's defaults)."""

    metric: str = "concurrency"
    target: float = 100.0
    """Wanted concurrency (or requests per second) per replica."""
    utilization: float = 0.7
    """target-utilization-percentage / 100: scale at this fraction of the target."""
    min_replicas: int = 1
    max_replicas: int = 0
    """0: no upper bound."""
    window: float = 60.0
    """The stable window, seconds (6 to 3600)."""
    panic_window_percentage: float = 10.0
    panic_threshold_percentage: float = 200.0

    @property
    def panic_window(self) -> float:
        return max(1.0, self.window * self.panic_window_percentage / 100.0)


def _number(name: str, value: object, low: float, high: float) -> float:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ScalingError(f"{name} must be a number, not {value!r}") from None
    if not low <= number <= high or math.isnan(number):
        raise ScalingError(f"{name} must be between {low:g} and {high:g}, not {value!r}")
    return number


def _whole(name: str, value: object, low: int) -> int:
    number = _number(name, value, low, 2**31 - 1)
    if number != int(number) or isinstance(value, bool):
        raise ScalingError(f"{name} must be a whole number, not {value!r}")
    return int(number)


def duration(name: str, value: object) -> float:
    """Seconds of a duration written as Knative's ("60s", "1m30s", "6s"), or a number of seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value).strip())
        if not match or not any(match.groups()):
            raise ScalingError(f"{name} must be a duration such as 60s or 1m, not {value!r}")
        hours, minutes, secs = match.groups()
        seconds = int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(secs or 0)
    if not 6 <= seconds <= 3600:
        raise ScalingError(f"{name} must be from 6s to 1h (Knative's range), not {value!r}")
    return seconds


def scaling_from(fields: Mapping[str, Any], name: Mapping[str, str] | None = None) -> Scaling:
    """Settings from spec.autoscaling's `fields` (`name` maps each field to the name to show in
    an error, for annotations). Raises ScalingError saying what is wrong."""
    shown = name or {key: key for key in SCALING_KEYS}
    unknown = sorted(set(fields) - set(SCALING_KEYS))
    if unknown:
        raise ScalingError(f"unknown autoscaling settings {unknown}: known are {list(shown)}")
    metric = str(fields.get("metric", "concurrency"))
    if metric not in METRICS:
        raise ScalingError(f"{shown['metric']} must be concurrency or rps, not {metric!r}")
    if "target" not in fields:
        raise ScalingError(f"{shown['target']} is required: the wanted {metric} per replica")
    scaling = Scaling(
        metric=metric,
        target=_number(shown["target"], fields["target"], 0.01, 1e9),
        utilization=_number(
            shown["targetUtilizationPercentage"],
            fields.get("targetUtilizationPercentage", 70),
            1,
            100,
        )
        / 100.0,
        min_replicas=_whole(shown["minReplicas"], fields.get("minReplicas", 1), 0),
        max_replicas=_whole(shown["maxReplicas"], fields.get("maxReplicas", 0), 0),
        window=duration(shown["window"], fields.get("window", "60s")),
        panic_window_percentage=_number(
            shown["panicWindowPercentage"], fields.get("panicWindowPercentage", 10), 1, 100
        ),
        panic_threshold_percentage=_number(
            shown["panicThresholdPercentage"],
            fields.get("panicThresholdPercentage", 200),
            110,
            1000,
        ),
    )
    if scaling.max_replicas and scaling.min_replicas > scaling.max_replicas:
        raise ScalingError(
            f"{shown['minReplicas']} ({scaling.min_replicas}) is above "
            f"{shown['maxReplicas']} ({scaling.max_replicas})"
        )
    return scaling


def scaling_from_annotations(annotations: Mapping[str, str]) -> Scaling | None:
    """A Deployment's settings from its `autoscaling.knative.dev/*` annotations; None when it
    has no `autoscaling.knative.dev/target` (the built-in autoscaler leaves it alone)."""
    by_annotation = {annotation: key for key, annotation in SCALING_KEYS.items()}
    fields = {
        by_annotation[key[len(KNATIVE) :]]: value
        for key, value in annotations.items()
        if key.startswith(KNATIVE) and key[len(KNATIVE) :] in by_annotation
    }
    if "target" not in fields:
        return None
    return scaling_from(fields, {key: KNATIVE + a for key, a in SCALING_KEYS.items()})


class Decision(NamedTuple):
    """What `Decider.decide` says: the replicas to scale to, whether it panics, and the two
    observed averages (total over replicas) it decided on."""

    replicas: int
    panicking: bool
    stable: float
    panic: float


class _Window:
    """Cumulative samples (time, value) covering the last `seconds`: the oldest kept is the
    newest at or before now - seconds, so the difference spans the whole window once it can."""

    __slots__ = ("samples",)

    def __init__(self) -> None:
        self.samples: deque[tuple[float, float]] = deque()

    def add(self, now: float, total: float, seconds: float) -> None:
        samples = self.samples
        samples.append((now, total))
        while len(samples) >= 2 and samples[1][0] <= now - seconds:
            samples.popleft()

    def average(self) -> float | None:
        samples = self.samples
        if len(samples) < 2:
            return None
        (start, first), (end, last) = samples[0], samples[-1]
        return (last - first) / (end - start) if end > start else None

    def span(self) -> float:
        """Seconds the kept samples cover."""
        return self.samples[-1][0] - self.samples[0][0] if self.samples else 0.0


class Decider:
    """One scaled object's windows and panic state; O(1) amortised per tick."""

    __slots__ = ("_last", "_max_panic", "_panic", "_panic_since", "_stable", "_total")

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._total = 0.0
        self._stable = _Window()
        self._panic = _Window()
        self._panic_since: float | None = None
        self._max_panic = 0

    def observe(self, now: float, counters: Mapping[str, float], scaling: Scaling) -> None:
        """Add the sources' cumulative counters (held seconds, or requests, by source) read at
        `now`. A source seen for the first time adds nothing yet; one whose counter went down
        (its proxy restarted) adds its new value; one that is gone is forgotten. A value that
        is no count (negative, NaN, infinite) is ignored, and the running total never becomes
        non-finite, so one bad reading cannot stop the decisions for good."""
        last = self._last
        added = 0.0
        for source, value in counters.items():
            if not math.isfinite(value) or value < 0:
                continue  # never a count: the source is as if not read
            before = last.get(source)
            if before is not None:
                added += value - before if value >= before else value
            last[source] = value
        if len(last) > len(counters):
            for source in [s for s in last if s not in counters]:
                del last[source]
        if math.isfinite(self._total + added):
            self._total += added
        self._stable.add(now, self._total, scaling.window)
        self._panic.add(now, self._total, scaling.panic_window)

    @property
    def panicking(self) -> bool:
        return self._panic_since is not None

    def decide(self, now: float, scaling: Scaling, ready: int, current: int) -> Decision:
        """The replicas to scale to, from `ready` replicas serving and `current` asked for
        (kept while fewer than two samples were observed)."""
        stable, panic = self._stable.average(), self._panic.average()
        if stable is None or panic is None:
            return Decision(_bounded(current, scaling), self.panicking, 0.0, 0.0)
        ready_count = max(1, ready)
        up = math.ceil(MAX_SCALE_UP_RATE * ready_count)
        down = math.floor(ready_count / MAX_SCALE_DOWN_RATE)
        per_replica = scaling.target * scaling.utilization
        wanted_stable = math.ceil(round(stable / per_replica, 9))
        wanted_panic = math.ceil(round(panic / per_replica, 9))
        desired_stable = min(max(wanted_stable, down), up)
        desired_panic = min(max(wanted_panic, down), up)
        over = wanted_panic / ready_count >= scaling.panic_threshold_percentage / 100.0
        if over:
            self._panic_since = now
        elif self._panic_since is not None and now - self._panic_since >= scaling.window:
            self._panic_since = None
            self._max_panic = 0
        desired = desired_stable
        if desired == 0 and self._stable.span() < scaling.window:
            desired = 1  # zero only after a whole window without a request
        if self._panic_since is not None:
            self._max_panic = max(self._max_panic, desired_panic, current)
            desired = self._max_panic
        return Decision(_bounded(desired, scaling), self.panicking, stable, panic)


def _bounded(replicas: int, scaling: Scaling) -> int:
    if scaling.max_replicas:
        replicas = min(replicas, scaling.max_replicas)
    return max(replicas, scaling.min_replicas)
