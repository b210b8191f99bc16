"""The retry schedule of a connection refused while the upstream restarts (`proxy.reconnect`):
on its own, with a connect that is refused as often as a test says. Through a real Triton:
tests/proxy/test_upstream_restart.py; the node gateway's restore:
tests/agent/quarantine/test_restore_hold.py."""

from __future__ import annotations

import asyncio
import time

import pytest

from proxy.reconnect import connect_retrying


class Refusing:
    """A connect refused until `listening` is set, counting its tries."""

    def __init__(self) -> None:
        self.tries = 0
        self.listening = asyncio.Event()

    async def __call__(self) -> str:
        self.tries += 1
        if not self.listening.is_set():
            raise ConnectionRefusedError(111, "Connection refused")
        return "connected"


async def test_a_refusal_past_the_bound_fails_without_a_restore() -> None:
    refusing = Refusing()
    started = time.monotonic()
    with pytest.raises(ConnectionRefusedError):
        await connect_retrying(refusing, 0.3, restoring=lambda: None)
    assert 0.1 < time.monotonic() - started < 2 and refusing.tries >= 3


async def test_a_refusal_during_a_restore_waits_for_it_then_connects() -> None:
    """Past --connect-retry (0.2 s here) while the model restores for 1 s, the restore seen
    at the first refusal: it waits for the restore's end, with no try meanwhile, then
    connects."""
    refusing = Refusing()
    restored = asyncio.Event()

    def restoring() -> tuple[asyncio.Event, float] | None:
        return (restored, 30.0) if refusing.tries else None

    task = asyncio.create_task(connect_retrying(refusing, 0.2, restoring=restoring))
    await asyncio.sleep(1.0)
    assert not task.done() and refusing.tries == 1, "no try while the model restores"
    refusing.listening.set()
    restored.set()
    assert await asyncio.wait_for(task, 5) == "connected"
    assert refusing.tries == 2


async def test_a_restore_is_waited_for_once_and_at_most_its_bound() -> None:
    refusing = Refusing()
    never = asyncio.Event()
    started = time.monotonic()
    with pytest.raises(ConnectionRefusedError):
        await connect_retrying(refusing, 0.2, restoring=lambda: (never, 0.5))
    took = time.monotonic() - started
    assert 0.6 < took < 3, "the restore's bound, then --connect-retry again, then it fails"


async def test_a_restore_seen_after_the_refusal_is_waited_for_before_the_next_try() -> None:
    """Refused while Triton was down but before the gateway saw the exit (no restore yet): 10 ms
    later Triton listens again without its models and the gateway sees the exit. The next try,
    50 ms after the refusal, would reach Triton before it has the model (404 unknown model): the
    restore that began meanwhile is waited for first."""
    refusing = Refusing()
    restored = asyncio.Event()
    restore: list[tuple[asyncio.Event, float]] = []

    def exit_seen() -> None:
        refusing.listening.set()
        restore.append((restored, 30.0))

    async def connect() -> str:
        if refusing.tries == 0:
            asyncio.get_running_loop().call_later(0.01, exit_seen)
        return await refusing()

    task = asyncio.create_task(
        connect_retrying(connect, 5.0, restoring=lambda: restore[0] if restore else None)
    )
    await asyncio.sleep(0.5)
    assert not task.done() and refusing.tries == 1, "no try while the model restores"
    restored.set()
    assert await asyncio.wait_for(task, 5) == "connected"
    assert refusing.tries == 2


async def test_a_connection_begun_during_a_restore_waits_for_it_before_its_first_try() -> None:
    """Triton's keeper starts it again at once: a request admitted before the exit that
    connects while its model restores finds Triton listening, never refused, and would be
    answered 404 unknown model there. It waits for the restore first, then tries once."""
    refusing = Refusing()
    refusing.listening.set()  # listening again, without the model
    restored = asyncio.Event()
    task = asyncio.create_task(connect_retrying(refusing, 5.0, restoring=lambda: (restored, 30.0)))
    await asyncio.sleep(0.3)
    assert not task.done() and refusing.tries == 0, "no try while the model restores"
    restored.set()
    assert await asyncio.wait_for(task, 5) == "connected"
    assert refusing.tries == 1
    # With no restore under way, the first try goes at once.
    assert await connect_retrying(refusing, 5.0, restoring=lambda: None) == "connected"
    assert refusing.tries == 2
