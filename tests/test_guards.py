"""The leak guards of tests/conftest.py: what the task guard lets end and what it names, and
the process tree the process guard reads."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time

import psutil

from tests.conftest import TASK_GRACE_SECONDS, pending_tasks
from tests.process_tree import descendant_pids


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


def test_the_process_tree_holds_grandchildren_and_children_forked_by_other_threads() -> None:
    """What psutil's walk of all of /proc finds, and nothing once the tree has exited (the
    background native build may change the rest of the tree meanwhile)."""
    shell = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"], start_new_session=True)
    from_thread: list[subprocess.Popen[bytes]] = []
    thread = threading.Thread(target=lambda: from_thread.append(subprocess.Popen(["sleep", "60"])))
    thread.start()
    thread.join()
    try:
        deadline = time.monotonic() + 30
        while len(psutil.Process(shell.pid).children()) < 2:
            assert time.monotonic() < deadline, "the shell did not start its two sleeps"
            time.sleep(0.02)
        grandchildren = {p.pid for p in psutil.Process(shell.pid).children()}
        started = {shell.pid, from_thread[0].pid} | grandchildren
        assert started <= descendant_pids(os.getpid())
        assert started <= {p.pid for p in psutil.Process().children(recursive=True)}
        assert descendant_pids(shell.pid) == grandchildren
    finally:
        os.killpg(shell.pid, signal.SIGKILL)
        shell.wait(10)
        from_thread[0].kill()
        from_thread[0].wait(10)
    assert descendant_pids(shell.pid) == set()
