"""Witnessing Triton's deaths for the agent: which pods had requests at Triton when it went away.

The gateway holds one idle connection of its own to Triton's HTTP port (`common.sentinel`).
Triton's death closes it at once; the gateway then takes its snapshot of the pods with requests
at Triton, and once a new connection is refused (Triton is gone, not just the connection) it
appends a record (`common.crashwitness`) to the file beside the caller table, which the agent
reads when it has seen Triton exit (`agent.requestcrash`). Nothing here runs per request;
the snapshot reads what each pod's limiter already keeps.

A pod is a suspect when it has requests in flight at Triton at the snapshot, when one of its
requests left within `recent_seconds` before it (failed by the same death, answered a moment
before the sentinel's turn on the event loop), or, when no pod is either, when it sent the last
request to reach Triton within `last_seconds` before (a request whose harm comes a moment after
its answer). What it must not do: decide whether Triton's exit was unexpected, or count crashes
(the agent does both).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from common.crashwitness import MAX_RECORDS, Suspect, Witness, WitnessError, read_witnesses
from common.crashwitness import write_witnesses as write_file
from common.sentinel import Sentinel
from proxy.gateway.tenants import Tenant

log = logging.getLogger(__name__)

RECENT_SECONDS = 0.25
"""A request that left this long before the snapshot is counted as at Triton when it died: the
relays see the same death on their own connections, and may answer theirs first."""
LAST_SECONDS = 5.0
"""With no request at Triton, the pod that sent the last one within this long is the suspect."""


def suspects_of(
    tenants: Iterable[Tenant], now: float, *, recent: float, last: float
) -> tuple[Suspect, ...]:
    """The pods with requests at Triton at `now` (monotonic seconds), by the rule above."""
    found = []
    latest: tuple[float, Tenant] | None = None
    for tenant in tenants:
        limiter = tenant.limiter
        if limiter.in_flight > 0 or (limiter.left_at and now - limiter.left_at <= recent):
            found.append(_suspect(tenant, max(limiter.in_flight, 1)))
        elif (
            limiter.last
            and now - limiter.last <= last
            and (latest is None or limiter.last > latest[0])
        ):
            latest = (limiter.last, tenant)
    if not found and latest is not None:
        found.append(_suspect(latest[1], 0))
    return tuple(sorted(found, key=lambda s: s.pod))


def _suspect(tenant: Tenant, in_flight: int) -> Suspect:
    caller = tenant.caller
    return Suspect(caller.pod, caller.uid, caller.address, caller.model_id, in_flight)


class CrashWitness:
    """Writes a record each time the sentinel (`common.sentinel`) sees Triton go away."""

    def __init__(
        self,
        path: Path,
        triton_http: str,
        tenants: Callable[[], Iterable[Tenant]],
        *,
        recent_seconds: float = RECENT_SECONDS,
        last_seconds: float = LAST_SECONDS,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self._tenants = tenants
        self.recent_seconds = recent_seconds
        self.last_seconds = last_seconds
        self._wall = wall
        self._clock = clock
        self.sentinel = Sentinel(triton_http, self._snapshot, self._record)
        self.records = 0
        """Records written since start."""

    async def run(self, stop: asyncio.Event) -> None:
        await self.sentinel.run(stop)

    def _snapshot(self) -> Witness:
        suspects = suspects_of(
            self._tenants(), self._clock(), recent=self.recent_seconds, last=self.last_seconds
        )
        return Witness(self._wall(), suspects)

    def _record(self, witnessed: Witness) -> None:
        who = ", ".join(f"{s.pod} ({s.in_flight} in flight)" for s in witnessed.suspects)
        log.warning(
            "Triton went away with requests of %s at it: recorded for the node's agent, which "
            "counts them if Triton exited unexpectedly.",
            who or "no pod",
        )
        try:
            kept = read_witnesses(self.path)
        except WitnessError as e:
            log.warning("%s: starting it afresh.", e)
            kept = []
        try:
            write_file(self.path, [*kept[-(MAX_RECORDS - 1) :], witnessed])
        except OSError as e:
            log.error(
                "Cannot write the crash witness file %s (%s): the node's agent cannot tell "
                "which pod's requests crashed Triton; check the volume shared with it.",
                self.path,
                e.strerror,
            )
            return
        self.records += 1
