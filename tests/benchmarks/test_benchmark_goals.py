"""Each benchmark with a goal checks it in code: its figures against the goal it states, printed
with met or NOT MET, and the exit status `benchmarks.goals` gives (1 when one is missed)."""

from __future__ import annotations

import pytest

from benchmarks import (
    agent_install,
    agent_kube,
    autoscale,
    churnrule,
    crash_quarantine,
    goals,
    held_bytes,
    kserve_client,
    model_hosts,
    namespace_share,
    onnx_latency,
    proxy_hotpath,
    proxy_latency,
    replica_spread,
    residency_live,
    sim_apiserver,
)
from benchmarks.churnload import Request
from sim.demo.autoscale import AutoscaleResult
from sim.onnxmodels import CONV_NAME


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


def test_agent_kube_wants_the_one_door_no_dearer_than_the_official_client() -> None:
    cheaper = {"read a pod": {"official client": 0.399, "one door": 0.132}}
    assert agent_kube.check_goals(cheaper) == [True]
    dearer = {**cheaper, "set a pod condition": {"official client": 0.4, "one door": 0.41}}
    assert agent_kube.check_goals(dearer) == [True, False]


def test_agent_install_wants_its_throughput_and_a_small_load_overhead() -> None:
    assert agent_install.check_goals(295.0, 60.0) == [True, True]
    assert agent_install.check_goals(150.0, 400.0) == [False, False]


def test_replica_spread_wants_a_second_gpu_to_add_and_the_same_gpu_not_to() -> None:
    assert replica_spread.check_goals({"one": 47.0, "spread": 92.6, "packed": 48.6}) == [
        True,
        True,
    ]
    assert replica_spread.check_goals({"one": 47.0, "spread": 70.0, "packed": 60.0}) == [
        False,
        False,
    ]


def test_onnx_latency_judges_each_hop_by_what_it_adds_over_direct() -> None:
    conv = CONV_NAME
    figures: onnx_latency.Figures = {}
    for protocol, direct, proxy, full in (("REST", 0.6, 0.7, 0.8), ("gRPC", 0.7, 0.9, 1.2)):
        figures[(conv, protocol, "direct")] = [direct, direct]
        figures[(conv, protocol, "proxy")] = [proxy, proxy]
        figures[(conv, protocol, "full")] = [full, full]
    # REST adds 17 % and 33 %; gRPC 29 % (over 25 %) and 71 % (over 50 %).
    assert onnx_latency.check_goals(figures) == [True, True, False, False]


def test_held_bytes_bounds_the_budgeted_gateway_and_counts_the_victims_errors() -> None:
    budget = 32 * 2**20
    unbounded = {"growth": 135.1, "victim errors": 0.0}
    held = {"growth": 53.3, "victim errors": 0.0}
    assert held_bytes.check_goals([(0, unbounded), (budget, held)]) == [True, True, True]
    grown = {"growth": 70.0, "victim errors": 2.0}
    assert held_bytes.check_goals([(0, unbounded), (budget, grown)]) == [True, False, False]


def test_namespace_share_wants_the_victims_half_its_p99_and_no_error() -> None:
    fair = {"victim share %": 49.0, "p99 alone ms": 10.0, "p99 beside ms": 18.5, "errors": 0.0}
    assert namespace_share.check_goals(fair) == [True, True, True]
    crowded = {"victim share %": 12.5, "p99 alone ms": 10.0, "p99 beside ms": 80.0, "errors": 3.0}
    assert namespace_share.check_goals(crowded) == [False, False, False]


def test_sim_apiserver_wants_quick_lists_and_watches_in_bounded_memory() -> None:
    quick = [0.002] * 10
    assert sim_apiserver.check_goals(quick, quick, 323.0) == [True, True, True]
    slow_tail = [0.002] * 18 + [0.05] * 2
    assert sim_apiserver.check_goals([0.02] * 5, slow_tail, 600.0) == [False, False, False]


def test_churn_prints_each_part_of_its_rule_and_fails_a_failed_request(
    capsys: pytest.CaptureFixture[str],
) -> None:
    passed = churnrule.Verdict(rates={"steady": 300.0})
    assert churnrule.check_goals(passed) == [True] * 5
    failed = churnrule.Verdict(
        failed=[Request("steady", "rest", 0.0, 1.0, False, "503")], rates={"steady": 100.0}
    )
    assert churnrule.check_goals(failed) == [False, True, True, True, False]
    assert "goal: failed requests 1 (goal <= 0): NOT MET" in capsys.readouterr().out


def test_kserve_client_judges_the_service_against_the_proxy_and_triton() -> None:
    def paths(triton: float, proxy: float, service: float) -> dict[str, list[float]]:
        return {"triton": [triton / 1e3], "proxy": [proxy / 1e3], "service": [service / 1e3]}

    fair = {"REST": paths(1.0, 1.1, 1.12), "gRPC": paths(1.2, 1.4, 1.45)}
    assert kserve_client.check_goals(fair, answered=True) == [True] * 5
    # A Service as cheap as ever over the proxy, but a proxy 0.5 ms over Triton: the old check
    # (the Service over the proxy alone) passed it.
    slow_proxy = {"REST": paths(1.0, 1.5, 1.52), "gRPC": paths(1.2, 1.4, 1.45)}
    assert kserve_client.check_goals(slow_proxy, answered=False) == [
        False,
        True,
        False,
        True,
        True,
    ]
