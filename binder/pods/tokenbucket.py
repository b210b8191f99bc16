"""A token bucket: how often the binder's pod writes that are bounded by a rate may happen (the
Scheduled Events, a dead agent's pod deletions), as client-go's flowcontrol bounds a client's
QPS. Pure: it reads only the clock it is given."""

from __future__ import annotations

from collections.abc import Callable


class TokenBucket:
    """`rate` tokens a second, at most `burst` held (full at the start)."""

    def __init__(self, rate: float, clock: Callable[[], float], *, burst: float = 1.0) -> None:
        self.rate = rate
        self._burst = max(1.0, burst)
        self._clock = clock
        self._tokens = self._burst
        self._at = clock()

    def take(self) -> bool:
        """Takes a token if one is held; False, and nothing taken, when none is."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True
