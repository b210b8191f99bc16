"""The lifecycle stops on signals, reports failed tasks and runs cleanups in reverse order."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from common.lifecycle import Lifecycle, serve, spawn
from common.logs import JsonFormatter, configure_logging

ROOT = Path(__file__).resolve().parents[2]


async def test_cleanups_run_in_reverse_order_and_tasks_are_cancelled() -> None:
    order: list[str] = []
    cancelled = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def main(life: Lifecycle) -> None:
        life.spawn("worker", forever())

        async def first() -> None:
            order.append("first")

        async def second() -> None:
            order.append("second")

        life.on_shutdown("first", first)
        life.on_shutdown("second", second)
        life.request_stop("test")

    assert await Lifecycle().run(main) == 0
    assert order == ["second", "first"]
    assert cancelled.is_set()


async def test_a_failing_task_stops_the_process_with_code_1(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken() -> None:
        raise RuntimeError("boom")

    async def main(life: Lifecycle) -> None:
        life.spawn("watcher", broken())

    with caplog.at_level(logging.ERROR):
        code = await asyncio.wait_for(Lifecycle().run(main), 10)
    assert code == 1
    assert "watcher has failed" in caplog.text


async def test_a_spawned_task_that_raises_is_logged_with_its_name_and_then_handed_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken() -> None:
        raise RuntimeError("boom")

    kept: set[asyncio.Task[object]] = set()
    failures: list[BaseException] = []
    with caplog.at_level(logging.ERROR, logger="common.lifecycle"):
        task = spawn(
            "Recording event X on pod a/b",
            broken(),
            consequence="the pod does not show it",
            on_failure=failures.append,
            keep=kept,
        )
        assert task.get_name() == "Recording event X on pod a/b" and kept == {task}
        with pytest.raises(RuntimeError):
            await task
        await asyncio.sleep(0)  # done-callbacks run on the next loop turn
    (record,) = caplog.records
    assert (
        record.getMessage() == "Recording event X on pod a/b has failed: the pod does not show it."
    )
    assert record.exc_info is not None and "boom" in caplog.text
    assert [str(e) for e in failures] == ["boom"]
    assert not kept


async def test_a_cancelled_or_finished_task_is_not_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failures: list[BaseException] = []
    with caplog.at_level(logging.DEBUG, logger="common.lifecycle"):
        sleeping = spawn("sleeper", asyncio.sleep(60), on_failure=failures.append)
        done = spawn("quick", asyncio.sleep(0, "result"), on_failure=failures.append)
        await asyncio.sleep(0)
        sleeping.cancel()
        assert await done == "result"
        with pytest.raises(asyncio.CancelledError):
            await sleeping
        await asyncio.sleep(0)
    assert not caplog.records and not failures


async def test_sigterm_requests_a_stop() -> None:
    life = Lifecycle()
    seen: list[signal.Signals] = []
    life.install_signal_handlers(seen.append)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(life.wait(), 10)
    finally:
        loop = asyncio.get_running_loop()
        loop.remove_signal_handler(signal.SIGTERM)
        loop.remove_signal_handler(signal.SIGINT)
    assert seen == [signal.SIGTERM]
    assert life.stop_reason == "SIGTERM"


async def test_a_slow_cleanup_is_bounded_and_the_next_still_runs() -> None:
    ran: list[str] = []

    async def slow() -> None:
        await asyncio.Event().wait()

    async def quick() -> None:
        ran.append("quick")

    life = Lifecycle(cleanup_timeout=0.05)
    life.on_shutdown("quick", quick)
    life.on_shutdown("slow", slow)
    await life.shutdown()
    assert ran == ["quick"]


async def test_spawning_a_running_name_twice_is_refused() -> None:
    life = Lifecycle()
    life.spawn("x", asyncio.Event().wait())  # type: ignore[arg-type]
    coro = asyncio.Event().wait()
    with pytest.raises(RuntimeError, match="already running"):
        life.spawn("x", coro)  # type: ignore[arg-type]
    await life.shutdown()


async def test_a_stop_while_starting_cancels_the_start_and_undoes_what_it_did() -> None:
    undone: list[str] = []
    cancelled = asyncio.Event()

    async def start(life: Lifecycle) -> None:
        async def close_listener() -> None:
            undone.append("listener")

        life.on_shutdown("the listener", close_listener)
        life.request_stop("SIGTERM")  # as a signal would, while the caches still fill
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        undone.append("started after the stop")  # never reached

    assert await asyncio.wait_for(Lifecycle().run(start), 10) == 0
    assert cancelled.is_set()
    assert undone == ["listener"]


async def test_an_error_while_starting_is_raised_after_the_cleanups_so_far() -> None:
    undone: list[str] = []

    async def start(life: Lifecycle) -> None:
        async def close_listener() -> None:
            undone.append("listener")

        life.on_shutdown("the listener", close_listener)
        raise OSError("the port is taken")

    with pytest.raises(OSError, match="the port is taken"):
        await Lifecycle().run(start)
    assert undone == ["listener"]


async def test_a_failed_task_that_is_not_vital_leaves_the_process_running(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken() -> None:
        raise RuntimeError("boom")

    life = Lifecycle()
    with caplog.at_level(logging.ERROR, logger="common.lifecycle"):
        task = life.spawn(
            "The watch on dead agents", broken(), consequence="no pod is replaced", vital=False
        )
        with pytest.raises(RuntimeError):
            await task
        await asyncio.sleep(0)  # done-callbacks run on the next loop turn
    assert caplog.messages == ["The watch on dead agents has failed: no pod is replaced."]
    assert not life.stop_event.is_set() and life.failure is None
    await life.shutdown()


async def test_finishing_tasks_waits_for_those_that_see_the_stop_and_cancels_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    life = Lifecycle()
    finished_step = asyncio.Event()
    seen_by_later_cleanup: list[bool] = []

    async def polite() -> None:
        await life.stop_event.wait()
        finished_step.set()

    async def stuck() -> None:
        await asyncio.Event().wait()

    async def later_cleanup() -> None:  # registered first, so it runs after the tasks finish
        seen_by_later_cleanup.append(finished_step.is_set() and stuck_task.cancelled())

    life.on_shutdown("the clients", later_cleanup)
    life.on_shutdown_finish_tasks("the loops", grace=0.2)
    life.spawn("the polite loop", polite())
    stuck_task = life.spawn("the stuck loop", stuck())
    life.request_stop("test")
    with caplog.at_level(logging.WARNING, logger="common.lifecycle"):
        await asyncio.wait_for(life.shutdown(), 10)
    assert seen_by_later_cleanup == [True]
    assert caplog.messages == [
        "the stuck loop did not finish within 0.2 s of the stop: cancelling it."
    ]


async def test_serve_runs_a_part_and_returns_its_exit_code() -> None:
    class Failing:
        async def start(self, lifecycle: Lifecycle) -> None:
            lifecycle.spawn("the part's loop", self._loop())

        async def _loop(self) -> None:
            raise RuntimeError("boom")

    try:
        assert await asyncio.wait_for(serve(Failing()), 10) == 1
    finally:
        loop = asyncio.get_running_loop()
        loop.remove_signal_handler(signal.SIGTERM)
        loop.remove_signal_handler(signal.SIGINT)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # serve leaves them ignored for the exit
        signal.signal(signal.SIGINT, signal.default_int_handler)


def test_a_stop_signal_after_the_part_stopped_does_not_end_its_exit() -> None:
    """A node pod's gateway shares its keeper's process group: a SIGTERM to the group reaches it,
    and the keeper sends it on; the second one may come once the part has stopped."""
    script = (
        "import asyncio, os, signal, sys\n"
        "from common.lifecycle import serve\n"
        "class Done:\n"
        "    async def start(self, lifecycle):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "code = asyncio.run(serve(Done()))\n"
        "os.kill(os.getpid(), signal.SIGTERM)  # the keeper's copy, once the loop is gone\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, timeout=60)
    assert done.returncode == 0


def test_json_logs_carry_message_and_extra_fields() -> None:
    record = logging.LogRecord(
        "agent.gpus.nvml", logging.WARNING, __file__, 1, "GPU %d is lost", (1,), None
    )
    record.gpu_uuid = "GPU-3f2"
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "GPU 1 is lost"
    assert entry["level"] == "warning"
    assert entry["logger"] == "agent.gpus.nvml"
    assert entry["gpu_uuid"] == "GPU-3f2"


def test_configure_logging_replaces_handlers_and_quiets_clients() -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure_logging("DEBUG", "json")
        assert len(root.handlers) == 1
        assert isinstance(root.handlers[0].formatter, JsonFormatter)
        assert logging.getLogger("kubernetes").level == logging.WARNING
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
