"""Retry timing: exponential backoff with full jitter, bounded by one overall deadline.

Pure: the clock and the random source are passed in, so tests drive them without waiting. Must
not sleep or decide which failures are worth retrying (errors.py does).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Delay before retry n (0-based): uniform in [0, min(maximum, initial * 2**n)].

    Full jitter spreads the retries of many model pods that found the same agent down at once.
    """

    initial: float
    maximum: float

    def ceiling(self, attempt: int) -> float:
        """The largest delay retry `attempt` may draw."""
        # Cap the exponent: 2**attempt overflows a float long before a pod gives up.
        return min(self.maximum, self.initial * 2.0 ** min(attempt, 60))

    def delay(self, attempt: int, rng: random.Random) -> float:
        """A delay for retry `attempt`, drawn from `rng`."""
        return rng.uniform(0.0, self.ceiling(attempt))


class Deadline:
    """A point in time on `clock` (seconds, monotonic) after which the loader gives up."""

    def __init__(self, seconds: float, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.started = clock()
        self.at = self.started + seconds

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self.at - self._clock())

    def elapsed(self) -> float:
        """Seconds since the deadline was set."""
        return self._clock() - self.started

    def bound(self, seconds: float) -> float:
        """`seconds`, shortened to what is left."""
        return min(seconds, self.remaining())
