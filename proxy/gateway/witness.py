"""Witnessing Triton's deaths for the agent: which pods had requests at Triton when it went away.

The gateway holds one idle connection of its own to Triton's HTTP port (`common.sentinel`). Triton's
death closes it at once; the gateway then takes its snapshot of the pods with requests at Triton,
and once a new connection is refused (Triton is gone, not just the connection) it adds the pods
whose requests failed meanwhile and appends a record (`common.crashwitness`) to
`--crash-witness-file`, which the agent reads when it has seen Triton exit
(`agent.status.requestcrash`). Nothing here runs per request; the snapshot reads what each pod's
limiter and metrics already keep.

A pod's model (each row of the caller table: a model host's replica) is a suspect when it has
requests in flight at Triton at the snapshot, or when one of its inference requests failed with
Triton gone (answered 502 or UNAVAILABLE) since the sentinel last found Triton there: the relays
see the death on their own connections and may answer theirs before the sentinel's turn on the
event loop (a readiness check failed on a stale connection is no presence). A request's harm may
come a moment after its answer: every other pod's model that sent one within `beside_seconds` is
named too, with none in flight, so that the agent counts a pod alone only when no other was there
or sent just before; with none at Triton, so is the last sender within `last_seconds`. The
probation lane stays quiet for `beside_seconds` between two probationers' turns
(`policy.probation`), so a harm delayed into that gap is not the next pod's. What it must not do:
decide whether Triton's exit was unexpected, or count crashes (the agent does both).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TypeVar

from common.crashwitness import (
    BESIDE_SECONDS,
    MAX_RECORDS,
    Suspect,
    Witness,
    WitnessError,
    read_witnesses,
)
from common.crashwitness import write_witnesses as write_file
from common.sentinel import Sentinel
from proxy.gateway.restore import Restore
from proxy.gateway.tenants import FAILED, Member, Tenant, members
from proxy.metrics import INFERENCE_ROUTES
from proxy.policy.probation import ProbationLane

log = logging.getLogger(__name__)

LAST_SECONDS = 5.0
"""With no request at Triton, the pod that sent the last one within this long is named."""


Witnessed = TypeVar("Witnessed", bound=Member | Tenant)
"""A pod's model as the witness reads it: a host's `Member`, or a model pod's `Tenant`."""


def failures(tenant: Member | Tenant) -> int:
    """The pod's inference requests answered as failed by Triton's connection so far (a
    readiness or metadata check failed on a connection Triton's restart left stale is not a
    request at Triton)."""
    return tenant.metrics.answered_with(FAILED, INFERENCE_ROUTES)


def suspects_of(
    tenants: Iterable[Witnessed],
    failed_before: Mapping[Witnessed, int],
    now: float,
    *,
    last: float,
    beside: float = BESIDE_SECONDS,
) -> tuple[Suspect, ...]:
    """The pods with requests at Triton when it died, seen at `now` (monotonic seconds), and
    those that sent one just before, by the rule above; `failed_before` holds each pod's
    `failures` when Triton was last there."""
    found = []
    senders: list[tuple[float, Witnessed]] = []
    for tenant in tenants:
        limiter = tenant.limiter
        failed = failures(tenant) - failed_before.get(tenant, 0)
        if limiter.in_flight > 0 or failed > 0:
            found.append(_suspect(tenant, limiter.in_flight + max(failed, 0)))
        elif limiter.last and now - limiter.last <= last:
            senders.append((limiter.last, tenant))
    named = [tenant for sent, tenant in senders if now - sent <= beside]
    if not found and senders:
        latest = max(senders, key=lambda sender: sender[0])[1]
        named += [] if latest in named else [latest]
    found += [_suspect(tenant, 0) for tenant in named]
    return tuple(sorted(found, key=lambda s: (s.pod, s.model_id)))


def _suspect(tenant: Member | Tenant, in_flight: int) -> Suspect:
    caller = tenant.caller
    return Suspect(caller.pod, caller.uid, caller.address, caller.model_id, in_flight)


class CrashWitness:
    """Writes a record each time the sentinel (`common.sentinel`) sees Triton go away."""

    def __init__(
        self,
        path: Path,
        triton_http: str,
        tenants: Callable[[], Iterable[Tenant]],
        restore: Restore,
        *,
        last_seconds: float = LAST_SECONDS,
        lane: ProbationLane | None = None,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self._tenants = tenants
        self.last_seconds = last_seconds
        self._lane = lane
        """The probation lane, closed by a turn Triton died under until this has named who was
        there."""
        self._wall = wall
        self._clock = clock
        self._failed_before: dict[Member | Tenant, int] = {}
        self._restore = restore
        """Told the moment Triton's sockets close and whenever Triton is there (with
        --restore-hold-seconds 0 it holds nothing)."""
        self.sentinel = Sentinel(
            triton_http, self._snapshot, self._record, on_up=self._triton_there
        )
        restore.gone = self.sentinel.closed_now
        self.records = 0
        """Records written since start."""

    async def run(self, stop: asyncio.Event) -> None:
        await self.sentinel.run(stop)

    def _triton_there(self) -> None:
        # Failures from now on are Triton's next death's (or a dropped connection's).
        self._failed_before = {m: failures(m) for m in members(self._tenants())}
        self._restore.up()

    def _snapshot(self) -> Witness:
        suspects = suspects_of(
            members(self._tenants()), self._failed_before, self._clock(), last=self.last_seconds
        )
        self._restore.lost()  # after the snapshot: it reads who is at Triton
        return Witness(self._wall(), suspects)

    def _record(self, witnessed: Witness) -> None:
        # The sentinel's connection may have closed a moment before the death (for a reason of
        # its own): a pod with a request that failed since was at Triton too.
        named = {s.uid: s for s in witnessed.suspects}
        later = suspects_of(members(self._tenants()), self._failed_before, self._clock(), last=0.0)
        for suspect in later:
            if suspect.in_flight > named.get(suspect.uid, suspect).in_flight or (
                suspect.uid not in named and suspect.in_flight > 0
            ):
                named[suspect.uid] = suspect
        ordered = sorted(named.values(), key=lambda s: (s.pod, s.model_id))
        witnessed = Witness(witnessed.at, tuple(ordered))
        if self._lane is not None:
            for present in members(self._tenants()):
                if present.caller.uid in named:
                    present.present_at_exit()
            self._lane.reopen()
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
