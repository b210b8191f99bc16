"""`python -m benchmarks.churn`'s pass rule (`benchmarks.churnrule`), its exit code and the
in-flight accounting, on synthetic records: no cluster."""

from __future__ import annotations

import threading
import time
from typing import Any, cast

import pytest

from benchmarks import churn
from benchmarks.churnload import (
    PER_WAY,
    Caller,
    Load,
    LoadCpu,
    Request,
    Target,
    in_flight_at,
    spike,
)
from benchmarks.churnrule import (
    HOLD_BOUND,
    MIN_PER_MINUTE,
    Change,
    Exit,
    exit_code,
    judge,
    why_expected,
)

MODELS = [m for ms in churn.MODELS.values() for m in ms]
MINUTES = 1.0


def steady_load(per_model: int = MIN_PER_MINUTE, in_flight: int = 8) -> list[Request]:
    """`per_model` answered requests a model over one minute from time 0, `in_flight` of each
    model at every moment."""
    requests = []
    for model in MODELS:
        for _lane in range(in_flight):
            n = per_model // in_flight + 1
            step = 60.0 / n
            for i in range(n):
                start = i * step
                requests.append(Request(model, "rest", start, start + step, True))
    return requests


def changes() -> list[Change]:
    return [
        Change("gateway", "gpu-a", limit=120, start=10, moment=10, took=3, end=23),
        Change("node-pod", "gpu-b", limit=120, start=30, moment=30, took=8, end=48),
    ]


def expected_exits() -> list[Exit]:
    return [
        Exit(10.1, "gateway/gpu-a", "signal SIGKILL", "SIGKILL by the churn", ""),
        Exit(30.5, "triton/gpu-b", "signal SIGTERM", "unknown (see its last lines)", ""),
        Exit(33.0, "pod team-a/host-x/proxy", "exit code 0", "Completed (pod deleted)", ""),
    ]


def failed(
    model: str, detail: str = "502: the gateway's connection ended", at: float = 12.0
) -> Request:
    return Request(model, "grpc-stream", at, at + 0.2, False, detail)


def test_a_clean_run_passes() -> None:
    verdict = judge(steady_load(), changes(), expected_exits(), MODELS, MINUTES)
    assert verdict.passed, verdict.reasons()
    assert exit_code(verdict) == 0
    assert verdict.reasons() == []


def test_one_failed_request_of_a_lone_replica_fails_the_run() -> None:
    requests = [*steady_load(), failed("scaled")]
    verdict = judge(requests, changes(), expected_exits(), MODELS, MINUTES)
    assert exit_code(verdict) == 1
    assert verdict.failed == [requests[-1]]
    assert verdict.reasons() == ["1 failed requests (scaled 1)"]


def test_an_unexpected_process_exit_fails_the_run() -> None:
    stray = Exit(40.0, "agent/gpu-a", "exit code 1", "unknown (see its last lines)", "boom")
    verdict = judge(steady_load(), changes(), [*expected_exits(), stray], MODELS, MINUTES)
    assert exit_code(verdict) == 1
    assert verdict.unexpected == [stray]
    assert verdict.reasons() == ["1 unexpected process exits (agent/gpu-a)"]


@pytest.mark.parametrize("took", [None, 121.0])
def test_a_change_unfinished_or_past_its_time_fails_the_run(took: float | None) -> None:
    late = Change("scale", "gpu-a", limit=120, start=50, moment=50, took=took, end=60)
    verdict = judge(steady_load(), [*changes(), late], expected_exits(), MODELS, MINUTES)
    assert exit_code(verdict) == 1
    assert verdict.unfinished == [late]


def test_an_answer_past_the_hold_bound_or_a_thin_load_fails_the_run() -> None:
    slow = Request("zero", "rest", 5.0, 5.0 + HOLD_BOUND + 0.1, True)
    verdict = judge([*steady_load(), slow], changes(), expected_exits(), MODELS, MINUTES)
    assert verdict.slow == [slow] and exit_code(verdict) == 1
    thin = judge(steady_load(per_model=100), changes(), expected_exits(), MODELS, MINUTES)
    assert exit_code(thin) == 1
    assert set(thin.thin) == set(MODELS)


def test_a_bounds_refusal_and_the_crashers_own_are_listed_not_counted() -> None:
    refused = failed(
        "zero",
        "503 Retry-After 1: model zero is scaled to zero and is starting; this host holds 1024 "
        "of its requests (1024 of all its parked models'), its most; retry in 1 s",
    )
    crashers = failed("crasher", "502: Triton exited")
    verdict = judge(
        [*steady_load(), refused, crashers], changes(), expected_exits(), MODELS, MINUTES
    )
    assert verdict.passed
    assert [r for r, _, _ in verdict.refused] == [refused]
    assert "parked model's queue" in verdict.refused[0][1]
    assert verdict.crasher == 1


def test_a_wake_timeout_is_a_failure_not_a_bound() -> None:
    timed_out = failed(
        "zero",
        "503 Retry-After 1: model zero is scaled to zero and no replica of it was ready within "
        "30 s; retry in 1 s",
    )
    verdict = judge([*steady_load(), timed_out], changes(), [], MODELS, MINUTES)
    assert verdict.failed == [timed_out]


def test_which_exits_a_change_expects() -> None:
    done = changes()
    assert why_expected(expected_exits()[0], done) == "the churn's own"
    assert why_expected(expected_exits()[1], done) == "its node pod replaced"
    assert why_expected(expected_exits()[2], done) == "its pod was deleted"
    crashed = Exit(
        70, "triton/gpu-a", "signal SIGSEGV", "not this benchmark; it last loaded crasher_abc", ""
    )
    assert why_expected(crashed, done) == "the crasher's"
    # Triton of the other node, or after the node pod's change: nothing expected it.
    assert why_expected(Exit(31, "triton/gpu-a", "signal SIGTERM", "", ""), done) == ""
    assert why_expected(Exit(49, "triton/gpu-b", "signal SIGTERM", "", ""), done) == ""
    # A crash during the node pod's replacement is no stop.
    assert why_expected(Exit(31, "triton/gpu-b", "signal SIGSEGV", "", ""), done) == ""
    assert why_expected(Exit(31, "pod team-a/host-y/proxy", "exit code 1", "Error", ""), done) == ""


def test_a_hung_container_may_be_restarted_during_its_hang_and_no_other() -> None:
    hang = Change("hang", "gpu-a", limit=120, start=100, took=25, end=135, process="gateway")
    probed = Exit(118, "gateway/gpu-a", "signal SIGKILL", "the kubelet killed it: its liveness", "")
    assert why_expected(probed, [hang]) == "restarted as it hung"
    assert why_expected(Exit(118, "agent/gpu-a", "signal SIGKILL", "", ""), [hang]) == ""
    assert why_expected(Exit(140, "gateway/gpu-a", "signal SIGKILL", "", ""), [hang]) == ""
    assert why_expected(Exit(118, "gateway/gpu-b", "signal SIGKILL", "", ""), [hang]) == ""


def test_the_oom_change_expects_its_own_container_oomkilled_during_it_and_no_other() -> None:
    oom = Change("oom", "gpu-a", limit=150, start=10, moment=11, took=20, end=40)
    oom.process = "team-b/pods-1/proxy"
    killed = Exit(14.0, "pod team-b/pods-1/proxy", "exit code -9", "OOMKilled", "")
    assert why_expected(killed, [oom]) == "OOM-killed by the churn"
    other = Exit(14.0, "pod team-b/pods-2/proxy", "exit code -9", "OOMKilled", "")
    crashed = Exit(14.0, "pod team-b/pods-1/proxy", "exit code 1", "Error", "")
    later = Exit(41.0, "pod team-b/pods-1/proxy", "exit code -9", "OOMKilled", "")
    for e in (other, crashed, later):
        assert why_expected(e, [oom]) == ""


def test_the_store_down_change_expects_storage_initializers_to_fail_during_it_only() -> None:
    down = Change("store-down", "gpu-a", limit=270, start=10, moment=10, took=60, end=80)
    fetch = Exit(20.0, "pod team-b/pods-3/storage-initializer", "exit code 1", "Error", "")
    assert why_expected(fetch, [down]) == "its fetch failed while the store was down"
    assert why_expected(Exit(90.0, fetch.name, "exit code 1", "Error", ""), [down]) == ""
    proxy = Exit(20.0, "pod team-b/pods-3/proxy", "exit code 1", "Error", "")
    assert why_expected(proxy, [down]) == ""
    other = Change("webhook-down", "gpu-a", limit=240, start=10, moment=10, took=60, end=80)
    assert why_expected(fetch, [other]) == ""
    stopped = Exit(10.5, "webhook", "signal SIGTERM", "SIGTERM by the churn", "")
    assert why_expected(stopped, [other]) == "the churn's own"


def test_every_kind_is_in_the_default_schedule_with_a_limit() -> None:
    plan = churn.schedule(list(churn.KINDS), seed=1, rounds=1)
    assert sorted(c.kind for c in plan) == sorted(churn.KINDS)
    single = [c for c in plan if c.kind != "two"]
    assert all(c.limit == churn.LIMITS[c.kind] > 0 for c in single)


def test_two_applies_one_change_of_each_row_at_once_within_the_longer_limit() -> None:
    plan = churn.schedule(["two"], seed=3, rounds=20)
    for change in plan:
        first, second = change.parts
        assert first.kind in churn.PAIRS[0] and second.kind in churn.PAIRS[1]
        assert change.limit == max(first.limit, second.limit)
    assert len({tuple(p.kind for p in c.parts) for c in plan}) > 5  # drawn, not fixed
    assert churn.schedule(["two"], seed=3, rounds=20) == plan  # from the seed alone


def test_the_parts_of_two_expect_what_each_expects_alone() -> None:
    oom = Change("oom", "gpu-a", limit=150, start=10, took=5, end=40, process="team-b/p/proxy")
    hang = Change("hang", "gpu-b", limit=120, start=10, took=25, end=40, process="agent")
    two = Change("two", "gpu-a", limit=150, start=10, took=25, end=40, parts=[oom, hang])
    killed = Exit(12.0, "pod team-b/p/proxy", "exit code -9", "OOMKilled", "")
    probed = Exit(30.0, "agent/gpu-b", "signal SIGKILL", "the kubelet killed it: its liveness", "")
    assert why_expected(killed, [two]) == "OOM-killed by the churn"
    assert why_expected(probed, [two]) == "restarted as it hung"
    assert why_expected(Exit(30.0, "agent/gpu-a", "signal SIGKILL", "", ""), [two]) == ""


def test_in_flight_at_a_changes_moment_counts_the_requests_sent_and_not_yet_answered() -> None:
    timeline = [
        Request("steady", "rest", 0.0, 1.0, True),  # answered before the moment
        Request("steady", "grpc", 0.5, 2.5, True),  # in flight
        Request("steady", "rest-new", 2.0, 2.1, False),  # sent at the moment: in flight
        Request("zero", "grpc-stream", 1.9, 30.0, True),  # held at zero: in flight
        Request("zero", "rest", 2.0, 2.0, True),  # answered at once: never in flight
        Request("lazy", "poisson", 2.01, 3.0, True),  # sent after the moment
    ]
    assert in_flight_at(timeline, 2.0) == {"steady": 2, "zero": 1}
    line, fewest = churn.in_flight_line(timeline, 2.0)
    assert line.startswith("steady 2, lazy 0, scaled 0, zero 1")
    assert fewest == 0


def test_the_load_comes_back_from_its_process_whole() -> None:
    load = Load([failed("pods", "ConnectionResetError: reset")], LoadCpu(1.5, 1.2, 60.0), 2, 3)
    assert Load.read(load.dump()) == load


def run_report(
    requests: list[Request], exits: list[Exit], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    load = Load(requests, LoadCpu(6.0, 5.0, 60.0))
    code = churn.report(load, requests, changes(), exits, 1, MINUTES, 0.0, 0.5)
    return code, capsys.readouterr().out


def test_the_report_exits_0_on_a_clean_run(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_report(steady_load(), expected_exits(), capsys)
    assert code == 0
    last = out.splitlines()[-1]
    assert last.startswith("churn: seed 1, 2 changes in 1.0 min,") and last.endswith("-> pass")
    assert "at least 8 a model in flight at each change" in last
    assert "in flight steady 8, lazy 8, scaled 8, zero 8, pods 8" in out


def test_the_report_exits_1_and_names_what_failed(capsys: pytest.CaptureFixture[str]) -> None:
    stray = Exit(40.0, "gateway/gpu-b", "signal SIGSEGV", "unknown (see its last lines)", "")
    code, out = run_report([*steady_load(), failed("scaled")], [*expected_exits(), stray], capsys)
    assert code == 1
    assert "1 x gateway: scaled grpc-stream" in out
    assert "gateway/gpu-b: signal SIGSEGV, unknown (see its last lines) [UNEXPECTED]" in out
    assert "fails the rule: 1 failed requests (scaled 1)" in out
    assert "fails the rule: 1 unexpected process exits (gateway/gpu-b)" in out
    assert out.splitlines()[-1].endswith("-> FAIL")


def test_a_spike_adds_its_callers_for_its_time_then_stops_them() -> None:
    target = Target("steady", "team-a", "127.0.0.1")
    log: list[Request] = []
    extra: list[Caller] = []
    began = time.monotonic()
    spike(target, ("rest", "grpc"), 10, 0.5, log, threading.Event(), extra)
    assert time.monotonic() - began >= 0.5
    assert len(extra) == 2 * PER_WAY * 9
    for caller in extra:
        caller.thread.join(10)
        assert not caller.thread.is_alive()
    assert {r.model for r in log} == {"steady"}
    assert {r.protocol for r in log} == {"rest", "grpc"}


def test_a_pod_containers_exit_is_recorded_once_as_state_then_as_last_state() -> None:
    kubelet = churn.Kubelet(cast(Any, None), 0.0)
    ended = {"exitCode": -9, "reason": "OOMKilled", "startedAt": "t0", "finishedAt": "t1"}

    def pod(restarts: int, state: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
        status = {"name": "proxy", "restartCount": restarts, "state": state, "lastState": last}
        return {
            "metadata": {"namespace": "team-b", "name": "p"},
            "spec": {"containers": [{"name": "proxy"}]},
            "status": {"containerStatuses": [status]},
        }

    kubelet._pod_exits(pod(0, {"terminated": ended}, {}))
    kubelet._pod_exits(pod(1, {"running": {}}, {"terminated": ended}))
    again = {**ended, "startedAt": "t2", "finishedAt": "t3"}
    kubelet._pod_exits(pod(2, {"running": {}}, {"terminated": again}))
    assert [(e.name, e.cause) for e in kubelet.exits] == [("pod team-b/p/proxy", "OOMKilled")] * 2
