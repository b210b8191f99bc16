"""The built-in autoscaler's arithmetic (binder/autoscaler/kpa.py) on fake time: KPA's stable and
panic windows, scale-down after the window, bounds, the rps metric and the settings' checks."""

from __future__ import annotations

import pytest

from binder.autoscaler.kpa import (
    Decider,
    Scaling,
    ScalingError,
    scaling_from,
    scaling_from_annotations,
)

SEED = Scaling(target=1.0, max_replicas=5)
"""The seed's experiment: target concurrency 1 (70 % utilization), at most 5 replicas."""


class Replicas:
    """A scaled object on fake time: `tick` feeds one second of `concurrency` requests held at
    each ready replica's proxy (and `rps` answered), decides, and applies the decision at once
    (every asked replica ready)."""

    def __init__(self, scaling: Scaling, replicas: int = 1) -> None:
        self.scaling = scaling
        self.decider = Decider()
        self.replicas = replicas
        self.now = 0.0
        self.held = 0.0
        self.answered = 0.0
        self.history: list[int] = []

    def panics(self) -> bool:
        return self.decider.panicking

    def tick(self, concurrency: float = 0.0, rps: float = 0.0, seconds: int = 1) -> int:
        for _ in range(seconds):
            self.now += 1.0
            self.held += concurrency
            self.answered += rps
            value = self.held if self.scaling.metric == "concurrency" else self.answered
            # Split over two hosts, as the loop reads it: the sum is what counts.
            self.decider.observe(self.now, {"a": value / 2, "b": value / 2}, self.scaling)
            decision = self.decider.decide(self.now, self.scaling, self.replicas, self.replicas)
            self.replicas = decision.replicas
            self.history.append(self.replicas)
        return self.replicas


def test_a_burst_panics_and_reaches_five_replicas_within_seconds() -> None:
    model = Replicas(SEED)
    model.tick(seconds=60)
    assert model.replicas == 1 and not model.panics()
    model.tick(5.0)
    # One second of 5 in flight over the 6 s panic window: 0.83 / 0.7 -> 2 replicas, twice the
    # one ready: panic.
    assert model.replicas == 2 and model.panics()
    model.tick(5.0, seconds=4)
    assert model.replicas == 5
    assert model.history[60:] == [2, 3, 4, 5, 5]


def test_without_panic_the_stable_window_alone_is_slow() -> None:
    calm = Replicas(Scaling(target=1.0, max_replicas=5, panic_threshold_percentage=1000))
    calm.tick(seconds=60)
    calm.tick(5.0, seconds=5)
    assert calm.replicas == 1  # 25 request-seconds over 60 s: 0.42 / 0.7 -> 1
    calm.tick(5.0, seconds=25)
    assert calm.replicas == 4  # after 30 s, 150 / 60 = 2.5; / 0.7 -> 4
    assert not calm.panics()


def test_panic_never_scales_down_and_ends_a_stable_window_after_the_last_surge() -> None:
    model = Replicas(SEED)
    model.tick(seconds=60)
    model.tick(5.0, seconds=30)
    assert model.replicas == 5
    last_over = model.now - 26  # with 5 ready, 5 / 0.7 -> 8 is under twice 5 from the 4th s
    model.tick(0.0, seconds=20)
    assert model.replicas == 5 and model.panics()
    model.tick(0.0, seconds=int(last_over + 60 - model.now))
    assert not model.panics()
    # Out of panic, the stable window decides, at most halving per decision.
    model.tick(0.0, seconds=60)
    assert model.replicas == 1
    downs = [b for a, b in zip(model.history, model.history[1:], strict=False) if b < a]
    assert all(b >= a // 2 for a, b in zip(model.history, model.history[1:], strict=False))
    assert downs, "it scaled down"


def test_the_seed_experiment_scales_1_to_5_to_1_with_a_short_window() -> None:
    model = Replicas(Scaling(target=1.0, max_replicas=5, window=6.0))
    model.tick(seconds=10)
    model.tick(5.0, seconds=30)
    assert model.history[10:13] == [5, 5, 5]  # the 1 s panic window sees all 5 at once
    model.tick(0.0, seconds=20)
    assert model.replicas == 1


def test_min_and_max_bound_the_decision() -> None:
    model = Replicas(Scaling(target=1.0, min_replicas=2, max_replicas=3), replicas=2)
    model.tick(seconds=70)
    assert model.replicas == 2
    model.tick(20.0, seconds=10)
    assert model.replicas == 3
    unbounded = Replicas(Scaling(target=1.0))
    unbounded.tick(seconds=60)
    unbounded.tick(20.0, seconds=10)
    assert unbounded.replicas == 29  # ceil(20 / 0.7)


def test_zero_only_after_a_whole_window_without_requests() -> None:
    model = Replicas(Scaling(target=1.0, min_replicas=0, window=10.0))
    model.tick(seconds=5)
    assert model.replicas == 1  # not yet a whole window observed
    model.tick(1.0, seconds=3)
    model.tick(seconds=9)
    assert model.replicas == 1  # the request-seconds are still in the window
    model.tick(seconds=2)
    assert model.replicas == 0


def test_rps_scales_on_requests_per_second() -> None:
    model = Replicas(Scaling(metric="rps", target=10.0, max_replicas=10))
    model.tick(seconds=60)
    model.tick(rps=50.0, seconds=10)
    assert model.replicas == 8  # ceil(50 / (10 x 0.7))
    model.tick(concurrency=50.0, seconds=70)
    assert model.replicas == 1  # concurrency is not its metric


def test_a_restarted_source_and_a_new_one_add_no_spike() -> None:
    decider = Decider()
    scaling = Scaling(target=1.0, window=10.0)
    decider.observe(0.0, {"a": 1000.0}, scaling)
    decider.observe(1.0, {"a": 1001.0, "b": 5000.0}, scaling)  # b: first seen, adds nothing
    decider.observe(2.0, {"a": 1.0, "b": 5001.0}, scaling)  # a restarted: adds its 1
    decision = decider.decide(2.0, scaling, 1, 1)
    assert decision.stable == pytest.approx(1.5)  # 3 request-seconds over 2 s


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), -5.0])
def test_a_value_that_is_no_count_leaves_the_decisions_as_they_were(bad: float) -> None:
    """A source's NaN, Infinity or negative reading is skipped: the windows stay finite, and
    its next reading counts from its last good one."""
    decider = Decider()
    scaling = Scaling(target=1.0, window=10.0, max_replicas=5)
    decider.observe(0.0, {"a": 0.0, "b": 0.0}, scaling)
    decider.observe(1.0, {"a": 1.0, "b": bad}, scaling)
    decider.observe(2.0, {"a": 2.0, "b": 0.5}, scaling)
    decider.observe(3.0, {"a": 3.0, "b": 1.5}, scaling)
    decision = decider.decide(3.0, scaling, 1, 1)
    assert decision.stable == pytest.approx(1.5)  # a: 3, b: 1.5 over 3 s
    assert 1 <= decision.replicas <= 5  # decided, not raised


def test_fewer_than_two_samples_keep_the_current_count() -> None:
    decider = Decider()
    scaling = Scaling(target=1.0, max_replicas=4)
    assert decider.decide(0.0, scaling, 3, 3).replicas == 3
    decider.observe(0.0, {"a": 0.0}, scaling)
    assert decider.decide(0.0, scaling, 9, 9).replicas == 4  # still within max


def test_settings_from_the_spec_and_from_knative_annotations() -> None:
    spec = scaling_from({"target": 1, "minReplicas": 0, "maxReplicas": 5, "window": "1m30s"})
    assert spec == Scaling(target=1.0, min_replicas=0, max_replicas=5, window=90.0)
    assert spec.panic_window == 9.0
    annotated = scaling_from_annotations(
        {
            "autoscaling.knative.dev/target": "1",
            "autoscaling.knative.dev/metric": "rps",
            "autoscaling.knative.dev/max-scale": "5",
            "autoscaling.knative.dev/window": "6s",
            "autoscaling.knative.dev/panic-threshold-percentage": "300",
            "other.io/x": "y",
        }
    )
    assert annotated == Scaling(
        metric="rps", target=1.0, max_replicas=5, window=6.0, panic_threshold_percentage=300.0
    )
    assert annotated.panic_window == 1.0  # at least one read of the counters
    assert scaling_from_annotations({"autoscaling.knative.dev/max-scale": "5"}) is None


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({}, "target is required"),
        ({"target": 1, "metric": "cpu"}, "concurrency or rps"),
        ({"target": 0}, "target must be between"),
        ({"target": 1, "window": "2s"}, "from 6s to 1h"),
        ({"target": 1, "window": "soon"}, "duration such as 60s"),
        ({"target": 1, "minReplicas": 3, "maxReplicas": 2}, "minReplicas (3) is above"),
        ({"target": 1, "minReplicas": 1.5}, "whole number"),
        ({"target": 1, "replicas": 2}, "unknown autoscaling settings ['replicas']"),
        ({"target": 1, "panicThresholdPercentage": 100}, "between 110 and 1000"),
    ],
)
def test_bad_settings_say_what_to_change(fields: dict[str, object], says: str) -> None:
    with pytest.raises(ScalingError, match=None) as raised:
        scaling_from(fields)
    assert says in str(raised.value)


def test_a_bad_annotation_is_named_by_its_annotation() -> None:
    with pytest.raises(ScalingError) as raised:
        scaling_from_annotations(
            {"autoscaling.knative.dev/target": "1", "autoscaling.knative.dev/min-scale": "-1"}
        )
    assert "autoscaling.knative.dev/min-scale must be between" in str(raised.value)
