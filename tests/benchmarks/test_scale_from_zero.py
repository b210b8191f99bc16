"""`python -m benchmarks.scale_from_zero` runs the counts asked, refuses those it cannot run
before starting anything, and closes on the largest count's p95 beside Triton's own load."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import scale_from_zero as bench
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


def test_the_report_gives_percentiles_and_closes_on_the_largest_count() -> None:
    firsts = tuple(float(i) for i in range(1, 21))  # 1..20 s
    wakes = [
        bench.Wake("TritonModels", 20, firsts, 8.0),
        bench.Wake("TritonModels", 1, (0.5,), 0.4),
    ]
    assert wakes[0].line() == (
        "20 TritonModels woken at once: first answer p50 10.00 s, p95 19.00 s, max 20.00 s; "
        "Triton loading 20 at once 8.00 s"
    )
    last = bench.closing(wakes)
    assert last.startswith("scale_from_zero: 20 models: p95 19.0 s, triton 8.0 s")


def test_a_triton_loads_as_many_at_once_as_it_is_given(tmp_path: Path) -> None:
    """The floor's Triton and the simulated node's run with the node's load threads (the
    agent's --parallel-loads for each GPU), never Triton's default or a second figure."""
    server = TritonServer(tmp_path, parallel_loads=16)
    command = server.command(TritonInstall.find(), tmp_path / "backends")
    threads = [a for a in command if a.startswith("--model-load-thread-count")]
    assert threads == ["--model-load-thread-count=16"]
