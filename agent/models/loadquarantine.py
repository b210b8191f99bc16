"""The quarantine of model files around their loads: what is refused, and what it reports.

The ledger of Triton's unexpected exits decides which files, and which namespaces' new loads, are
quarantined on the node (`agent.quarantine.crashledger`). This is the models' side of it: an install
or a load of quarantined files is refused with the error a pod is told (`Quarantines.refuse`);
the pods refused at install are remembered, so that their condition says why; the pods that want
some files are found for the Events of a quarantine; a load Triton died under is counted and the
model's life follows the count; a quarantine an operator cleared lets its models load again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from agent.errors import AgentError, ConflictError
from agent.models.records import ModelRecords
from agent.phases import TRANSITIONS, Event, Phase
from agent.pods.owners import Owners
from agent.pods.provenpods import Proven
from agent.quarantine.crashledger import CrashLedger, CrashRecord, Marker, NamespaceRecord

__all__ = [
    "CRASHED_REASON",
    "NAMESPACE_CRASHED_REASON",
    "PodQuarantine",
    "Quarantines",
    "crash_message",
    "namespace_message",
    "quarantine_message",
]

CRASHED_REASON = "ModelCrashedTriton"
"""The reason of the pod's condition and Warning Event for a quarantined model."""


NAMESPACE_CRASHED_REASON = "NamespaceCrashedTriton"
"""The reason of the pod's condition and Warning Event when its namespace's new loads are
quarantined on the node."""


def namespace_message(record: NamespaceRecord) -> str:
    return (
        f"Triton exited under the loads of namespace {record.namespace} on this node "
        f"{record.crashes} times (last for pod {record.pod}, --crash-quarantine-after plus "
        f"--crash-namespace-quarantine-after): the node loads no model of namespace "
        f"{record.namespace}, so that "
        f"its other models stay served; fix the models, or ask the operator to clear it "
        f"(tritonshare quarantine clear <node> {record.namespace}/*)"
    )


def quarantine_message(record: CrashRecord | NamespaceRecord) -> str:
    if isinstance(record, NamespaceRecord):
        return namespace_message(record)
    return crash_message(record)


@dataclass(frozen=True)
class PodQuarantine:
    """A pod's model files are quarantined on this node (`Quarantines.for_pod`)."""

    record: CrashRecord
    installed: bool
    """Its own install holds them (its loads crashed Triton); False: its install was refused."""


REFUSED_REMEMBERED = 10_000
"""Pods remembered as refused at install for quarantined files (forgotten all at once beyond)."""


def crash_message(record: CrashRecord) -> str:
    return (
        f"model {record.model_id} was being loaded when the node's Triton exited unexpectedly "
        f"{record.crashes} times in a row (last for pod {record.pod}): it is quarantined on this "
        f"node and not loaded here again, so that the node's other models stay served; fix the "
        f"model (a new version of its files loads), or ask the operator to clear it "
        f"(tritonshare quarantine clear <node> {record.namespace}/{record.model_id})"
    )


class Quarantines:
    """The quarantines of the node's model files, as model operations meet them."""

    def __init__(
        self,
        crashes: CrashLedger,
        ownership: Owners,
        records: ModelRecords,
        all_proven: Callable[[], list[Proven]],
    ) -> None:
        self.crashes = crashes
        self.ownership = ownership
        self.records = records
        self._all_proven = all_proven
        """Every live pod of the node with a proven placement (`Pods.all_proven`)."""
        self._refused: dict[str, str] = {}
        """Pod uid -> the digest of the quarantined files its install was refused for."""

    def refuse_install(self, uid: str, digest: str) -> None:
        """Raise ConflictError when the files `digest` are quarantined here, remembering that the
        install of pod `uid` was refused for them."""
        quarantined = self.crashes.quarantined(digest)
        if quarantined is not None:
            # Refused before a byte is written: these files crashed this node's Triton, whichever
            # pod sends them (a controller's replacement of the quarantined pod, typically).
            if len(self._refused) >= REFUSED_REMEMBERED:
                self._refused.clear()
            self._refused[uid] = digest
            raise ConflictError(crash_message(quarantined), event_reason=CRASHED_REASON)

    def refuse(self, digest: str, namespace: str) -> None:
        """Raise ConflictError when the files or their namespace are quarantined here."""
        quarantined = self.crashes.quarantined(digest)
        if quarantined is not None:
            raise ConflictError(crash_message(quarantined), event_reason=CRASHED_REASON)
        namespace_held = self.crashes.namespace_quarantine(namespace)
        if namespace_held is not None:
            raise ConflictError(
                namespace_message(namespace_held), event_reason=NAMESPACE_CRASHED_REASON
            )

    def of(self, name: str) -> CrashRecord | NamespaceRecord | None:
        """The quarantine of the files installed as `name`, or of their namespace's new loads,
        if they are quarantined."""
        owned = self.ownership.store.get(name)
        if owned is None:
            return None
        files = self.crashes.quarantined(owned.digest) if owned.digest else None
        return files or self.crashes.namespace_quarantine(owned.namespace)

    def for_pod(self, owner: Proven) -> PodQuarantine | None:
        """Whether `owner`'s model files are quarantined here: the files it installed, or those
        it was refused at install for."""
        try:
            owned = self.ownership.store.get(self.ownership.triton_name(owner))
        except AgentError:  # a model id that cannot be served: nothing installed for it
            owned = None
        if owned is not None and owned.uid == owner.uid and owned.digest:
            record = self.crashes.quarantined(owned.digest)
            if record is not None:
                return PodQuarantine(record, installed=True)
        refused = self._refused.get(owner.uid)
        record = self.crashes.quarantined(refused) if refused else None
        return PodQuarantine(record, installed=False) if record is not None else None

    def wanting(self, digest: str) -> list[str]:
        """The live pods of this node (namespace/name) that want the files `digest`: their
        install holds them, or was refused for them."""
        found = []
        for proven in self._all_proven():
            try:
                owned = self.ownership.store.get(self.ownership.triton_name(proven))
            except AgentError:
                owned = None
            holds = owned is not None and owned.uid == proven.uid and owned.digest == digest
            if holds or self._refused.get(proven.uid) == digest:
                found.append(proven.key)
        return sorted(found)

    def crash_suspected(self, marker: Marker, *, alone: bool = True) -> CrashRecord:
        """Count a load Triton died under (`marker`, left over, its model not in Triton) against
        its files (only suspect them, not `alone`: `CrashLedger.crashed`); the model's life
        follows the count on disk, which survives restarts."""
        counted = self.crashes.crashed(marker, alone=alone)
        record = self.records.record(marker.name)
        record.life = replace(record.life, crashes=counted.crashes - 1)
        if (record.life.phase, Event.CRASH_SUSPECTED) in TRANSITIONS:
            self.records.step(marker.name, record, Event.CRASH_SUSPECTED)
        return counted

    def cleared(self, cleared: list[CrashRecord]) -> None:
        """An operator lifted these quarantines: their models may load again."""
        digests = {r.digest for r in cleared}
        for name, owned in self.ownership.store.all().items():
            record = self.records.get(name)
            if owned.digest in digests and record and record.life.phase is Phase.QUARANTINED:
                self.records.step(name, record, Event.QUARANTINE_CLEARED)
