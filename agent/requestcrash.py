"""Counting the pods whose requests were at Triton when it exited unexpectedly.

The reconciler's liveness watch sees Triton go away (a poll that found it live, then one that did
not) and, once Triton is back, hands the window between the two polls here. The node gateway has
meanwhile written what it saw at that moment (`common.crashwitness`); the records inside the
window, widened by `slack_seconds` for the two processes' clocks and writes, name the suspects,
which the ledger counts (`agent.suspects`, `agent.quarantine.CrashLedger`). A window with no
record counts nothing: the gateway saw no death (it was down too, or Triton was only unreachable
for the agent), and the agent blames no pod without a witness. A pod that reaches
`--crash-quarantine-after` exits in a row gets a Warning Event (RequestsCrashedTriton), and the
caller table the gateway follows says it is quarantined, so the gateway refuses its requests;
its ModelLoaded condition says so too (`agent.conditions`). What it must not do: detect exits
(`agent.reconcile`) or enforce the quarantine (the gateway does).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from agent.events import PodEvents
from agent.metrics import AgentMetrics
from agent.quarantine import CrashLedger
from agent.suspects import REASON, CallerRecord, merged, message
from common.crashwitness import WitnessError, read_witnesses
from common.logs import subject

log = logging.getLogger(__name__)

SLACK_SECONDS = 1.0


class RequestCrashes:
    """Reads the gateway's witnesses of each exit the liveness watch saw, and counts them."""

    def __init__(
        self,
        ledger: CrashLedger,
        witness_file: Path,
        events: PodEvents,
        metrics: AgentMetrics,
        on_quarantined: Callable[[], None],
        *,
        slack_seconds: float = SLACK_SECONDS,
    ) -> None:
        self.ledger = ledger
        self.witness_file = witness_file
        self._events = events
        self._metrics = metrics
        self._on_quarantined = on_quarantined
        self.slack_seconds = slack_seconds
        self._counted_until = 0.0
        """The newest record counted: a record is counted once, whatever windows overlap."""

    def quarantine_of(self, pod: str) -> str:
        """Why `pod`'s requests are refused (namespace/name); empty when they are not."""
        record = self.ledger.caller_quarantine(pod)
        return message(record) if record is not None else ""

    def exited(self, last_live: float, first_down: float) -> list[CallerRecord]:
        """Triton was live at `last_live` and not at `first_down` (Unix seconds): count the
        gateway's records of that moment; returns the pods quarantined by it."""
        try:
            records = read_witnesses(self.witness_file)
        except WitnessError as e:
            log.warning("Triton exited unexpectedly, but %s: no pod is counted for it.", e)
            return []
        start = max(last_live - self.slack_seconds, self._counted_until)
        inside = [w for w in records if start < w.at <= first_down + self.slack_seconds]
        if not inside:
            log.warning(
                "Triton exited unexpectedly, and the node gateway recorded no request at it "
                "then (%s): no pod is counted for it.",
                self.witness_file,
            )
            return []
        self._counted_until = max(w.at for w in inside)
        suspects = merged(w.suspects for w in inside)
        self._metrics.request_crashes.inc()
        quarantined = self.ledger.requests_crashed(suspects)
        limit = self.ledger.quarantine_after
        for suspect in suspects:
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
        if not suspects:
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
