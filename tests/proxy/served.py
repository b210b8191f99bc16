"""A part (a proxy, a gateway: `common.lifecycle.Part`) serving from a background thread's own
event loop, under a lifecycle of its own as its process would run it, so synchronous and asyncio
clients alike can use it; started by a test and stopped (its thread joined) after it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

from common.lifecycle import Lifecycle, Part

App = TypeVar("App", bound=Part)


class ServedInThread(Generic[App]):
    """The thread and loop; `build` makes the part on that loop, `cleanup_timeout` bounds each
    of its cleanups (as its `run` does)."""

    def __init__(self, name: str, build: Callable[[], App], cleanup_timeout: float) -> None:
        self.name = name
        self._build = build
        self._lifecycle = Lifecycle(cleanup_timeout=cleanup_timeout)
        self.loop = asyncio.new_event_loop()
        self._started: Future[App] = Future()
        self._thread = threading.Thread(target=self._run, name=f"{name}-under-test")
        self._thread.start()
        self.app = self._started.result(timeout=30)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        finally:
            # Transports closed in the app's last moments end on a later turn (their
            # connection_lost is scheduled, not called): give them those turns before closing.
            for _ in range(3):
                self.loop.run_until_complete(asyncio.sleep(0))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()

    async def _serve(self) -> None:
        """Start the part, hand it to the test (or the failure), serve until `stop`, then stop
        it in its documented order."""

        async def start(lifecycle: Lifecycle) -> None:
            try:
                part = self._build()
                await part.start(lifecycle)
            except BaseException as e:
                self._started.set_exception(e)
                raise
            self._started.set_result(part)

        await self._lifecycle.run(start)

    def call(self, coro: Any, timeout: float = 30) -> Any:
        """Run `coro` on the app's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._lifecycle.request_stop, "the test is over")
            self._thread.join(60)
        assert not self._thread.is_alive(), f"the {self.name} did not stop within 60 s"
