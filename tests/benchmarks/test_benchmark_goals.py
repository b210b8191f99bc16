"""Each benchmark with a goal checks it in code: its figures against the goal it states, printed
with met or NOT MET, and the exit status `benchmarks.goals` gives (1 when one is missed)."""

from __future__ import annotations

import pytest

from benchmarks import (
    autoscale,
    crash_quarantine,
    goals,
    model_hosts,
    proxy_hotpath,
    proxy_latency,
    residency_live,
)
from sim.demo.autoscale import AutoscaleResult


def test_crash_quarantine_holds_a_quick_quarantine_to_15_s(
    capsys: pytest.CaptureFixture[str],
) -> None:
    result = {
        "quarantine_after": 2,
        "triton_restarts": 2,
        "victim_served_again_after_s": 8.7,
        "crasher_quarantined": True,
        "victim_quarantined": False,
    }
    assert crash_quarantine.check_goals(result) == [True] * 4
    slow = {**result, "victim_served_again_after_s": None, "crasher_quarantined": False}
    assert crash_quarantine.check_goals(slow) == [True, False, True, False]
    assert crash_quarantine.check_goals({**result, "quarantine_after": 1000}) == []
    assert "none checked" in capsys.readouterr().out


def test_autoscale_wants_no_failure_and_the_built_in_ready_in_10_s() -> None:
    ready = AutoscaleResult(ready_after=9.2)
    assert autoscale.check_goals("builtin", ready) == [True, True, True]
    late = AutoscaleResult(ready_after=None, failed=["503"])
    assert autoscale.check_goals("builtin", late) == [False, True, False]
    assert autoscale.check_goals("hpa", AutoscaleResult(ready_after=47.0)) == [True, True]


def test_model_hosts_wants_1000_replicas_a_second_and_half_a_millisecond() -> None:
    assert model_hosts.check_goals("", 5032.0, 0.069) == [True, True]
    assert model_hosts.check_goals(" under attack", 990.0, 0.6) == [False, False]


def test_residency_live_wakes_within_its_targets() -> None:
    result = residency_live.LiveResult(
        wakes=[1.0, 1.2, 1.4],
        triton_loads=[1.0, 1.25, 1.35],
        alone=[0.010] * 98 + [0.020] * 2,
        during=[0.010] * 98 + [0.022] * 2,
    )
    assert residency_live.check_goals(result) == [True, True, True, True]
    result.failed.append("timed out")
    result.triton_loads[:] = [1.0, 1.1, 1.2]
    assert residency_live.check_goals(result) == [True, False, True, False]


def test_proxy_hotpath_judges_the_cpu_at_c16_by_the_median_of_rounds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cpu = {
        ("REST", 16, "proxy"): [117.0, 110.0, 130.0],
        ("REST", 16, "bare"): [100.0, 100.0, 100.0],
        ("gRPC", 16, "proxy"): [120.0, 125.0, 129.0],
        ("gRPC", 16, "bare"): [100.0, 100.0, 100.0],
    }
    assert proxy_hotpath.check_goals(cpu, "proxy") == [False, True]
    assert proxy_hotpath.check_goals(cpu, "gateway") == [True, True]
    assert "proxy REST c=16 CPU per request / the bare relay's 1.17x" in capsys.readouterr().out


def test_proxy_latency_returns_each_targets_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    results: proxy_latency.Results = {
        ("restcpu", "floor"): [100.0, 100.0],
        ("restcpu", "relay"): [120.0, 118.0],
        ("grpccpu", "floor"): [100.0, 100.0],
        ("grpccpu", "relay"): [120.0, 118.0],
    }
    assert proxy_latency.report(results, 2, 2) == [False, True]
    out = capsys.readouterr().out
    assert "target <= 1.15x: NOT MET" in out and "target <= 1.3x: met" in out
    assert goals.exit_code(proxy_latency.report(results, 2, 2)) == 1
