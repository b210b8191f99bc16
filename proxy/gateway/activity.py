"""Writing the node's activity table (`common.activity`) from what the gateway's relays count.

Each calling pod's relays already count its requests in their `Limiter` (in flight or queued,
and when one last began or left), so the hot path does nothing more. A timer reads every tenant
once per `period` (1 s) and writes the table when it changed, or when the last write is
`HEARTBEAT_SECONDS` old (so the agent can tell a quiet gateway from a dead one). A change of the
caller table reads them at once (`nudge`), and while a model is held every `HELD_PERIOD_SECONDS`:
a watched load waits for the table to show the held models' requests answered, and their new
requests wait with it. Models are keyed by their names in Triton (`Caller.name_in_triton`). The
limiters' monotonic times are written as Unix seconds. What it must not do: decide anything about
evictions (the agent's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from common.activity import HEARTBEAT_SECONDS, Activity, ActivityTable, write_table
from proxy.gateway.tenants import Tenant, members

log = logging.getLogger(__name__)

HELD_PERIOD_SECONDS = 0.1
"""How often the table is read (and written when it changed) while a model is held."""


def activity_of(
    tenants: Iterable[Tenant], monotonic_now: float, wall_now: float
) -> dict[str, Activity]:
    """Each tenant's models' activity (a host's each replica), its times as Unix seconds."""
    models = {}
    for model in members(tenants):
        limiter = model.limiter
        latest = max(limiter.last, limiter.left)
        models[model.caller.name_in_triton] = Activity(
            limiter.held,
            wall_now - (monotonic_now - latest) if latest else 0.0,
            limiter.in_flight,
            limiter.holding,
            limiter.restoring is not None,
        )
    return models


class ActivityWriter:
    """Writes the activity table at `path` from `tenants` (iterated afresh each time) every
    `period` seconds."""

    def __init__(
        self,
        path: Path,
        tenants: Iterable[Tenant],
        *,
        period: float = 1.0,
        held_period: float = HELD_PERIOD_SECONDS,
        heartbeat: float = HEARTBEAT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self._tenants = tenants
        self.period = period
        self.held_period = held_period
        self.heartbeat = heartbeat
        self._clock = clock
        self._wall = wall
        self._last: dict[str, Activity] | None = None
        self._written_at = -float("inf")
        self._failing = False
        self._holding = False
        """Whether the last read found a model held: the next comes after `held_period`."""
        self._wake = asyncio.Event()

    def nudge(self) -> None:
        """Read the tenants now (their holds may have changed), not at the next period."""
        self._wake.set()

    def write(self) -> bool:
        """Write the table if it changed or the heartbeat is due; True when written."""
        now = self._clock()
        models = activity_of(self._tenants, now, self._wall())
        self._holding = any(activity.held for activity in models.values())
        if models == self._last and now - self._written_at < self.heartbeat:
            return False
        try:
            write_table(self.path, ActivityTable(self._wall(), models))
        except OSError as e:
            if not self._failing:
                log.error(
                    "Cannot write the activity table %s (%s): the agent evicts no idle model "
                    "to make room until it can read a fresh one; check the volume.",
                    self.path,
                    e.strerror,
                )
            self._failing = True
            return False
        self._failing = False
        self._last, self._written_at = models, now
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Write every `period` (`held_period` while a model is held, at once when nudged)
        until `stop`."""
        stopping = asyncio.ensure_future(stop.wait())
        stopping.add_done_callback(lambda _: self._wake.set())
        try:
            while not stop.is_set():
                self._wake.clear()
                self.write()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._wake.wait(), self.held_period if self._holding else self.period
                    )
        finally:
            stopping.cancel()
