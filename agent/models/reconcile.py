"""Keeping Triton and the repository in line with the pods bound to this node.

A model is wanted when its owner (`agent.pods.ownership`) is a live pod on this node whose placement
is proved (`agent.pods.proofs`) and whose model has that name in Triton (`Models.triton_name`: its
private name, or a legacy model's public id); pods without a proof want nothing, whatever their
annotations say. Models are keyed here by their names in Triton, never by public ids, which two
pods may share.
On every change of this node's pods (the watch) and every resync period:
- a model no such pod wants (its pod crashed, was force-deleted, never called unload, lost its
  proof, or nobody ever installed it through the agent) is unloaded and its files and owner
  record removed, once it has been idle for the grace period (which covers a loader that
  installs before the watch has shown its pod);
- a wanted model Triton already runs but the agent does not remember (the agent restarted) is
  adopted only if the agent can vouch for it (its own install for this owner, files intact,
  pinned to the owner's GPU); otherwise it is taken out of Triton, and loaded again from the
  owner's files when those are intact, with a Warning Event on the pod either way;
- a wanted model that should run but is not READY (Triton restarted, or lost it) is loaded again;
  an `on-demand` model asleep is not (its next request wakes it), and one at rest whose pod runs
  is put to sleep (after an agent restart, or a reinstall);
  one whose load failed waits a resync period, doubling per failure in a row up to a cap, and
  after `max_load_attempts` failures is not loaded again (its pod is told, once);
- a loaded model measured above its request plus the tolerance (`agent.gpus.memory`) gets a Warning
  Event, or with enforcement `evict` is unloaded and its pod marked Failed (GPUMemoryExceeded);
- a crash marker left over (`agent.quarantine.records`: a load Triton died under, or just after) is
  counted against its model's files, unless pods' requests were at Triton then (only
  suspected when they were other pods' and the load had finished); at the node's
  limit the model is quarantined (never loaded again here, its pod told by a Warning Event and,
  when a controller replaces it, marked Failed: ModelCrashedTriton).
  After a crash, models under suspicion are loaded last and one at a time, each after the
  previous one's settling window, so that the others are served again first and an innocent
  model is not loaded beside the guilty one; the others' reloads (models Triton held before it
  restarted) are not watched.
A pass first plans (`Reconciler.plan`: one event of `agent.phases`, or a vouching check,
per model), then carries the plan out through `agent.models.nodemodels`.
It also polls Triton's liveness, so a Triton that comes back triggers a reconciliation at once.
Nothing happens before the first pod list: an empty cache must not read as "nothing is wanted".
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agent.errors import AgentError
from agent.gpus.memory import Excess
from agent.kube.events import PodEvents
from agent.metrics import AgentMetrics
from agent.models.nodemodels import Models
from agent.models.quarantines import (
    CRASHED_REASON,
    NAMESPACE_CRASHED_REASON,
    crash_message,
    namespace_message,
)
from agent.phases import Event, Life, Phase, RetryPolicy
from agent.pods.modelpods import PodInfo, init_failure, pod_from_dict
from agent.pods.nodepods import NodePods
from agent.pods.proofs import Proven
from agent.quarantine.records import Marker
from agent.triton import LOADING, READY
from common.lifecycle import spawn
from common.logs import subject
from common.quantity import format_bytes

log = logging.getLogger(__name__)

HOSTED_MODELS_INVALID = "HostedModelsInvalid"
INIT_CONTAINER_FAILED = "InitContainerFailed"
"""Event reason: a model host whose hosted-models annotation cannot be read serves nothing."""


class Check(enum.Enum):
    """What a pass asks of the agent beyond the lifecycle's events: whether it vouches for what
    Triton runs (raising ADOPTED or UNVOUCHED)."""

    ADOPT = "adopt"
    RECHECK = "recheck"


@dataclass(frozen=True)
class Action:
    """One model's part of a pass: the event (or check) raised for it, its owner and, for an
    eviction, the excess measured."""

    name: str
    cause: Event | Check
    owner: Proven | None = None
    excess: Excess | None = None
    marker: Marker | None = None
    alone: bool = True
    """For a crash: the marker's files were the most recent load there (else only suspected)."""
    restore: bool = False
    """A reload of a model Triton held before it restarted, under no suspicion: no change, so
    its READY is not watched (`agent.quarantine.records`)."""


class Reconciler:
    """Converges models towards this node's pods (`agent.pods.nodepods`, fed by the watch here)."""

    def __init__(
        self,
        models: Models,
        pods: NodePods,
        metrics: AgentMetrics,
        events: PodEvents,
        *,
        enforcement: str = "warn",
        fail_pod: Callable[[str, str, str, str], Awaitable[None]] | None = None,
        orphan_grace_seconds: float = 30.0,
        resync_seconds: float = 60.0,
        load_backoff_max_seconds: float = 300.0,
        max_load_attempts: int = 5,
        triton_poll_seconds: float = 2.0,
        wake: asyncio.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`wake`, when given, is the event others set to ask for a pass now (as `trigger`)."""
        self.models = models
        self.pods = pods
        self.metrics = metrics
        self.events = events
        self.enforcement = enforcement
        self._fail_pod = fail_pod
        self._warned: set[str] = set()
        self.orphan_grace_seconds = orphan_grace_seconds
        self.resync_seconds = resync_seconds
        self.triton_poll_seconds = triton_poll_seconds
        self._clock = clock
        # A refused load is tried again after a resync period, twice as long after each refusal
        # in a row, and not at all after `max_load_attempts`: each try holds its GPU's slot.
        self._retry = RetryPolicy(
            first=resync_seconds,
            factor=2.0,
            cap=load_backoff_max_seconds,
            attempts=max_load_attempts,
        )
        self._given_up: set[str] = set()
        """Names whose pods were told their loads are given up (told once per name)."""
        self.triton_live = False
        self.passes = 0
        self._deferred = False
        """Suspects of a crash were left for a later pass (`plan`)."""
        self._settling = False
        """A load answered READY is in its settling window (`agent.quarantine.records`)."""
        self._settle_pass: asyncio.TimerHandle | None = None
        self._wake = wake or asyncio.Event()
        self.on_pods: Callable[[], None] | None = None
        """Called when the pods may have changed (the gateway's caller table follows them)."""

    # Watch callbacks (run on the event loop).
    def on_list(self, items: list[dict[str, Any]]) -> None:
        self._hosts_refused(self.pods.replace(items))
        self.trigger()

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        self._hosts_refused(self.pods.apply(kind, obj))
        if kind != "DELETED":
            self._init_failed(obj)
        self.trigger()

    def _init_failed(self, obj: dict[str, Any]) -> None:
        """A model pod whose storage initializer or loader failed says why in an Event: the
        kubelet's own (BackOff) names the container, not the reason (a 404, a typo)."""
        pod = pod_from_dict(obj, self.pods.keys)
        failure = init_failure(obj)
        if failure is None or pod.scheduler_name != self.pods.scheduler_name:
            return
        container, why = failure
        message = f"init container {container} failed: {why}"
        self.events.warn(pod.key, pod.uid, INIT_CONTAINER_FAILED, message)

    def _hosts_refused(self, problems: list[tuple[PodInfo, str]]) -> None:
        """Model hosts that stand for no replica say why (an Event, deduplicated)."""
        for host, problem in problems:
            log.warning("%s.", problem, extra=subject(pod=host.key))
            self.events.warn(host.key, host.uid, HOSTED_MODELS_INVALID, problem)

    def trigger(self) -> None:
        self._wake.set()
        if self.on_pods is not None:
            self.on_pods()

    def callers(self) -> dict[str, Proven] | None:
        """The proven owners by their models' names in Triton, once the pods are listed (the
        gateway's caller table, the metrics' model info)."""
        return self.wanted() if self.pods.synced else None

    def wanted(self) -> dict[str, Proven]:
        """Name in Triton -> its owner, for every owner that is a live, proven pod wanting it."""
        # Proven pods only: a replica's uid is its TritonModel's, which a tenant can copy into
        # its own host's annotation; only the replica the binder placed proves it.
        by_uid = {proven.uid: proven for proven in self.pods.all_proven()}
        wanted = {}
        for name, owner in self.models.owners.all().items():
            proven = by_uid.get(owner.uid)
            if (
                proven is not None
                and proven.model_id == owner.model_id
                and self.models.triton_name(proven) == name  # a recorded id is a valid one
            ):
                wanted[name] = proven
        return wanted

    async def reconcile_once(self) -> None:
        """One pass; errors of single models are logged and retried on the next pass."""
        if not self.pods.synced:
            return
        self._deferred = self._settling = False
        plan = await self.plan()
        settle = self.models.crashes.quiet_seconds  # a held namespace's load settles longer
        if self._settling and settle > 0 and self._settle_pass is None:
            # Suspects wait for a settling window: the pass that lets them load comes then.
            self._settle_pass = asyncio.get_running_loop().call_later(settle, self._settled)
        self._warned &= {e.model.model_id for e in self.models.ledger.over()}
        if plan:
            await asyncio.gather(*(self._act(action) for action in plan.values()))
            if self._deferred:
                # What the suspects waited for is done: the next of them may load now.
                self._wake.set()
        self.passes += 1

    async def plan(self) -> dict[str, Action]:
        """What this pass raises, one action per name: two (a recheck and an eviction, say)
        would race for it. Decides only; `_act` carries each out through `Models`."""
        models = self.models
        wanted = self.wanted()
        index = await models.triton.index()
        on_disk = set(models.repository.installed_models())
        running = {name for name, e in index.items() if e.state in (READY, LOADING)}
        owned = set(models.owners.all())
        now = self._clock()
        plan: dict[str, Action] = {}
        for name in sorted((on_disk | running | owned) - set(wanted)):
            if models.records.is_busy(name):
                continue
            if now - models.records.record(name).last_activity < self.orphan_grace_seconds:
                continue
            plan[name] = Action(name, Event.POD_GONE)
        records = models.records.known()
        stopped: set[str] = set()
        markers = models.crashes.markers()
        loads_under_way = False
        died_loading: list[Marker] = []
        died_after: list[Marker] = []
        died_restoring: list[Marker] = []
        for name, marker in markers.items():
            entry = index.get(name)
            if marker.finished_at and entry is not None and entry.state == READY:
                # Settling: a suspect does not load beside it, so the next crash names one.
                if not models.crashes.settled(marker):
                    loads_under_way = True
                    self._settling = True
            elif marker.finished_at and models.records.is_busy(name):
                continue  # an unload or a new load of it: decided when that ends
            elif models.records.is_busy(name) or (entry is not None and entry.state == LOADING):
                loads_under_way = True
            elif entry is not None and entry.state == READY:
                models.crashes.answered(name)  # Triton finished it after the agent stopped
            elif marker.finished_at:
                died_after.append(marker)
            else:
                (died_restoring if marker.restore else died_loading).append(marker)
        # A load in flight when Triton died is the suspect; loads that had finished (settling)
        # only when none was in flight; reloads of what Triton held before, only when neither.
        # Several files there: the most recent load counts, the others are only suspected; each
        # loads again alone.
        # A settling load that shared the exit with other pods' requests is only suspected.
        # A load in flight at the exit whose pod asked for it again at once was decided already
        # (`Models.load`): it was in flight all the same.
        taken = models.crashes.in_flight_taken()
        blamed = [] if taken and not died_loading else died_loading or died_after or died_restoring
        unexplained = []
        shared = []
        for marker in [*died_loading, *died_after, *died_restoring]:
            if marker not in blamed:
                models.crashes.answered(marker.name)
            elif models.crashes.explained(marker):
                continue
            elif models.crashes.at_triton(marker):
                shared.append(marker)
            else:
                unexplained.append(marker)
        latest = max(unexplained, key=lambda m: m.finished_at or m.started_at, default=None)
        for marker in [*unexplained, *shared]:
            owner = wanted.get(marker.name)
            alone = latest is not None and marker.digest == latest.digest
            plan[marker.name] = Action(
                marker.name, Event.CRASH_SUSPECTED, owner, marker=marker, alone=alone
            )
        suspects: list[Action] = []
        for name, pod in sorted(wanted.items()):
            if name in plan:
                continue
            if models.records.is_busy(name):
                continue
            entry = index.get(name)
            record = records.get(name)
            if entry is not None and entry.state == READY:
                if record is None or not record.life.held_loaded:
                    plan[name] = Action(name, Check.ADOPT, pod)
                elif now - record.vouched_at >= self.resync_seconds:
                    plan[name] = Action(name, Check.RECHECK, pod)
                continue
            held = record is not None and record.life.held_loaded
            if pod.on_demand and not held:
                # Wanted but asleep: only its own next request loads it. One at rest (the agent
                # restarted, or its files came back) is put to sleep, so it says so.
                at_rest = record is None or record.life.phase is Phase.INSTALLED
                if name in on_disk and pod.pod.running and at_rest:
                    plan[name] = Action(name, Event.IDLE, pod)
                continue
            should_run = held or pod.pod.running
            if name not in on_disk or not should_run:
                continue
            if record is not None and now < self._retry.retry_at(record.life):
                if self._retry.retry_at(record.life) == float("inf"):
                    stopped.add(name)
                    self._announce_given_up(name, pod, record.life)
                continue
            if models.quarantine.of(name) is not None:
                continue
            owner_record = models.owners.get(name)
            if owner_record is not None and (
                models.crashes.suspected(owner_record.digest) or models.crashes.held(pod.namespace)
            ):
                suspects.append(Action(name, Event.TRITON_RESTARTED, pod))
                continue
            # Only what Triton served is reloaded unwatched: a load that died is no such thing.
            restore = held and record is not None and record.life.served
            plan[name] = Action(name, Event.TRITON_RESTARTED, pod, restore=restore)
        self._given_up &= stopped
        if suspects:
            # Suspects last, and one at a time: nothing else loads beside the one trying.
            # A namespace whose trial share is spent waits its turn; the passes go on meanwhile.
            due = [s for s in suspects if s.owner is None or not self._trial_wait(s.owner)]
            self._settling = self._settling or len(due) < len(suspects)
            if not plan and not loads_under_way and due:
                plan[due[0].name] = due[0]
            self._deferred = len(suspects) > 1 or suspects[0].name not in plan
        for over in self.models.ledger.over():
            name = over.model.model_id
            owner = wanted.get(name)
            if owner is None or models.records.is_busy(name):
                continue
            # Enforcing the limit comes first.
            plan[name] = Action(name, Event.OVER_REQUEST, owner, over)
        return plan

    def _announce_given_up(self, name: str, pod: Proven, life: Life) -> None:
        """Tell the pod, once, that its model's loads are given up (its condition says so too,
        from `ModelReports.status`)."""
        if name in self._given_up:
            return
        self._given_up.add(name)
        self.metrics.reconciles.labels("load_given_up").inc()
        message = (
            f"model {pod.model_id} ({name} in Triton) failed to load {life.failures} times in a "
            f"row (--max-load-attempts {self._retry.attempts}); the tritonshare agent does not "
            f"try again until the model's files are installed again or the pod is recreated. "
            f"The last failure: {life.failure}"
        )
        log.warning("%s.", message, extra=subject(pod=pod.key, model=pod.model_id))
        self.events.warn(pod.key, pod.uid, "ModelLoadGivenUp", message)

    async def _act(self, action: Action) -> None:
        name, owner = action.name, action.owner
        if action.cause is Event.POD_GONE:
            await self._remove_orphan(name)
        elif action.cause is Event.CRASH_SUSPECTED and action.marker is not None:
            await self._crashed(action.marker, owner, alone=action.alone)
        elif owner is None:
            raise AssertionError(f"{action} names no owner")
        elif action.cause is Check.ADOPT:
            await self._adopt(name, owner)
        elif action.cause is Check.RECHECK:
            await self._recheck(name, owner)
        elif action.cause is Event.IDLE:
            self.models.records.note(name, Event.IDLE)
            self.metrics.sleeps.labels("rested").inc()
        elif action.cause is Event.TRITON_RESTARTED:
            self.models.records.note(name, Event.TRITON_RESTARTED)
            await self._reload(name, owner, settle=not action.restore)
        elif action.cause is Event.OVER_REQUEST and action.excess is not None:
            await self._enforce(name, owner, action.excess)

    def _trial_wait(self, pod: Proven) -> float:
        hold = self.models.hold
        return hold.trial_wait(pod.namespace) if hold is not None else 0.0

    def _settled(self) -> None:
        self._settle_pass = None
        self._wake.set()

    async def _crashed(self, marker: Marker, pod: Proven | None, *, alone: bool = True) -> None:
        """A load Triton died under: count it, and quarantine the model at the limit."""
        namespace = marker.pod.partition("/")[0]
        was_held = self.models.crashes.namespace_quarantine(namespace)
        counted = self.models.quarantine.crash_suspected(marker, alone=alone)
        held = self.models.crashes.namespace_quarantine(namespace)
        if held is not None and was_held is None:
            log.error(
                "Quarantined: %s.",
                namespace_message(held),
                extra=subject(pod=marker.pod, model=marker.model_id),
            )
            if pod is not None:
                self.events.warn(
                    pod.key, pod.uid, NAMESPACE_CRASHED_REASON, namespace_message(held)
                )
        self.metrics.crashes_suspected.inc()
        limit = self.models.crashes.quarantine_after
        where = subject(pod=marker.pod, model=marker.model_id)
        if not alone:
            log.warning(
                "Triton exited while model %s of pod %s loaded or settled, beside a model loaded "
                "after it or other pods' requests at Triton: it is not counted, but it is a "
                "suspect and loads again after the other models, alone (%d of %d crashes in a "
                "row so far).",
                marker.model_id,
                marker.pod,
                counted.crashes,
                limit,
                extra=where,
            )
            return
        if not counted.quarantined:
            log.warning(
                "Triton exited while loading model %s of pod %s (%d of %d crashes in a row "
                "before quarantine): it loads again after the other models, alone.",
                marker.model_id,
                marker.pod,
                counted.crashes,
                limit,
                extra=where,
            )
            return
        message = crash_message(counted)
        log.error("Quarantined: %s.", message, extra=where)
        if pod is None:
            return
        self.events.warn(pod.key, pod.uid, CRASHED_REASON, message)
        if pod.pod.controlled and self._fail_pod is not None:
            # Its controller replaces it; the binder may place the replacement elsewhere.
            try:
                await self._fail_pod(pod.namespace, pod.pod.name, CRASHED_REASON, message)
            except AgentError as e:
                log.warning(
                    "Marking pod %s Failed has failed (%s): its condition still says why.",
                    pod.key,
                    e,
                    extra=where,
                )

    async def _remove_orphan(self, name: str) -> None:
        log.info(
            "Model %s is wanted by no pod on this node: unloading and removing it.",
            name,
            extra=subject(model=name),
        )
        try:
            await self.models.unload(
                name, reason="no pod on this node wants it", cause=Event.POD_GONE
            )
        except AgentError as e:
            log.warning(
                "Removing orphan model %s failed (%s): retrying later.",
                name,
                e,
                extra=subject(model=name),
            )
            return
        self.metrics.reconciles.labels("orphan_removed").inc()

    async def _adopt(self, name: str, pod: Proven) -> None:
        why = await self.models.vouch(name, pod)
        if not why:
            self.models.adopt(name, pod)
            self.metrics.reconciles.labels("adopted").inc()
            log.info(
                "Model %s is already loaded in Triton for pod %s: adopting it.",
                name,
                pod.key,
                extra=subject(pod=pod.key, model=pod.model_id),
            )
            return
        await self._evict(name, pod, why)

    async def _enforce(self, name: str, pod: Proven, over: Excess) -> None:
        message = (
            f"model {pod.model_id} ({name} in Triton) uses {format_bytes(over.model.bytes)} of "
            f"GPU memory on {pod.gpu_uuid}, more than the {format_bytes(pod.request)} its pod "
            f"requested (tritonshare.io/gpu-mem) plus the tolerance"
        )
        # Never evict on a figure another tenant could have inflated: only a warning then.
        doubt = over.doubt() if not over.sure(self.models.ledger.allowed(pod.request)) else ""
        if self.enforcement != "evict" or self._fail_pod is None or doubt:
            if doubt:
                message += f" ({doubt}; it is not evicted for them)"
            if name not in self._warned:
                self._warned.add(name)
                self.metrics.gpu_memory_over.labels("warned").inc()
                log.warning(
                    "%s: raise the pod's request, or the agent may evict it.",
                    message,
                    extra=subject(pod=pod.key, model=pod.model_id),
                )
            self.events.warn(
                pod.key, pod.uid, "GPUMemoryOverRequest", f"{message}; raise the request"
            )
            return
        log.warning(
            "%s: evicting it (--gpu-mem-enforcement=evict).",
            message,
            extra=subject(pod=pod.key, model=pod.model_id),
        )
        try:
            await self.models.unload(
                name,
                reason="it used more GPU memory than it requested",
                cause=Event.OVER_REQUEST,
            )
            await self._fail_pod(
                pod.namespace,
                pod.pod.name,
                "GPUMemoryExceeded",
                f"{message}; the tritonshare agent unloaded it. Raise the request and recreate it",
            )
        except AgentError as e:
            log.warning(
                "Evicting model %s failed (%s): retrying.",
                name,
                e,
                extra=subject(pod=pod.key, model=pod.model_id),
            )
            return
        self.metrics.gpu_memory_over.labels("evicted").inc()
        self.events.warn(pod.key, pod.uid, "GPUMemoryExceeded", f"{message}; evicted")

    async def _recheck(self, name: str, pod: Proven) -> None:
        """Once per resync period: is what Triton runs still what the agent installed?"""
        why = await self.models.vouch(name, pod)
        if not why:
            self.models.records.record(name).vouched_at = self._clock()
            self.models.records.note(name, Event.ADOPTED)
            return
        await self._evict(name, pod, why)

    async def _evict(self, name: str, pod: Proven, why: str) -> None:
        log.warning(
            "Triton runs model %s for pod %s, but the agent cannot vouch for it (%s): taking it "
            "out of Triton.",
            name,
            pod.key,
            why,
            extra=subject(pod=pod.key, model=pod.model_id),
        )
        try:
            await self.models.evict_unvouched(name, pod, why)
        except AgentError as e:
            log.warning(
                "Taking unvouched model %s out of Triton failed (%s): retrying.",
                name,
                e,
                extra=subject(pod=pod.key, model=pod.model_id),
            )
            return
        self.metrics.reconciles.labels("unvouched_removed").inc()
        files = self.models.repository.installed_manifest(name) is not None
        self.events.warn(
            pod.key,
            pod.uid,
            "ModelNotVouched",
            f"Triton ran model {pod.model_id} ({name}) in a way the tritonshare agent cannot "
            f"vouch for ({why}); "
            + (
                "it is loaded again from the files installed for this pod"
                if files
                else "its files are gone: delete the pod so its loader installs it again"
            ),
        )
        self.trigger()

    async def _reload(self, name: str, pod: Proven, *, settle: bool) -> None:
        log.warning(
            "Model %s of pod %s is not loaded in Triton (Triton restarted or lost it): "
            "loading it again.",
            name,
            pod.key,
            extra=subject(pod=pod.key, model=pod.model_id),
        )
        try:
            status = await self.models.load(pod.model_id, pod, settle=settle)
        except AgentError as e:
            log.warning(
                "Reloading model %s failed (%s): retrying later.",
                name,
                e,
                extra=subject(pod=pod.key, model=pod.model_id),
            )
            return
        self.metrics.reconciles.labels("reloaded").inc()
        log.info(
            "Model %s is %s again.",
            name,
            status.state.name,
            extra=subject(pod=pod.key, model=pod.model_id),
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Reconcile on every trigger and every resync period, until `stop`."""
        while not stop.is_set():
            await _first_of(self._wake, stop, limit=self.resync_seconds)
            self._wake.clear()
            if stop.is_set():
                return
            try:
                await self.reconcile_once()
            except AgentError as e:
                log.warning("Reconciling models failed (%s): retrying on the next change.", e)

    async def watch_triton(self, stop: asyncio.Event) -> None:
        """Poll Triton's liveness; when it comes back after being down, reconcile at once."""
        was_live: bool | None = None
        while not stop.is_set():
            live = await self.models.triton.live()
            self.triton_live = live
            if live and was_live is False:
                log.warning("Triton is live again: checking which models must be loaded again.")
                self.trigger()
            elif not live and was_live is not False:
                log.warning(
                    "Triton at %s does not answer: models cannot load until it is back.",
                    self.models.triton.base,
                )
            was_live = live
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.triton_poll_seconds)


async def _first_of(*events: asyncio.Event, limit: float) -> None:
    """Return when any of `events` is set, or after `limit` seconds."""
    waiters = [spawn("Waiting for a reason to reconcile", event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
