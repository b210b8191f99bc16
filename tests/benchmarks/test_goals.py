"""benchmarks/goals.py: a goal is printed beside its figure with met or NOT MET, and a run that
misses one exits 1, unless --no-goal asks it to explore."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import goals


@pytest.mark.parametrize(
    ("figure", "goal", "op", "met"),
    [
        (1.3, 1.3, "<=", True),
        (1.31, 1.3, "<=", False),
        (1.3, 1.3, "<", False),
        (1000.0, 1000.0, ">=", True),
        (999.0, 1000.0, ">=", False),
        (0.9, 0.9, ">", False),
    ],
)
def test_a_figure_meets_its_goal_by_its_operator(
    figure: float, goal: float, op: str, met: bool
) -> None:
    assert goals.met(figure, goal, op) is met


def test_the_line_says_the_figure_the_goal_and_the_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert goals.check("p95 / floor", 1.76, 1.3, unit="x") is False
    assert goals.check("decisions/s", 2138.0, 1000.0, ">=") is True
    assert goals.check("added", 0.0162, 0.05, unit=" ms") is True
    assert goals.check("restarts", 2, 1, ">=") is True
    assert goals.require("crasher quarantined", False) is False
    assert capsys.readouterr().out.splitlines() == [
        "goal: p95 / floor 1.76x (goal <= 1.30x): NOT MET",
        "goal: decisions/s 2,138 (goal >= 1,000): met",
        "goal: added 0.0162 ms (goal <= 0.05 ms): met",
        "goal: restarts 2 (goal >= 1): met",
        "goal: crasher quarantined: no (goal yes): NOT MET",
    ]


def test_an_unknown_operator_is_refused() -> None:
    with pytest.raises(ValueError, match="use one of <=, <, >=, >"):
        goals.met(1.0, 1.0, "==")


def test_the_exit_code_is_1_when_a_goal_is_missed_unless_exploring(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert goals.exit_code([True, True]) == 0
    assert goals.exit_code([]) == 0
    assert goals.exit_code([True, False]) == 1
    assert capsys.readouterr().out == ""
    assert goals.exit_code([False, False], no_goal=True) == 0
    assert "2 goal(s) not met; exit 0 as --no-goal asks" in capsys.readouterr().out


def test_the_flag_explores_only_when_given() -> None:
    parser = argparse.ArgumentParser()
    goals.add_flag(parser)
    assert parser.parse_args([]).no_goal is False
    assert parser.parse_args(["--no-goal"]).no_goal is True
