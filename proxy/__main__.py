"""`python -m proxy`: parse settings, configure logs, run the proxy until SIGTERM.

Runs on uvloop when it is installed: its event loop roughly halves the per-request cost of the
Python hop, which is the proxy's whole overhead.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from common.logs import configure_logging
from proxy.app import run
from proxy.settings import SettingsError, parse_settings

log = logging.getLogger("proxy")


def _event_loop_runner() -> Callable[[Coroutine[Any, Any, int]], int]:
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        log.info("uvloop is not installed: running on asyncio's own event loop.")
        return asyncio.run
    runner: Callable[[Coroutine[Any, Any, int]], int] = uvloop.run
    return runner


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    try:
        settings = parse_settings(sys.argv[1:] if argv is None else argv)
    except SettingsError as e:
        print(f"proxy: {e}", file=sys.stderr)
        return 2
    configure_logging(
        settings.log_level, "json" if settings.log_format == "json" else "text", name="proxy"
    )
    return _event_loop_runner()(run(settings))


if __name__ == "__main__":
    sys.exit(main())
