"""The hand-over of blocking work to worker threads: at most `workers` jobs at once, every
outcome (an error included) back on the loop's thread, and a drain that abandons what is left."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from binder.api.handover import Handover
from binder.api.inbox import Inbox
from tests.binder.simcluster import eventually


async def test_at_most_workers_jobs_run_at_once_and_outcomes_come_back_on_the_loop() -> None:
    loop_thread = threading.get_ident()
    release = threading.Event()
    lock = threading.Lock()
    running = peak = 0
    outcomes: list[tuple[int, str | None, bool]] = []

    def job(n: int) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        release.wait(10)
        with lock:
            running -= 1
        if n == 3:
            raise ValueError("job 3 failed")

    def outcome(n: int, error: Exception | None) -> None:
        outcomes.append((n, str(error) if error else None, threading.get_ident() == loop_thread))

    with ThreadPoolExecutor(8) as executor:
        handover = Handover(executor, workers=2, inbox=Inbox(asyncio.get_running_loop()))
        for n in range(6):
            handover.submit(partial(job, n), partial(outcome, n))
        await eventually(lambda: running == 2, within=5, what="two jobs running")
        release.set()
        await eventually(lambda: len(outcomes) == 6, within=5, what="every outcome")
    assert peak == 2
    assert sorted(outcomes) == [(n, "job 3 failed" if n == 3 else None, True) for n in range(6)]


async def test_drain_waits_for_running_jobs_then_abandons_the_rest() -> None:
    release = threading.Event()
    ran: list[int] = []
    outcomes: list[int] = []

    def job(n: int) -> None:
        release.wait(10)
        ran.append(n)

    def took(n: int, error: Exception | None) -> None:
        outcomes.append(n)

    with ThreadPoolExecutor(2) as executor:
        handover = Handover(executor, workers=1, inbox=Inbox(asyncio.get_running_loop()))
        for n in range(3):
            handover.submit(partial(job, n), partial(took, n))
        await handover.drain(0.05)  # the first job is stuck: the others are abandoned
        release.set()
    # The runner has posted the job's outcome before the executor let go of its thread; the
    # inbox keeps order, so once a marker posted now has run, that outcome has been taken.
    marker = asyncio.Event()
    assert handover.inbox is not None
    handover.inbox.post(marker.set)
    await asyncio.wait_for(marker.wait(), 5)
    assert ran == [0]  # the waiting jobs never ran
    assert outcomes == []  # and the running one's outcome is ignored
