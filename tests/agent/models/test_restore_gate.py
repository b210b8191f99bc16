"""The restore gate: closed at Triton's exit, opened by the first reconciler pass that began after
it (not by one under way when Triton exited again), and a load never waits past its bound."""

from __future__ import annotations

import asyncio

from agent.models.restoregate import RestoreGate


def closed(gate: RestoreGate) -> bool:
    return gate.restoring


async def test_a_pass_that_began_before_the_latest_exit_opens_nothing() -> None:
    exits: list[int] = []
    gate = RestoreGate(on_gone=lambda: exits.append(gate.generation))
    assert not closed(gate) and await gate.wait(0.01) == 0.0
    gate.gone()
    before = gate.generation
    gate.gone()  # Triton exited again while that pass ran
    assert exits == [1, 2], "the crash ledger hears of each exit"
    gate.restored(before)
    assert closed(gate)
    gate.restored(gate.generation)
    assert await gate.wait(5.0) == 0.0  # open: nothing to wait for


async def test_a_load_waits_until_the_restore_or_its_bound() -> None:
    gate = RestoreGate(on_gone=lambda: None)
    gate.gone()
    waiting = asyncio.ensure_future(gate.wait(30.0))
    await asyncio.sleep(0)
    assert not waiting.done()
    gate.restored(gate.generation)
    assert await asyncio.wait_for(waiting, 5) < 5
    gate.gone()
    assert await gate.wait(0.05) >= 0.05  # never restored: it goes on after its bound
