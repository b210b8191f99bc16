"""A model's load into Triton, and what stands around it on the node.

A load is checked against the node's policy and pinned to its pod's GPU (or the CPU); a load Triton
died under before is counted first (and, asked for again at once, waits until the models Triton
held are loaded again: `agent.models.restoregate`), and quarantined files are refused
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
from agent.installs.limits import ModelLimits
from agent.installs.modelconfig import (
    arena_released,
    backend_of,
    check_declared_backend,
    override_json,
    parse_config,
    pinned_config,
    queue_bounded,
)
from agent.installs.repository import Repository
from agent.kube.events import PodEvents
from agent.metrics import AgentMetrics
from agent.models.gpuadmission import GpuAdmission, Gpus
from agent.models.gpuroom import RoomMaker
from agent.models.heldloads import HeldLoads
from agent.models.loadquarantine import Quarantines
from agent.models.probationhold import ProbationHold
from agent.models.records import ModelRecords
from agent.models.restoregate import RestoreGate
from agent.models.statuses import ModelReports, ModelStatus
from agent.models.tritonram import Admitted, HostMemory
from agent.phases import Event, Phase, given_up
from agent.pods.ownership import OwnerRecord
from agent.pods.provenpods import Proven
from agent.quarantine.crashledger import CrashLedger, Marker
from agent.triton import KNOWN_TO_THIS_PROCESS, READY, TritonClient
from common.backends import runs_in_own_process
from common.logs import subject

__all__ = ["Loads"]

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


class Loads:
    """Loads the node's models into Triton, one model's load at a time under its lock."""

    def __init__(
        self,
        repository: Repository,
        triton: TritonClient,
        limits: ModelLimits,
        metrics: AgentMetrics,
        gpus: Gpus,
        *,
        records: ModelRecords,
        crashes: CrashLedger,
        quarantine: Quarantines,
        reports: ModelReports,
        admission: GpuAdmission,
        room: RoomMaker,
        host: HostMemory,
        hold: ProbationHold,
        restore_gate: RestoreGate,
        events: PodEvents,
        executor: Executor,
        clock: Callable[[], float],
        wall: Callable[[], float],
    ) -> None:
        self.repository = repository
        self.triton = triton
        self.limits = limits
        self.metrics = metrics
        self._gpus = gpus
        self.records = records
        self.crashes = crashes
        self.quarantine = quarantine
        self.reports = reports
        self.admission = admission
        self.events = events
        """Tells a pod what its load's config override lowered."""
        self.room = room
        """Puts idle on-demand models to sleep for a load that does not fit (with no activity
        table, none: the load is refused)."""
        self.host = host
        """Admits loads on Triton's host memory (`agent.models.tritonram`; with no limit or no
        Triton PID known, every load goes unmeasured)."""
        self.hold = hold
        """Holds probationers' requests at the gateway while a watched load (one whose READY is
        watched, `agent.quarantine.crashledger`) is under way or just ended (0 seconds: never
        held)."""
        self._unheld = ProbationHold(0)
        """What a reload of what Triton held goes through: it is no change, and holds nobody."""
        self.restore_gate = restore_gate
        """Closed after Triton's exit until what it held is loaded again."""
        self.held_loads = HeldLoads()
        self._executor = executor
        self.clock = clock
        self._wall = wall

    async def _in_thread(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def gpu_for(self, model_id: str, gpu_uuid: str) -> tuple[str, int]:
        return gpu_for(self._gpus.snapshot, model_id, gpu_uuid, self.limits.cpu_only)

    async def load_locked(
        self, name: str, owner: Proven, owned: OwnerRecord, *, settle: bool = True
    ) -> ModelStatus:
        model_id = owner.model_id
        record = self.records.touch(name, owner)
        record.pod = owner.key
        manifest = self.repository.installed_manifest(name)
        if manifest is None or manifest.digest != owned.digest:
            raise NotFoundError(
                f"model {model_id!r} is not installed on this node for pod {owner.key}; install "
                f"it (InstallModel) before loading"
            )
        uuid, index = self.gpu_for(model_id, owner.gpu_uuid)
        directory = self.repository.model_dir(name)
        config = parse_config((directory / "config.pbtxt").read_text(errors="replace"), model_id)
        # What Triton will find, not what was installed: the model's own code may have made
        # directories beside its files since.
        versions = self.limits.policy.versions(model_id, _subdirectories(directory))
        self.limits.policy.check_config(config, model_id, owner.namespace, versions)
        check_declared_backend(config, model_id, owner.pod.backend)
        sizes = {e.path: e.size for e in manifest.files}
        self.limits.policy.check_load_data_files(config, model_id, sizes)
        pin = self.pin(index)
        # Billed its own processes' memory: its load needs no window of the GPU's.
        apart = self.admission.apart is not None and runs_in_own_process(
            backend_of(config), config.runtime
        )
        # Triton requires the config's name to be the directory's: the name in Triton.
        # ONNX Runtime keeps no arena in Triton's process: what a request takes, it gives back.
        # Its batchers keep a request no longer than the node's bound: an unload waits for them.
        bounded, lowered = queue_bounded(
            arena_released(pinned_config(config, name, pin)),
            self.limits.policy.max_queue_microseconds,
        )
        override = override_json(bounded)
        if lowered:
            self._queue_bounded(owner, model_id, lowered)
        entry = await self.triton.state(name)
        if (
            entry is not None
            and entry.state == READY
            and record.life.held_loaded
            and (record.gpu_uuid, record.gpu_index) == (uuid, index)
        ):
            return self.reports.status_of(name, entry, manifest, owner.residency)
        left = self.crashes.markers().get(name)
        died_under = (
            left is not None
            and not left.finished_at
            # A model this Triton holds, unloads or refused was sent to it: no exit since.
            and (entry is None or entry.state not in KNOWN_TO_THIS_PROCESS)
        )
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
        if died_under:
            # Asked for again at once: the models Triton held come back first
            # (`agent.models.restoregate`), then it may take Triton down again if it must.
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
        if given_up(record.life, self.limits.max_load_attempts):
            # Each try holds the GPU's slot: a model that never loads must not hold it forever.
            return self.reports.status_of(name, entry, manifest, owner.residency)
        admitted: Admitted | None = None
        held = self.crashes.held(owner.namespace)
        hold = self.hold if settle else self._unheld
        # A suspect's load is its trial: probationers are kept from Triton until it settles.
        trial = hold.hold_seconds > 0 and (held or self.crashes.suspected(owned.digest))
        if trial:
            await hold.trial_turn(owner.namespace)  # at most half of probationers' time
        try:
            # A held namespace's load goes alone, then keeps the node quiet
            # (`agent.models.heldloads`).
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
        loaded = False
        settle_seconds = 0.0
        unreachable = False
        try:
            # Before the marker: a load cancelled meanwhile never reached Triton.
            # Files counted for an exit alone hold every pod through their trial.
            suspect = owned.digest if trial and self.crashes.suspected(owned.digest) else ""
            await hold.begin(owner.pod.object_key, trial=trial, suspect=suspect)
            waking = record.life.phase is Phase.IDLE_UNLOADED
            self.records.step(name, record, Event.REQUEST_ARRIVED if waking else Event.LOAD_STARTED)
            record.gpu_uuid, record.gpu_index = uuid, index
            started = self.clock()
            # Durable before Triton sees the load: if Triton dies under it, the marker says whose.
            marker = Marker(
                name,
                owned.digest,
                model_id,
                owner.key,
                started_at=self._wall(),
                restore=not settle,
                trial=trial,
                triton=self.crashes.triton,
            )
            await self._in_thread(self.crashes.loading, marker)
        except BaseException:
            self.held_loads.end(held, 0.0)
            hold.end(owner.pod.object_key, trial=trial)
            raise
        try:
            admitted = await self._in_thread(
                self.host.admit,
                name,
                manifest.digest,
                manifest.total_bytes,
                model_id,
                owner.key,
            )
            await self.admission.load_measured(
                name,
                override,
                owner,
                uuid,
                index,
                manifest.total_bytes,
                waking=waking,
                apart=apart,
                # READY: an exit from now on finds it settling, even while it is measured.
                on_ready=lambda: self.crashes.finished(marker, settle=settle),
                make_room=self.room.make_room,
            )
        except LoadTimedOutError as e:
            self.records.step(name, record, Event.LOAD_FAILED, str(e))
            self.metrics.load_failures.labels(e.reason).inc()
            if waking:
                self.metrics.wakes.labels("failed").inc()
            log.warning(
                "Model %s of pod %s was abandoned: %s",
                model_id,
                owner.key,
                e,
                extra=subject(pod=owner.key, model=model_id),
            )
            await self._abandon(name)
            # Triton may still be loading it: the answer is the agent's, the load is over.
            return self.reports.status_of(name, None, manifest, owner.residency)
        except TritonUnreachableError as e:
            unreachable = True
            if isinstance(e, TritonNotConnectedError) and not self.crashes.finished_at(name):
                # The load never reached Triton (down, or starting again after another
                # model's crash): it cannot have crashed it, and must not be blamed.
                self.crashes.answered(name)
            self.records.step(name, record, Event.LOAD_UNANSWERED)
            self.metrics.load_failures.labels("triton_unreachable").inc()
            raise
        except TritonError as e:
            self.crashes.answered(name)
            self.records.step(name, record, Event.LOAD_FAILED, str(e))
            self.metrics.load_failures.labels("triton_rejected").inc()
            if waking:
                self.metrics.wakes.labels("failed").inc()
            log.warning(
                "Model %s of pod %s failed to load: %s",
                model_id,
                owner.key,
                e,
                extra=subject(pod=owner.key, model=model_id),
            )
        except ResourceExhaustedError as e:
            self.crashes.answered(name)
            self.records.step(name, record, Event.LOAD_REFUSED)
            if isinstance(e, HostMemoryExhaustedError):
                self.metrics.host_memory_refusals.inc()
            else:
                self.metrics.gpu_memory_refusals.inc()
            if waking:
                self.metrics.wakes.labels("no_room").inc()
            raise
        except BaseException:
            self.records.step(name, record, Event.LOAD_UNANSWERED)
            raise
        else:
            loaded = True
            settle_seconds = self.crashes.settle_of(marker)
            self.crashes.finished(marker, settle=settle)
            await self._in_thread(self.host.finished, admitted, True)
            admitted = None
            self.records.step(name, record, Event.LOAD_OK)
            record.vouched_at = self.clock()
            self.metrics.load_seconds.observe(self.clock() - started)
            if waking:
                self.metrics.wakes.labels("woken").inc()
                self.metrics.wake_seconds.observe(self.clock() - started)
            log.info(
                "Model %s of pod %s is loaded in Triton as %s on %s.",
                model_id,
                owner.key,
                name,
                f"GPU {index} ({uuid})" if pin is not None else "the CPU",
            )
        finally:
            if admitted is not None:
                self.host.finished(admitted, False)  # refused or failed: nothing to measure
            self.held_loads.end(held, self.crashes.quiet_seconds if loaded else 0.0)
            hold.end(
                owner.pod.object_key,
                trial=trial,
                settle_seconds=settle_seconds,
                exited=unreachable,
            )
        return self.reports.status_of(
            name, await self.triton.state(name), manifest, owner.residency
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
        return None if self.limits.cpu_only or gpu_index < 0 else gpu_index
