"""The async lifecycle every long-running part uses.

Signals set a stop event. Long-lived tasks are created in one place, named, and guarded so that a
crash is logged as "X has failed" and stops the process instead of dying silently. Shutdown runs
the registered cleanups in reverse order of registration (last started, first stopped), each
bounded by a timeout, so the order is fixed and documented by the code that registers them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

Cleanup = Callable[[], Awaitable[None]]


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
        task = asyncio.create_task(self._guard(name, coro), name=name)
        # A task cancelled before its first step never awaits `coro`: close it so it is not
        # reported as "never awaited".
        task.add_done_callback(lambda _: coro.close())
        self._tasks[name] = task
        return task

    async def _guard(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("%s has failed: stopping the process.", name)
            if self.failure is None:
                self.failure = e
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
