"""The API server's clock: wall time plus an offset tests can advance.

Token expiry and deletion timestamps read this clock, so a test can expire a one-hour token in
milliseconds (`RunningApiServer.clock.advance(3600)`) instead of sleeping. Nothing else lives here.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime


class Clock:
    """Seconds since the epoch, shifted by whatever `advance` has added."""

    def __init__(self) -> None:
        self._offset = 0.0
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return time.time() + self._offset

    def advance(self, seconds: float) -> None:
        """Move the server's time forward (never backward: expiry must stay monotonic)."""
        if seconds < 0:
            raise ValueError(f"the clock only moves forward; got {seconds} seconds")
        with self._lock:
            self._offset += seconds


def rfc3339(seconds: float) -> str:
    """A Kubernetes `Time`: whole seconds, UTC, `Z` suffix."""
    return datetime.fromtimestamp(int(seconds), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_micro(seconds: float) -> str:
    """A Kubernetes `MicroTime`."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
