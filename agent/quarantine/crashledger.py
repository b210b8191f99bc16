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
however many versions or models they try at once: each exit of Triton is counted once against a
namespace and once against a model's files, however many of their loads it left over, by the name
of the Triton process that exited (`triton`, written in each marker: `Marker.triton`). An exit a
load in flight shared with pods' requests is counted against neither (`explained`; the pods go on
probation), until that load's files are counted for an exit alone: then it is counted against
them too, and the probation it gave ends (`agent.quarantine.callercounts.CallerCounts.forgive`;
kept in memory only). `CrashLedger` stores and counts, with the marker files in
`agent.quarantine.markers` and the counts of files, namespaces and pods in
`agent.quarantine.filecounts`, `.namespaces` and `.callers`; `agent.models.nodemodels` writes the
markers around its loads; `agent.models.aftercrash` decides when a marker is a crash and what the
pod is told.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from agent.quarantine.callercounts import CallerCounts
from agent.quarantine.filecounts import CrashRecord, FileCounts
from agent.quarantine.markers import MARKER_SUFFIX, Marker, MarkerFiles, write_durably
from agent.quarantine.namespaces import NamespaceCounts, NamespaceRecord
from agent.quarantine.suspects import CallerRecord
from common.crashwitness import Suspect

__all__ = [
    "COUNTS_FILE",
    "DECIDED_KEPT",
    "MARKER_SUFFIX",
    "MAX_RECORDS",
    "NAMESPACE",
    "SUSPECT_QUIET_SECONDS",
    "CrashLedger",
    "CrashRecord",
    "Marker",
    "NamespaceRecord",
]

log = logging.getLogger(__name__)

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
        self.directory = directory
        self.quarantine_after = quarantine_after
        self.settle_seconds = settle_seconds
        self.expiry_seconds = expiry_seconds
        """A quarantine of files lapses this long after it began (`expire`); 0: never."""
        self._wall = wall
        self._markers = MarkerFiles(directory)
        self._files = FileCounts(quarantine_after, MAX_RECORDS, wall)
        self._namespaces = NamespaceCounts(quarantine_after, namespace_quarantine_after, wall)
        self._callers = CallerCounts(quarantine_after, probation_seconds, MAX_RECORDS, wall)
        self._held: set[str] | None = None
        """Namespaces with quarantined files (None: to be worked out again)."""
        self._decided: list[tuple[Marker, float]] = []
        """Markers counted or dismissed lately, with when (Unix seconds): an exit's evidence
        for `loads_at` after the reconciler has taken them off the disk."""
        self._shared: dict[str, float] = {}
        """Files only suspected at an exit (beside other pods' requests or a more recent
        load), by digest, with when (Unix seconds): `shared_before`."""
        self._in_flight_taken = False
        """A load in flight at the last exit was decided before the reconciler's pass over it."""
        self._boot = uuid.uuid4().hex[:12]
        self._exits_seen = 0
        self.witnessed: Callable[[Marker], list[str]] | None = None
        """The pods whose requests the node gateway saw at Triton when it died since the load
        of a marker began (`agent.status.requestcrash`); None: no gateway witnesses."""

    @property
    def triton(self) -> str:
        """The name of the Triton process loads go to now (`Marker.triton`): it changes at each
        exit the agent sees (`triton_exited`), so the markers an exit leaves over name it, and
        it is counted once however many loads it had."""
        return f"{self._boot}.{self._exits_seen}"

    def triton_exited(self) -> None:
        """Triton exited (its liveness or the sentinel says so): loads from now on go to another
        process."""
        self._exits_seen += 1

    def _exit_found(self, marker: Marker) -> None:
        # An exit found by a marker left over, which the liveness watch missed (Triton came
        # back between two polls): the loads from now on go to another process all the same.
        if marker.triton == self.triton:
            self.triton_exited()

    @property
    def namespace_quarantine_after(self) -> int:
        """The crashes past `quarantine_after` at which a namespace's loads are quarantined."""
        return self._namespaces.namespace_quarantine_after

    @property
    def probation_seconds(self) -> float:
        """How long a pod present at an ambiguous exit is on probation (seconds)."""
        return self._callers.probation_seconds

    def load(self) -> None:
        """Read the counts; an unreadable file is kept aside and counting starts afresh."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.directory / COUNTS_FILE
        self._files.reset()
        self._callers.reset()
        self._namespaces.reset()
        self._held = None
        try:
            document = json.loads(path.read_text())
            self._namespaces.read(document.get("namespaces", []))
            self._callers.read(document.get("callers", []))
            self._files.read(document["records"])
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            # Nothing of it is kept: the quarantines come back from the Node (`restore`).
            self._files.reset()
            self._callers.reset()
            self._namespaces.reset()
            self._held = None
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
        self._markers.write(marker)

    def answered(self, name: str) -> None:
        """Triton refused the load of `name` (it did not die under it), or the model is gone."""
        self._markers.remove(name)

    def finished(self, marker: Marker, *, settle: bool = True) -> None:
        """Triton answered the load READY: the marker stays, finished, until `settled` (not at
        all without `settle`: a model Triton held before it restarted, loaded again)."""
        if self.settle_of(marker) <= 0 or not settle:
            self.answered(marker.name)
            self.loaded(marker.digest)
            return
        self._markers.write(replace(marker, finished_at=self._wall()))

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
        return self._markers.read()

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
            self._exit_found(marker)
            self.answered(marker.name)
            if not marker.finished_at:
                held = self.held(marker.pod.partition("/")[0])
                if held:
                    # A held namespace's load in flight stays its suspect beside requests too,
                    # or a neighbour's traffic would buy it exits past its bound.
                    self._count_namespace(marker, marker.exit)
                    self._save()
                self._callers.shared_exit(marker.digest, marker.exit, against_namespace=held)
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
        self._exit_found(marker)
        exits: list[str | None] = []
        if alone:
            # Found guilty, its loads' exits shared with requests were its own too.
            shared = [(marker.exit, False), *self._callers.forgive(marker.digest)]
            for exit, counted in shared:
                if not counted:
                    self._count_namespace(marker, exit)  # once an exit, whatever its loads
            exits = [exit for exit, _ in shared]
            self._shared.pop(marker.digest, None)
        else:
            self._shared[marker.digest] = self._wall()
        record = self._files.crashed(marker.digest, marker.model_id, marker.pod, exits)
        self._save()
        self.answered(marker.name)
        return record

    def loaded(self, digest: str) -> None:
        """Triton answered a load of these files READY: their crashes in a row end."""
        self._shared.pop(digest, None)
        self._callers.loaded(digest)
        if self._files.loaded(digest):
            self._save()

    def suspected(self, digest: str) -> bool:
        """Whether these files coincided with an exit since they last stayed READY through
        their settling window, and are not quarantined: they load again last, alone."""
        return self._files.suspected(digest)

    def count(self, digest: str) -> int:
        """The crashes in a row of these files (0: none, or cleared)."""
        return self._files.count(digest)

    def quarantined(self, digest: str) -> CrashRecord | None:
        return self._files.quarantined(digest)

    def records(self) -> list[CrashRecord]:
        return self._files.records()

    # Namespaces whose files were quarantined here.
    @property
    def quiet_seconds(self) -> float:
        """The quiet period after a held namespace's load."""
        return max(self.settle_seconds, SUSPECT_QUIET_SECONDS)

    def held(self, namespace: str) -> bool:
        """Whether `namespace`'s models load as suspects: one of its files is quarantined
        here, or its loads crashed Triton `quarantine_after` times."""
        if self._held is None:
            self._held = self._files.held() | self._namespaces.held()
        return namespace in self._held

    def namespace_quarantine(self, namespace: str) -> NamespaceRecord | None:
        """The quarantine of `namespace`'s new loads on this node, if it is quarantined."""
        return self._namespaces.quarantine(namespace)

    def namespaces(self) -> list[NamespaceRecord]:
        return self._namespaces.records()

    def clear_namespaces(self, selectors: Iterable[str]) -> list[NamespaceRecord]:
        """Forget the namespaces any of `selectors` names (`NAMESPACE/*`); returns them."""
        gone = self._namespaces.clear(selectors)
        if gone:
            self._save()
        return gone

    def restore_namespaces(self, records: Iterable[NamespaceRecord]) -> list[NamespaceRecord]:
        """Take back namespace quarantines this ledger lacks (from the Node)."""
        taken = self._namespaces.restore(records)
        if taken:
            self._save()
        return taken

    @property
    def namespace_bound(self) -> int:
        """The crashes of a namespace's loads at which its loads are quarantined on the node."""
        return self._namespaces.bound

    def _count_namespace(self, marker: Marker, exit: str | None) -> None:
        self._namespaces.count(marker.pod, exit)
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
        (`CallerCounts.forgive`): an exit the load is then found guilty of was not the
        requests'."""
        quarantined = self._callers.crashed(
            suspects, ambiguous=ambiguous, loading=[m.digest for m in loading]
        )
        self._save()
        return quarantined

    def caller_quarantine(self, pod: str) -> CallerRecord | None:
        """The quarantine of `pod`'s requests (namespace/name), if it is quarantined."""
        return self._callers.quarantine(pod)

    def caller_probation(self, pod: str) -> CallerRecord | None:
        """The record of `pod` (namespace/name) while it is on probation
        (`agent.quarantine.suspects`): the gateway serializes its requests with other
        probationers'."""
        return self._callers.probation(pod)

    def callers(self) -> list[CallerRecord]:
        return self._callers.records()

    def restore(
        self, records: Iterable[CrashRecord], callers: Iterable[CallerRecord] = ()
    ) -> list[CrashRecord | CallerRecord]:
        """Take back quarantines this ledger lacks (its state directory was lost with the node
        pod, the Node kept them); returns those taken."""
        taken: list[CrashRecord | CallerRecord] = [*self._files.restore(records)]
        taken.extend(self._callers.restore(callers))
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
        if self._namespaces.expire(now, self.expiry_seconds):
            self._save()
        lapsed = self._files.expire(now, self.expiry_seconds)
        if lapsed:
            self._save()
        return lapsed

    def clear(self, selectors: Iterable[str]) -> list[CrashRecord]:
        """Forget the records any of `selectors` names (`CrashRecord.matches`); returns them."""
        gone = self._files.clear(selectors)
        if gone:
            self._save()
        return gone

    def clear_callers(self, selectors: Iterable[str]) -> list[CallerRecord]:
        """Forget the pods any of `selectors` names (`CallerRecord.matches`); returns them."""
        gone = self._callers.clear(selectors)
        if gone:
            self._save()
        return gone

    def _save(self) -> None:
        self._held = None  # every change of the records is saved
        document = {
            "records": self._files.document(),
            "callers": self._callers.document(),
            "namespaces": self._namespaces.document(),
        }
        write_durably(self.directory / COUNTS_FILE, document)
