"""The crashes in a row of each model's files on this node, and their quarantines.

A crash is counted against a model's files by their manifest digest (`CrashRecord`), so a
replacement pod with the same files is refused too, and a fixed version is not. A load that stays
READY through its settling window ends the count: the count is of crashes in a row. At
`quarantine_after` of them the files are quarantined on the node until an operator clears the
record, or until it lapses `expiry_seconds` after it began (`FileCounts.expire`): then the count
stays one short of the limit, so one more crash in a row quarantines the files again. At most
`kept` counts are kept (the oldest unquarantined go first), so a tenant cannot fill the disk.

`FileCounts` keeps the counts in memory and answers for them, each exit of Triton once (by its
name, `CrashRecord.exits`); the crash ledger (`agent.quarantine.crashledger.CrashLedger`) decides
which exits a crash adds, and saves the
counts in `crashes.json` (its `records` list: `CrashRecord`'s fields, `quarantined_at` absent in
the oldest files, read as the time they are read).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from agent.quarantine.namespaces import EXITS_KEPT


@dataclass(frozen=True)
class CrashRecord:
    """The crashes in a row of one model's files on this node."""

    digest: str
    model_id: str
    pod: str
    """The pod of the last crash (namespace/name)."""
    crashes: int
    quarantined: bool = False
    quarantined_at: float = 0.0
    """When it was quarantined (Unix seconds; for `CrashLedger.expire`)."""
    exits: tuple[str, ...] = ()
    """The exits counted in its run, by name (the latest `EXITS_KEPT`): each is counted once."""

    @property
    def namespace(self) -> str:
        return self.pod.partition("/")[0]

    def matches(self, selector: str) -> bool:
        """Whether an operator's `selector` names it: its model id, namespace/model id, pod
        (namespace/name), or a digest prefix of at least 12 characters."""
        return selector in (
            self.model_id,
            f"{self.namespace}/{self.model_id}",
            self.pod,
        ) or (len(selector) >= 12 and self.digest.startswith(selector))


class FileCounts:
    """Each model's files' crashes in a row on this node, by digest."""

    def __init__(self, quarantine_after: int, kept: int, wall: Callable[[], float]) -> None:
        self.quarantine_after = quarantine_after
        self.kept = kept
        """Counts kept at most (`agent.quarantine.crashledger.MAX_RECORDS`)."""
        self._wall = wall
        self._records: dict[str, CrashRecord] = {}

    def reset(self) -> None:
        """Forget every count (before the saved ones are read)."""
        self._records = {}

    def read(self, items: Iterable[Mapping[str, Any]]) -> None:
        """Take the saved counts `items` (`crashes.json`'s `records`), one by one."""
        for item in items:
            record = CrashRecord(
                str(item["digest"]),
                str(item["model_id"]),
                str(item["pod"]),
                int(item["crashes"]),
                bool(item["quarantined"]),
                float(item.get("quarantined_at", 0.0))
                or (self._wall() if item["quarantined"] else 0.0),
                tuple(str(e) for e in item.get("exits", ())),
            )
            self._records[record.digest] = record

    def document(self) -> list[dict[str, Any]]:
        """The counts as `crashes.json` keeps them."""
        return [asdict(r) for r in self._records.values()]

    def crashed(
        self, digest: str, model_id: str, pod: str, exits: Iterable[str | None]
    ) -> CrashRecord:
        """Add the exits `exits` (none: the files only suspected; None: an exit with no name)
        to the run of the files `digest`, loaded for `pod` (namespace/name) as `model_id`, each
        exit once; returns their record."""
        before = self._records.get(digest)
        crashes = before.crashes if before else 0
        named = before.exits if before else ()
        for exit in exits:
            if exit is not None and exit in named:
                continue
            crashes += 1
            if exit is not None:
                named = (*named, exit)[-EXITS_KEPT:]
        record = CrashRecord(
            digest,
            model_id,
            pod,
            crashes,
            quarantined=crashes >= self.quarantine_after,
            quarantined_at=self._wall() if crashes >= self.quarantine_after else 0.0,
            exits=named,
        )
        self._records[digest] = record
        self._trim()
        return record

    def loaded(self, digest: str) -> bool:
        """The files `digest` stayed READY: their run ends unless they are quarantined;
        returns whether it did."""
        record = self._records.get(digest)
        if record is None or record.quarantined:
            return False
        del self._records[digest]
        return True

    def suspected(self, digest: str) -> bool:
        """Whether these files have a run, and are not quarantined."""
        record = self._records.get(digest)
        return record is not None and not record.quarantined

    def count(self, digest: str) -> int:
        """The crashes in a row of these files (0: none, or cleared)."""
        record = self._records.get(digest)
        return record.crashes if record is not None else 0

    def quarantined(self, digest: str) -> CrashRecord | None:
        record = self._records.get(digest)
        return record if record is not None and record.quarantined else None

    def records(self) -> list[CrashRecord]:
        return sorted(self._records.values(), key=lambda r: (r.pod, r.digest))

    def held(self) -> set[str]:
        """The namespaces with quarantined files."""
        return {r.namespace for r in self._records.values() if r.quarantined}

    def restore(self, records: Iterable[CrashRecord]) -> list[CrashRecord]:
        """Take back quarantines these counts lack (from the Node); returns them."""
        taken = []
        for record in records:
            if record.quarantined and record.digest not in self._records:
                record = replace(record, quarantined_at=record.quarantined_at or self._wall())
                self._records[record.digest] = record
                taken.append(record)
        return taken

    def expire(self, now: float, expiry_seconds: float) -> list[CrashRecord]:
        """Lift the quarantines that began `expiry_seconds` before `now`, their counts one
        short of the limit; returns those lifted."""
        lapsed = [
            r
            for r in self._records.values()
            if r.quarantined and now >= r.quarantined_at + expiry_seconds
        ]
        for record in lapsed:
            self._records[record.digest] = replace(
                record, crashes=self.quarantine_after - 1, quarantined=False, quarantined_at=0.0
            )
        return lapsed

    def clear(self, selectors: Iterable[str]) -> list[CrashRecord]:
        """Forget the records any of `selectors` names (`CrashRecord.matches`); returns them."""
        wanted = [s.strip() for s in selectors if s.strip()]
        gone = [r for r in self._records.values() if any(r.matches(s) for s in wanted)]
        for record in gone:
            del self._records[record.digest]
        return gone

    def _trim(self) -> None:
        if len(self._records) <= self.kept:
            return
        for digest in [d for d, r in self._records.items() if not r.quarantined][
            : len(self._records) - self.kept
        ]:
            del self._records[digest]
