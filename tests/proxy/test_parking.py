"""Scale to zero's activator in a model host's proxy (proxy/parking.py, through proxy/app.py and
the models file): a request for a model parked here waits, counted as held (the autoscaler's
demand), and goes on once the loader lists the model served; a client that waits too long, or
that finds the model's or the host's bound full, is answered 503 with Retry-After at once, never
left hanging. No Triton is needed: the table is read, nothing listens."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy.app import Proxy
from proxy.parking import Parking
from proxy.policy import refusals
from proxy.policy.limiter import Limiter
from proxy.policy.refusals import WakeError
from proxy.settings import parse_settings
from proxy.table import TableError, read_models


def _write(path: Path, entries: list[dict[str, object]]) -> None:
    partial = path.with_suffix(".new")
    partial.write_text(json.dumps(entries))
    partial.replace(path)


def _proxy(table: Path, *flags: str) -> Proxy:
    urls = ["--triton-http-url", "t:1", "--triton-grpc-url", "t:2"]
    return Proxy(parse_settings([*urls, "--models-file", str(table), *flags], env={}))


async def _until(check: Callable[[], bool], seconds: float = 5.0) -> None:
    """Poll `check` on the loop (the tasks it waits for run between polls)."""
    async with asyncio.timeout(seconds):
        while not check():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


async def test_a_parked_model_holds_its_requests_until_the_loader_lists_it_served(
    tmp_path: Path,
) -> None:
    table = tmp_path / "models.json"
    _write(table, [{"model": "m", "parked": True}])
    proxy = _proxy(table, "--wake-timeout-seconds", "30")
    assert proxy.table is not None
    proxy.table.reread(table)
    limiter = proxy.table.models["m"].limiter
    assert proxy.parking.asleep("m"), "its readiness is not asked of Triton"
    held = asyncio.create_task(limiter.acquire())
    await _until(lambda: limiter.held == 1)
    before = limiter.concurrency_seconds()
    await asyncio.sleep(0.05)
    assert limiter.concurrency_seconds() > before, "counted as held: the autoscaler's demand"
    assert not held.done()
    # The replica is ready here: listed as served, the request goes on.
    _write(table, [{"model": "m", "maxConcurrency": 2}])
    proxy.table.reread(table)
    await asyncio.wait_for(held, 5)
    assert not proxy.parking.asleep("m") and limiter.in_flight == 1
    assert limiter.residency is None and limiter.limit == 2
    limiter.release()


async def test_a_request_waiting_too_long_gets_503_with_retry_after() -> None:
    parking = Parking(10)
    limiter = Limiter(1, 5, 30.0)
    limiter.residency = parking.park("m", lambda: limiter.queue_limit, 0.05)
    with pytest.raises(WakeError, match=r"no replica of it was ready within 0\.05 s") as refused:
        await limiter.acquire()
    assert refusals.http_status(refused.value) == 503
    assert refusals.retry_after(refused.value) == 1
    assert limiter.held == 0 and parking.waiting == 0


async def test_a_flood_past_the_model_s_bound_is_refused_at_once() -> None:
    """Attack: one client sends far more requests than a parked model may hold."""
    parking = Parking(1000)
    limiter = Limiter(1, 3, 30.0)
    limiter.residency = parking.park("m", lambda: limiter.queue_limit, 30.0)
    waiting = [asyncio.create_task(limiter.acquire()) for _ in range(3)]
    await _until(lambda: parking.waiting == 3)
    for _ in range(50):
        with pytest.raises(WakeError, match="its most; retry in 1 s") as refused:
            await asyncio.wait_for(limiter.acquire(), 1)
        assert refusals.retry_after(refused.value) == 1
    assert parking.waiting == 3 and limiter.held == 3
    parking.unpark("m")
    await asyncio.wait_for(waiting[0], 5)  # the first takes the one slot; the others queue
    for task in waiting:
        task.cancel()


async def test_the_host_s_bound_holds_across_its_parked_models() -> None:
    """Attack: a tenant parks many models and floods them all: the host holds `most_total`."""
    parking = Parking(4)
    tasks = []
    for name in ("a", "b", "c"):
        limiter = Limiter(1, 10, 30.0)
        limiter.residency = parking.park(name, lambda: 10, 30.0)
        tasks += [asyncio.create_task(limiter.acquire()) for _ in range(2)]
    await _until(lambda: parking.waiting == 4)
    await asyncio.sleep(0.01)
    refused = [t for t in tasks if t.done()]
    assert len(refused) == 2
    assert all(isinstance(t.exception(), WakeError) for t in refused)
    for task in tasks:
        task.cancel()


async def test_a_parked_model_that_leaves_the_host_answers_its_waiting_requests(
    tmp_path: Path,
) -> None:
    """Its replica is served on another node: the requests held here are told to retry (the
    Service then reaches the other host), not left to time out."""
    table = tmp_path / "models.json"
    _write(table, [{"model": "m", "parked": True}, {"model": "other"}])
    proxy = _proxy(table)
    assert proxy.table is not None
    proxy.table.reread(table)
    held = asyncio.create_task(proxy.table.models["m"].limiter.acquire())
    await _until(lambda: proxy.parking.waiting == 1)
    _write(table, [{"model": "other"}])
    proxy.table.reread(table)
    with pytest.raises(WakeError, match="now served by another host"):
        await asyncio.wait_for(held, 5)


def test_parked_is_true_or_false_in_the_models_file(tmp_path: Path) -> None:
    table = tmp_path / "models.json"
    _write(table, [{"model": "m", "parked": True}, {"model": "n"}])
    assert [e.parked for e in read_models(table)] == [True, False]
    _write(table, [{"model": "m", "parked": "yes"}])
    with pytest.raises(TableError, match="`parked` 'yes' is not true or false"):
        read_models(table)
