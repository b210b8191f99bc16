"""The async lifecycle every long-running part uses, and the one way any part starts a task.

Every part (the agent, the binder, the proxy, the gateway) has the same shape, a `Part`:
  1. build: its constructor takes the settings and builds every object; nothing listens yet;
  2. start: `start(lifecycle)` listens, spawns the long-lived tasks with `Lifecycle.spawn` and
     registers each cleanup with `Lifecycle.on_shutdown` right before starting what it undoes;
  3. stop: on a signal or a failed task, `Lifecycle.shutdown` runs the cleanups in reverse order
     of registration (last started, first stopped), each bounded by a timeout.
`serve(part)` runs these steps for a process and returns its exit code; a stop requested while
the part is still starting (a signal, a failed task) cancels the start, and the cleanups
registered so far undo what it did.

Every asyncio task in the parts is created by `spawn`: it has a name, and an exception in it is
logged as "X has failed: <consequence>" with its traceback (and handed to `on_failure`) instead of
vanishing with the task. `Lifecycle.spawn` starts a part's long-lived tasks with it: a crash there
stops the process unless the task is declared not vital.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine, MutableSet
from functools import partial
from typing import Any, Protocol, TypeVar

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

    def ignore_signals(self) -> None:
        """The part has stopped: from now until the process exits SIGTERM and SIGINT are ignored,
        so that a stop asked twice (a signal to the process group, sent on again by a keeper
        that shares it) cannot end a clean exit with the signal's status."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
            signal.signal(sig, signal.SIG_IGN)

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

    def spawn(
        self,
        name: str,
        coro: Coroutine[Any, Any, None],
        *,
        consequence: str = "stopping the process",
        vital: bool = True,
    ) -> asyncio.Task[None]:
        """Start a named long-lived task, cancelled at the end of shutdown if still running. If it
        raises, log "`name` has failed: `consequence`."; a vital task's failure stops the process
        (exit code 1), another's leaves the process running without that task's work."""
        if name in self._tasks and not self._tasks[name].done():
            coro.close()
            raise RuntimeError(f"task {name!r} is already running")
        task = spawn(
            name,
            coro,
            consequence=consequence,
            on_failure=partial(self.fail, name) if vital else None,
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

    def on_shutdown_finish_tasks(self, name: str, grace: float) -> None:
        """Register a cleanup that gives the tasks spawned by then a grace period to see the stop
        event and finish their current step, then cancels those still running (so none is cut
        off mid-call by the cleanups registered before this one)."""

        async def finish() -> None:
            running = [task for task in self._tasks.values() if not task.done()]
            if not running:
                return
            _, late = await asyncio.wait(running, timeout=grace)
            for task in late:
                log.warning(
                    "%s did not finish within %g s of the stop: cancelling it.",
                    task.get_name(),
                    grace,
                )
                task.cancel()
            for task in late:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

        self.on_shutdown(name, finish)

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
            await self._start(main)
            await self.wait()
        finally:
            await self.shutdown()
        return 1 if self.failure is not None else 0

    async def _start(self, main: Callable[[Lifecycle], Awaitable[None]]) -> None:
        """Run `main` unless a stop is requested first: then it is cancelled (a binder waiting
        for its caches, say, stops on SIGTERM). An error of `main` is raised here."""
        starting = asyncio.ensure_future(main(self))
        stopping = asyncio.ensure_future(self.stop_event.wait())
        try:
            await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not starting.done():
                starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stopping
            try:
                await starting
            except asyncio.CancelledError:
                if not self.stop_event.is_set():
                    raise  # cancelled from outside, not by a stop


class Part(Protocol):
    """A long-running part: built by its constructor, started under a lifecycle (module
    docstring)."""

    async def start(self, lifecycle: Lifecycle) -> None:
        """Listen, spawn the long-lived tasks and register their cleanups."""


async def serve(
    part: Part,
    *,
    cleanup_timeout: float = 30.0,
    on_signal: Callable[[signal.Signals], None] | None = None,
) -> int:
    """Run `part` as the process: SIGTERM and SIGINT stop it (after `on_signal`, if given); the
    process's exit code (0 after a clean stop, 1 after a vital task failed). An error while
    starting is raised, after the cleanups registered so far have run."""
    lifecycle = Lifecycle(cleanup_timeout=cleanup_timeout)
    lifecycle.install_signal_handlers(on_signal)
    try:
        return await lifecycle.run(part.start)
    finally:
        lifecycle.ignore_signals()
