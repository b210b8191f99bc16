"""The crashes of each namespace's loads on this node, whatever their files.

Quarantine by digest alone is escaped by new files (the same model with one byte more), so the
crash ledger (`agent.quarantine.crashledger.CrashLedger`) also counts every crash of a namespace's
loads against the namespace (`NamespaceRecord`), never reset by a good load. At
`quarantine_after` of them the namespace is held (its models load as suspects); at
`quarantine_after` + `namespace_quarantine_after` (`NamespaceCounts.bound`) the node loads none
of its models until an operator clears `NAMESPACE/*`. An unquarantined count lapses
`expiry_seconds` after its last crash (`NamespaceCounts.expire`).

A crash is one exit of Triton: the loads of a namespace in flight or settling at one exit (several
versions, several models), and the files found guilty of it later, add one crash between them, as
each record keeps the names of the exits it counted (`NamespaceRecord.exits`, the Triton process
that exited: `agent.quarantine.markers.Marker.triton`).

`NamespaceCounts` keeps the counts in memory and answers for them; the ledger decides which
crashes count, works out which namespaces are held (a quarantine of one of their files holds
them too), and saves the counts in `crashes.json` (its `namespaces` list: `NamespaceRecord`'s
fields, `at` absent in the oldest files).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

EXITS_KEPT = 64
"""Names of counted exits kept per record: far more than an exit's loads and the files found
guilty of it later, which come within the bound's few exits."""


@dataclass(frozen=True)
class NamespaceRecord:
    """The crashes of one namespace's loads on this node since one of its files was
    quarantined here."""

    namespace: str
    pod: str
    """The pod of the last crash (namespace/name)."""
    crashes: int
    quarantined: bool = False
    at: float = 0.0
    """When its last crash was counted (Unix seconds): an unquarantined count lapses
    `expiry_seconds` after it (`CrashLedger.expire`)."""
    exits: tuple[str, ...] = ()
    """The exits counted, by name (the latest `EXITS_KEPT`): each is counted once."""

    def matches(self, selector: str) -> bool:
        """Whether an operator's `selector` names it: `NAMESPACE/*`."""
        return selector == f"{self.namespace}/*"


class NamespaceCounts:
    """Each namespace's count of crashes on this node, by namespace."""

    def __init__(
        self, quarantine_after: int, namespace_quarantine_after: int, wall: Callable[[], float]
    ) -> None:
        self.quarantine_after = quarantine_after
        self.namespace_quarantine_after = namespace_quarantine_after
        self._wall = wall
        self._records: dict[str, NamespaceRecord] = {}

    @property
    def bound(self) -> int:
        """The crashes of a namespace's loads at which its loads are quarantined on the node."""
        return self.quarantine_after + self.namespace_quarantine_after

    def reset(self) -> None:
        """Forget every count (before the saved ones are read)."""
        self._records = {}

    def read(self, items: Iterable[Mapping[str, Any]]) -> None:
        """Take the saved counts `items` (`crashes.json`'s `namespaces`), one by one."""
        for item in items:
            held = NamespaceRecord(
                str(item["namespace"]),
                str(item["pod"]),
                int(item["crashes"]),
                bool(item["quarantined"]),
                float(item.get("at", 0.0)),
                tuple(str(e) for e in item.get("exits", ())),
            )
            self._records[held.namespace] = held

    def document(self) -> list[dict[str, Any]]:
        """The counts as `crashes.json` keeps them."""
        return [asdict(r) for r in self._records.values()]

    def held(self) -> set[str]:
        """The namespaces quarantined, or whose loads crashed Triton `quarantine_after` times."""
        return {
            n.namespace
            for n in self._records.values()
            if n.quarantined or n.crashes >= self.quarantine_after
        }

    def quarantine(self, namespace: str) -> NamespaceRecord | None:
        """The quarantine of `namespace`'s new loads on this node, if it is quarantined."""
        record = self._records.get(namespace)
        return record if record is not None and record.quarantined else None

    def records(self) -> list[NamespaceRecord]:
        return sorted(self._records.values(), key=lambda r: r.namespace)

    def count(self, pod: str, exit: str | None) -> bool:
        """Count the exit `exit` of Triton under a load of `pod` (namespace/name) against its
        namespace, unless it is counted already (None: an exit with no name, counted);
        returns whether it was counted now."""
        namespace = pod.partition("/")[0]
        before = self._records.get(namespace)
        exits = before.exits if before else ()
        if exit is not None and exit in exits:
            return False
        crashes = (before.crashes if before else 0) + 1
        self._records[namespace] = NamespaceRecord(
            namespace,
            pod,
            crashes,
            (before is not None and before.quarantined) or crashes >= self.bound,
            self._wall(),
            (*exits, exit)[-EXITS_KEPT:] if exit is not None else exits,
        )
        return True

    def clear(self, selectors: Iterable[str]) -> list[NamespaceRecord]:
        """Forget the namespaces any of `selectors` names (`NAMESPACE/*`); returns them."""
        wanted = [s.strip() for s in selectors if s.strip()]
        gone = [r for r in self._records.values() if any(r.matches(s) for s in wanted)]
        for record in gone:
            del self._records[record.namespace]
        return gone

    def restore(self, records: Iterable[NamespaceRecord]) -> list[NamespaceRecord]:
        """Take back namespace quarantines these counts lack (from the Node); returns them."""
        taken = [r for r in records if r.quarantined and r.namespace not in self._records]
        for record in taken:
            self._records[record.namespace] = record
        return taken

    def expire(self, now: float, expiry_seconds: float) -> bool:
        """Forget the unquarantined counts whose last crash is `expiry_seconds` before `now`;
        returns whether any was."""
        lapsed = [
            namespace
            for namespace, counted in self._records.items()
            if not counted.quarantined and now >= counted.at + expiry_seconds
        ]
        for namespace in lapsed:
            del self._records[namespace]
        return bool(lapsed)
