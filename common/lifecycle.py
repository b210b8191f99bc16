"""The async lifecycle every long-running part uses, and the one way any part starts a task.

Every asyncio task in the parts is created by `spawn`: it has a name, and an exception in it is
logged as "X has failed: <consequence>" with its traceback (and handed to `on_failure`) instead of
vanishing with the task. `Lifecycle.spawn` starts a part's long-lived tasks with it: a crash there
stops the process. Signals set a stop event. Shutdown runs the registered cleanups in reverse
order of registration (last started, first stopped), each bounded by a timeout, so the order is
fixed and documented by the code that registers them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine, MutableSet
from functools import partial
from typing import Any, TypeVar

log = logging.getLogger(__name__)

Cleanup = Callable[[], Awaitable[None]]
T = TypeVar("T")


def spawn(
    name: str,
    coro: Coroutine[Any, Any, T],
    *,
    consequence: str = "its work is abandoned",
    on_failure: Callable[[BaseException], None] | None = None,
    keep: MutableSet[asyncio.Task[Any]] | None = None,
) -> asyncio.Task[T]:
    """Run `coro` as the task `name`. If it raises, log "`name` has failed: `consequence`." with
    the traceback, then call `on_failure(error)`. `keep` holds the task until it ends (the loop
    holds tasks only weakly) and lets its owner wait for or cancel what is left.

    The cost is one done-callback per task, so it is used on the proxy's paths too."""
    task = asyncio.get_running_loop().create_task(coro, name=name)
    if keep is not None:
        keep.add(task)
        task.add_done_callback(keep.discard)
    task.add_done_callback(partial(_report, consequence, on_failure))
    return task


def _report(
    consequence: str,
    on_failure: Callable[[BaseException], None] | None,
    task: asyncio.Task[Any],
) -> None:
    if task.cancelled():
        return
    error = task.exception()
    if error is None:
        return
    log.error("%s has failed: %s.", task.get_name(), consequence, exc_info=error)
    if on_failure is not None:
        on_failure(error)


class Lifecycle:
    """Owns a process's stop event, its named tasks and its ordered cleanups."""

    def __init__(self, *, cleanup_timeout: float = 30.0) -> None:
        self.stop_event = asyncio.Event()
        self.failure: BaseException | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cleanups: list[tuple[str, Cleanup]] = []
        self._cleanup_timeout = cleanup_timeout
        self.stop_reason = ""

    def install_signal_handlers(
        self, on_signal: Callable[[signal.Signals], None] | None = None
    ) -> None:
        """SIGTERM and SIGINT request a stop (after `on_signal`, if given)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._signalled, sig, on_signal)

    def _signalled(
        self, sig: signal.Signals, on_signal: Callable[[signal.Signals], None] | None
    ) -> None:
        log.info("Received %s: stopping.", sig.name)
        if on_signal is not None:
            on_signal(sig)
        self.request_stop(sig.name)

    def request_stop(self, reason: str = "requested") -> None:
        """Ask every task to wind down; idempotent."""
        if not self.stop_event.is_set():
            self.stop_reason = reason
            self.stop_event.set()

    def spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Start a named long-lived task; if it raises, log it and stop the process."""
        if name in self._tasks and not self._tasks[name].done():
            coro.close()
            raise RuntimeError(f"task {name!r} is already running")
        task = spawn(
            name,
            coro,
            consequence="stopping the process",
            on_failure=partial(self.fail, name),
        )
        self._tasks[name] = task
        return task

    def fail(self, name: str, error: BaseException) -> None:
        """`name` failed with `error`: stop, and exit with code 1."""
        if self.failure is None:
            self.failure = error
        self.request_stop(f"{name} failed")

    def on_shutdown(self, name: str, cleanup: Cleanup) -> None:
        """Register a cleanup; cleanups run in reverse order of registration."""
        self._cleanups.append((name, cleanup))

    async def wait(self) -> None:
        """Block until a stop is requested."""
        await self.stop_event.wait()

    async def shutdown(self) -> None:
        """Run the cleanups (reverse order), then cancel the remaining tasks and wait for them."""
        for name, cleanup in reversed(self._cleanups):
            try:
                await asyncio.wait_for(cleanup(), self._cleanup_timeout)
            except TimeoutError:
                log.error(
                    "Stopping %s took longer than %.0f s: moving on.", name, self._cleanup_timeout
                )
            except Exception:
                log.exception("Stopping %s has failed: moving on.", name)
        self._cleanups.clear()
        tasks = [t for t in self._tasks.values() if not t.done()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    async def run(self, main: Callable[[Lifecycle], Awaitable[None]]) -> int:
        """Start via `main` (which spawns tasks and registers cleanups), wait, shut down.

        Returns the process exit code: 0 for a clean stop, 1 if a task failed.
        """
        try:
            await main(self)
            await self.wait()
        finally:
            await self.shutdown()
        return 1 if self.failure is not None else 0
