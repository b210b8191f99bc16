"""What the agent reports about the node's models: each model's status, and the node's figures.

A model's status is read from its record (`agent.models.records`), what Triton holds and the
files installed, as `agent.phases.reported` tells them, with its quarantine
(`agent.models.loadquarantine`) and its pod's residency; a pod that does not own its name learns
nothing. The node's figures (the models held loaded or asleep per GPU, and the bytes charged to
them) are read for ListGpus and the metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agent.gpus.memory import MemoryLedger
from agent.installs.limits import ModelLimits
from agent.installs.repository import Repository
from agent.models.loadquarantine import NAMESPACE_CRASHED_REASON, Quarantines, quarantine_message
from agent.models.records import ModelRecord, ModelRecords
from agent.phases import ModelState, Phase, given_up, reported
from agent.pods.owners import Owners
from agent.pods.provenpods import Proven
from agent.quarantine.crashledger import NamespaceRecord
from agent.triton import LOADING, READY, IndexEntry, TritonClient
from common.manifest import Manifest

__all__ = ["ModelReports", "ModelStatus"]


@dataclass(frozen=True)
class ModelStatus:
    """What the agent reports about one model."""

    model_id: str
    """The public id, as the pod's clients name the model."""
    state: ModelState
    reason: str = ""
    manifest_digest: str = ""
    gpu_uuid: str = ""
    gpu_index: int = -1
    pod: str = ""
    triton_name: str = ""
    """The model's name in Triton (its pod's private name, or a legacy model's public id)."""
    given_up: bool = False
    """Its loads failed --max-load-attempts times in a row: none is tried until it changes."""
    quarantined: bool = False
    """Its files coincided with too many of Triton's unexpected exits
    (`agent.quarantine.crashledger`)."""
    quarantine_reason: str = ""
    """The condition's reason when it is not the files' own quarantine (its namespace's)."""
    residency: str = ""
    """Its pod's residency class from the proof of placement ("" when no live pod owns it)."""
    sleeping: bool = False
    """An on-demand model unloaded while idle, its files kept: its next load wakes it."""


class ModelReports:
    """Reads the status of the node's models, and the node's figures of them."""

    def __init__(
        self,
        records: ModelRecords,
        quarantine: Quarantines,
        ownership: Owners,
        repository: Repository,
        triton: TritonClient,
        ledger: MemoryLedger,
        limits: ModelLimits,
        all_proven: Callable[[], list[Proven]],
    ) -> None:
        self.records = records
        self.quarantine = quarantine
        self.ownership = ownership
        self.repository = repository
        self.triton = triton
        self.ledger = ledger
        self.limits = limits
        self._all_proven = all_proven
        """Every live pod of the node with a proven placement (`Pods.all_proven`)."""

    async def current(self, name: str, residency: str) -> ModelStatus:
        entry = await self.triton.state(name)
        return self.status_of(name, entry, self.repository.installed_manifest(name), residency)

    def status_of(
        self, name: str, entry: IndexEntry | None, manifest: Manifest | None, residency: str = ""
    ) -> ModelStatus:
        record = self.records.get(name) or ModelRecord()
        state = reported(record.life, entry.state if entry else "", manifest is not None)
        sleeping = record.life.phase is Phase.IDLE_UNLOADED and state is ModelState.INSTALLED
        reason = record.life.failure if state is ModelState.FAILED else ""
        attempts = self.limits.max_load_attempts
        stopped = state is ModelState.FAILED and given_up(record.life, attempts)
        if stopped:
            reason = (
                f"its load failed {record.life.failures} times in a row (--max-load-attempts "
                f"{attempts}); it is not tried again until its files are installed again or "
                f"the pod is recreated. The last failure: {reason}"
            )
        quarantined = self.quarantine.of(name)
        if quarantined is not None and state is not ModelState.READY:
            state, reason = ModelState.FAILED, quarantine_message(quarantined)
        return ModelStatus(
            model_id=self.records.public_id(name),
            state=state,
            reason=reason,
            given_up=stopped,
            quarantined=quarantined is not None and state is ModelState.FAILED,
            quarantine_reason=(
                NAMESPACE_CRASHED_REASON if isinstance(quarantined, NamespaceRecord) else ""
            ),
            manifest_digest=manifest.digest if manifest else "",
            gpu_uuid=record.gpu_uuid,
            gpu_index=record.gpu_index,
            pod=record.pod,
            triton_name=name,
            residency=residency,
            sleeping=sleeping,
        )

    async def status_for(self, owner: Proven) -> ModelStatus:
        """The status of the owner's model; a pod that does not own its name learns nothing."""
        name = self.ownership.triton_name(owner)
        if not await self.ownership.owns(name, owner):
            return ModelStatus(owner.model_id, ModelState.ABSENT, residency=owner.residency)
        return await self.current(name, owner.residency)

    def residencies(self) -> dict[str, Proven]:
        """Name in Triton -> its owner, for every name a live proven pod owns."""
        by_uid = {proven.uid: proven for proven in self._all_proven()}
        owned = {}
        for name, owner in self.ownership.store.all().items():
            proven = by_uid.get(owner.uid)
            if proven is not None:
                owned[name] = proven
        return owned

    async def status(self, name: str) -> ModelStatus:
        """The status of the model named `name` in Triton (the platform's view)."""
        owner = self.residencies().get(name)
        return await self.current(name, owner.residency if owner else "")

    async def statuses(self) -> list[ModelStatus]:
        """Every model on disk, in Triton, or remembered (a failure), sorted by name in Triton."""
        index = await self.triton.index()
        names = set(self.repository.installed_models()) | set(self.records.known())
        names |= {name for name, entry in index.items() if entry.state in (READY, LOADING)}
        owners = self.residencies()
        return [
            self.status_of(
                name,
                index.get(name),
                self.repository.installed_manifest(name),
                owners[name].residency if name in owners else "",
            )
            for name in sorted(names)
        ]

    def residency_states(self) -> dict[str, str]:
        """Name in Triton -> `loaded`, `sleeping` or `waking`, for every on-demand model a live
        proven pod owns (for the metrics)."""
        states = {}
        for name, owner in self.residencies().items():
            record = self.records.get(name)
            if not owner.on_demand or record is None:
                continue
            phase = record.life.phase
            if phase is Phase.WAKING:
                states[name] = "waking"
            elif phase is Phase.IDLE_UNLOADED:
                states[name] = "sleeping"
            elif record.life.counts_loaded:
                states[name] = "loaded"
        return states

    def gpu_bytes(self) -> dict[str, tuple[int, int]]:
        """GPU UUID -> (bytes charged to the models held loaded on it, the larger of request
        and measured each; bytes its sleeping on-demand models request), for ListGpus."""
        figures: dict[str, tuple[int, int]] = {}
        for name, owner in self.residencies().items():
            record = self.records.get(name)
            if record is None or not owner.gpu_uuid:
                continue
            loaded, sleeping = figures.get(owner.gpu_uuid, (0, 0))
            if record.life.counts_loaded:
                loaded += max(owner.request, self.ledger.measured(name))
            elif record.life.phase is Phase.IDLE_UNLOADED:
                sleeping += owner.request
            figures[owner.gpu_uuid] = (loaded, sleeping)
        return figures

    def loaded_per_gpu(self) -> dict[str, int]:
        """Models the agent holds loaded, by GPU UUID ("" for the CPU), for metrics."""
        counts: dict[str, int] = {}
        for record in self.records.known().values():
            if record.life.counts_loaded:
                counts[record.gpu_uuid] = counts.get(record.gpu_uuid, 0) + 1
        return counts
