"""The end-to-end binder benchmark's goals decide its exit status: decisions a second and CPU
per pod for plain pods, and the CPU per pod against a baseline tree for every workload."""

from __future__ import annotations

from benchmarks.binder_e2e import check_goals
from benchmarks.goals import exit_code

CPU = "binder CPU ms per bound pod"


def test_the_plain_workload_meets_its_goals_or_the_run_fails() -> None:
    fast = {"this .": {"decisions/s": 1200.0, CPU: 0.45}}
    assert check_goals("plain", fast, baseline=False) == [True, True]
    slow = {"this .": {"decisions/s": 700.0, CPU: 0.45}}
    assert exit_code(check_goals("plain", slow, baseline=False)) == 1
    assert exit_code(check_goals("plain", slow, baseline=False), no_goal=True) == 0


def test_more_cpu_per_pod_than_the_baseline_allows_fails_every_workload() -> None:
    medians = {
        "baseline b": {"decisions/s": 900.0, CPU: 1.0},
        "this .": {"decisions/s": 900.0, CPU: 1.2},
    }
    assert check_goals("spread", medians, baseline=True) == [False]
    within = {
        "baseline b": {"decisions/s": 900.0, CPU: 1.0},
        "this .": {"decisions/s": 900.0, CPU: 1.05},
    }
    assert check_goals("spread", within, baseline=True) == [True]
