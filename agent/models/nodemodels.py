"""The models on this node: install, load, sleep and unload, serialized per model.

This is where the repository (files) and Triton (loaded instances) meet, and it only
orchestrates: every operation on one model holds that model's lock, so concurrent requests for the
same model run one after another while different models proceed in parallel; file work runs on
the agent's own small thread pool so the event loop keeps answering. Callers name a model by its
public id; the agent finds its name in Triton from the caller's pod (`agent.pods.owners`).

`Models` composes the parts, each handed the node as model operations see it (`agent.models.node`:
Triton, its repository, the policy, the GPUs and what models are billed): each model's record and
lock (`agent.models.records`); receiving and checking files (`agent.models.install`); each GPU's
turns, admission and billing (`agent.models.gpuadmission`); what placements hold, and idle on-demand
models put to sleep for a load that does not fit (`agent.models.gpuroom`); quarantined files
(`agent.models.loadquarantine`); status (`agent.models.statuses`); loads (`agent.models.loads`).
Which moves a model's life may make is `agent.phases`'; who may call, `agent.api.auth`'s; which
models are wanted, `agent.models.reconcile`'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Protocol, TypeVar

from agent.errors import (
    AgentError,
    ConflictError,
    DigestMismatchError,
)
from agent.gpus.gpuqueue import Work
from agent.installs.filecache import FileCache, NamespaceDisk
from agent.installs.limits import ModelLimits
from agent.installs.modelconfig import (
    pinned_as,
)
from agent.kube.events import PodEvents
from agent.models.evictor import Evictor
from agent.models.gpuadmission import GpuAdmission
from agent.models.gpuroom import Bookings, RoomMaker
from agent.models.install import Installer, InstallResult, not_kept
from agent.models.loadquarantine import Quarantines
from agent.models.loads import LoadGuards, Loads
from agent.models.node import Node
from agent.models.probationhold import ProbationHold
from agent.models.records import ModelRecord, ModelRecords
from agent.models.restoregate import RestoreGate
from agent.models.statuses import ModelReports, ModelStatus
from agent.models.tritonram import OverShare
from agent.phases import (
    Event,
    ModelState,
    Phase,
    Rules,
)
from agent.pods.owners import Owners
from agent.pods.ownership import OwnerRecord, OwnerStore
from agent.pods.provenpods import Proven
from agent.quarantine.crashledger import CrashLedger
from agent.triton import LOADING, READY, UNLOADING
from common.logs import subject
from common.manifest import Manifest

__all__ = [
    "Chunk",
    "InstallResult",
    "ModelLimits",
    "ModelState",
    "Models",
    "Pods",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


Chunk = tuple[str, int, bytes]


class Pods(Protocol):
    """This node's pods as model operations see them (`agent.pods.nodepods.NodePods`)."""

    def all_proven(self) -> list[Proven]:
        """Every live pod of the node with a proven placement."""

    async def owner_alive(self, owner: OwnerRecord) -> bool:
        """Whether the recorded owner of a model is still a live pod on this node with a proven
        placement for the record's model id; raises KubeError when that cannot be told."""


class Models:
    """Owns every model operation on the node."""

    def __init__(
        self,
        node: Node,
        owners: OwnerStore,
        pods: Pods,
        *,
        cache: FileCache,
        namespace_disk: NamespaceDisk,
        crashes: CrashLedger,
        evictor: Evictor,
        hold: ProbationHold,
        events: PodEvents,
    ) -> None:
        """A deployment without one of the node's safeguards passes it switched off, never None:
        `cache` of 0 bytes keeps nothing; an `evictor` without the gateway's activity table puts
        no model to sleep for room (such a load is refused); the node's `host` and `apart`
        without Triton's PID (or, for `host`, a memory limit) admit and measure nothing apart;
        a `hold` of 0 seconds holds nobody."""
        self.node = node
        self.repository = repository = node.repository
        self.triton = triton = node.triton
        self.limits = limits = node.limits
        self.metrics = node.metrics
        self.ledger = ledger = node.ledger
        self.host = node.host
        self._gpus = node.gpus
        self.clock = clock = node.clock
        self.owners = owners
        self.ownership = Owners(owners, pods.owner_alive)
        live = pods.all_proven
        self.cache = cache
        """Files kept after their last pod left (`agent.installs.filecache`)."""
        self.installer = Installer(
            repository, owners, limits, node.metrics, cache, namespace_disk, clock
        )
        self.crashes = crashes
        self.hold = hold
        """Holds probationers' requests at the gateway while a watched load is under way or just
        ended (`agent.models.probationhold`)."""
        self.records = ModelRecords(
            repository, owners, Rules(quarantine_after=crashes.quarantine_after), clock
        )
        """Every model's record and lock (`agent.models.records`)."""
        self.quarantine = Quarantines(crashes, self.ownership, self.records, live)
        """What quarantined files refuse and report (`agent.models.loadquarantine`)."""
        self.reports = ModelReports(
            self.records, self.quarantine, self.ownership, repository, triton, ledger, limits, live
        )
        """The models' status and the node's figures of them (`agent.models.statuses`)."""
        self.restore_gate = RestoreGate(on_gone=crashes.triton_exited)
        """Closed from Triton's exit until what it held is loaded again: a load Triton died under,
        asked for again, waits for it (`Loads`)."""
        self.bookings = Bookings(
            self.ownership, self.records, ledger, live, clock=clock, wall=node.wall
        )
        """What the placements on each GPU hold (`agent.models.gpuroom`)."""
        self.admission = GpuAdmission(node, booked=self.bookings.booked)
        """Every GPU's turns, and what its loads are admitted and billed
        (`agent.models.gpuadmission`)."""
        self.room = RoomMaker(node, evictor, self.bookings, self.admission, self.records, crashes)
        """Puts idle on-demand models to sleep for a load that does not fit
        (`agent.models.gpuroom`)."""
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="agent-files")
        guards = LoadGuards(crashes, self.quarantine, hold, self.restore_gate)
        self.loads = Loads(
            node,
            records=self.records,
            reports=self.reports,
            admission=self.admission,
            room=self.room,
            guards=guards,
            events=events,
            executor=self._executor,
        )
        """Each model's load into Triton and what stands around it (`agent.models.loads`)."""

    async def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    async def _in_thread(
        self, fn: Callable[..., T], *args: object, executor: Executor | None = None
    ) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor or self._executor, fn, *args)

    async def over_share(self) -> list[OverShare]:
        """The models their namespace's share of Triton's host memory no longer holds
        (`HostMemory.over_share`), read on the agent's own threads: never behind the loop's
        default executor, which other work may fill while Triton restarts."""
        return await self._in_thread(self.host.over_share)

    # Names and ownership (the rules are `agent.pods.owners`').
    def triton_name(self, owner: Proven) -> str:
        """The name of `owner`'s model in Triton (`agent.pods.owners.Owners.triton_name`)."""
        return self.ownership.triton_name(owner)

    @staticmethod
    def _name_check(model_id: str, owner: Proven) -> None:
        Owners.check_model_id(model_id, owner)

    async def _claim_locked(self, name: str, owner: Proven) -> OwnerRecord:
        """The owner record for `owner`, claiming its name if it is free or its owner is gone;
        OwnedByAnotherPodError while another live pod owns it. Holds the name's lock."""
        owned = await self.ownership.claimable(name, owner)
        if owned is not None:
            return owned
        if await self._holds_anything(name):
            gone = (
                "its previous owner is gone" if self.owners.get(name) else "no owner vouches for it"
            )
            # Nothing another pod left (or nobody installed) may serve the new owner.
            await self._unload_locked(name, f"its name is claimed by pod {owner.key}; {gone}")
        return self.ownership.claim(name, owner)

    async def _check_owner(self, name: str, owner: Proven) -> bool:
        return await self.ownership.owns(name, owner)

    async def _holds_anything(self, name: str) -> bool:
        if self.repository.model_dir(name).exists():
            return True
        entry = await self.triton.state(name)
        return entry is not None and entry.state in (READY, LOADING, UNLOADING)

    # Install (receiving, checks and disk room are `agent.models.install`'s).
    async def install(
        self, model_id: str, manifest: Manifest, chunks: AsyncIterator[Chunk], owner: Proven
    ) -> InstallResult:
        """Write the streamed files to staging, verify, fsync and rename into the repository.

        A manifest identical to the one installed for the same owner returns at once
        (`unchanged`), reading no chunk: a restarted pod does not resend gigabytes. The files go
        under the owner's name in Triton (`triton_name`).
        """
        self._name_check(model_id, owner)
        self.quarantine.refuse_install(owner.uid, manifest.digest)
        started = self.clock()
        self.installer.admit(model_id, manifest, owner.namespace)
        name = self.triton_name(owner)
        async with self.records.lock(name):
            self.records.touch(name, owner)
            owned = await self._claim_locked(name, owner)
            # Fetched after the claim, which may have removed what a previous owner left.
            record = self.records.touch(name, owner)
            record.pod = owner.key
            if await self._in_thread(self.installer.unchanged, name, manifest, owned):
                return InstallResult(model_id, manifest.digest, True, 0)
            installed = self.repository.installed_manifest(name)
            if installed is not None or self.repository.model_dir(name).exists():
                entry = await self.triton.state(name)
                if entry is not None and entry.state in (READY, LOADING):
                    raise ConflictError(
                        f"model {model_id!r} is loaded with other files (manifest "
                        f"{installed.digest[:12] if installed else 'unknown'}); unload it before "
                        f"installing a different version"
                    )
            room = (name, model_id, manifest, owner.namespace)
            await self._in_thread(self.installer.make_room, *room)
            self.records.step(name, record, Event.INSTALL_STARTED)
            try:
                result = await self.installer.write(name, manifest, chunks, owner, started)
            except BaseException:
                self.records.step(name, record, Event.INSTALL_FAILED)
                raise
            self.owners.put(name, owned.installed(manifest.digest))
            self.records.step(name, record, Event.INSTALL_DONE)
            return result

    async def install_kept(self, model_id: str, manifest: Manifest, owner: Proven) -> InstallResult:
        """Install the owner's model from the files this node kept for its namespace (a previous
        pod's, same manifest digest), through the same checks as a streamed install, each file
        hashed again on its way. NotFoundError when the node keeps no such copy for the namespace,
        whether or not another namespace's copy has that digest; a copy that fails its check is
        dropped and reads as a miss too."""
        namespace = owner.namespace
        if not self.cache.holds(namespace, manifest.digest):
            self.metrics.kept_installs.labels("miss").inc()
            raise not_kept(model_id)
        try:
            result = await self.install(
                model_id, manifest, self.cache.chunks(namespace, manifest), owner
            )
        except DigestMismatchError as e:
            log.warning(
                "The node's copy of model %s for pod %s failed its check (%s): dropping it.",
                model_id,
                owner.key,
                e,
            )
            await self._in_thread(self.cache.drop, namespace, manifest.digest)
            self.metrics.kept_installs.labels("miss").inc()
            raise not_kept(model_id) from e
        self.metrics.kept_installs.labels("hit").inc()
        return result

    def _remove_or_keep(self, name: str) -> None:
        self.installer.remove_or_keep(name)

    # Load.
    async def load(self, model_id: str, owner: Proven, *, settle: bool = True) -> ModelStatus:
        """Load the owner's installed model pinned to its proven GPU (or the CPU); READY, or
        FAILED with Triton's reason. Without `settle` (a reload of what Triton held before it
        restarted), Triton's exits after READY do not count against it
        (`agent.quarantine.crashledger`)."""
        self._name_check(model_id, owner)
        name = self.triton_name(owner)
        async with self.records.lock(name):
            owned = await self._claim_locked(name, owner)
            return await self.loads.load_locked(name, owner, owned, settle=settle)

    # Unload.
    async def unload_for(self, owner: Proven, *, reason: str) -> ModelStatus:
        """Unload the owner's model (by its name in Triton) as `unload` does. A name nobody
        alive owns is reported ABSENT untouched (the reconciler removes what is left); one
        another live pod owns is refused."""
        name = self.triton_name(owner)
        async with self.records.lock(name):
            if not await self._check_owner(name, owner):
                return ModelStatus(owner.model_id, ModelState.ABSENT)
            return await self._unload_locked(name, reason)

    async def sleep_for(self, owner: Proven) -> ModelStatus:
        """Put the owner's on-demand model to sleep: out of Triton (through its GPU's queue),
        its files and owner record kept, so that its next load wakes it. ConflictError for a pod
        whose proof of placement says `always`; a model already asleep is answered as it is."""
        name = self.triton_name(owner)
        if not owner.on_demand:
            raise ConflictError(
                f"model {owner.model_id!r} of pod {owner.key} is placed as residency "
                f"{owner.residency!r}: it stays loaded while its pod lives and is never put to "
                f"sleep; only a pod placed with the annotation tritonshare.io/residency: "
                f"on-demand may be (recreate the pod with it)"
            )
        async with self.records.lock(name):
            if not await self._check_owner(name, owner):
                return ModelStatus(owner.model_id, ModelState.ABSENT, residency=owner.residency)
            record = self.records.touch(name, owner)
            if record.life.phase is not Phase.IDLE_UNLOADED:
                await self._sleep_locked(name, record, "idle, asked by its pod's proxy")
                self.metrics.sleeps.labels("idle").inc()
            return await self.reports.current(name, owner.residency)

    async def _sleep_locked(self, name: str, record: ModelRecord, reason: str) -> None:
        """Unload the model keeping its files, then rest it asleep. Holds the name's lock."""
        if record.life.phase is not Phase.INSTALLED:
            await self._unload_locked(name, reason, keep_files=True)
        self.records.step(name, record, Event.IDLE)

    async def unload(
        self, name: str, *, reason: str, cause: Event = Event.UNLOAD_STARTED
    ) -> ModelStatus:
        """Unload the model named `name` in Triton, wait until UNAVAILABLE, remove its files and
        its owner record: the agent's own decision (`cause`: an orphan, an eviction), never a
        pod's."""
        async with self.records.lock(name):
            return await self._unload_locked(name, reason, cause=cause)

    async def _unload_locked(
        self,
        name: str,
        reason: str,
        *,
        keep_files: bool = False,
        cause: Event = Event.UNLOAD_STARTED,
    ) -> ModelStatus:
        model_id = self.records.public_id(name)
        record = self.records.touch(name)
        self.records.step(name, record, cause)
        started = self.clock()
        work = Work.UNLOAD if cause is Event.UNLOAD_STARTED else Work.EVICT
        try:
            entry = await self.triton.state(name)
            if entry is not None and entry.state in (READY, LOADING, UNLOADING):
                await self.admission.unload_measured(name, work)
            if not keep_files and self.repository.model_dir(name).exists():
                await self._in_thread(self._remove_or_keep, name)
        except BaseException as e:
            self.records.step(name, record, Event.UNLOAD_FAILED)
            if isinstance(e, AgentError):
                self.metrics.unload_failures.labels(e.reason).inc()
            raise
        self.metrics.unload_seconds.observe(self.clock() - started)
        self.ledger.forget(name)
        self.host.forget(name)
        self.crashes.answered(name)  # out of Triton on purpose: no crash to tell
        if keep_files:
            self.records.step(name, record, Event.UNLOADED)
            log.info(
                "Model %s (%s in Triton) is unloaded; its files stay (%s).",
                model_id,
                name,
                reason,
                extra=subject(model=model_id),
            )
            return ModelStatus(model_id, ModelState.INSTALLED, triton_name=name)
        log.info(
            "Model %s (%s in Triton) is unloaded and its files removed (%s).",
            model_id,
            name,
            reason,
            extra=subject(model=model_id),
        )
        self.records.step(name, record, Event.REMOVED)
        self.records.forget(name)
        self.owners.drop(name)
        return ModelStatus(model_id, ModelState.ABSENT)

    async def vouch(self, name: str, owner: Proven) -> str:
        """Why the agent cannot vouch that what Triton runs as `name` is the owner's model as it
        installed it, pinned to the owner's GPU; "" when it can."""
        if name != self.triton_name(owner):
            return "the agent never installed it for this pod"
        problem = await self._in_thread(self.installer.files_problem, name, owner.uid)
        if problem:
            return problem
        try:
            _, index = self.loads.gpu_for(owner.model_id, owner.gpu_uuid)
        except AgentError as e:
            return str(e)
        config = await self.triton.config(name)
        if config is None or not pinned_as(config, self.loads.pin(index)):
            return "Triton runs it with instances that are not pinned to the pod's GPU"
        return ""

    def files_vouched(self, name: str, owner: Proven) -> bool:
        """True when the installed files are those the agent installed for `owner`."""
        return not self.installer.files_problem(name, owner.uid)

    async def evict_unvouched(self, name: str, owner: Proven, why: str) -> None:
        """Take out of Triton what the agent cannot vouch for; keep the owner's files when they
        are the ones it installed (the reconciler then loads them again), else remove them."""
        async with self.records.lock(name):
            keep = self.files_vouched(name, owner)
            await self._unload_locked(
                name, f"Triton ran it unvouched: {why}", keep_files=keep, cause=Event.UNVOUCHED
            )
            if not keep and self.owners.get(name) is None:
                # The owner keeps its name (its loader has finished): it must reinstall.
                self.owners.put(name, OwnerRecord(owner.uid, owner.key, owner.model_id))

    def adopt(self, name: str, owner: Proven) -> None:
        """Take over a model Triton already runs, vouched for, after an agent restart."""
        record = self.records.touch(name, owner)
        self.records.step(name, record, Event.ADOPTED)
        record.vouched_at = self.clock()
        record.pod = owner.key
        record.gpu_uuid = owner.gpu_uuid
        snapshot = self._gpus.snapshot
        gpu = snapshot.by_uuid(owner.gpu_uuid) if snapshot and owner.gpu_uuid else None
        record.gpu_index = gpu.index if gpu else -1
        if gpu is not None:
            self.ledger.adopt(name, gpu.uuid, owner.request)
