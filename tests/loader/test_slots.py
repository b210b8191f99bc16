"""The host's fetch slots: a model holds one at most, models retrying after a failure one fewer
than all, a free slot goes to the longest waiting replica that may take it, and a replica
cancelled while waiting or just granted leaves no slot taken."""

from __future__ import annotations

import asyncio

from loader.slots import Slots


async def _take(slots: Slots, model: str, retrying: bool, release: asyncio.Event) -> None:
    async with slots.hold(model, retrying=retrying):
        await release.wait()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_model_holds_one_slot_and_retries_leave_one_to_the_others() -> None:
    slots = Slots(3)
    names = ("r1", "r2", "r3", "b", "a0", "a1")
    release = {name: asyncio.Event() for name in names}
    tasks = []
    for name in names:
        model, retrying = name[0] if name[0] == "a" else name, name.startswith("r")
        tasks.append(asyncio.create_task(_take(slots, model, retrying, release[name])))
        await _settle()
    assert slots.held() == {"r1": True, "r2": True, "b": False}, "b passes r3; a waits"
    release["r1"].set()
    await _settle()
    assert slots.held() == {"r2": True, "b": False, "r3": True}, "the longest waiting first"
    release["b"].set()
    await _settle()
    assert slots.held() == {"r2": True, "r3": True, "a": False}
    release["a0"].set()
    await _settle()
    assert slots.held() == {"r2": True, "r3": True, "a": False}, "a's second replica"
    for event in release.values():
        event.set()
    await asyncio.gather(*tasks)
    assert slots.held() == {}


async def test_a_replica_cancelled_while_waiting_takes_no_slot() -> None:
    slots = Slots(1)
    release = asyncio.Event()
    first = asyncio.create_task(_take(slots, "a", False, release))
    await _settle()
    waiting = asyncio.create_task(_take(slots, "b", False, asyncio.Event()))
    await _settle()
    waiting.cancel()
    release.set()
    await first
    await asyncio.gather(waiting, return_exceptions=True)
    assert slots.held() == {}
    async with slots.hold("c", retrying=True):
        assert slots.held() == {"c": True}, "one slot: a retry may take it"


async def test_a_models_first_replica_passes_the_other_replicas_of_models_begun() -> None:
    """A wake of many models at once: each model's first replica is loaded before the second
    replicas of the models loaded first, so that every model's held requests are answered as
    soon as the floor of loading each model once allows."""
    slots = Slots(1)
    names = ("a0", "a1", "b0", "b1", "c0")
    release = {name: asyncio.Event() for name in names}
    tasks = []
    for name in names:
        tasks.append(asyncio.create_task(_take(slots, name[0], False, release[name])))
        await _settle()
    order = []
    for _ in names:
        (model,) = slots.held()
        order.append(model)
        waiting = next(n for n in names if n[0] == model and not release[n].is_set())
        release[waiting].set()
        await _settle()
    assert order == ["a", "b", "c", "a", "b"]
    await asyncio.gather(*tasks)
    assert slots.held() == {}
    release_d = asyncio.Event()
    task = asyncio.create_task(_take(slots, "d", False, release_d))
    await _settle()
    a_again = asyncio.create_task(_take(slots, "a", False, asyncio.Event()))
    e_first = asyncio.create_task(_take(slots, "e", False, asyncio.Event()))
    await _settle()
    release_d.set()
    await task
    await _settle()
    assert slots.held() == {"a": False}, "a, done before, begins afresh: the longest waiting"
    for pending in (a_again, e_first):
        pending.cancel()
    await asyncio.gather(a_again, e_first, return_exceptions=True)
