"""Triton's keeper, the node pod's Triton container's main process, with stand-in servers: it
starts a server that dies again at once, then after growing delays (one that ran a while: at
once), gives up after so many exits in a row (a server that ran long enough starts the count
afresh), ends what a dead server left in its process group, and on SIGTERM stops the server and
itself with the server's status. The real server under it: tests/sim/test_triton.py."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from common import keeper as keeper_module
from common.keeper import Keeper
from sim.processes import wait_until


def _server(body: str, starts: Path) -> list[str]:
    """A stand-in server that appends its start time to `starts`, then runs `body`."""
    return [
        sys.executable,
        "-c",
        f"import os, sys, time\nopen({str(starts)!r}, 'a').write(f'{{time.monotonic()}}\\n')\n"
        + body,
    ]


def _starts(path: Path) -> list[float]:
    return [float(line) for line in path.read_text().split()] if path.exists() else []


def test_a_dying_server_starts_again_at_once_then_after_growing_delays_until_given_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    starts = tmp_path / "starts"
    keeper = Keeper(_server("sys.exit(3)", starts), delays=(0.0, 0.3, 0.6), give_up_after=4)
    assert keeper.run() == 3  # the server's status, after its 4th exit in a row
    times = _starts(starts)
    assert len(times) == 4
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps[1] >= 0.3 and gaps[2] >= 0.6, gaps
    said = capsys.readouterr().out.splitlines()
    assert [line.partition("starting it again in ")[2][:4] for line in said[:3]] == [
        "0 s ",
        "0.3 ",
        "0.6 ",
    ]
    assert "exited (exit code 3)" in said[3] and "4 times in a row" in said[3]


def test_a_server_that_ran_long_enough_starts_the_count_afresh(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    # The first three run 0.4 s each (past the 0.3 s that counts as settled), then they die at once.
    body = f"if len(open({str(starts)!r}).read().split()) <= 3:\n    time.sleep(0.4)\nsys.exit(1)"
    keeper = Keeper(_server(body, starts), delays=(0.0,), settled_seconds=0.3, give_up_after=2)
    assert keeper.run() == 1
    assert len(_starts(starts)) == 4  # given up at the second short one in a row, not before


def test_a_server_that_ran_a_while_starts_again_at_once_and_only_brief_exits_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    starts = tmp_path / "starts"
    # The first two run 0.5 s each (killed by a model while serving, say), then they die at once
    # (a server that cannot start).
    body = f"if len(open({str(starts)!r}).read().split()) <= 2:\n    time.sleep(0.5)\nsys.exit(1)"
    keeper = Keeper(
        _server(body, starts), delays=(0.0, 0.5, 1.0), brief_seconds=0.3, give_up_after=5
    )
    assert keeper.run() == 1
    times = _starts(starts)
    assert len(times) == 5
    said = capsys.readouterr().out.splitlines()
    assert [line.partition("starting it again in ")[2][:4] for line in said[:4]] == [
        "0 s ",
        "0 s ",
        "0 s ",  # the first brief exit in a row
        "0.5 ",
    ]
    assert times[4] - times[3] >= 0.5


def test_what_a_dead_server_left_in_its_process_group_ends_with_it(tmp_path: Path) -> None:
    starts, child = tmp_path / "starts", tmp_path / "child"
    body = (
        "import subprocess\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(child)!r}, 'w').write(str(p.pid))\n"
        "sys.exit(1)"
    )
    keeper = Keeper(_server(body, starts), give_up_after=1)
    assert keeper.run() == 1
    left = psutil.Process(int(child.read_text()))
    wait_until(
        "the server's child ended",
        lambda: not left.is_running() or left.status() == psutil.STATUS_ZOMBIE,
        10,
    )


def test_sigterm_stops_the_server_and_the_keeper_with_the_servers_status(
    tmp_path: Path,
) -> None:
    starts, ready = tmp_path / "starts", tmp_path / "ready"
    stopped = tmp_path / "stopped"
    body = (
        "import signal\n"
        "def stop(*_):\n"
        f"    open({str(stopped)!r}, 'w').write('stopped')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        f"open({str(ready)!r}, 'w').write('ready')\n"
        "time.sleep(60)\n"
    )
    keeper = subprocess.Popen(
        [sys.executable, "-B", keeper_module.__file__, "--", *_server(body, starts)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until("the server ready for SIGTERM", ready.exists, 30)
        keeper.send_signal(signal.SIGTERM)
        assert keeper.wait(20) == 0
        assert stopped.read_text() == "stopped"
        assert len(_starts(starts)) == 1, "started again after a stop"
        out, _ = keeper.communicate(timeout=5)
        assert "stopped (exit code 0)" in out
    finally:
        if keeper.poll() is None:
            os.killpg(keeper.pid, signal.SIGKILL)
