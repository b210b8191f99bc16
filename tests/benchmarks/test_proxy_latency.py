"""benchmarks/proxy_latency.py's explaining counters: the others' load is the box's CPU less the
benchmark's own, where its own counts every process under it (running or waited for), and the
report prints the per-call CPU at c=1 and the others' load from the saved figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import native_relay
from benchmarks.proxy_latency import Results, box_cpu_seconds, headline, report

_BURN = (
    "import sys, time\n"
    "end = time.process_time() + 0.3\n"
    "while time.process_time() < end:\n"
    "    pass\n"
    "print('burnt', flush=True)\n"
    "sys.stdin.read()\n"
)
"""A child that spends 0.3 s of CPU, says so, and stays alive until its stdin closes."""


def test_a_child_of_the_benchmark_counts_as_its_own_load_running_and_once_waited_for() -> None:
    box, own = box_cpu_seconds()
    child = subprocess.Popen(
        [sys.executable, "-c", _BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "burnt\n"
        running_box, running_own = box_cpu_seconds()
        assert running_own - own >= 0.25  # the live child's CPU is the benchmark's own
    finally:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.close()
        child.wait(10)
        child.stdout.close()
    box_after, own_after = box_cpu_seconds()
    assert own_after - own >= 0.25  # still counted once it ended and was waited for
    # The box's busy time holds the benchmark's (to /proc/stat's 10 ms ticks per CPU).
    assert box_after - box >= (own_after - own) - 0.05
    assert running_box <= box_after


def test_the_report_prints_the_others_load_and_each_hops_cpu_per_call_at_c1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    results: Results = {
        ("grpc1", "direct"): [0.50, 0.52],
        ("grpc1", "chain"): [0.66, 0.70],
        ("grpc1", "full"): [0.76, 0.80],
        ("grpc1cpu", "chain"): [40.0, 44.0],
        ("grpc1cpu", "chain:proxy"): [100.0, 104.0],
        ("grpc1cpu", "full"): [110.0, 118.0],
        ("grpc1cpu", "full:proxy"): [96.0, 98.0],
        ("others", "box"): [0.10, 0.30],
    }
    report(results, 2, 2)
    out = capsys.readouterr().out
    assert "others: work outside this benchmark took 20% of the box's CPU" in out
    assert "(rounds 10% .. 30%)" in out
    assert "gRPC c=1, per call (python grpc client): chain 42 us, full 114 us" in out
    assert "chain:proxy 102 us, full:proxy 97 us" in out
    # the gateway over the bare relay in its place: CPU +72 us, latency +100 us (medians)
    assert "the gateway's CPU per call 114 us, +72 us over the bare relay's" in out
    assert "adds +100 us of latency over" in out


def test_the_headline_says_each_hop_over_triton_directly_and_the_proxy_over_the_relay() -> None:
    results: Results = {
        ("rest1", "direct"): [0.30, 0.32],
        ("rest1", "floor"): [0.40, 0.42],
        ("rest1", "relay"): [0.42, 0.44],
        ("rest1", "full"): [0.48, 0.50],
        ("rest16", "direct"): [1000.0, 1000.0],
        ("rest16", "relay"): [900.0, 900.0],
        ("rest16", "full"): [800.0, 800.0],
        ("grpc1", "direct"): [0.50, 0.50],
        ("grpc1", "relay"): [0.60, 0.60],
    }
    assert headline(results) == (
        "proxy_latency: REST c=1 over Triton directly: proxy +0.120 ms, full path +0.180 ms, "
        "the proxy +0.020 ms over the bare relay, c=16 kept of Triton's: proxy 90%, full path "
        "80%; gRPC c=1 over Triton directly: proxy +0.100 ms"
    )


def test_native_runs_the_bare_relay_compiled_too(tmp_path: Path) -> None:
    """With --native the floor is the same relay compiled with mypyc: a compiled proxy against
    an interpreted relay is no floor."""
    out = tmp_path / "native-relay"
    assert native_relay.build(out) is True
    assert native_relay.compiled(out)
    assert native_relay.build(out) is False, "up to date: not built again"
    imported = subprocess.run(
        [sys.executable, "-c", "import benchmarks.tcp_relay as r; print(r.__file__)"],
        cwd=out,
        capture_output=True,
        text=True,
        check=True,
    )
    assert imported.stdout.strip().endswith(".so"), "the run imports the compiled relay"
    assert native_relay.command()[:2] == [sys.executable, "-c"], "python -m cannot run a .so"
