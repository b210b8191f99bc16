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


async def test_a_request_queued_when_triton_exits_waits_for_its_model_back_with_its_slot() -> None:
    """Queued for a slot before the node gateway saw Triton's exit: given its slot during the
    restore, it waits (holding the slot) until the model is READY again rather than reaching the
    restarted Triton before the model (404 unknown model); cancelled meanwhile, the slot is
    given back."""
    limiter = Limiter(1, 4, 30.0)
    limiter.restore_seconds = 30.0
    assert limiter.try_acquire()
    waiting = asyncio.get_running_loop().create_task(limiter.acquire())
    await asyncio.sleep(0)  # it queues
    restored = limiter.restoring = asyncio.Event()  # the gateway sees the exit
    limiter.release()
    await asyncio.sleep(0.05)
    assert not waiting.done(), "sent before its model is back"
    assert limiter.in_flight == 1
    restored.set()
    limiter.restoring = None
    await asyncio.wait_for(waiting, 5)
    limiter.release()

    assert limiter.try_acquire()
    waiting = asyncio.get_running_loop().create_task(limiter.acquire())
    await asyncio.sleep(0)
    limiter.restoring = asyncio.Event()
    limiter.release()
    await asyncio.sleep(0.05)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert limiter.in_flight == 0
