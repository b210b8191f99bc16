"""A benchmark's goals, checked in code: each figure printed beside its goal with "met" or "NOT
MET", and the exit status the run ends with (1 when a goal is not met, unless `--no-goal`).

A goal is what a benchmark claims to its users (its docstring, docs/results.md); this module
knows no benchmark and measures nothing: it compares, prints one line a goal, and decides the
exit status.
"""

from __future__ import annotations

import argparse
import operator
from collections.abc import Callable, Iterable

OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
}


def add_flag(parser: argparse.ArgumentParser) -> None:
    """`--no-goal`: print every goal and whether it is met, but end with 0 whatever they say."""
    parser.add_argument(
        "--no-goal",
        action="store_true",
        help="explore: print each goal and whether it is met, but exit 0 when one is not",
    )


def number(value: float) -> str:
    """A figure as a reader wants it: 2,138 / 2 / 1.76 / 0.0523."""
    if abs(value) >= 100 or float(value).is_integer():
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def met(figure: float, goal: float, op: str = "<=") -> bool:
    """Whether `figure op goal` holds (`op` one of <=, <, >=, >)."""
    if op not in OPS:
        raise ValueError(f"goal operator {op!r}: use one of {', '.join(OPS)}")
    return OPS[op](figure, goal)


def line(name: str, figure: float, goal: float, op: str = "<=", unit: str = "") -> str:
    """`goal: NAME FIGURE (goal OP GOAL): met` or `... NOT MET`."""
    verdict = "met" if met(figure, goal, op) else "NOT MET"
    return f"goal: {name} {number(figure)}{unit} (goal {op} {number(goal)}{unit}): {verdict}"


def check(name: str, figure: float, goal: float, op: str = "<=", unit: str = "") -> bool:
    """Print `figure` beside its goal and whether it is met; True when it is."""
    print(line(name, figure, goal, op, unit), flush=True)
    return met(figure, goal, op)


def require(name: str, holds: bool) -> bool:
    """Print a yes-or-no goal (`name` should hold) and whether it is met; `holds`."""
    print(f"goal: {name}: {'yes' if holds else 'no'} (goal yes): {'met' if holds else 'NOT MET'}")
    return holds


def exit_code(results: Iterable[bool], no_goal: bool = False) -> int:
    """0 when every goal is met (or none was checked), 1 when one is not; 0 anyway with
    `--no-goal`, saying so."""
    missed = sum(1 for result in results if not result)
    if missed and no_goal:
        print(f"{missed} goal(s) not met; exit 0 as --no-goal asks", flush=True)
    return 1 if missed and not no_goal else 0
