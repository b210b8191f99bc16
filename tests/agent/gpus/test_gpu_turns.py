"""The agent's waits at a GPU's slot follow the GPU queue's grants: one turn at a time, in the
order the queue grants, a waiter cancelled while it waits (or just as it is granted) passes its
turn on, and a turn past its budget is cut short."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.errors import LoadTimedOutError
from agent.gpus.gpuqueue import GpuQueue, Turn, Work
from agent.models.nodemodels import Models
from tests.agent.pods.test_ownership import owner_models


async def take_turn(models: Models, name: str, entered: list[str], leave: asyncio.Event) -> None:
    async with models.admission.turn("GPU-a", Work.LOAD, name, "team-a"):
        entered.append(name)
        await leave.wait()


def asked(models: Models) -> list[str]:
    """The models holding or awaiting GPU-a's slot, in the queue's order."""
    holder = models.admission.queue.holder("GPU-a")
    waiting = models.admission.queue.waiting("GPU-a")
    return [turn.name for turn in ([holder] if holder else []) + waiting]


async def until(condition: Callable[[], bool], what: str) -> None:
    """Yield to the loop until `condition()` holds (bounded: a few hundred loop turns)."""
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


async def test_turns_are_taken_one_at_a_time_in_the_order_asked(tmp_path: Path) -> None:
    models = await owner_models(tmp_path, alive=True)
    try:
        entered: list[str] = []
        leaves = {name: asyncio.Event() for name in ("a", "b", "c", "d", "e")}
        tasks = {}
        for name in ("a", "b", "c", "d", "e"):
            tasks[name] = asyncio.create_task(take_turn(models, name, entered, leaves[name]))
            await until(lambda n=name: n in asked(models), f"{name} asking")  # type: ignore[misc]
        await until(lambda: entered == ["a"], "a holding the slot")
        # b gives up while it waits: the others keep their order.
        tasks["b"].cancel()
        await until(lambda: asked(models) == ["a", "c", "d", "e"], "b leaving the queue")
        leaves["a"].set()
        await until(lambda: entered == ["a", "c"], "c holding the slot")
        # d is cancelled just as c's end grants it the slot: it passes the turn on to e.
        grant = models.admission.queue.done_all

        def grant_then_cancel(turn: Turn, now: float) -> list[Turn]:
            following = grant(turn, now)
            if any(t.name == "d" for t in following):
                tasks["d"].cancel()
            return following

        models.admission.queue.done_all = grant_then_cancel  # type: ignore[method-assign]
        leaves["c"].set()
        await until(lambda: entered == ["a", "c", "e"], "e holding the slot")
        leaves["e"].set()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        assert [tasks[n].cancelled() for n in "abcde"] == [False, True, False, True, False]
        assert asked(models) == [] and models.admission._granted == {}
    finally:
        await models.close()


async def test_a_turn_past_its_budget_is_cut_short_and_the_slot_passed_on(tmp_path: Path) -> None:
    models = await owner_models(tmp_path, alive=True)
    try:
        models.admission.queue = GpuQueue(lambda turn: 0.05 if turn.name == "slow" else None)
        entered: list[str] = []
        held_for_ever = asyncio.Event()
        slow = asyncio.create_task(take_turn(models, "slow", entered, held_for_ever))
        await until(lambda: entered == ["slow"], "slow holding the slot")
        done = asyncio.Event()
        done.set()
        # Granted only once the slow turn is cut short at its budget.
        await take_turn(models, "next", entered, done)
        with pytest.raises(LoadTimedOutError) as cut:
            await slow
        assert "--load-timeout-base-seconds" in str(cut.value)
        assert entered == ["slow", "next"] and asked(models) == []

        # A TimeoutError of the turn's own work, within its budget, is not the budget's.
        models.admission.queue = GpuQueue(lambda turn: 60.0)
        with pytest.raises(TimeoutError) as own:
            async with models.admission.turn("GPU-a", Work.LOAD, "m", "team-a"):
                raise TimeoutError("the work's own")
        assert not isinstance(own.value, LoadTimedOutError) and asked(models) == []
    finally:
        await models.close()
