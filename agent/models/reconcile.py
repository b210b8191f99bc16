"""Keeping Triton and the repository in line with the pods bound to this node.

A model is wanted when its owner (`agent.pods.ownership`) is a live pod on this node whose placement
is proved (`agent.pods.provenpods`) and whose model has that name in Triton (`Models.triton_name`:
its private name, or a legacy model's public id); pods without a proof want nothing, whatever their
annotations say. Models are keyed here by their names in Triton, never by public ids, which two
pods may share.
On every change of this node's pods (the watch) and every resync period:
- a model no such pod wants (its pod crashed, was force-deleted, never called unload, lost its
  proof, or nobody ever installed it through the agent) is unloaded and its files and owner
  record removed, once it has been idle for the grace period (which covers a loader that
  installs before the watch has shown its pod);
- a wanted model Triton already runs but the agent does not remember (the agent restarted) is
  adopted only if the agent can vouch for it, and checked again every resync period
  (`agent.models.vouching`);
- a wanted model that should run but is not READY (Triton restarted, or lost it) is loaded again,
  once Triton has finished unloading it if it was (an unload under way is no exit of Triton);
  an `on-demand` model asleep is not (its next request wakes it), and one at rest whose pod runs
  is put to sleep (after an agent restart, or a reinstall);
  one whose load failed waits, and is given up after a number of failures
  (`agent.models.loadretries`);
- a loaded model measured above its request plus the tolerance is warned or evicted
  (`agent.models.overrequest`);
- a crash marker left over is counted against its model's files, and models under suspicion load
  last and one at a time (`agent.models.aftercrash`).
A pass first plans (`Reconciler.plan`: one `agent.models.passplan.Action` per model), then
carries the plan out through `agent.models.nodemodels` and the parts above.
It also polls Triton's liveness, so a Triton that comes back triggers a reconciliation at once.
Nothing happens before the first pod list: an empty cache must not read as "nothing is wanted".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agent.errors import AgentError
from agent.kube.events import PodEvents
from agent.metrics import AgentMetrics
from agent.models.aftercrash import AfterCrash
from agent.models.loadretries import LoadRetries
from agent.models.nodemodels import Models
from agent.models.overrequest import OverRequest
from agent.models.passplan import Action, Check
from agent.models.vouching import Vouching
from agent.phases import Event, Phase
from agent.pods.modelpods import PodInfo, init_failure, pod_from_dict
from agent.pods.nodepods import NodePods
from agent.pods.provenpods import Proven
from agent.triton import LOADING, READY, UNLOADING
from common.lifecycle import spawn
from common.logs import subject

log = logging.getLogger(__name__)

HOSTED_MODELS_INVALID = "HostedModelsInvalid"
INIT_CONTAINER_FAILED = "InitContainerFailed"
"""Event reason: a model host whose hosted-models annotation cannot be read serves nothing."""


@dataclass(frozen=True)
class ReconcilePolicy:
    """How the reconciler converges (each from the agent's setting of the same name)."""

    orphan_grace_seconds: float = 30.0
    """Seconds a model no pod wants stays idle before it is removed."""
    resync_seconds: float = 60.0
    """Seconds between passes with no change seen."""
    load_backoff_max_seconds: float = 300.0
    """The longest wait before a failed load is tried again."""
    max_load_attempts: int = 5
    """Failed loads of a model before it is given up."""
    triton_poll_seconds: float = 2.0
    """Seconds between checks of Triton's liveness."""
    enforcement: str = "warn"
    """What a model over its GPU memory request gets: `warn`, or `evict`."""


class Reconciler:
    """Converges models towards this node's pods (`agent.pods.nodepods`, fed by the watch here)."""

    def __init__(
        self,
        models: Models,
        pods: NodePods,
        metrics: AgentMetrics,
        events: PodEvents,
        *,
        policy: ReconcilePolicy = ReconcilePolicy(),
        fail_pod: Callable[[str, str, str, str], Awaitable[None]],
        wake: asyncio.Event,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`wake` is the event others set to ask for a pass now (as `trigger`); `fail_pod` marks
        a controlled pod Failed, so its controller replaces it."""
        self.models = models
        self.pods = pods
        self.metrics = metrics
        self.events = events
        self.orphan_grace_seconds = policy.orphan_grace_seconds
        self.resync_seconds = policy.resync_seconds
        self.triton_poll_seconds = policy.triton_poll_seconds
        self._clock = clock
        self._wake = wake
        self.retries = LoadRetries(
            metrics,
            events,
            resync_seconds=policy.resync_seconds,
            load_backoff_max_seconds=policy.load_backoff_max_seconds,
            max_load_attempts=policy.max_load_attempts,
        )
        self.over_request = OverRequest(models, metrics, events, policy.enforcement, fail_pod)
        self.after_crash = AfterCrash(models, metrics, events, self._wake, fail_pod)
        self.vouching = Vouching(models, metrics, events, self.trigger, clock)
        self.triton_live = False
        self.passes = 0
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
        # Off the loop, before the pass takes its view: an exit noticed meanwhile is this
        # pass's to restore from.
        await self.over_request.measure()
        self.after_crash.begin()
        generation = self.models.restore_gate.generation
        plan = await self.plan()
        self.after_crash.pass_when_settled()
        self.over_request.forget_the_rest()
        if plan:
            await asyncio.gather(*(self._act(action) for action in plan.values()))
            if self.after_crash.deferred:
                # What the suspects waited for is done: the next of them may load now.
                self._wake.set()
        # Triton answered this pass's index: what it held before an exit is loaded again.
        self.models.restore_gate.restored(generation)
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
        for action in self.after_crash.blamed(index, wanted):
            plan[action.name] = action
        stopped: set[str] = set()
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
            if entry is not None and entry.state == UNLOADING:
                continue  # Triton is still unloading it (no exit): loaded again once it is over
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
            if record is not None and now < self.retries.retry_at(record.life):
                if self.retries.given_up(name, pod, record.life):
                    stopped.add(name)
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
        self.retries.only_given_up(stopped)
        self.after_crash.order(plan, suspects)
        for action in self.over_request.actions(wanted):
            # Enforcing the limit comes first.
            plan[action.name] = action
        return plan

    async def _act(self, action: Action) -> None:
        name, owner = action.name, action.owner
        if action.cause is Event.POD_GONE:
            await self._remove_orphan(name)
        elif action.cause is Event.CRASH_SUSPECTED and action.marker is not None:
            await self.after_crash.crashed(action.marker, owner, alone=action.alone)
        elif owner is None:
            raise AssertionError(f"{action} names no owner")
        elif action.cause is Check.ADOPT:
            await self.vouching.adopt(name, owner)
        elif action.cause is Check.RECHECK:
            await self.vouching.recheck(name, owner)
        elif action.cause is Event.IDLE:
            self.models.records.note(name, Event.IDLE)
            self.metrics.sleeps.labels("rested").inc()
        elif action.cause is Event.TRITON_RESTARTED:
            self.models.records.note(name, Event.TRITON_RESTARTED)
            await self._reload(name, owner, settle=not action.restore)
        elif action.cause is Event.OVER_REQUEST and action.excess is not None:
            await self.over_request.enforce(name, owner, action.excess)
        elif action.cause is Event.OVER_REQUEST and action.host is not None:
            await self.over_request.enforce_host(name, owner, action.host)

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
                self.models.restore_gate.gone()
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
