"""The HPA's arithmetic against upstream's cases (replica_calculator_test.go and
horizontal_test.go of kube-controller-manager, v1.31): tolerance, AverageValue and Value targets,
bounds, stabilization windows, rate policies and the older rules of an HPA without a behavior."""

from __future__ import annotations

from typing import Any

import pytest

from sim.controllers.autoscaling import (
    Autoscaler,
    Decision,
    Reading,
    SpecError,
    parse_spec,
    quantity,
)


def external(target: str, kind: str = "AverageValue", name: str = "s0-prometheus") -> Any:
    key = "averageValue" if kind == "AverageValue" else "value"
    return {
        "type": "External",
        "external": {"metric": {"name": name}, "target": {"type": kind, key: target}},
    }


def spec(
    minimum: int = 1,
    maximum: int = 10,
    metrics: list[Any] | None = None,
    behavior: Any = None,
) -> Any:
    raw: dict[str, Any] = {
        "minReplicas": minimum,
        "maxReplicas": maximum,
        "metrics": metrics or [external("1")],
    }
    if behavior is not None:
        raw["behavior"] = behavior
    return parse_spec(raw)


def decide(
    hpa: Any, current: int, values: list[float], now: float = 1000.0, a: Autoscaler | None = None
) -> Decision:
    return (a or Autoscaler()).decide(hpa, current, current, [Reading(tuple(values))], now)


def condition(decision: Decision, kind: str) -> tuple[str, str]:
    found = [c for c in decision.conditions if c.type == kind]
    assert found, f"no {kind} condition in {decision.conditions}"
    return found[0].status, found[0].reason


# Upstream's replica calculator cases for external metrics (levels, targets, replicas).
@pytest.mark.parametrize(
    ("current", "level", "target", "kind", "expected", "shown"),
    [
        (1, 8600, "4400", "Value", 2, 8600),  # ScaleUpCMExternal
        (3, 8600, "2150", "AverageValue", 4, 2867),  # ScaleUpPerPodCMExternal
        (5, 8600, "14334", "Value", 3, 8600),  # ScaleDownCMExternal
        (5, 8600, "2867", "AverageValue", 3, 1720),  # ScaleDownPerPodCMExternal
        (3, 8600, "8888", "Value", 3, 8600),  # ToleranceCMExternal
        (3, 8600, "2900", "AverageValue", 3, 2867),  # TolerancePerPodCMExternal
    ],
)
def test_external_metrics_propose_upstreams_replicas(
    current: int, level: float, target: str, kind: str, expected: int, shown: int
) -> None:
    a = Autoscaler()
    # No stabilization window: a scale down is taken at once.
    hpa = parse_spec(
        {
            "minReplicas": 1,
            "maxReplicas": 100,
            "metrics": [external(target, kind)],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}},
        }
    )
    decision = a.decide(hpa, current, current, [Reading((level,))], 0.0)
    assert decision.desired == expected
    assert decision.metrics[0][1] is not None
    assert round(decision.metrics[0][1] + 0.4999) == shown  # upstream rounds the shown usage up


def test_the_seeds_experiment_five_in_flight_at_target_one_asks_for_five() -> None:
    hpa = spec(maximum=8, behavior={})
    decision = decide(hpa, 1, [5.0])
    assert decision.desired == 5
    assert decision.reason == "external metric s0-prometheus above target"
    assert condition(decision, "AbleToScale") == ("True", "SucceededRescale")


def test_within_the_tolerance_nothing_changes() -> None:
    hpa = spec(behavior={})
    assert decide(hpa, 4, [4.39]).desired == 4  # 1.0975 of the target
    assert decide(hpa, 4, [4.5]).desired == 5  # 1.125: outside


def test_the_largest_proposal_of_several_metrics_wins() -> None:
    hpa = spec(maximum=50, metrics=[external("1", name="a"), external("10", name="b")], behavior={})
    a = Autoscaler()
    decision = a.decide(hpa, 4, 4, [Reading((3.0,)), Reading((70.0,))], 0.0)
    assert decision.desired == 7
    assert decision.reason == "external metric b above target"


def test_an_unread_metric_stops_a_scale_down_but_not_a_scale_up() -> None:
    hpa = spec(maximum=50, metrics=[external("1", name="a"), external("1", name="b")], behavior={})
    down = Autoscaler().decide(hpa, 6, 6, [Reading((1.0,)), Reading(error="timeout")], 0.0)
    assert down.desired == 6
    assert condition(down, "ScalingActive") == ("False", "FailedGetExternalMetric")
    up = Autoscaler().decide(hpa, 2, 2, [Reading((9.0,)), Reading(error="timeout")], 0.0)
    assert up.desired == 6  # asks 9; the default rules allow max(+100 %, +4 pods) per 15 s
    assert condition(up, "ScalingActive")[0] == "True"


def test_no_metric_read_does_nothing_and_says_why() -> None:
    decision = decide(spec(behavior={}), 3, [])
    assert decision.desired == 3
    status, reason = condition(decision, "ScalingActive")
    assert (status, reason) == ("False", "FailedGetExternalMetric")
    assert "no series matched" in decision.conditions[1].message


def test_a_target_at_zero_replicas_has_autoscaling_disabled() -> None:
    decision = decide(spec(behavior={}), 0, [50.0])
    assert decision.desired == 0
    assert condition(decision, "ScalingActive") == ("False", "ScalingDisabled")


@pytest.mark.parametrize(
    ("current", "desired", "reason"),
    [(12, 10, "TooManyReplicas"), (1, 2, "TooFewReplicas")],
)
def test_replicas_outside_the_bounds_are_brought_within_them_first(
    current: int, desired: int, reason: str
) -> None:
    decision = decide(spec(minimum=2, maximum=10, behavior={}), current, [0.0])
    assert decision.desired == desired
    assert condition(decision, "ScalingLimited") == ("True", reason)


# horizontal_test.go's TestNormalizeDesiredReplicasWithBehavior, no earlier events.
def pods(value: int, period: int = 60) -> Any:
    return {"type": "Pods", "value": value, "periodSeconds": period}


def percent(value: int, period: int = 60) -> Any:
    return {"type": "Percent", "value": value, "periodSeconds": period}


@pytest.mark.parametrize(
    ("behavior", "maximum", "current", "usage", "expected", "limited"),
    [
        ({}, 1000, 10, 50, 20, "ScaleUpLimit"),  # default: +100 % beats +4 pods
        ({}, 1000, 2, 50, 6, "ScaleUpLimit"),  # default: +4 pods beats +100 %
        ({"scaleUp": {"policies": [pods(30)]}}, 1000, 100, 300, 130, "ScaleUpLimit"),
        ({"scaleUp": {"policies": [percent(200)]}}, 1000, 10, 100, 30, "ScaleUpLimit"),
        ({"scaleUp": {"policies": [pods(100)]}}, 200, 100, 300, 200, "TooManyReplicas"),
        ({"scaleUp": {"policies": [percent(10000)]}}, 200, 100, 300, 200, "TooManyReplicas"),
        (
            {"scaleUp": {"policies": [pods(5), percent(50)], "selectPolicy": "Min"}},
            1000,
            100,
            300,
            105,
            "ScaleUpLimit",
        ),
        ({"scaleUp": {"selectPolicy": "Disabled"}}, 1000, 10, 50, 10, "ScaleUpLimit"),
    ],
)
def test_scale_up_rate_policies(
    behavior: Any, maximum: int, current: int, usage: float, expected: int, limited: str
) -> None:
    decision = decide(spec(maximum=maximum, behavior=behavior), current, [usage])
    assert decision.desired == expected
    assert condition(decision, "ScalingLimited") == ("True", limited)


@pytest.mark.parametrize(
    ("rules", "current", "usage", "expected", "limited"),
    [
        ({}, 100, 5, 5, "DesiredWithinRange"),  # default: -100 % per 15 s
        ({"policies": [pods(5)]}, 100, 2, 95, "ScaleDownLimit"),
        ({"policies": [percent(50)]}, 100, 1, 50, "ScaleDownLimit"),
        ({"policies": [pods(5), percent(50)], "selectPolicy": "Min"}, 100, 1, 95, "ScaleDownLimit"),
        ({"policies": [percent(100)]}, 100, 0, 1, "TooFewReplicas"),
    ],
)
def test_scale_down_rate_policies(
    rules: Any, current: int, usage: float, expected: int, limited: str
) -> None:
    behavior = {"scaleDown": {"stabilizationWindowSeconds": 0, **rules}}
    decision = decide(spec(maximum=1000, behavior=behavior), current, [usage])
    assert decision.desired == expected
    assert condition(decision, "ScalingLimited")[1] == limited


def test_a_policys_period_counts_the_changes_already_made_in_it() -> None:
    hpa = spec(maximum=100, behavior={"scaleUp": {"policies": [pods(4, period=60)]}})
    a = Autoscaler()
    assert a.decide(hpa, 2, 2, [Reading((40.0,))], 0.0).desired == 6
    # 30 s later the period still holds the +4: nothing more may be added.
    assert a.decide(hpa, 6, 6, [Reading((40.0,))], 30.0).desired == 6
    # Past the period the next 4 may come.
    assert a.decide(hpa, 6, 6, [Reading((40.0,))], 61.0).desired == 10


def test_the_scale_down_window_keeps_the_highest_recent_recommendation() -> None:
    hpa = spec(maximum=20, behavior={"scaleDown": {"stabilizationWindowSeconds": 60}})
    a = Autoscaler()
    assert a.decide(hpa, 5, 5, [Reading((5.0,))], 0.0).desired == 5
    # The load is gone; within 60 s of the recommendation of 5 the HPA holds 5.
    held = a.decide(hpa, 5, 5, [Reading((1.0,))], 30.0)
    assert held.desired == 5
    assert held.reason == ""
    assert a.decide(hpa, 5, 5, [Reading((1.0,))], 61.0).desired == 1


def test_the_scale_up_window_keeps_the_lowest_recent_recommendation() -> None:
    hpa = spec(maximum=20, behavior={"scaleUp": {"stabilizationWindowSeconds": 60}})
    a = Autoscaler()
    assert a.decide(hpa, 2, 2, [Reading((2.0,))], 0.0).desired == 2
    assert a.decide(hpa, 2, 2, [Reading((8.0,))], 30.0).desired == 2
    assert a.decide(hpa, 2, 2, [Reading((8.0,))], 61.0).desired == 6  # +4 pods, the default


def test_without_a_behavior_the_older_rules_apply() -> None:
    """What an HPA made by KEDA without `advanced.horizontalPodAutoscalerConfig` does."""
    hpa = spec(maximum=8)
    a = Autoscaler()
    first = a.decide(hpa, 1, 1, [Reading((5.0,))], 0.0)
    assert first.desired == 4  # at most max(2 x 1, 4)
    assert condition(first, "ScalingLimited") == ("True", "ScaleUpLimit")
    assert a.decide(hpa, 4, 4, [Reading((5.0,))], 15.0).desired == 5
    # Idle: the 300 s window holds the highest recommendation, then lets go at once.
    assert a.decide(hpa, 5, 5, [Reading((0.0,))], 45.0).desired == 5
    assert a.decide(hpa, 5, 5, [Reading((0.0,))], 320.0).desired == 1


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"maxReplicas": 0, "metrics": [external("1")]}, "maxReplicas must be at least 1"),
        ({"minReplicas": 5, "maxReplicas": 2, "metrics": [external("1")]}, "minReplicas"),
        ({"maxReplicas": 3}, "at least one External or Pods metric"),
        ({"maxReplicas": 3, "metrics": [{"type": "Resource"}]}, "use External or Pods"),
        ({"maxReplicas": 3, "metrics": [external("0")]}, "above 0"),
        ({"maxReplicas": 3, "metrics": [external("x")]}, "not a quantity"),
        (
            {
                "maxReplicas": 3,
                "metrics": [external("1")],
                "behavior": {"scaleUp": {"policies": [{"type": "Nodes", "value": 1}]}},
            },
            "Pods or Percent",
        ),
    ],
)
def test_a_spec_the_autoscaler_cannot_act_on_says_what_to_change(raw: Any, words: str) -> None:
    with pytest.raises(SpecError, match=words):
        parse_spec(raw)


def test_quantities() -> None:
    assert quantity("500m") == 0.5
    assert quantity(4) == 4.0
    assert quantity("2k") == 2000.0
    assert quantity("1Ki") == 1024.0
