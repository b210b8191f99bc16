"""Closing tenant connections that stay idle (`--idle-timeout`): one sweep per listener.

A connection is idle while no request (REST) or call (gRPC) is in progress on it. Four times per
timeout the sweep looks at every connection; one found idle on five sweeps in a row, with no request
begun in between, has been idle for at least the timeout and is closed, so an idle connection lives
between 1 and 1.25 timeouts. There is no timer per connection or per request: the hot path pays
nothing for this. What it must not do: judge what a connection is doing (each connection says).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Protocol

SWEEPS = 4
"""Sweeps per timeout; a connection idle on SWEEPS + 1 sweeps in a row is closed."""


class Idler(Protocol):
    """A tenant connection, as the sweep sees it."""

    def activity(self) -> object | None:
        """None while a request or call is in progress; otherwise a value that changes whenever
        one begins."""

    def close_idle(self) -> None:
        """Close the connection in the way its protocol expects of an idle server."""


class IdleSweeper:
    """Closes the connections of `connections` (a live collection) idle for `timeout` seconds;
    a timeout of 0 keeps idle connections open forever. `closed` counts those it closed."""

    def __init__(self, timeout: float, connections: Collection[Idler]) -> None:
        self.timeout = timeout
        self.connections = connections
        self.closed = 0
        self._seen: dict[Idler, tuple[object, int]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        if self.timeout > 0 and self._timer is None:
            self._schedule()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._seen.clear()

    def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.timeout / SWEEPS, self.sweep)

    def sweep(self) -> None:
        """Close the connections found idle on every one of the last SWEEPS + 1 sweeps."""
        seen: dict[Idler, tuple[object, int]] = {}
        for connection in list(self.connections):
            mark = connection.activity()
            if mark is None:
                continue
            before = self._seen.get(connection)
            sweeps = before[1] + 1 if before is not None and before[0] == mark else 0
            if sweeps >= SWEEPS:
                connection.close_idle()
                self.closed += 1
            else:
                seen[connection] = (mark, sweeps)
        self._seen = seen
        if self._timer is not None:
            self._schedule()
