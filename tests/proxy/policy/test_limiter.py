"""policy.limiter: a waiter cancelled while a slot is being given back leaves the queue whole."""

from __future__ import annotations

import asyncio

import pytest

from proxy.policy.limiter import Limiter
from proxy.policy.refusals import HeldError


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


async def test_a_request_a_restore_let_go_is_not_held_again_but_a_trial_still_refuses_it() -> None:
    """Held until its model is back after Triton's exit, a request of a pod not on probation is
    not held a second time by a suspected file's trial that began meanwhile (the trial waits for
    the restores and what they let go: `common.activity.Activity.restoring`), or two holds in a
    row outlast its client; a new request is held; a probationer's is held again; through a
    suspect's trial a probationer's is refused all the same."""
    limiter = Limiter(4, 4, 30.0)
    limiter.restore_seconds = limiter.hold_seconds = 30.0
    restored = limiter.restoring = asyncio.Event()  # Triton exited
    waiting = asyncio.get_running_loop().create_task(limiter.acquire())
    await asyncio.sleep(0.05)
    assert not waiting.done(), "held for the restore"
    limiter.hold(True, after_restore=False)  # a suspected file's trial begins meanwhile
    limiter.restoring = None
    restored.set()
    await asyncio.wait_for(waiting, 5)
    fresh = asyncio.get_running_loop().create_task(limiter.acquire())
    await asyncio.sleep(0.05)
    assert not fresh.done(), "a new request is held"
    limiter.hold(False)
    await asyncio.wait_for(fresh, 5)

    restored = limiter.restoring = asyncio.Event()
    waiting = asyncio.get_running_loop().create_task(limiter.acquire())
    await asyncio.sleep(0.05)
    limiter.hold(True)  # a probationer: held through any watched load, restored or not
    limiter.restoring = None
    restored.set()
    await asyncio.sleep(0.05)
    assert not waiting.done(), "a probationer's is held again"
    limiter.hold(False)
    await asyncio.wait_for(waiting, 5)

    restored = limiter.restoring = asyncio.Event()
    waiting = asyncio.get_running_loop().create_task(limiter.acquire())
    await asyncio.sleep(0.05)
    limiter.hold(True, trial=True)
    limiter.restoring = None
    restored.set()
    with pytest.raises(HeldError):
        await asyncio.wait_for(waiting, 5)


async def test_a_held_request_let_go_as_triton_exits_waits_for_its_model_back() -> None:
    """Held for a load that then killed Triton: the hold ends as the restore begins, and the
    request waits for its model to be back instead of reaching a dead Triton (a failure there
    would also name its pod beside the exit)."""
    limiter = Limiter(4, 4, 30.0)
    limiter.restore_seconds = limiter.hold_seconds = 30.0
    limiter.hold(True, after_restore=False)
    waiting = asyncio.get_running_loop().create_task(limiter.acquire())
    await asyncio.sleep(0.05)
    assert not waiting.done(), "held for the load"
    restored = limiter.restoring = asyncio.Event()  # the load killed Triton
    limiter.hold(False)
    await asyncio.sleep(0.05)
    assert not waiting.done(), "sent to a dead Triton"
    assert limiter.in_flight == 0
    limiter.restoring = None
    restored.set()
    await asyncio.wait_for(waiting, 5)
    assert limiter.in_flight == 1
