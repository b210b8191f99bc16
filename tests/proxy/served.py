"""An asyncio app (a proxy, a gateway) serving from a background thread's own event loop, so
synchronous and asyncio clients alike can use it, started by a test and stopped (its thread
joined) after it."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

App = TypeVar("App")


class ServedInThread(Generic[App]):
    """The thread and loop; a subclass says how its app serves (`_serve`) and stops
    (`_request_stop`, called on the loop)."""

    def __init__(self, name: str) -> None:
        self.name = name
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
        """Start the app, report it with `_ready` (or the failure with `_failed`), serve until
        `_request_stop`, then stop it."""
        raise NotImplementedError

    def _request_stop(self) -> None:
        raise NotImplementedError

    def _ready(self, app: App) -> None:
        self._started.set_result(app)

    def _failed(self, error: BaseException) -> None:
        self._started.set_exception(error)

    def call(self, coro: Any, timeout: float = 30) -> Any:
        """Run `coro` on the app's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._request_stop)
            self._thread.join(60)
        assert not self._thread.is_alive(), f"the {self.name} did not stop within 60 s"
