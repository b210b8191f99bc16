"""`python -m benchmarks.scale_from_zero` runs the counts asked, refuses those it cannot run
before starting anything, closes on the largest count's p95 and max beside the better floor's,
and holds 25 TritonModels to their goal: p95 within 1.3x the floor's p95, max within 1.5x its
max, exit 1 when not met (0 with --no-goal)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import scale_from_zero as bench
from benchmarks.loadfloor import Floor, Way
from sim.triton import TritonInstall, TritonServer


def test_the_counts_default_to_knatives_but_100_and_one_count_runs_alone() -> None:
    assert bench.parse([]).models == [1, 5, 25]
    assert bench.parse(["--models", "25"]).models == [25]
    assert bench.parse(["--models", "100", "--as", "pods"]).kind == "pods"
    assert bench.parse(["--during-scale-down"]).during_scale_down
    assert not bench.parse([]).during_scale_down


def test_a_wake_during_a_scale_down_is_for_tritonmodels_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as refused:
        bench.parse(["--during-scale-down", "--as", "pods"])
    assert refused.value.code == 2
    assert "--during-scale-down is for TritonModels" in capsys.readouterr().err


@pytest.mark.parametrize("count", ["0", "101"])
def test_a_count_it_cannot_run_is_refused_with_what_to_give(
    count: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        bench.parse(["--models", count])
    assert refused.value.code == 2
    assert "--models: each count is 1 to 100" in capsys.readouterr().err


def _floors(p95: float, top: float) -> tuple[Floor, ...]:
    """A bounded floor of `p95` and `top` (at least `p95`) and a worse unbounded one."""
    rounds = (p95,) * 19 + (top,)
    worse = tuple(2 * r for r in rounds)
    return Floor(Way("8 at a time", 8), (rounds,)), Floor(Way("all at once", None), (worse,))


FIRSTS = tuple(float(i) for i in range(1, 21))  # 1..20 s: p95 19, max 20


def test_the_report_gives_percentiles_and_closes_on_the_largest_count() -> None:
    wakes = [
        bench.Wake("TritonModels", 20, FIRSTS, _floors(16.0, 16.0), "25 wakes"),
        bench.Wake("TritonModels", 1, (0.5,), _floors(0.4, 0.4)),
    ]
    assert wakes[0].lines() == [
        "20 TritonModels woken at once: first answer p50 10.00 s, p95 19.00 s, max 20.00 s",
        "  the agent meanwhile: 25 wakes",
    ]
    assert wakes[0].floor_lines() == [
        "  floor: Triton over gRPC, 8 at a time: p95 16.00 s, max 16.00 s (medians of 1 rounds)",
        "  floor: Triton over gRPC, all at once: p95 32.00 s, max 32.00 s (medians of 1 rounds)",
    ]
    assert bench.closing(wakes) == (
        "scale_from_zero: 20 TritonModels: p95 19.0 s, max 20.0 s; floor p95 16.0 s, max 16.0 s "
        "(1.19x, 1.25x)"
    )


@pytest.mark.parametrize(
    ("floor_p95", "floor_top", "met", "code"),
    [
        (10.0, 20.0, [True, True], 0),  # exactly at the goals
        (9.0, 20.0, [False, True], 1),  # p95 1.44x
        (10.0, 19.0, [True, False], 1),  # max 1.58x
        (5.0, 10.0, [False, False], 1),
    ],
)
def test_25_tritonmodels_are_held_to_the_better_floor_like_with_like(
    floor_p95: float, floor_top: float, met: list[bool], code: int,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    wake = bench.Wake("TritonModels", 25, (13.0,) * 24 + (30.0,), _floors(floor_p95, floor_top))
    assert (wake.p95, wake.top, wake.floor_p95, wake.floor_top) == (13, 30, floor_p95, floor_top)
    assert wake.goals() == met
    said = capsys.readouterr().out
    assert said.count("NOT MET") == met.count(False) and "p95 / the floor's p95" in said
    assert bench.verdict([wake]) == code
    assert bench.verdict([wake], no_goal=True) == 0


def test_only_25_tritonmodels_have_the_goal(capsys: pytest.CaptureFixture[str]) -> None:
    slow = _floors(1.0, 1.0)
    assert bench.Wake("TritonModels", 5, FIRSTS, slow).goals() == []
    assert bench.Wake("model pods", 25, FIRSTS, slow).goals() == []
    assert bench.verdict([bench.Wake("model pods", 25, FIRSTS, slow)]) == 0
    assert "none checked" in capsys.readouterr().out
    assert bench.parse([]).rounds == 3 and not bench.parse([]).no_goal
    assert bench.parse(["--rounds", "5", "--no-goal"]).no_goal


def test_the_agents_histograms_are_told_as_counts_and_means() -> None:
    before = {"tritonshare_agent_load_duration_seconds_count": 2.0,
              "tritonshare_agent_load_duration_seconds_sum": 3.0}  # fmt: skip
    after = {"tritonshare_agent_load_duration_seconds_count": 6.0,
             "tritonshare_agent_load_duration_seconds_sum": 11.0,
             "tritonshare_agent_wake_duration_seconds_count": 4.0,
             "tritonshare_agent_wake_duration_seconds_sum": 12.0}  # fmt: skip
    assert bench.phases(before, after) == (
        "4 wakes, start to READY mean 3.00 s; 4 loads, Triton's load call mean 2.00 s; 0 installs"
    )


def test_a_triton_loads_as_many_at_once_as_it_is_given(tmp_path: Path) -> None:
    """The floor's Triton and the simulated node's run with the node's load threads (the
    agent's --parallel-loads for each GPU), never Triton's default or a second figure."""
    server = TritonServer(tmp_path, parallel_loads=16)
    command = server.command(TritonInstall.find(), tmp_path / "backends")
    threads = [a for a in command if a.startswith("--model-load-thread-count")]
    assert threads == ["--model-load-thread-count=16"]
