"""Whether Triton served nothing but one model over a window of time, as the node gateway's
activity table (`common.activity`) tells.

`agent.models.tritonram` bills a load the growth of Triton's own process across it only when no
other model could have caused that growth: no other model had a request in flight, nor began or
ended one, from the load's start until its end. The gateway sees every request to the node's
Triton and writes, per model, its requests in flight and when one last began or ended; a table
written at or after the window's end answers for the whole window. A missing, unreadable or stale
table answers "not quiet" (nothing can be told, so nothing is billed on it); a fresh table not yet
written past the window's end answers "not yet". Blocking reads: callers run it off the event
loop. What it must not do: decide what is billed (`agent.models.tritonram`'s).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from common.activity import ActivityTableError, freshness_problem, read_table

SLACK_SECONDS = 1.0
"""Added before a window's start: the gateway writes monotonic times as Unix seconds, and a
request that ended just before a load began may leave memory behind that settles during it."""


class QuietWindow:
    """Asks the gateway's activity table at `path` (None: the node runs no gateway, and nothing is
    ever quiet) whether a window was quiet."""

    def __init__(
        self,
        path: Path | None,
        *,
        max_age: float,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.max_age = max_age
        self._wall = wall

    def __call__(self, name: str, since: float, until: float) -> bool | None:
        """True when no model but `name` had a request in flight at Triton's door, or began or
        ended one, between `since` and `until` (Unix seconds); False when one did, or nothing
        can be told; None while the gateway's table does not reach `until` yet."""
        if self.path is None:
            return False
        try:
            table = read_table(self.path)
        except ActivityTableError:
            return False
        if freshness_problem(table, self._wall(), self.max_age):
            return False
        busy = any(
            activity.in_flight > 0 or activity.last_used >= since - SLACK_SECONDS
            for model, activity in table.models.items()
            if model != name
        )
        if busy:
            return False
        return True if table.written_at >= until else None
