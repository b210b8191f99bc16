"""A model's load into Triton, and what stands around it on the node.

A load is checked against the node's policy and pinned to its pod's GPU (or the CPU), as the pure
`agent.models.loadplan.plan_load` plans it; a load Triton died under before is counted first (and,
asked for again at once, waits until the models Triton held are loaded again:
`agent.models.restoregate`), and quarantined files are refused
(`agent.models.loadquarantine`). A held namespace's load goes alone (`agent.models.heldloads`), a
suspect's is a trial for which probationers are held (`agent.models.probationhold`), and a marker on
disk says whose load it was should Triton die under it (`agent.quarantine.crashledger`). Triton's
host memory admits it (`agent.models.tritonram`), its GPU admits and measures it
(`agent.models.gpuadmission`), and its life is stepped on each outcome. The caller holds the model's
lock and its claim (`Models.load`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from agent.errors import (
    AgentError,
    ConflictError,
    HostMemoryExhaustedError,
    LoadTimedOutError,
    NotFoundError,
    ResourceExhaustedError,
    TritonError,
    TritonNotConnectedError,
    TritonUnreachableError,
)
from agent.gpus.inventory import gpu_for
from agent.kube.events import PodEvents
from agent.models.gpuadmission import GpuAdmission
from agent.models.gpuroom import RoomMaker
from agent.models.heldloads import HeldLoads
from agent.models.loadplan import LoadPlan, pin_of, plan_load
from agent.models.loadquarantine import Quarantines
from agent.models.node import Node
from agent.models.probationhold import ProbationHold
from agent.models.records import ModelRecord, ModelRecords
from agent.models.restoregate import RestoreGate
from agent.models.statuses import ModelReports, ModelStatus
from agent.models.tritonram import Admitted
from agent.phases import Event, Phase, given_up
from agent.pods.ownership import OwnerRecord
from agent.pods.provenpods import Proven
from agent.quarantine.crashledger import CrashLedger, Marker
from agent.triton import KNOWN_TO_THIS_PROCESS, READY, IndexEntry
from common.logs import subject
from common.manifest import Manifest

__all__ = ["LoadGuards", "Loads"]

log = logging.getLogger(__name__)

QUEUE_BOUNDED_REASON = "ModelQueueBounded"
"""The reason of the Warning Event a pod gets when its config's queue delays are lowered."""

T = TypeVar("T")


def _subdirectories(directory: Path) -> list[str]:
    """The names of the directory's subdirectories as Triton lists them (links followed)."""
    try:
        with os.scandir(directory) as entries:
            return [entry.name for entry in entries if entry.is_dir()]
    except OSError:
        return []


def _died_under(left: Marker | None, entry: IndexEntry | None) -> bool:
    """Whether Triton exited under an earlier load of the model: its marker left unanswered, and
    Triton holds no state of it that only the process it was sent to could have given it."""
    return (
        left is not None
        and not left.finished_at
        # A model this Triton holds, unloads or refused was sent to it: no exit since.
        and (entry is None or entry.state not in KNOWN_TO_THIS_PROCESS)
    )


@dataclass(frozen=True)
class _Watch:
    """How a load is watched (`Loads._watch`)."""

    held: bool
    """Its namespace is held: it goes alone (`agent.models.heldloads`)."""
    hold: ProbationHold
    trial: bool
    """It loads a suspect's files: probationers are kept from Triton until it settles."""


@dataclass(frozen=True)
class _InFlight:
    """A load under way (`Loads._begin`): what it asks, and what says whose it is."""

    plan: LoadPlan
    record: ModelRecord
    manifest: Manifest
    marker: Marker
    watch: _Watch
    started: float
    """When it began (the agent's monotonic clock)."""

    @property
    def settle(self) -> bool:
        """Triton's exits after its READY count against it (not a reload of what Triton held)."""
        return not self.marker.restore


@dataclass(frozen=True)
class LoadGuards:
    """What stands around a load so that one that crashes Triton costs its neighbours no more."""

    crashes: CrashLedger
    """Counts the exits of Triton under loads, by a marker written before each load."""
    quarantine: Quarantines
    """Refuses quarantined files (`agent.models.loadquarantine`)."""
    hold: ProbationHold
    """Holds probationers' requests at the gateway while a watched load (one whose READY is
    watched, `agent.quarantine.crashledger`) is under way or just ended (0 seconds: never)."""
    restore_gate: RestoreGate
    """Closed after Triton's exit until what it held is loaded again."""


class Loads:
    """Loads the node's models into Triton, one model's load at a time under its lock."""

    def __init__(
        self,
        node: Node,
        *,
        records: ModelRecords,
        reports: ModelReports,
        admission: GpuAdmission,
        room: RoomMaker,
        guards: LoadGuards,
        events: PodEvents,
        executor: Executor,
    ) -> None:
        self.repository = node.repository
        self.triton = node.triton
        self.limits = node.limits
        self.metrics = node.metrics
        self._gpus = node.gpus
        self.host = node.host
        self.records = records
        self.reports = reports
        self.admission = admission
        self.room = room
        """Puts idle on-demand models to sleep for a load that does not fit (with no activity
        table, none: the load is refused)."""
        self.crashes = guards.crashes
        self.quarantine = guards.quarantine
        self.hold = guards.hold
        self._unheld = ProbationHold(0)
        """What a reload of what Triton held goes through: it is no change, and holds nobody."""
        self.restore_gate = guards.restore_gate
        self.events = events
        """Tells a pod what its load's config override lowered."""
        self.held_loads = HeldLoads()
        self._executor = executor
        self.clock = node.clock
        self._wall = node.wall

    async def _in_thread(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def gpu_for(self, model_id: str, gpu_uuid: str) -> tuple[str, int]:
        return gpu_for(self._gpus.snapshot, model_id, gpu_uuid, self.limits.cpu_only)

    async def load_locked(
        self, name: str, owner: Proven, owned: OwnerRecord, *, settle: bool = True
    ) -> ModelStatus:
        """Load the owner's installed model as `plan_load` plans it, after what an exit of Triton
        under an earlier load of it asks (`_after_exit`), watched (`_watch`), marked (`_begin`)
        and carried out (`_carry_out`). Without `settle`, a reload of what Triton held before it
        restarted. The caller holds the model's lock and its claim (`Models.load`)."""
        record = self.records.touch(name, owner)
        record.pod = owner.key
        manifest = self.repository.installed_manifest(name)
        if manifest is None or manifest.digest != owned.digest:
            raise NotFoundError(
                f"model {owner.model_id!r} is not installed on this node for pod {owner.key}; "
                f"install it (InstallModel) before loading"
            )
        plan = self._plan(name, owner, manifest)
        request = plan.request
        entry = await self.triton.state(name)
        if (
            entry is not None
            and entry.state == READY
            and record.life.held_loaded
            and (record.gpu_uuid, record.gpu_index) == (request.uuid, request.index)
        ):
            return self.reports.status_of(name, entry, manifest, owner.residency)
        await self._after_exit(name, owner, owned, entry)
        if given_up(record.life, self.limits.max_load_attempts):
            # Each try holds the GPU's slot: a model that never loads must not hold it forever.
            return self.reports.status_of(name, entry, manifest, owner.residency)
        watch = await self._watch(owner, owned, settle)
        load = await self._begin(plan, record, manifest, owned, watch, settle)
        return await self._carry_out(load)

    def _plan(self, name: str, owner: Proven, manifest: Manifest) -> LoadPlan:
        """`plan_load` of the model's files as they are on disk now; what its config's override
        lowers is said (`_queue_bounded`)."""
        gpu = self.gpu_for(owner.model_id, owner.gpu_uuid)
        directory = self.repository.model_dir(name)
        plan = plan_load(
            name,
            owner,
            manifest,
            (directory / "config.pbtxt").read_text(errors="replace"),
            # What Triton will find, not what was installed: the model's own code may have made
            # directories beside its files since.
            _subdirectories(directory),
            self.limits,
            gpu,
            measures_apart=self.admission.apart is not None,
        )
        if plan.lowered:
            self._queue_bounded(owner, owner.model_id, list(plan.lowered))
        return plan

    async def _after_exit(
        self, name: str, owner: Proven, owned: OwnerRecord, entry: IndexEntry | None
    ) -> None:
        """Count an exit of Triton under an earlier load of the model, refuse quarantined files,
        and, when such a load is asked for again at once, wait until what Triton held is loaded
        again (`agent.models.restoregate`)."""
        model_id = owner.model_id
        left = self.crashes.markers().get(name)
        died_under = _died_under(left, entry)
        if died_under:
            # The reconciler's pass over that exit will not find it: a load was in flight there.
            self.crashes.took_in_flight()
        if left is not None and died_under and not self.crashes.explained(left):
            # A load of it Triton never answered, nor holds: Triton died under it (a load that
            # never reached Triton leaves none). Counted here, not only by the next reconcile
            # pass: a pod asking again at once would otherwise crash Triton before any pass
            # finds it up with no load under way, again and again, never counted.
            counted = self.quarantine.crash_suspected(left)
            log.warning(
                "Triton exited while loading model %s of pod %s (%d of %d crashes in a row "
                "before quarantine), found as it loads again.",
                left.model_id,
                left.pod,
                counted.crashes,
                self.crashes.quarantine_after,
                extra=subject(pod=left.pod, model=left.model_id),
            )
        self.quarantine.refuse(owned.digest, owner.namespace)
        if not died_under:
            return
        # Asked for again at once: the models Triton held come back first, then it may take
        # Triton down again if it must.
        waited = await self.restore_gate.wait()
        if waited >= 0.1:
            log.info(
                "Model %s of pod %s, in flight when Triton exited, waited %.1f s for the "
                "models Triton held to be loaded again.",
                model_id,
                owner.key,
                waited,
                extra=subject(pod=owner.key, model=model_id),
            )
        self.quarantine.refuse(owned.digest, owner.namespace)  # counted meanwhile?

    async def _watch(self, owner: Proven, owned: OwnerRecord, settle: bool) -> _Watch:
        """Take the load's turns: a held namespace's load goes alone, then keeps the node quiet
        (`agent.models.heldloads`); a suspect's load is its trial, for which probationers are
        kept from Triton until it settles (`agent.models.probationhold`)."""
        held = self.crashes.held(owner.namespace)
        hold = self.hold if settle else self._unheld
        trial = hold.hold_seconds > 0 and (held or self.crashes.suspected(owned.digest))
        if trial:
            await hold.trial_turn(owner.namespace)  # at most half of probationers' time
        try:
            await self.held_loads.begin(held)
            try:
                # Crashes counted while it waited may have quarantined it.
                self.quarantine.refuse(owned.digest, owner.namespace)
            except ConflictError:
                self.held_loads.end(held, 0.0)
                raise
        except BaseException:
            if trial:
                hold.trial_over()
            raise
        return _Watch(held, hold, trial)

    async def _begin(
        self,
        plan: LoadPlan,
        record: ModelRecord,
        manifest: Manifest,
        owned: OwnerRecord,
        watch: _Watch,
        settle: bool,
    ) -> _InFlight:
        """Hold probationers, step the model's life, and write the marker that says whose load
        it was should Triton die under it; the turns are given back when any of it fails."""
        name, owner = plan.request.name, plan.request.owner
        try:
            # Before the marker: a load cancelled meanwhile never reached Triton.
            # Files counted for an exit alone hold every pod through their trial.
            trial = watch.trial
            suspect = owned.digest if trial and self.crashes.suspected(owned.digest) else ""
            await watch.hold.begin(owner.pod.object_key, trial=trial, suspect=suspect)
            waking = record.life.phase is Phase.IDLE_UNLOADED
            self.records.step(name, record, Event.REQUEST_ARRIVED if waking else Event.LOAD_STARTED)
            record.gpu_uuid, record.gpu_index = plan.request.uuid, plan.request.index
            started = self.clock()
            # Durable before Triton sees the load: if Triton dies under it, the marker says whose.
            marker = Marker(
                name,
                owned.digest,
                owner.model_id,
                owner.key,
                started_at=self._wall(),
                restore=not settle,
                trial=trial,
                triton=self.crashes.triton,
            )
            await self._in_thread(self.crashes.loading, marker)
        except BaseException:
            self.held_loads.end(watch.held, 0.0)
            watch.hold.end(owner.pod.object_key, trial=watch.trial)
            raise
        request = replace(plan.request, waking=waking)
        return _InFlight(replace(plan, request=request), record, manifest, marker, watch, started)

    async def _carry_out(self, load: _InFlight) -> ModelStatus:
        """Admit the load on Triton's host memory and on its GPU, which loads and measures it;
        step its life on the outcome and give its turns back."""
        request, watch, manifest = load.plan.request, load.watch, load.manifest
        name, owner = request.name, request.owner
        admitted: Admitted | None = None
        loaded = False
        settle_seconds = 0.0
        unreachable = False
        try:
            admitted = await self._in_thread(
                self.host.admit,
                name,
                manifest.digest,
                manifest.total_bytes,
                owner.model_id,
                owner.key,
            )
            await self.admission.load_measured(
                request,
                # READY: an exit from now on finds it settling, even while it is measured.
                on_ready=lambda: self.crashes.finished(load.marker, settle=load.settle),
                make_room=self.room.make_room,
            )
        except BaseException as e:
            unreachable = isinstance(e, TritonUnreachableError)
            if not self._failed(e, load):
                raise
            if isinstance(e, LoadTimedOutError):
                await self._abandon(name)
                # Triton may still be loading it: the answer is the agent's, the load is over.
                return self.reports.status_of(name, None, manifest, owner.residency)
        else:
            loaded = True
            settle_seconds = self.crashes.settle_of(load.marker)
            self.crashes.finished(load.marker, settle=load.settle)
            await self._in_thread(self.host.finished, admitted, True)
            admitted = None
            self._loaded(load)
        finally:
            if admitted is not None:
                self.host.finished(admitted, False)  # refused or failed: nothing to measure
            self.held_loads.end(watch.held, self.crashes.quiet_seconds if loaded else 0.0)
            watch.hold.end(
                owner.pod.object_key,
                trial=watch.trial,
                settle_seconds=settle_seconds,
                exited=unreachable,
            )
        return self.reports.status_of(
            name, await self.triton.state(name), manifest, owner.residency
        )

    def _failed(self, e: BaseException, load: _InFlight) -> bool:
        """Step the model's life on its failed load, count it and say why; True when the failure
        is the load's answer (Triton refused it, or it timed out), False when it is raised."""
        request, record = load.plan.request, load.record
        name, owner, waking = request.name, request.owner, request.waking
        where = subject(pod=owner.key, model=owner.model_id)
        if isinstance(e, LoadTimedOutError):
            self.records.step(name, record, Event.LOAD_FAILED, str(e))
            self.metrics.load_failures.labels(e.reason).inc()
            if waking:
                self.metrics.wakes.labels("failed").inc()
            log.warning(
                "Model %s of pod %s was abandoned: %s", owner.model_id, owner.key, e, extra=where
            )
            return True
        if isinstance(e, TritonUnreachableError):
            if isinstance(e, TritonNotConnectedError) and not self.crashes.finished_at(name):
                # The load never reached Triton (down, or starting again after another
                # model's crash): it cannot have crashed it, and must not be blamed.
                self.crashes.answered(name)
            self.records.step(name, record, Event.LOAD_UNANSWERED)
            self.metrics.load_failures.labels("triton_unreachable").inc()
            return False
        if isinstance(e, TritonError):
            self.crashes.answered(name)
            self.records.step(name, record, Event.LOAD_FAILED, str(e))
            self.metrics.load_failures.labels("triton_rejected").inc()
            if waking:
                self.metrics.wakes.labels("failed").inc()
            log.warning(
                "Model %s of pod %s failed to load: %s", owner.model_id, owner.key, e, extra=where
            )
            return True
        if isinstance(e, ResourceExhaustedError):
            self.crashes.answered(name)
            self.records.step(name, record, Event.LOAD_REFUSED)
            if isinstance(e, HostMemoryExhaustedError):
                self.metrics.host_memory_refusals.inc()
            else:
                self.metrics.gpu_memory_refusals.inc()
            if waking:
                self.metrics.wakes.labels("no_room").inc()
            return False
        self.records.step(name, record, Event.LOAD_UNANSWERED)
        return False

    def _loaded(self, load: _InFlight) -> None:
        """Step the model's life on its load answered READY, count it and say so."""
        request, record = load.plan.request, load.record
        self.records.step(request.name, record, Event.LOAD_OK)
        record.vouched_at = self.clock()
        self.metrics.load_seconds.observe(self.clock() - load.started)
        if request.waking:
            self.metrics.wakes.labels("woken").inc()
            self.metrics.wake_seconds.observe(self.clock() - load.started)
        log.info(
            "Model %s of pod %s is loaded in Triton as %s on %s.",
            request.owner.model_id,
            request.owner.key,
            request.name,
            load.plan.where,
        )

    async def _abandon(self, name: str) -> None:
        """Ask Triton to unload a load given up on mid-way. Triton answers once the load has
        ended (it cannot stop one), or the call times out first; either way the GPU's slot is
        the next turn's already."""
        try:
            await self.triton.unload(name)
        except AgentError as e:
            log.warning(
                "Triton has not confirmed the unload of abandoned model %s (%s): it unloads it "
                "once the load it started has ended.",
                name,
                e,
            )

    def _queue_bounded(self, owner: Proven, model_id: str, lowered: list[str]) -> None:
        """Say what the config override lowered (`queue_bounded`): logged, and a Warning Event
        on the pod."""
        most = self.limits.policy.max_queue_microseconds
        message = (
            f"config.pbtxt of model {model_id!r} asks its batchers to keep requests longer than "
            f"this node's bound of {most} microseconds (--max-model-queue-seconds): it is loaded "
            f"with {'; '.join(lowered)} (Triton's unload of a model waits for what its batchers "
            f"keep)"
        )
        log.warning("%s.", message, extra=subject(pod=owner.key, model=model_id))
        self.events.warn(owner.key, owner.uid, QUEUE_BOUNDED_REASON, message)

    def pin(self, gpu_index: int) -> int | None:
        return pin_of(self.limits, gpu_index)
