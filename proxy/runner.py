"""Which event loop the proxy and the gateway run on: uvloop when it is installed.

uvloop roughly halves the per-request cost of the Python hop, which is the relays' whole overhead.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


def event_loop_runner() -> Callable[[Coroutine[Any, Any, int]], int]:
    """`uvloop.run` when uvloop is installed, else `asyncio.run`."""
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        log.info("uvloop is not installed: running on asyncio's own event loop.")
        return asyncio.run
    runner: Callable[[Coroutine[Any, Any, int]], int] = uvloop.run
    return runner
