"""The gateway's activity table (proxy/gateway/activity.py): what the agent's evictions read about
which models are serving. Written by a timer from the relays' own counters, never per request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from common.activity import ActivityTableError, decode, freshness_problem, read_table
from common.callers import Caller
from proxy.gateway.activity import ActivityWriter
from proxy.policy.limiter import Limiter
from sim.triton import TritonServer
from tests.proxy.gateway.conftest import (
    RunningGateway,
    caller,
    gateway_settings,
    publish,
    running_gateway,
)
from tests.proxy.gateway.test_gateway import ADD_ONE_POD, INFER, fetch, poll


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def tenant(address: str, triton_name: str, clock: Clock) -> Any:
    caller = Caller(address, "model", "team/pod", "uid", 0, triton_name)
    return SimpleNamespace(caller=caller, limiter=Limiter(0, 10, 1.0, clock=clock), host=False)


def test_the_table_counts_requests_held_and_is_written_on_change_or_heartbeat(
    tmp_path: Path,
) -> None:
    clock = Clock()
    busy, quiet = tenant("10.0.0.1", "busy-x", clock), tenant("10.0.0.2", "quiet-y", clock)
    path = tmp_path / "activity.json"
    writer = ActivityWriter(
        path, [busy, quiet], heartbeat=2.0, clock=clock, wall=lambda: clock.now + 1e6
    )
    assert writer.write()
    table = read_table(path)
    assert table.models["busy-x"].in_flight == 0 and table.models["quiet-y"].last_used == 0
    assert not writer.write()  # nothing changed, heartbeat not due: no write

    clock.now = 101.0
    assert busy.limiter.try_acquire()
    assert writer.write()
    assert read_table(path).models["busy-x"].in_flight == 1
    clock.now = 101.5
    busy.limiter.release()
    assert writer.write()
    table = read_table(path)
    assert table.models["busy-x"].in_flight == 0
    assert table.models["busy-x"].last_used == pytest.approx(101.5 + 1e6)

    clock.now = 103.6  # quiet, but the heartbeat says the gateway is alive
    assert writer.write()
    assert read_table(path).written_at == pytest.approx(103.6 + 1e6)
    assert freshness_problem(read_table(path), 103.6 + 1e6 + 6, 5.0)


def test_the_table_says_which_models_are_held_and_what_is_at_triton(tmp_path: Path) -> None:
    """The agent reads both before a watched load (`agent.models.probationhold`); tables of gateways
    before the fields read as nothing held, nothing at Triton."""
    clock = Clock()
    held = tenant("10.0.0.1", "held-x", clock)
    path = tmp_path / "activity.json"
    writer = ActivityWriter(path, [held], clock=clock)
    assert held.limiter.try_acquire()
    held.limiter.hold(True)
    assert writer.write()
    activity = read_table(path).models["held-x"]
    assert (activity.in_flight, activity.at_triton, activity.held) == (1, 1, True)
    assert not activity.restoring
    held.limiter.restoring = asyncio.Event()  # Triton exited: held until the model is back
    assert writer.write()
    assert read_table(path).models["held-x"].restoring
    old = decode(
        b'{"format": "tritonshare.io/activity/v1", "writtenAt": 1, '
        b'"models": {"m": {"inFlight": 2, "lastUsed": 0}}}'
    )
    assert (old.models["m"].at_triton, old.models["m"].held, old.models["m"].restoring) == (
        0,
        False,
        False,
    )
    with pytest.raises(ActivityTableError, match="held 1 of 'm' is not true or false"):
        decode(
            b'{"format": "tritonshare.io/activity/v1", "writtenAt": 1, '
            b'"models": {"m": {"inFlight": 0, "lastUsed": 0, "held": 1}}}'
        )


async def test_a_hold_reaches_the_table_at_once_and_its_drain_within_the_held_period(
    tmp_path: Path,
) -> None:
    """A watched load waits for the table to show the held models' requests answered, and their new
    requests wait with it: the table must not lag a timer's whole period behind then."""
    held = tenant("10.0.0.1", "held-x", Clock())
    held.limiter = Limiter(0, 10, 1.0)
    path = tmp_path / "activity.json"
    writer = ActivityWriter(path, [held], period=60.0, held_period=0.05)
    stop = asyncio.Event()
    task = asyncio.create_task(writer.run(stop))
    try:
        await _until("the first table", lambda: path.exists())
        assert held.limiter.try_acquire()
        held.limiter.hold(True)  # the caller table marked the pod held
        writer.nudge()
        await _until("the hold in the table", lambda: _read(path) == (True, 1))
        held.limiter.release()
        await _until("the held model drained", lambda: _read(path) == (True, 0))
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def _until(what: str, done: Callable[[], bool], within: float = 10.0) -> None:
    """Wait for `done`, well inside `ActivityWriter.period` (60 s): only a nudge or the held
    period can make it true."""
    deadline = time.monotonic() + within
    while not done():
        assert time.monotonic() < deadline, f"{what} did not come within {within:g} s"
        await asyncio.sleep(0.02)


def _read(path: Path) -> tuple[bool, int]:
    activity = read_table(path).models["held-x"]
    return activity.held, activity.at_triton


def test_a_malformed_table_is_refused() -> None:
    with pytest.raises(ActivityTableError, match="format"):
        decode(b'{"format": "other"}')
    with pytest.raises(ActivityTableError, match="not a count"):
        decode(
            b'{"format": "tritonshare.io/activity/v1", "writtenAt": 1, '
            b'"models": {"m": {"inFlight": -1, "lastUsed": 0}}}'
        )


@pytest.fixture
def gateway(served_triton: TritonServer, table: Path) -> Iterator[RunningGateway]:
    publish(table, caller(ADD_ONE_POD, "add_one"))
    with running_gateway(gateway_settings(served_triton, table)) as running:
        yield running


@pytest.mark.triton
def test_the_running_gateway_writes_a_pods_requests_beside_the_caller_table(
    gateway: RunningGateway, table: Path
) -> None:
    path = table.parent / "activity.json"
    poll(path.exists, "the activity table to be written")
    started = time.time()
    assert fetch(gateway, ADD_ONE_POD, "POST", "/v2/models/add_one/infer", INFER)[0] == 200

    def seen() -> bool:
        try:
            activity = read_table(path).models.get("add_one")
        except ActivityTableError:
            return False  # the rename is atomic; a missing file only before the first write
        return activity is not None and activity.last_used >= started - 0.01

    poll(seen, "the request in the activity table", within=5.0)
    assert read_table(path).models["add_one"].in_flight == 0
