"""The inbox that hands work from other threads to the event loop: order kept across threads, one
wake-up of the loop per burst, a failing callback not stopping the others, a closed loop said."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from binder.api.inbox import Inbox
from tests.binder.simcluster import eventually


async def test_callbacks_run_on_the_loop_in_the_order_posted_one_wake_up_per_burst(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()
    inbox = Inbox(loop)
    wake_ups = 0
    real = loop.call_soon_threadsafe

    def counted(*args: object) -> asyncio.Handle:
        nonlocal wake_ups
        wake_ups += 1
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(loop, "call_soon_threadsafe", counted)
    seen: list[tuple[str, int, bool]] = []
    on_loop = threading.get_ident()

    def record(who: str, i: int) -> None:
        seen.append((who, i, threading.get_ident() == on_loop))

    def burst(who: str) -> None:
        for i in range(100):
            inbox.post(record, who, i)

    threads = [threading.Thread(target=burst, args=(who,)) for who in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wake_ups == 1, "the loop ran nothing meanwhile: everything rides on one wake-up"
    await eventually(lambda: len(seen) == 200, what="every callback")
    assert all(on for _, _, on in seen)
    for who in ("a", "b"):
        assert [i for w, i, _ in seen if w == who] == list(range(100))
    inbox.post(record, "c", 0)
    await eventually(lambda: len(seen) == 201, what="the next burst")
    assert wake_ups == 2


async def test_a_failing_callback_is_logged_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inbox = Inbox(asyncio.get_running_loop())
    seen: list[int] = []

    def broken() -> None:
        raise RuntimeError("a bug")

    with caplog.at_level(logging.ERROR, logger="binder.api.inbox"):
        inbox.post(seen.append, 1)
        inbox.post(broken)
        inbox.post(seen.append, 2)
        await eventually(lambda: seen == [1, 2], what="both callbacks around the failure")
    assert "A callback handed to the event loop has failed." in caplog.messages


def test_posting_to_a_closed_loop_says_so() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    assert not Inbox(loop).post(print, "never")
