"""The leaked-task guard of tests/conftest.py: what it lets end and what it names."""

from __future__ import annotations

import asyncio

from tests.conftest import TASK_GRACE_SECONDS, pending_tasks


def test_a_task_ending_within_the_grace_is_not_pending_and_one_that_waits_on_is() -> None:
    loop = asyncio.new_event_loop()
    try:
        waits_on = loop.create_task(asyncio.sleep(60 * TASK_GRACE_SECONDS), name="waits on")
        ends_soon = loop.create_task(asyncio.sleep(TASK_GRACE_SECONDS / 10), name="ends soon")
        assert pending_tasks(loop) == [waits_on]
        assert ends_soon.done()
        waits_on.cancel()
        loop.run_until_complete(asyncio.gather(waits_on, return_exceptions=True))
        assert pending_tasks(loop) == []
    finally:
        loop.close()
