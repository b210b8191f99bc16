"""policy.limiter: a waiter cancelled while a slot is being given back leaves the queue whole."""

from __future__ import annotations

import asyncio

import pytest

from proxy.policy.limiter import Limiter


async def test_a_waiter_cancelled_as_a_slot_comes_back_neither_fails_nor_leaks_it() -> None:
    limiter = Limiter(1, 4, 30.0)
    assert limiter.try_acquire()
    waiting = asyncio.get_running_loop().create_task(limiter.acquire())
    await asyncio.sleep(0)  # it queues
    assert limiter.queued == 1
    waiting.cancel()  # cancels the future it awaits, before the task runs again...
    limiter.release()  # ...and the slot comes back meanwhile: the cancelled waiter is skipped
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert (limiter.in_flight, limiter.queued) == (0, 0)
    assert limiter.try_acquire()  # the slot is free, not lost to the cancelled waiter
