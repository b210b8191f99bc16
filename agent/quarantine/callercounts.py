"""The pods whose requests were at Triton when it exited, counted on this node, and the
probations that the loads in flight at those exits owe them.

`CallerCounts` keeps each pod's `CallerRecord`: each unexpected exit's witnesses give the next
records by the rule of `agent.quarantine.suspects.counted` (a pod present alone counts, at
`quarantine_after` exits in a row it is quarantined; several pods, or a load in flight beside
them, put them on probation for `probation_seconds`). An exit a load in flight shared with pods'
requests is counted against neither: the probations it gave are owed by the load's files (by
digest), with the exits they shared (`shared_exit`), until those files are counted for an exit
alone; then those exits were theirs too, the probations they gave end (`forgive`), and
`agent.quarantine.crashledger.CrashLedger.crashed` counts the exits against them. A good load of the
files clears what they owe (`loaded`). What is owed is kept in memory only; the ledger saves the
records in `crashes.json` (its `callers` list: `CallerRecord`'s fields).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, replace
from typing import Any

from agent.quarantine.suspects import CallerRecord, counted
from common.crashwitness import Suspect


class CallerCounts:
    """The pods whose requests were at Triton's exits, by pod (namespace/name)."""

    def __init__(
        self,
        quarantine_after: int,
        probation_seconds: float,
        kept: int,
        wall: Callable[[], float],
    ) -> None:
        self.quarantine_after = quarantine_after
        self.probation_seconds = probation_seconds
        self.kept = kept
        """Records kept at most, and loads' debts (`agent.quarantine.crashledger.MAX_RECORDS`)."""
        self._wall = wall
        self._records: dict[str, CallerRecord] = {}
        self._owed: dict[str, dict[str, tuple[float, float]]] = {}
        """By digest of a load in flight at an exit it shared with requests: the pods that exit
        put on probation, with their probation before and the one it gave (`forgive`)."""
        self._owed_exits: dict[str, list[tuple[str | None, bool]]] = {}
        """By digest: the exits its loads in flight shared with requests since it last loaded
        (by name, `agent.quarantine.markers.Marker.exit`), each once, and whether it was counted
        against its namespace then (`CrashLedger.explained`)."""

    def reset(self) -> None:
        """Forget every pod's record (before the saved ones are read)."""
        self._records = {}

    def read(self, items: Iterable[Mapping[str, Any]]) -> None:
        """Take the saved records `items` (`crashes.json`'s `callers`), one by one."""
        for item in items:
            caller = CallerRecord(
                str(item["pod"]),
                str(item["model_id"]),
                str(item["uid"]),
                int(item["crashes"]),
                bool(item["quarantined"]),
                float(item.get("probation_until", 0.0)),
            )
            self._records[caller.pod] = caller

    def document(self) -> list[dict[str, Any]]:
        """The records as `crashes.json` keeps them."""
        return [asdict(r) for r in self._records.values()]

    def crashed(
        self, suspects: Iterable[Suspect], *, ambiguous: bool, loading: Iterable[str]
    ) -> list[CallerRecord]:
        """Count one unexpected exit of Triton whose witnesses name `suspects`; returns the pods
        it quarantines. The probations it gives are owed by the files of the loads in flight
        (`loading`, by digest) until those are counted (`forgive`)."""
        before = self._records
        self._records = counted(
            before,
            suspects,
            self.quarantine_after,
            now=self._wall(),
            probation_seconds=self.probation_seconds,
            ambiguous=ambiguous,
        )
        while len(self._records) > self.kept:
            unquarantined = [p for p, r in self._records.items() if not r.quarantined]
            if not unquarantined:
                break
            del self._records[unquarantined[0]]
        for digest in loading:
            owed = self._owed.setdefault(digest, {})
            for pod, record in self._records.items():
                until = before[pod].probation_until if pod in before else 0.0
                if record.probation_until > until:
                    owed[pod] = (min(until, owed.get(pod, (until, 0.0))[0]), record.probation_until)
        while len(self._owed) > self.kept:
            del self._owed[next(iter(self._owed))]
        while len(self._owed_exits) > self.kept:
            del self._owed_exits[next(iter(self._owed_exits))]
        return [
            r
            for pod, r in self._records.items()
            if r.quarantined and not (pod in before and before[pod].quarantined)
        ]

    def shared_exit(self, digest: str, exit: str | None, *, against_namespace: bool) -> None:
        """A load in flight of the files `digest` shared the exit `exit` (None: one with no
        name) with pods' requests; the exit was counted `against_namespace` of the load, or
        not. Loads of the same files at one exit owe it once."""
        owed = self._owed_exits.setdefault(digest, [])
        if exit is None or all(exit != e for e, _ in owed):
            owed.append((exit, against_namespace))

    def forgive(self, digest: str) -> list[tuple[str | None, bool]]:
        """The files of `digest` are counted for an exit: the probations their loads' shared
        exits gave end (those renewed since by another exit stay); returns those exits, each
        with whether it was counted against the namespace already."""
        for pod, (before, given) in self._owed.pop(digest, {}).items():
            record = self._records.get(pod)
            if record is not None and record.probation_until == given:
                self._records[pod] = replace(record, probation_until=before)
        return self._owed_exits.pop(digest, [])

    def loaded(self, digest: str) -> None:
        """Triton answered a load of the files `digest` READY: they owe nothing (the requests
        beside its loads stay the suspects)."""
        self._owed.pop(digest, None)
        self._owed_exits.pop(digest, None)

    def quarantine(self, pod: str) -> CallerRecord | None:
        """The quarantine of `pod`'s requests (namespace/name), if it is quarantined."""
        record = self._records.get(pod)
        return record if record is not None and record.quarantined else None

    def probation(self, pod: str) -> CallerRecord | None:
        """The record of `pod` (namespace/name) while it is on probation."""
        record = self._records.get(pod)
        return record if record is not None and record.on_probation(self._wall()) else None

    def records(self) -> list[CallerRecord]:
        return sorted(self._records.values(), key=lambda r: r.pod)

    def clear(self, selectors: Iterable[str]) -> list[CallerRecord]:
        """Forget the pods any of `selectors` names (`CallerRecord.matches`); returns them."""
        wanted = [s.strip() for s in selectors if s.strip()]
        gone = [r for r in self._records.values() if any(r.matches(s) for s in wanted)]
        for record in gone:
            del self._records[record.pod]
        return gone

    def restore(self, callers: Iterable[CallerRecord]) -> list[CallerRecord]:
        """Take back pods' quarantines these records lack (from the Node); returns them."""
        taken = []
        for caller in callers:
            if caller.quarantined and caller.pod not in self._records:
                self._records[caller.pod] = caller
                taken.append(caller)
        return taken
