"""The agent's waits at a GPU's slot follow the GPU queue's grants: one turn at a time, in the
order asked, and a waiter cancelled while it waits (or just as it is granted) passes its turn on."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from agent.gpuqueue import Turn, Work
from agent.models import Models
from tests.agent.test_ownership import owner_models


async def take_turn(models: Models, name: str, entered: list[str], leave: asyncio.Event) -> None:
    async with models._gpu_turn("GPU-a", Work.LOAD, name, "team-a"):
        entered.append(name)
        await leave.wait()


def asked(models: Models) -> list[str]:
    """The models holding or awaiting GPU-a's slot, in the queue's order."""
    holder = models.gpu_queue.holder("GPU-a")
    waiting = models.gpu_queue.waiting("GPU-a")
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
        grant = models.gpu_queue.done

        def grant_then_cancel(turn: Turn, now: float) -> Turn | None:
            following = grant(turn, now)
            if following is not None and following.name == "d":
                tasks["d"].cancel()
            return following

        models.gpu_queue.done = grant_then_cancel  # type: ignore[method-assign]
        leaves["c"].set()
        await until(lambda: entered == ["a", "c", "e"], "e holding the slot")
        leaves["e"].set()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        assert [tasks[n].cancelled() for n in "abcde"] == [False, True, False, True, False]
        assert asked(models) == [] and models._granted == {}
    finally:
        await models.close()
