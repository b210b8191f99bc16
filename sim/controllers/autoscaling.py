"""The HorizontalPodAutoscaler controller's arithmetic (autoscaling/v2), as a function of time.

`Autoscaler.decide` is kube-controller-manager's `reconcileAutoscaler` for one HPA and one sync:
the target's current replicas and the metrics' readings in, the replicas to scale to, the reason,
and the HPA's conditions out. It follows upstream (v1.31) where it decides:

- **Metrics.** `External` and `Pods` metrics with an `AverageValue` target propose
  `ceil(sum / target)` replicas, an `External` metric with a `Value` target
  `ceil(value / target * ready pods)`; each proposal keeps the current count while the usage ratio
  is within the tolerance (0.1) of 1. The largest proposal wins; when any metric could not be read
  the HPA does not scale down (it may still scale up on the others).
- **Bounds.** Replicas above `maxReplicas` or below `minReplicas` are brought within them first;
  a target at 0 replicas with `minReplicas` above 0 has autoscaling disabled.
- **Behaviour.** The stabilization windows (scale up: the smallest recommendation of the window,
  default 0 s; scale down: the largest, default 300 s) then the rate policies (Pods and Percent per
  period, `selectPolicy` Max, Min or Disabled; defaults: up by max(100 %, 4 pods) per 15 s, down by
  100 % per 15 s) over the scale events of each policy's period.
- **Conditions.** AbleToScale, ScalingActive and ScalingLimited with upstream's reasons.

Where the simulated autoscaler differs from the real one: metric readings are numbers handed in
(the caller queries Prometheus; there is no metrics API aggregation layer), `Resource` and
`Object` metrics and `Utilization` targets are not read (`ContainerResource` neither), and readiness
of the pods (the CPU-initialization period upstream applies to resource metrics) plays no part.

Pure; no clock (times are passed in), no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from common.conditions import Condition

JsonObject = dict[str, Any]

TOLERANCE = 0.1
"""Upstream's --horizontal-pod-autoscaler-tolerance."""
DOWNSCALE_STABILIZATION_S = 300
"""Upstream's --horizontal-pod-autoscaler-downscale-stabilization: the scale-down window."""
SCALE_UP_DEFAULT: JsonObject = {
    "stabilizationWindowSeconds": 0,
    "selectPolicy": "Max",
    "policies": [
        {"type": "Percent", "value": 100, "periodSeconds": 15},
        {"type": "Pods", "value": 4, "periodSeconds": 15},
    ],
}
SCALE_DOWN_DEFAULT: JsonObject = {
    "selectPolicy": "Max",
    "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
}


class SpecError(ValueError):
    """An HPA whose spec the autoscaler cannot act on; the message says what to change."""


@dataclass(frozen=True)
class Policy:
    kind: str  # "Pods" or "Percent"
    value: int
    period_s: int


@dataclass(frozen=True)
class Rules:
    """One direction's behaviour: its window, how it picks among policies, its policies."""

    window_s: int
    select: str  # "Max", "Min" or "Disabled"
    policies: tuple[Policy, ...]


@dataclass(frozen=True)
class MetricSpec:
    """One entry of `spec.metrics`: where the reading comes from and its target."""

    kind: str  # "External" or "Pods"
    name: str
    selector: Mapping[str, Any]
    target_kind: str  # "AverageValue" or "Value"
    target: float

    def describe(self) -> str:
        """The metric as upstream's event messages name it, for example `external metric s0`."""
        return f"{self.kind.lower()} metric {self.name}"


@dataclass(frozen=True)
class HpaSpec:
    min_replicas: int
    max_replicas: int
    metrics: tuple[MetricSpec, ...]
    up: Rules | None
    """None when the HPA has no `behavior`: upstream's older rules apply (see `Autoscaler`)."""
    down: Rules | None


def quantity(value: Any) -> float:
    """A Kubernetes quantity as a number (`500m`, `4`, `1.5`, `2k`); what metrics targets use."""
    text = str(value).strip()
    suffixes = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20}
    suffixes |= {"Gi": 2**30, "Ti": 2**40}
    for suffix in sorted(suffixes, key=len, reverse=True):
        if text.endswith(suffix) and text[: -len(suffix)]:
            return float(text[: -len(suffix)]) * suffixes[suffix]
    try:
        return float(text)
    except ValueError as e:
        raise SpecError(f"{value!r} is not a quantity (for example 1, 500m or 2k)") from e


def _rules(raw: Mapping[str, Any] | None, default: JsonObject, window_default: int) -> Rules:
    raw = raw or {}
    policies_raw = raw.get("policies") or default["policies"]
    policies = []
    for p in policies_raw:
        kind = p.get("type")
        if kind not in ("Pods", "Percent"):
            raise SpecError(f"a scaling policy's type must be Pods or Percent, not {kind!r}")
        value, period = int(p.get("value", 0)), int(p.get("periodSeconds", 0))
        if value <= 0 or not 0 < period <= 1800:
            raise SpecError(
                "a scaling policy needs a value above 0 and periodSeconds in 1..1800; "
                f"got value {value}, periodSeconds {period}"
            )
        policies.append(Policy(kind, value, period))
    window = raw.get("stabilizationWindowSeconds")
    select = raw.get("selectPolicy") or "Max"
    if select not in ("Max", "Min", "Disabled"):
        raise SpecError(f"selectPolicy must be Max, Min or Disabled, not {select!r}")
    return Rules(
        window_s=int(default.get("stabilizationWindowSeconds", window_default))
        if window is None
        else int(window),
        select=select,
        policies=tuple(policies),
    )


def _metric(raw: Mapping[str, Any]) -> MetricSpec:
    kind = raw.get("type")
    if kind == "External":
        body = raw.get("external") or {}
    elif kind == "Pods":
        body = raw.get("pods") or {}
    else:
        raise SpecError(
            f"metric type {kind!r} is not read by the simulated autoscaler: use External or Pods"
        )
    metric = body.get("metric") or {}
    target = body.get("target") or {}
    target_kind = target.get("type")
    if target_kind == "AverageValue":
        value = target.get("averageValue")
    elif target_kind == "Value" and kind == "External":
        value = target.get("value")
    else:
        raise SpecError(
            f"a {kind} metric's target must be AverageValue"
            + (" or Value" if kind == "External" else "")
            + f", not {target_kind!r}"
        )
    number = quantity(value)
    if number <= 0:
        raise SpecError(f"metric {metric.get('name')!r}: the target must be above 0, not {value}")
    return MetricSpec(
        kind=kind,
        name=str(metric.get("name") or ""),
        selector=dict(metric.get("selector") or {}),
        target_kind=target_kind,
        target=number,
    )


def parse_spec(spec: Mapping[str, Any]) -> HpaSpec:
    """An HPA's `spec` as the autoscaler reads it, with upstream's defaults filled in."""
    minimum = int(spec.get("minReplicas", 1))
    maximum = int(spec.get("maxReplicas", 0))
    if maximum < 1 or minimum < 0 or minimum > maximum:
        raise SpecError(
            f"maxReplicas must be at least 1 and minReplicas within 0..maxReplicas; "
            f"got minReplicas {minimum}, maxReplicas {maximum}"
        )
    metrics = tuple(_metric(m) for m in spec.get("metrics") or ())
    if not metrics:
        raise SpecError("the simulated autoscaler needs at least one External or Pods metric")
    behavior = spec.get("behavior")
    if behavior is None:
        return HpaSpec(minimum, maximum, metrics, None, None)
    return HpaSpec(
        min_replicas=minimum,
        max_replicas=maximum,
        metrics=metrics,
        up=_rules(behavior.get("scaleUp"), SCALE_UP_DEFAULT, 0),
        down=_rules(behavior.get("scaleDown"), SCALE_DOWN_DEFAULT, DOWNSCALE_STABILIZATION_S),
    )


@dataclass(frozen=True)
class Reading:
    """A metric read for one sync: the values of its series, or why it could not be read."""

    values: tuple[float, ...] = ()
    error: str | None = None


def propose(metric: MetricSpec, reading: Reading, current: int, ready: int) -> int:
    """The replicas one metric asks for (upstream's replica calculator); `current` above 0."""
    usage = sum(reading.values)
    if metric.target_kind == "AverageValue":
        ratio = usage / (metric.target * current)
        if abs(1.0 - ratio) <= TOLERANCE:
            return current
        return math.ceil(usage / metric.target)
    ratio = usage / metric.target
    if abs(1.0 - ratio) <= TOLERANCE:
        return current
    return math.ceil(ratio * ready)


@dataclass(frozen=True)
class Decision:
    desired: int
    """The replicas to scale to (the current count when nothing changes)."""
    reason: str
    """Why, as upstream's SuccessfulRescale event says it; empty when nothing changes."""
    conditions: tuple[Condition, ...]
    metrics: tuple[tuple[MetricSpec, float | None], ...]
    """Each metric's current value (the average per replica for AverageValue targets)."""


@dataclass
class _Event:
    at: float
    change: int


def _condition(kind: str, status: str, reason: str, message: str) -> Condition:
    return Condition(kind, status, reason, message)


_TOO_MANY = ("TooManyReplicas", "the desired replica count is more than the maximum replica count")
_TOO_FEW = ("TooFewReplicas", "the desired replica count is less than the minimum replica count")
_UP_LIMIT = (
    "ScaleUpLimit",
    "the desired replica count is increasing faster than the maximum scale rate",
)
_DOWN_LIMIT = (
    "ScaleDownLimit",
    "the desired replica count is decreasing faster than the maximum scale rate",
)
_WITHIN = ("DesiredWithinRange", "the desired count is within the acceptable range")


@dataclass
class Autoscaler:
    """One HPA's memory between syncs: its recommendations and its scale events.

    Without a `behavior` in the spec, upstream's older rules apply: the largest recommendation of
    the last 300 s bounds a scale down, and a scale up goes at most to max(2 x current, 4).
    """

    recommendations: list[tuple[float, int]] = field(default_factory=list)
    ups: list[_Event] = field(default_factory=list)
    downs: list[_Event] = field(default_factory=list)

    def decide(
        self,
        spec: HpaSpec,
        current: int,
        ready: int,
        readings: Sequence[Reading],
        now: float,
    ) -> Decision:
        """The sync at `now`: what to scale to and the conditions to write."""
        if current == 0 and spec.min_replicas != 0:
            disabled = _condition(
                "ScalingActive",
                "False",
                "ScalingDisabled",
                "scaling is disabled since the replica count of the target is zero",
            )
            return Decision(current, "", (_able(current, current), disabled), ())
        if current > spec.max_replicas or current < spec.min_replicas:
            above = current > spec.max_replicas
            desired = spec.max_replicas if above else spec.min_replicas
            reason = "Current number of replicas " + (
                "above Spec.MaxReplicas" if above else "below Spec.MinReplicas"
            )
            limited = _condition("ScalingLimited", "True", *(_TOO_MANY if above else _TOO_FEW))
            return self._applied(spec, current, desired, reason, (limited,), (), now)

        proposal, proposed_by = 0, ""
        errors: list[str] = []
        values: list[tuple[MetricSpec, float | None]] = []
        for metric, reading in zip(spec.metrics, readings, strict=True):
            if reading.error is not None or not reading.values:
                errors.append(f"{metric.describe()}: {reading.error or 'no series matched'}")
                values.append((metric, None))
                continue
            total = sum(reading.values)
            values.append(
                (metric, total / current if metric.target_kind == "AverageValue" else total)
            )
            replicas = propose(metric, reading, current, ready)
            if replicas > proposal:
                proposal, proposed_by = replicas, f"{metric.describe()} above target"
        if len(errors) == len(spec.metrics) or (errors and proposal < current):
            # Upstream: with no metric read, or a scale down that an unread metric might forbid,
            # the HPA does nothing this sync.
            failed = _condition(
                "ScalingActive", "False", "FailedGetExternalMetric", "; ".join(errors)
            )
            return Decision(current, "", (_able(current, current), failed), tuple(values))
        active = _condition(
            "ScalingActive",
            "True",
            "ValidMetricFound",
            "the HPA was able to successfully calculate a replica count from "
            + ", ".join(m.describe() for m, v in values if v is not None),
        )
        reason = proposed_by if proposal > current else "All metrics below target"
        if spec.up is None or spec.down is None:
            desired, limited = self._legacy(spec, proposal, current, now)
        else:
            stabilized = self._stabilized(spec.up, spec.down, proposal, current, now)
            desired, limited = self._rate_limited(spec, stabilized, current, now)
        return self._applied(spec, current, desired, reason, (active, limited), values, now)

    def _remember(self, proposal: int, now: float, keep_s: int) -> None:
        self.recommendations = [(at, r) for at, r in self.recommendations if at > now - keep_s]
        self.recommendations.append((now, proposal))

    def _legacy(
        self, spec: HpaSpec, proposal: int, current: int, now: float
    ) -> tuple[int, Condition]:
        cutoff = now - DOWNSCALE_STABILIZATION_S
        stabilized = max([proposal] + [r for at, r in self.recommendations if at >= cutoff])
        self._remember(proposal, now, DOWNSCALE_STABILIZATION_S)
        up_limit = max(2 * current, 4)
        ceiling, why = (
            (up_limit, _UP_LIMIT)
            if spec.max_replicas > up_limit
            else (
                spec.max_replicas,
                _TOO_MANY,
            )
        )
        if stabilized < spec.min_replicas:
            return spec.min_replicas, _condition("ScalingLimited", "True", *_TOO_FEW)
        if stabilized > ceiling:
            return ceiling, _condition("ScalingLimited", "True", *why)
        return stabilized, _condition("ScalingLimited", "False", *_WITHIN)

    def _stabilized(self, up: Rules, down: Rules, proposal: int, current: int, now: float) -> int:
        up_cutoff, down_cutoff = now - up.window_s, now - down.window_s
        lowest, highest = proposal, proposal
        for at, recommendation in self.recommendations:
            if at > up_cutoff:
                lowest = min(lowest, recommendation)
            if at > down_cutoff:
                highest = max(highest, recommendation)
        self._remember(proposal, now, max(up.window_s, down.window_s))
        return min(max(current, lowest), highest)

    def _changed(self, events: list[_Event], period_s: int, now: float) -> int:
        return sum(e.change for e in events if e.at > now - period_s)

    def _limit(self, rules: Rules, current: int, now: float, up: bool) -> int:
        """The furthest `rules` let the replicas go from `current` now (upstream's
        calculateScaleUpLimitWithScalingRules and calculateScaleDownLimitWithBehaviors)."""
        if rules.select == "Disabled":
            return current
        proposals = []
        for policy in rules.policies:
            start = (
                current
                - self._changed(self.ups, policy.period_s, now)
                + self._changed(self.downs, policy.period_s, now)
            )
            if policy.kind == "Pods":
                proposals.append(start + policy.value if up else start - policy.value)
            elif up:
                proposals.append(math.ceil(start * (1 + policy.value / 100)))
            else:
                proposals.append(int(start * (1 - policy.value / 100)))
        # Max lets the largest change through: the highest limit up, the lowest down.
        largest_change = rules.select == "Max"
        return (max if largest_change == up else min)(proposals)

    def _rate_limited(
        self, spec: HpaSpec, desired: int, current: int, now: float
    ) -> tuple[int, Condition]:
        assert spec.up is not None and spec.down is not None
        if desired > current:
            limit = max(self._limit(spec.up, current, now, up=True), current)
            ceiling, why = (
                (limit, _UP_LIMIT)
                if spec.max_replicas > limit
                else (
                    spec.max_replicas,
                    _TOO_MANY,
                )
            )
            if desired > ceiling:
                return ceiling, _condition("ScalingLimited", "True", *why)
        elif desired < current:
            limit = min(self._limit(spec.down, current, now, up=False), current)
            floor, why = (
                (limit, _DOWN_LIMIT)
                if spec.min_replicas < limit
                else (
                    spec.min_replicas,
                    _TOO_FEW,
                )
            )
            if desired < floor:
                return floor, _condition("ScalingLimited", "True", *why)
        return desired, _condition("ScalingLimited", "False", *_WITHIN)

    def _applied(
        self,
        spec: HpaSpec,
        current: int,
        desired: int,
        reason: str,
        conditions: tuple[Condition, ...],
        values: Sequence[tuple[MetricSpec, float | None]],
        now: float,
    ) -> Decision:
        if spec.up is not None:  # upstream keeps scale events only for HPAs with a behavior
            if desired > current:
                self.ups.append(_Event(now, desired - current))
            elif desired < current:
                self.downs.append(_Event(now, current - desired))
            horizon = now - 1800  # the longest period a policy may have
            self.ups = [e for e in self.ups if e.at > horizon]
            self.downs = [e for e in self.downs if e.at > horizon]
        return Decision(
            desired,
            reason if desired != current else "",
            (_able(current, desired), *conditions),
            tuple(values),
        )


def _able(current: int, desired: int) -> Condition:
    if desired != current:
        return _condition(
            "AbleToScale",
            "True",
            "SucceededRescale",
            f"the HPA controller was able to update the target scale to {desired}",
        )
    return _condition(
        "AbleToScale", "True", "ReadyForNewScale", "recommended size matches current size"
    )
