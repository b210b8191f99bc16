"""Which models coincided with Triton's unexpected exits on this node, kept on disk.

A crash marker (`<name>.loading` in the state directory) is written, and synced, before a load
reaches Triton and removed when Triton answers it; with `settle_seconds` above 0, a load
answered READY keeps its marker, marked finished, that much longer (a model may kill Triton just
after its load: a thread its initialization started, its first warm-up, a timer), unless the load
only gave back what Triton held before it restarted (`finished(settle=False)`). A marker left
over whose model Triton does not hold, with no load of it under way, is a load Triton died under
or just after: unless pods' requests were at Triton then (`explained`), the reconciler
counts it against the model's files (its manifest digest, so a
replacement pod with the same files is refused too, and a fixed version is not). A load that
stays READY through its settling window ends the count: the count is of crashes in a row. At
`quarantine_after` crashes in a row the files are quarantined on the node: never loaded again
there until an operator clears the record (`tritonshare quarantine clear NODE MODEL`, through
the Node).

The counts live in one JSON file (`crashes.json`) beside the owner records, written to a
temporary file and renamed, so an agent restart keeps them. A node pod replacement starts with an
empty state directory; the quarantines themselves are also on the Node (`Keys.quarantined`,
written by `agent.quarantine.published.NodeQuarantine` with when each began and the node's pods
still wanting quarantined files, read by `tritonshare quarantine list` and `status`), and the new
agent takes them back from there before it serves. `NodeQuarantine` also lifts the quarantines an
operator names on the Node (`Keys.quarantine_clear`). The ledger also keeps the pods whose requests
were at Triton when it exited (`agent.quarantine.suspects`, counted from the gateway's witnesses by
`agent.status.requestcrash`), quarantined, shown and cleared the same way. A quarantine of files
lapses after `expiry_seconds` (`CrashLedger.expire`, carried out by `NodeQuarantine`): it rests on
one node's evidence.

Quarantine by digest alone is escaped by new files (the same model with one byte more), so the
ledger also counts every crash of a namespace's loads (`NamespaceRecord`), whatever their files,
never reset by a good load: once one of its files is quarantined on the node, or its loads
crashed Triton `quarantine_after` times, the namespace is held (its models load as suspects:
last, alone, each with a quiet period of `quiet_seconds` whose exit still counts against it,
beside other pods' requests too); at `quarantine_after` + `namespace_quarantine_after` the node
loads none of the namespace's models (those installed before too), until an operator clears
`NAMESPACE/*`. So a namespace's loads take Triton down at most that many times per node,
however many versions or models they try at once. An exit a load in flight shared with pods'
requests is counted against neither (`explained`; the pods go on probation), until that load's
files are counted for an exit alone: then it is counted against them too, and the probation it
gave ends (`_forgive`; kept in memory only). `CrashLedger` stores and counts;
`agent.models.nodemodels` writes the markers around its loads; `agent.models.aftercrash` decides
when a marker is a crash and what the pod is told.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from agent.quarantine.suspects import CallerRecord
from agent.quarantine.suspects import counted as counted_callers
from common.crashwitness import Suspect

log = logging.getLogger(__name__)

MARKER_SUFFIX = ".loading"
COUNTS_FILE = "crashes.json"
MAX_RECORDS = 10_000
"""Counts kept at most (the oldest unquarantined go first): a tenant cannot fill the disk."""
DECIDED_KEPT = 64
"""Markers counted or dismissed remembered (`CrashLedger.loads_at`)."""

SUSPECT_QUIET_SECONDS = 5.0
"""The least quiet period after a held namespace's load (`--crash-settle-seconds` when longer):
nothing else loads meanwhile, and an exit of Triton counts against that load."""

NAMESPACE = "namespace"
"""The `cause` of a quarantined namespace's entry in the annotation."""


@dataclass(frozen=True)
class Marker:
    """A load under way, as written before it reached Triton."""

    name: str
    """The model's name in Triton."""
    digest: str
    model_id: str
    pod: str
    """namespace/name of the pod it was loaded for."""
    finished_at: float = 0.0
    """When Triton answered the load READY (Unix seconds); 0 while it is in flight."""
    started_at: float = 0.0
    """When the load was sent to Triton (Unix seconds); 0: not known (an older marker)."""
    restore: bool = False
    """A reload of what Triton held before it restarted: no change, so no evidence against
    another party at an exit (`loads_at`), and counted only when nothing else explains it."""
    trial: bool = False
    """A suspect's load with probationers held through its settling window
    (`agent.models.probationhold`): requests at Triton beside it are not a probationer's, so sharing
    a second exit with them does not make the exit theirs (`shared_before`)."""

    def at_exit(self, first_down: float, settle_seconds: float, slack: float) -> bool:
        """Whether this load was in flight, or settling, when Triton was found gone at
        `first_down` (Unix seconds, `slack` for the clocks and the sentinel's delay)."""
        if self.started_at > first_down + slack:
            return False  # sent to the Triton that came back
        return not self.finished_at or first_down <= self.finished_at + settle_seconds + slack


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

    def matches(self, selector: str) -> bool:
        """Whether an operator's `selector` names it: `NAMESPACE/*`."""
        return selector == f"{self.namespace}/*"


class CrashLedger:
    """The node's crash markers and crash counts, in memory and in `directory`."""

    def __init__(
        self,
        directory: Path,
        quarantine_after: int,
        *,
        settle_seconds: float = 0.0,
        probation_seconds: float = 600.0,
        namespace_quarantine_after: int = 2,
        expiry_seconds: float = 0.0,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if quarantine_after < 1 or namespace_quarantine_after < 1:
            raise ValueError("quarantine_after and namespace_quarantine_after must be at least 1")
        self.namespace_quarantine_after = namespace_quarantine_after
        self._namespaces: dict[str, NamespaceRecord] = {}
        self._held: set[str] | None = None
        """Namespaces with quarantined files (None: to be worked out again)."""
        self.directory = directory
        self.quarantine_after = quarantine_after
        self.settle_seconds = settle_seconds
        self.probation_seconds = probation_seconds
        self.expiry_seconds = expiry_seconds
        """A quarantine of files lapses this long after it began (`expire`); 0: never."""
        self._wall = wall
        self._records: dict[str, CrashRecord] = {}
        self._callers: dict[str, CallerRecord] = {}
        self._decided: list[tuple[Marker, float]] = []
        """Markers counted or dismissed lately, with when (Unix seconds): an exit's evidence
        for `loads_at` after the reconciler has taken them off the disk."""
        self._shared: dict[str, float] = {}
        """Files only suspected at an exit (beside other pods' requests or a more recent
        load), by digest, with when (Unix seconds): `shared_before`."""
        self._owed: dict[str, dict[str, tuple[float, float]]] = {}
        """By digest of a load in flight at an exit it shared with requests: the pods that exit
        put on probation, with their probation before and the one it gave (`_forgive`)."""
        self._owed_exits: dict[str, tuple[int, int]] = {}
        """By digest: the exits its loads in flight shared with requests since it last loaded,
        and how many of them were counted against its namespace then (`explained`)."""
        self._in_flight_taken = False
        """A load in flight at the last exit was decided before the reconciler's pass over it."""
        self.witnessed: Callable[[Marker], list[str]] | None = None
        """The pods whose requests the node gateway saw at Triton when it died since the load
        of a marker began (`agent.status.requestcrash`); None: no gateway witnesses."""

    def load(self) -> None:
        """Read the counts; an unreadable file is kept aside and counting starts afresh."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.directory / COUNTS_FILE
        self._records = {}
        self._callers = {}
        self._namespaces = {}
        self._held = None
        try:
            document = json.loads(path.read_text())
            for item in document.get("namespaces", []):
                held = NamespaceRecord(
                    str(item["namespace"]),
                    str(item["pod"]),
                    int(item["crashes"]),
                    bool(item["quarantined"]),
                    float(item.get("at", 0.0)),
                )
                self._namespaces[held.namespace] = held
            for item in document.get("callers", []):
                caller = CallerRecord(
                    str(item["pod"]),
                    str(item["model_id"]),
                    str(item["uid"]),
                    int(item["crashes"]),
                    bool(item["quarantined"]),
                    float(item.get("probation_until", 0.0)),
                )
                self._callers[caller.pod] = caller
            for item in document["records"]:
                record = CrashRecord(
                    str(item["digest"]),
                    str(item["model_id"]),
                    str(item["pod"]),
                    int(item["crashes"]),
                    bool(item["quarantined"]),
                    float(item.get("quarantined_at", 0.0))
                    or (self._wall() if item["quarantined"] else 0.0),
                )
                self._records[record.digest] = record
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as e:
            aside = path.with_name(path.name + ".unreadable")
            with contextlib.suppress(OSError):
                path.replace(aside)
            log.warning(
                "The crash counts %s are unreadable (%s): kept as %s, counting starts afresh.",
                path,
                e,
                aside,
            )

    # Markers.
    def loading(self, marker: Marker) -> None:
        """Write `marker` durably before its load reaches Triton."""
        self._write(self.directory / f"{marker.name}{MARKER_SUFFIX}", asdict(marker))

    def answered(self, name: str) -> None:
        """Triton refused the load of `name` (it did not die under it), or the model is gone."""
        with contextlib.suppress(FileNotFoundError):
            (self.directory / f"{name}{MARKER_SUFFIX}").unlink()

    def finished(self, marker: Marker, *, settle: bool = True) -> None:
        """Triton answered the load READY: the marker stays, finished, until `settled` (not at
        all without `settle`: a model Triton held before it restarted, loaded again)."""
        if self.settle_of(marker) <= 0 or not settle:
            self.answered(marker.name)
            self.loaded(marker.digest)
            return
        self._write(
            self.directory / f"{marker.name}{MARKER_SUFFIX}",
            asdict(replace(marker, finished_at=self._wall())),
        )

    def finished_at(self, name: str) -> float:
        """When the load of `name` whose marker is on disk was answered READY (0: it was not,
        or there is no marker)."""
        marker = self.markers().get(name)
        return marker.finished_at if marker is not None else 0.0

    def settled(self, marker: Marker) -> bool:
        """For a finished marker whose model Triton still holds: once `settle_seconds` have
        passed, the load is cleared of suspicion (its marker removed, its count ended)."""
        if self._wall() < marker.finished_at + self.settle_of(marker):
            return False
        self.answered(marker.name)
        self.loaded(marker.digest)
        return True

    def markers(self) -> dict[str, Marker]:
        """Every marker on disk, by name in Triton (unreadable ones are removed)."""
        found = {}
        for path in sorted(self.directory.glob(f"*{MARKER_SUFFIX}")):
            try:
                data = json.loads(path.read_text())
                marker = Marker(
                    str(data["name"]),
                    str(data["digest"]),
                    str(data["model_id"]),
                    str(data["pod"]),
                    float(data.get("finished_at", 0.0)),
                    float(data.get("started_at", 0.0)),
                    bool(data.get("restore", False)),
                    bool(data.get("trial", False)),
                )
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("The crash marker %s is unreadable (%s): removing it.", path, e)
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            found[marker.name] = marker
        return found

    def at_triton(self, marker: Marker) -> list[str]:
        """The pods whose requests were at Triton when it died under (or just after) the load
        of `marker` (left over)."""
        return self.witnessed(marker) if self.witnessed is not None else []

    def explained(self, marker: Marker) -> list[str]:
        """The pods whose requests explain the exit that left `marker` over, which is then
        removed and not counted against the load (the pods are counted,
        `agent.quarantine.suspects`): any pod's for a load in flight, its own pod's for a load that
        had finished (settling). A settling load with only other pods' requests there shares the
        exit with them: it is not explained (`at_triton` names them; it is only suspected), unless
        it shared the exit before this load too (`shared_before`): an exit requests were at twice in
        a row is theirs, or an attacker's requests would keep a neighbour's reload suspected and
        never be counted."""
        pods = self.at_triton(marker)
        if marker.finished_at and marker.pod not in pods and not self.shared_before(marker):
            return []
        if pods:
            self._decide(marker)
            self.answered(marker.name)
            if not marker.finished_at:
                exits, counted = self._owed_exits.get(marker.digest, (0, 0))
                if self.held(marker.pod.partition("/")[0]):
                    # A held namespace's load in flight stays its suspect beside requests too,
                    # or a neighbour's traffic would buy it exits past its bound.
                    self._count_namespace(marker)
                    counted += 1
                    self._save()
                self._owed_exits[marker.digest] = (exits + 1, counted)
            log.warning(
                "Triton exited while model %s of pod %s loaded or settled, with requests of %s "
                "at it: the exit is not counted against the model's files.",
                marker.model_id,
                marker.pod,
                ", ".join(pods),
            )
        return pods

    def shared_before(self, marker: Marker) -> bool:
        """Whether the files of `marker` were only suspected at an exit before its load began
        (the exit that made it a suspect's reload), and it was no trial (a trial held the
        probationers: who is at Triton beside it was at no exit before)."""
        shared = self._shared.get(marker.digest, 0.0)
        return not marker.trial and 0.0 < shared < marker.started_at

    def took_in_flight(self) -> None:
        """A load's pod asked for it again before the reconciler's pass over the exit it was in
        flight at, and its marker, left over, was decided then (`Models.load`): that pass finds
        no load in flight on disk, but there was one (`in_flight_taken`)."""
        self._in_flight_taken = True

    def in_flight_taken(self) -> bool:
        """Whether `took_in_flight` was said since the last call (the reconciler's pass over the
        exit asks once)."""
        taken, self._in_flight_taken = self._in_flight_taken, False
        return taken

    def loads_at(self, first_down: float, slack: float) -> list[Marker]:
        """The loads in flight or settling when Triton was found gone at `first_down` (Unix
        seconds), whether their markers are still on disk or already counted or dismissed
        (reloads of what Triton held before among them: `Marker.restore`)."""
        found = {
            m.name: m
            for m, decided in self._decided
            if decided >= first_down - slack and m.at_exit(first_down, self.settle_seconds, slack)
        }
        for name, marker in self.markers().items():
            if marker.at_exit(first_down, self.settle_seconds, slack):
                found.setdefault(name, marker)
        return [found[name] for name in sorted(found)]

    def _decide(self, marker: Marker) -> None:
        self._decided = [*self._decided[-(DECIDED_KEPT - 1) :], (marker, self._wall())]

    # Counts.
    def crashed(self, marker: Marker, *, alone: bool = True) -> CrashRecord:
        """Count a crash against the marker's files (and its namespace, when held) and remove
        the marker; not `alone` (another load, more recent, was there too), the files are only
        suspected: their run stays as it is, and they load again alone (`suspected`)."""
        self._decide(marker)
        # Found guilty, its loads' exits shared with requests were its own too.
        shared, counted = self._forgive(marker.digest) if alone else (0, 0)
        for _ in range(1 + shared - counted if alone else 0):  # once an exit
            self._count_namespace(marker)
        before = self._records.get(marker.digest)
        crashes = (before.crashes if before else 0) + (1 + shared if alone else 0)
        if alone:
            self._shared.pop(marker.digest, None)
        else:
            self._shared[marker.digest] = self._wall()
        record = CrashRecord(
            marker.digest,
            marker.model_id,
            marker.pod,
            crashes,
            quarantined=crashes >= self.quarantine_after,
            quarantined_at=self._wall() if crashes >= self.quarantine_after else 0.0,
        )
        self._records[marker.digest] = record
        self._trim()
        self._save()
        self.answered(marker.name)
        return record

    def loaded(self, digest: str) -> None:
        """Triton answered a load of these files READY: their crashes in a row end."""
        self._shared.pop(digest, None)
        self._owed.pop(digest, None)  # the requests beside it stay the suspects
        self._owed_exits.pop(digest, None)
        record = self._records.get(digest)
        if record is not None and not record.quarantined:
            del self._records[digest]
            self._save()

    def suspected(self, digest: str) -> bool:
        """Whether these files coincided with an exit since they last stayed READY through
        their settling window, and are not quarantined: they load again last, alone."""
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

    # Namespaces whose files were quarantined here.
    @property
    def quiet_seconds(self) -> float:
        """The quiet period after a held namespace's load."""
        return max(self.settle_seconds, SUSPECT_QUIET_SECONDS)

    def held(self, namespace: str) -> bool:
        """Whether `namespace`'s models load as suspects: one of its files is quarantined
        here, or its loads crashed Triton `quarantine_after` times."""
        if self._held is None:
            self._held = {r.namespace for r in self._records.values() if r.quarantined} | {
                n.namespace
                for n in self._namespaces.values()
                if n.quarantined or n.crashes >= self.quarantine_after
            }
        return namespace in self._held

    def namespace_quarantine(self, namespace: str) -> NamespaceRecord | None:
        """The quarantine of `namespace`'s new loads on this node, if it is quarantined."""
        record = self._namespaces.get(namespace)
        return record if record is not None and record.quarantined else None

    def namespaces(self) -> list[NamespaceRecord]:
        return sorted(self._namespaces.values(), key=lambda r: r.namespace)

    def clear_namespaces(self, selectors: Iterable[str]) -> list[NamespaceRecord]:
        """Forget the namespaces any of `selectors` names (`NAMESPACE/*`); returns them."""
        wanted = [s.strip() for s in selectors if s.strip()]
        gone = [r for r in self._namespaces.values() if any(r.matches(s) for s in wanted)]
        for record in gone:
            del self._namespaces[record.namespace]
        if gone:
            self._save()
        return gone

    def restore_namespaces(self, records: Iterable[NamespaceRecord]) -> list[NamespaceRecord]:
        """Take back namespace quarantines this ledger lacks (from the Node)."""
        taken = [r for r in records if r.quarantined and r.namespace not in self._namespaces]
        for record in taken:
            self._namespaces[record.namespace] = record
        if taken:
            self._save()
        return taken

    @property
    def namespace_bound(self) -> int:
        """The crashes of a namespace's loads at which its loads are quarantined on the node."""
        return self.quarantine_after + self.namespace_quarantine_after

    def _count_namespace(self, marker: Marker) -> None:
        namespace = marker.pod.partition("/")[0]
        before = self._namespaces.get(namespace)
        crashes = (before.crashes if before else 0) + 1
        self._namespaces[namespace] = NamespaceRecord(
            namespace,
            marker.pod,
            crashes,
            (before is not None and before.quarantined) or crashes >= self.namespace_bound,
            self._wall(),
        )
        self._held = None

    def settle_of(self, marker: Marker) -> float:
        """How long a load of `marker` settles after its READY."""
        if self.held(marker.pod.partition("/")[0]):
            return self.quiet_seconds
        return self.settle_seconds

    # Pods whose requests were at Triton when it exited.
    def requests_crashed(
        self,
        suspects: Iterable[Suspect],
        *,
        ambiguous: bool = False,
        loading: Iterable[Marker] = (),
    ) -> list[CallerRecord]:
        """Count one unexpected exit of Triton whose witnesses name `suspects`
        (`agent.quarantine.suspects.counted`); returns the pods it quarantines. The probations it
        gives beside the loads `loading` in flight last until those loads' files are counted
        (`_forgive`): an exit the load is then found guilty of was not the requests'."""
        before = self._callers
        self._callers = counted_callers(
            before,
            suspects,
            self.quarantine_after,
            now=self._wall(),
            probation_seconds=self.probation_seconds,
            ambiguous=ambiguous,
        )
        while len(self._callers) > MAX_RECORDS:
            unquarantined = [p for p, r in self._callers.items() if not r.quarantined]
            if not unquarantined:
                break
            del self._callers[unquarantined[0]]
        for marker in loading:
            owed = self._owed.setdefault(marker.digest, {})
            for pod, record in self._callers.items():
                until = before[pod].probation_until if pod in before else 0.0
                if record.probation_until > until:
                    owed[pod] = (min(until, owed.get(pod, (until, 0.0))[0]), record.probation_until)
        while len(self._owed) > MAX_RECORDS:
            del self._owed[next(iter(self._owed))]
        while len(self._owed_exits) > MAX_RECORDS:
            del self._owed_exits[next(iter(self._owed_exits))]
        self._save()
        return [
            r
            for pod, r in self._callers.items()
            if r.quarantined and not (pod in before and before[pod].quarantined)
        ]

    def _forgive(self, digest: str) -> tuple[int, int]:
        """The files of `digest` are counted for an exit: the probations their loads' shared
        exits gave end (those renewed since by another exit stay); returns those exits, and how
        many of them were counted against the namespace already."""
        for pod, (before, given) in self._owed.pop(digest, {}).items():
            record = self._callers.get(pod)
            if record is not None and record.probation_until == given:
                self._callers[pod] = replace(record, probation_until=before)
        return self._owed_exits.pop(digest, (0, 0))

    def caller_quarantine(self, pod: str) -> CallerRecord | None:
        """The quarantine of `pod`'s requests (namespace/name), if it is quarantined."""
        record = self._callers.get(pod)
        return record if record is not None and record.quarantined else None

    def caller_probation(self, pod: str) -> CallerRecord | None:
        """The record of `pod` (namespace/name) while it is on probation
        (`agent.quarantine.suspects`): the gateway serializes its requests with other
        probationers'."""
        record = self._callers.get(pod)
        return record if record is not None and record.on_probation(self._wall()) else None

    def callers(self) -> list[CallerRecord]:
        return sorted(self._callers.values(), key=lambda r: r.pod)

    def restore(
        self, records: Iterable[CrashRecord], callers: Iterable[CallerRecord] = ()
    ) -> list[CrashRecord | CallerRecord]:
        """Take back quarantines this ledger lacks (its state directory was lost with the node
        pod, the Node kept them); returns those taken."""
        taken: list[CrashRecord | CallerRecord] = []
        for record in records:
            if record.quarantined and record.digest not in self._records:
                record = replace(record, quarantined_at=record.quarantined_at or self._wall())
                self._records[record.digest] = record
                taken.append(record)
        for caller in callers:
            if caller.quarantined and caller.pod not in self._callers:
                self._callers[caller.pod] = caller
                taken.append(caller)
        if taken:
            self._save()
        return taken

    def expire(self) -> list[CrashRecord]:
        """Lift the quarantines of files older than `expiry_seconds`: one node's evidence holds
        for so long. Their counts stay one short of the limit, so one more crash in a row
        quarantines them again; returns those lifted. A namespace's count, unquarantined,
        lapses as long after its last crash."""
        if self.expiry_seconds <= 0:
            return []
        now = self._wall()
        for namespace, counted in list(self._namespaces.items()):
            if not counted.quarantined and now >= counted.at + self.expiry_seconds:
                del self._namespaces[namespace]
                self._save()
        lapsed = [
            r
            for r in self._records.values()
            if r.quarantined and now >= r.quarantined_at + self.expiry_seconds
        ]
        for record in lapsed:
            self._records[record.digest] = replace(
                record, crashes=self.quarantine_after - 1, quarantined=False, quarantined_at=0.0
            )
        if lapsed:
            self._save()
        return lapsed

    def clear(self, selectors: Iterable[str]) -> list[CrashRecord]:
        """Forget the records any of `selectors` names (`CrashRecord.matches`); returns them."""
        wanted = [s.strip() for s in selectors if s.strip()]
        gone = [r for r in self._records.values() if any(r.matches(s) for s in wanted)]
        for record in gone:
            del self._records[record.digest]
        if gone:
            self._save()
        return gone

    def clear_callers(self, selectors: Iterable[str]) -> list[CallerRecord]:
        """Forget the pods any of `selectors` names (`CallerRecord.matches`); returns them."""
        wanted = [s.strip() for s in selectors if s.strip()]
        gone = [r for r in self._callers.values() if any(r.matches(s) for s in wanted)]
        for record in gone:
            del self._callers[record.pod]
        if gone:
            self._save()
        return gone

    def _trim(self) -> None:
        if len(self._records) <= MAX_RECORDS:
            return
        for digest in [d for d, r in self._records.items() if not r.quarantined][
            : len(self._records) - MAX_RECORDS
        ]:
            del self._records[digest]

    def _save(self) -> None:
        self._held = None  # every change of the records is saved
        document = {
            "records": [asdict(r) for r in self._records.values()],
            "callers": [asdict(r) for r in self._callers.values()],
            "namespaces": [asdict(r) for r in self._namespaces.values()],
        }
        self._write(self.directory / COUNTS_FILE, document)

    @staticmethod
    def _write(path: Path, document: object) -> None:
        temporary = path.with_name(path.name + ".tmp")
        with temporary.open("w") as f:
            json.dump(document, f)
            f.flush()
            os.fsync(f.fileno())
        temporary.replace(path)
