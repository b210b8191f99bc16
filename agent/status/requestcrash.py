"""Counting the pods whose requests were at Triton when it exited unexpectedly.

The agent holds an idle connection of its own to Triton (`common.sentinel`): Triton's death closes
it, and a new connection is refused until Triton is started again, which tells an exit of Triton
apart from one dropped connection (the agent never restarts Triton itself, so every exit is
unexpected to it). Once Triton is back, the node gateway has written what it saw at that moment
(`common.crashwitness`; on a busy node the agent waits for it up to `witness_wait_seconds`,
whichever of the two saw the exit first); the records between the sentinel's close and the refusal,
widened by `slack_seconds` for the two processes' clocks, name the suspects, which the ledger counts
(`agent.quarantine.suspects`, `agent.quarantine.crashledger.CrashLedger`). A window with no record
counts nothing: the gateway saw no death (it was down too, or Triton was only unreachable for the
agent), and the agent blames no pod without a witness. A sentinel whose loop stalled past Triton's
restart sees only a drop (its new connection accepted by the new Triton): a gateway record of a
death since that connection was accepted counts it then (the gateway writes one only when Triton
refused its new connection, and a record is counted once). The loads the ledger saw in flight or
settling at that moment come first (`agent.quarantine.suspects.at_exit`), and in turn the ledger
asks which pods' requests were at Triton when a load's marker is left over (`requests_at`): an exit
requests explain is not counted against a load. A pod that reaches `--crash-quarantine-after` exits
in a row it was alone at (`agent.quarantine.suspects`) gets a Warning Event (RequestsCrashedTriton),
and the caller table the gateway follows says it is quarantined, so the gateway refuses its
requests; its ModelLoaded condition says so too (`agent.status.conditions`). What it must not do:
detect exits (`agent.models.aftercrash`) or enforce the quarantine (the gateway does).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from agent.kube.events import PodEvents
from agent.metrics import AgentMetrics
from agent.quarantine.crashledger import CrashLedger, Marker
from agent.quarantine.suspects import REASON, CallerRecord, at_exit, merged, message
from common.crashwitness import Witness, WitnessError, read_witnesses
from common.logs import subject
from common.sentinel import Sentinel

log = logging.getLogger(__name__)

SLACK_SECONDS = 1.0

WITNESS_WAIT_SECONDS = 5.0
"""How long, once Triton is back, the agent waits for the gateway's record of the exit (a busy
node may run the gateway's witness after the agent's watch) before it counts no pod for it."""

_WAIT_STEP_SECONDS = 0.1


class RequestCrashes:
    """Reads the gateway's witnesses of each exit the liveness watch saw, and counts them."""

    def __init__(
        self,
        triton_http: str,
        ledger: CrashLedger,
        witness_file: Path,
        events: PodEvents,
        metrics: AgentMetrics,
        on_quarantined: Callable[[], None],
        *,
        slack_seconds: float = SLACK_SECONDS,
        witness_wait_seconds: float = WITNESS_WAIT_SECONDS,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.ledger = ledger
        self._wall = wall
        self.sentinel = Sentinel(
            triton_http, wall, self._gone, self._back, on_up=self._up, on_dropped=self._dropped
        )
        self._up_at = 0.0
        """When the sentinel's connection was last accepted (Unix seconds): Triton was there."""
        self._away: tuple[float, float] | None = None
        """Triton's sentinel closed at the first time, and it was refused at the second."""
        self.witness_file = witness_file
        self._events = events
        self._metrics = metrics
        self._on_quarantined = on_quarantined
        self.slack_seconds = slack_seconds
        self.witness_wait_seconds = witness_wait_seconds
        self._counted_until = 0.0
        """The newest record counted: a record is counted once, whatever windows overlap."""
        self.on_triton_gone: Callable[[], None] | None = None
        """Called when the sentinel sees Triton exit (the restore gate closes then)."""
        self.on_triton_up: Callable[[], None] | None = None
        """Called whenever the sentinel's connection is accepted: Triton is there (the
        probation hold after a load that ended with Triton gone ends then)."""

    def requests_at(self, marker: Marker) -> list[str]:
        """The pods whose requests the gateway saw at Triton when it died since the load of
        `marker` began (a record is taken after the death, so no slack: a record of the exit
        before, late on a busy node, must not explain this one)."""
        try:
            records = read_witnesses(self.witness_file)
        except WitnessError:
            return []
        since = marker.started_at or marker.finished_at
        return sorted(
            {s.pod for w in records if w.at >= since for s in w.suspects if s.in_flight > 0}
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Watch Triton's exits until `stop`."""
        await self.sentinel.run(stop)

    def _gone(self, lost_at: float) -> None:
        log.warning("Triton exited: the node gateway's witnesses are counted once it is back.")
        self._metrics.triton_exits.inc()
        if self.on_triton_gone is not None:
            self.on_triton_gone()
        self._away = (lost_at, self._wall())

    def _back(self) -> None:
        if self._away is not None:
            away, self._away = self._away, None
            self._count(away, self._wall() + self.witness_wait_seconds)

    def _up(self) -> None:
        self._up_at = self._wall()
        if self.on_triton_up is not None:
            self.on_triton_up()

    def _dropped(self, lost_at: float) -> None:
        # The connection accepted at `_up_at` closed, and Triton accepted a new one at once: a
        # dropped connection, or an exit this loop, stalled, saw only after Triton was back.
        # The gateway's record of a death in between tells them apart.
        if self._up_at:
            self._count((self._up_at, lost_at), self._wall() + self.witness_wait_seconds, True)

    def _count(self, away: tuple[float, float], until: float, dropped: bool = False) -> None:
        """Count the exit Triton was `away` for once the gateway's record of it is there, or
        at `until` (Unix seconds) without it; `dropped`: the sentinel saw only a drop, which
        is an exit only if the gateway recorded one."""
        try:
            inside = self._inside(*away)
        except WitnessError:
            inside = []  # `exited` says so, if it stays so
        if not inside and self._wall() < until:
            loop = asyncio.get_running_loop()
            loop.call_later(_WAIT_STEP_SECONDS, self._count, away, until, dropped)
            return
        if not dropped:
            self.exited(*away, gone_at=away[0])
        elif inside:
            log.warning(
                "Triton exited and came back before the agent's connection saw it go, as the "
                "node gateway recorded: counted as an exit."
            )
            self.exited(away[0], max(w.at for w in inside))

    def _inside(self, last_live: float, first_down: float) -> list[Witness]:
        """The gateway's records of an exit between `last_live` and `first_down` not counted
        yet (raises WitnessError for an unreadable file)."""
        start = max(last_live - self.slack_seconds, self._counted_until)
        records = read_witnesses(self.witness_file)
        return [w for w in records if start < w.at <= first_down + self.slack_seconds]

    def quarantine_of(self, pod: str) -> str:
        """Why `pod`'s requests are refused (namespace/name); empty when they are not."""
        record = self.ledger.caller_quarantine(pod)
        return message(record) if record is not None else ""

    def on_probation(self, pod: str) -> bool:
        """Whether the gateway serializes `pod`'s requests with other probationers'."""
        return self.ledger.caller_probation(pod) is not None

    def exited(
        self, last_live: float, first_down: float, *, gone_at: float = 0.0
    ) -> list[CallerRecord]:
        """Triton was there at `last_live` and gone at `first_down` (Unix seconds): count the
        gateway's records of that moment; returns the pods quarantined by it. `gone_at`: when
        this agent's own connection closed (its clock: no slack), after which no load it sent
        was at the exit (the reloads once Triton is back, whatever the slack says)."""
        try:
            inside = self._inside(last_live, first_down)
        except WitnessError as e:
            log.warning("Triton exited unexpectedly, but %s: no pod is counted for it.", e)
            return []
        if not inside:
            log.warning(
                "Triton exited unexpectedly, and the node gateway recorded no request at it "
                "then (%s): no pod is counted for it.",
                self.witness_file,
            )
            return []
        self._counted_until = max(w.at for w in inside)
        witnessed = merged(w.suspects for w in inside)
        loads = self.ledger.loads_at(first_down, self.slack_seconds)
        loads = [m for m in loads if not gone_at or m.started_at <= gone_at]
        changes = [m for m in loads if not m.restore]
        loading = [m for m in changes if not m.finished_at or m.finished_at > first_down]
        settling = [m for m in changes if m not in loading]
        suspects, ambiguous = at_exit(
            witnessed,
            loading=bool(loading),
            settling={m.pod for m in settling},
            restoring=len(changes) < len(loads),
            # A suspect's reload that shares a second exit in a row with requests is theirs.
            explained={m.pod for m in settling if self.ledger.shared_before(m)},
        )
        self._metrics.request_crashes.inc()
        quarantined = self.ledger.requests_crashed(
            suspects, ambiguous=ambiguous, loading=loading if ambiguous else ()
        )
        limit = self.ledger.quarantine_after
        if loads and len(suspects) < len(witnessed):
            log.warning(
                "Triton exited unexpectedly while model %s loaded or settled: the pods whose "
                "last request was answered (%s) are no evidence.",
                ", ".join(f"{m.model_id} of pod {m.pod}" for m in loads),
                ", ".join(s.pod for s in witnessed if s not in suspects),
            )
        if ambiguous and len(suspects) == 1:
            log.warning(
                "Triton exited unexpectedly with requests of pod %s at it while model %s "
                "loaded or settled: it counts against neither, and the pod is on probation for "
                "%g s.",
                suspects[0].pod,
                ", ".join(f"{m.model_id} of pod {m.pod}" for m in loading or settling),
                self.ledger.probation_seconds,
            )
            self._on_quarantined()  # the caller table marks the probationer
        if len(suspects) > 1:
            log.warning(
                "Triton exited unexpectedly with requests of several pods at it or just sent "
                "(%s): it counts against none of them, and they are on probation for %g s (the "
                "gateway lets no two of them be at Triton at once, with a quiet gap between).",
                ", ".join(s.pod for s in suspects),
                self.ledger.probation_seconds,
            )
            self._on_quarantined()  # the caller table marks the probationers
        for suspect in suspects if len(suspects) == 1 and not ambiguous else ():
            if self.ledger.caller_quarantine(suspect.pod) is not None:
                continue
            counted = next((r for r in self.ledger.callers() if r.pod == suspect.pod), None)
            log.warning(
                "Triton exited unexpectedly with requests of pod %s (model %s) at it: %d of %d "
                "exits in a row before its requests are quarantined.",
                suspect.pod,
                suspect.model_id,
                counted.crashes if counted is not None else 0,
                limit,
                extra=subject(pod=suspect.pod, model=suspect.model_id),
            )
        if not witnessed:
            log.warning("Triton exited unexpectedly with no request at it: no pod is counted.")
        for record in quarantined:
            said = message(record)
            log.error(
                "Quarantined: %s.", said, extra=subject(pod=record.pod, model=record.model_id)
            )
            self._events.warn(record.pod, record.uid, REASON, said)
        if quarantined:
            self._on_quarantined()
        return quarantined
