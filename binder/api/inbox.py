"""Work handed from other threads to the event loop, in order, with one wake-up per burst.

The binder's other threads (a watch thread per kind, the API writers) each finish small pieces of
work the loop must take: a watch event to apply, the outcome of a pod's writes. Waking the loop
costs more CPU than most pieces (a write to its self-pipe, an epoll return, a read, a callback),
so every thread posts to one inbox, and the loop is woken only when the inbox was empty. What
arrives while the loop has not yet emptied it rides on the same wake-up; the watch event a bind
causes and the bind's answer usually arrive together.

Owns no domain logic: callbacks run as given, in the order posted.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class Inbox:
    """Callbacks posted from any thread, run on the loop in the order posted."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[tuple[Callable[..., None], tuple[Any, ...]]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False

    def post(self, callback: Callable[..., None], *args: Any) -> bool:
        """Run `callback(*args)` on the loop, after everything posted before it. False when the
        loop is closed (the process is ending): nothing will run it."""
        with self._lock:
            self._items.append((callback, args))
            if self._scheduled:
                return True
            self._scheduled = True
        try:
            self._loop.call_soon_threadsafe(self._take)
        except RuntimeError:
            return False
        return True

    def _take(self) -> None:
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self._scheduled = False
        for callback, args in items:
            try:
                callback(*args)
            except Exception:  # the others must still run; callers guard their own
                log.exception("A callback handed to the event loop has failed.")
