"""A pending pod's turn: place it, bind it or say why not.

While this replica leads, the binder's loop (`binder.reconciler`) hands each pod taken from its
queue to `schedule_one`, which decides on the cache's state (no API reads), charge the pod to the
chosen GPU at once (assume), then, off the loop, post the Binding, which carries the pod's GPU
annotation and proof. A 404 or 409 (deleted, or bound by someone else) drops the assumption; other
failures drop it and retry the pod with backoff. A pod that fits nowhere gets a FailedScheduling
Event and PodScheduled=False (only when the message changes, so a pod waiting for hours does not
flood the API) and waits out its backoff, or less if the cluster changes in a way that helps. A pod
whose preemption made room holds it (the nomination annotation says where, signed) from equal and
lower priorities until it is placed, across a change of leader too (binder.pods.preemptions); one
kept out only by split free memory may have smaller pods moved for it (binder.pods.roommaking).
The cache's unproven pods are reported here too (binder.pods.unprovenreports).

Owns the decisions and the API writes they cause, run through one handover of at most
`bind_workers` writers, the Scheduled Events through one of their own (EVENT_WRITERS); reads the
cluster only through the cache.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from contextlib import nullcontext
from dataclasses import replace
from functools import partial
from typing import Any

from binder.api.handover import Handover, Outcome
from binder.api.inbox import Inbox
from binder.api.kube import Kube
from binder.cluster.chargedpods import Unproven, sign
from binder.cluster.ledger import Ledger
from binder.cluster.objects import PodInfo
from binder.framework.placement import Placement, Policy, Unschedulable, place
from binder.framework.preemption import lower_holds
from binder.framework.queue import SchedulingQueue
from binder.framework.quota import check_for
from binder.metrics import Metrics
from binder.pods.preemptions import Preemptions
from binder.pods.roommaking import RoomMaking
from binder.pods.scheduledevents import ScheduledEvents
from binder.pods.unprovenreports import UnprovenReports
from common.contract import Keys
from common.kubeapi.errors import ApiError, ConflictError, NotFoundError
from common.logs import subject
from common.proofs import KeyRing
from common.quantity import format_bytes

log = logging.getLogger(__name__)

DECIDED_AHEAD = 2
"""Pods decided per bind worker whose writes may wait for a worker, so a worker that finishes
takes the next at once. Writes in flight stay at most `bind_workers`."""
EVENT_WRITERS = 1
"""Threads writing the Scheduled Events, apart from the bind workers: an Event write never holds
a binding up (one the API server is slow to take would hold a bind worker for its retries)."""

REPORT_INTERVAL_SECONDS = 10.0
"""Shortest time between two FailedScheduling writes for one pod whose reason changed."""


class PodController:
    """Decides and binds; the cache's listener."""

    def __init__(
        self,
        kube: Kube,
        ledger: Ledger,
        *,
        leading: asyncio.Event,
        keys: Keys,
        policy: Policy,
        queue: SchedulingQueue,
        metrics: Metrics,
        executor: Executor,
        bind_workers: int,
        identity: str,
        placement_keys: Callable[[], KeyRing],
        clock: Callable[[], float] = time.time,
        report_interval: float = REPORT_INTERVAL_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
        consolidate_moves: int = 0,
        preemption: bool = True,
        scheduled_events_per_second: float = 0.0,
        inbox: Inbox,
        preempt_replica: Callable[[PodInfo, str, str], None],
    ) -> None:
        """`ledger` is the cache's (read here, changed there); `leading` is set while this
        replica leads (only the leader schedules and writes); `inbox` is where the writers hand
        outcomes back: the one the informers use, so the bind's answer and the watch event it
        causes share a wake-up of the loop;
        `preempt_replica(victim, by, node)` drains a TritonModel replica a pod preempts (the
        model controller's). `queue` is the binder's one
        queue, shared with the TritonModels: a cluster change retries both.
        `scheduled_events_per_second`: the most Scheduled Events a second
        (`binder.pods.scheduledevents`; 0: none)."""
        self._kube = kube
        self._keys = keys
        self._policy = policy
        self.queue = queue
        self._metrics = metrics
        self._slots = asyncio.Semaphore(bind_workers * DECIDED_AHEAD)
        self._identity = identity
        self._placement_keys = placement_keys
        self._clock = clock
        # The ledger's parts under short names: read on every decision, and never replaced.
        self.state = ledger.state
        self.pending = ledger.pending
        self._ledger = ledger
        self._in_flight: set[str] = set()
        self._reported: dict[str, tuple[str, float]] = {}
        """Per pod: the last message written and when (monotonic seconds)."""
        self._report_interval = report_interval
        self._monotonic = monotonic
        self.bound = 0
        self._writes = Handover(executor, bind_workers, inbox=inbox)
        """The API writes decided here, run on at most `bind_workers` threads."""
        self._calls: dict[str, Any] = {}
        self._scheduled = metrics.attempts.labels("scheduled")
        self._preemptions = Preemptions(
            kube,
            ledger,
            leading=leading,
            keys=keys,
            policy=policy,
            queue=queue,
            writes=self._writes,
            count=self._count,
            identity=identity,
            placement_keys=placement_keys,
            clock=clock,
            enabled=preemption,
            preempt_replica=preempt_replica,
        )
        self._room = RoomMaking(
            kube,
            ledger.state,
            leading=leading,
            writes=self._writes,
            count=self._count,
            identity=identity,
            clock=clock,
            monotonic=monotonic,
            max_moves=consolidate_moves,
        )
        self._event_writes = Handover(executor, EVENT_WRITERS, inbox=inbox)
        """The Scheduled Events' writes, on threads of their own."""
        self._scheduled_events = ScheduledEvents(
            kube,
            self._event_writes,
            per_second=scheduled_events_per_second,
            identity=identity,
            count=self._count,
            skipped=metrics.scheduled_events_skipped.inc,
            monotonic=monotonic,
        )
        self._unproven = UnprovenReports(
            kube,
            ledger.unproven,
            leading=leading,
            writes=self._writes,
            count=self._count,
            identity=identity,
        )

    # ---- listener of the cache -------------------------------------------------------------------

    def pending_changed(self, pod: PodInfo, relevant: bool) -> None:
        self._metrics.pending.set(len(self.pending))
        if pod.uid in self._in_flight:
            return
        if relevant or pod.uid not in self.queue:
            self.queue.add(pod.uid, pod.namespace)

    def pending_gone(self, uid: str) -> None:
        self._preemptions.release(uid)
        self.queue.remove(uid)
        self._reported.pop(uid, None)
        self._metrics.pending.set(len(self.pending))

    def cluster_changed(self, why: str) -> None:
        moved = self.queue.move_all_to_active()
        if moved:
            log.debug("%s: retrying %d unschedulable pods now.", why, moved)

    def restore_nominations(self) -> None:
        """On taking the lead, before anything is placed: the rooms pending pods' preemptions
        made are held again (`Preemptions.restore`)."""
        self._preemptions.restore()

    def unproven_seen(self, verdict: Unproven) -> None:
        """Report an unproven pod with a Warning Event, once per pod and reason
        (`UnprovenReports.seen`)."""
        self._unproven.seen(verdict)

    # ---- the loop --------------------------------------------------------------------------------

    async def slot(self) -> None:
        """Waits for a bind slot, which `schedule_one` takes and releases once its API writes
        are done: at most `bind_workers` x DECIDED_AHEAD pods decided ahead of their writes."""
        await self._slots.acquire()

    def release_slot(self) -> None:
        """Gives back a slot `slot` took for a pod not decided after all."""
        self._slots.release()

    def schedule_one(self, uid: str) -> None:
        """Decide for one pod. Holds a bind slot, released when its API writes are done."""
        state = self.state
        pod = self.pending.get(uid)
        state.release_nomination(uid)  # the pod's own held room is its to take
        if pod is None or state.is_accounted(uid) or uid in self._in_flight:
            self._slots.release()
            return
        preemptions = self._preemptions
        nominated = preemptions.held(uid)
        if nominated is not None and pod.nominated_node != nominated[0]:
            pod = replace(pod, nominated_node=nominated[0])
        # The namespace's pods and replicas together within its quotas: no room helps.
        exceeded = self._exceeded_quota(pod)
        # As kube-scheduler counts nominated pods only against lower-or-equal priorities, the
        # rooms held for lower-priority pods are free to this one (and theirs are no victims).
        lower = [] if exceeded else lower_holds(state, pod)
        with state.without(lower) if lower else nullcontext():
            placed = (
                Unschedulable(exceeded, {})
                if exceeded
                else place(state, pod, now=self._clock(), policy=self._policy)
            )
            if isinstance(placed, Placement):
                preemptions.forget(uid)
                proof = self._sign(pod, placed)
                state.assume(pod, placed.node, placed.gpu.uuid, proof)
                self._bind(pod, placed, proof)
            else:
                result = placed if exceeded else preemptions.preempt(pod, placed)
        landed = placed.node if isinstance(placed, Placement) else None
        held = preemptions.held(uid)
        if landed is None and held is not None and held != nominated:
            landed = held[0]  # its own preemption made room there just now
        if landed is not None:
            preemptions.displace(lower, landed)
        if isinstance(placed, Placement):
            return
        self._metrics.attempts.labels(result.attempt_result).inc()
        delay = self.queue.backoff(uid)
        log.info(
            "Pod %s (%s of GPU memory) %s: %s Retrying in %.0f s or on a helpful cluster change.",
            pod.key,
            format_bytes(pod.request),
            "is unschedulable"
            if result.condition_reason == "Unschedulable"
            else "could not be scheduled (scheduler error)",
            result.message,
            delay,
            extra=subject(pod=pod.key, model=pod.model_id),
        )
        if self._room.max_moves and result.condition_reason == "Unschedulable" and not exceeded:
            self._room.make(pod)
        if self._should_report(uid, result.message):
            # Reported before and not failed since: PodScheduled is False already.
            was = "False" if uid in self._reported else None
            self._reported[uid] = (result.message, self._monotonic())
            self._report(pod, result.message, result.condition_reason, was)
        else:
            self._slots.release()

    def _exceeded_quota(self, pod: PodInfo) -> str:
        """Why placing the pod would take its namespace's pods and replicas past a quota on GPU
        memory, in the API server's words ("" when it would not: `binder.framework.quota`)."""
        if pod.request <= 0 or pod.namespace not in self._ledger.quotas:
            return ""
        check = check_for(
            self._ledger, self._keys, pod.namespace, pod.priority_class, pod=pod.asked
        )
        return check.refusal(pod.request, pod.allowance) if check is not None else ""

    def _should_report(self, uid: str, message: str) -> bool:
        """Write a pod's first reason at once; a changed reason at most once per interval (the
        largest free block moves with every bind elsewhere); an unchanged one never again."""
        last = self._reported.get(uid)
        if last is None:
            return True
        return last[0] != message and self._monotonic() - last[1] >= self._report_interval

    # ---- API writes: on worker threads (binder.api.handover), outcomes back on the loop
    # -------------

    def _hand_over(self, work: Callable[[], None], outcome: Outcome) -> None:
        """Run `work` (API writes) on a worker thread, then `outcome(its error or None)` here."""
        self._writes.submit(work, outcome)

    def _count(self, call: str) -> None:
        """Count one API write (from any thread); the labelled child is looked up once."""
        child = self._calls.get(call)
        if child is None:
            child = self._calls.setdefault(call, self._metrics.api_calls.labels(call))
        child.inc()

    def _sign(self, pod: PodInfo, placement: Placement) -> str:
        """The proof of this placement, signed with the current key."""
        return sign(self._placement_keys(), pod, placement.node, placement.gpu.uuid)

    def _bind(self, pod: PodInfo, placement: Placement, proof: str = "") -> None:
        """Post the pod's Binding, off the loop, carrying its GPU annotation and proof (the API
        server sets them on the pod as it binds it: one write per pod, and a pod is never on a
        node without them). The caller holds a bind slot, released with the outcome."""
        annotations = {
            self._keys.gpu: placement.gpu.uuid,
            self._keys.placement: proof or self._sign(pod, placement),
        }

        def write() -> None:
            self._kube.bind(pod.namespace, pod.name, pod.uid, placement.node, annotations)
            self._count("bind")

        self._in_flight.add(pod.uid)
        try:
            self._hand_over(write, partial(self._bound, pod, placement))
        except BaseException:
            self._in_flight.discard(pod.uid)
            raise

    def _bound(self, pod: PodInfo, placement: Placement, error: Exception | None) -> None:
        """The outcome of a pod's writes, on the loop."""
        state = self.state
        try:
            if error is None:
                self._bound_well(pod, placement)
            elif isinstance(error, NotFoundError | ConflictError):
                state.forget_assumed(pod.uid)
                self.queue.remove(pod.uid)
                self._metrics.attempts.labels("error").inc()
                log.info(
                    "Pod %s was not bound to %s (%s): it was deleted or bound elsewhere; "
                    "dropping it.",
                    pod.key,
                    placement.node,
                    error.reason or error.status,
                    extra=subject(pod=pod.key, node=placement.node),
                )
            elif isinstance(error, ApiError | OSError):
                state.forget_assumed(pod.uid)
                self._metrics.attempts.labels("error").inc()
                delay = self.queue.backoff(pod.uid)
                log.warning(
                    "Binding pod %s to %s has failed (%s): released its GPU memory, retrying in "
                    "%.0f s.",
                    pod.key,
                    placement.node,
                    error,
                    delay,
                    extra=subject(pod=pod.key, node=placement.node),
                )
            else:
                log.error(
                    "Binding pod %s has failed: its work is abandoned.",
                    pod.key,
                    exc_info=error,
                    extra=subject(pod=pod.key),
                )
        finally:
            self._in_flight.discard(pod.uid)
            self._slots.release()

    def _bound_well(self, pod: PodInfo, placement: Placement) -> None:
        self.bound += 1
        self._preemptions.forget(pod.uid)
        self._scheduled.inc()
        if pod.created:
            self._metrics.latency.observe(max(0.0, self._clock() - pod.created))
        self.queue.remove(pod.uid)
        self._reported.pop(pod.uid, None)
        self._scheduled_events.bound(pod, placement.node, placement.gpu.index, placement.gpu.uuid)
        # DEBUG, as kube-scheduler keeps "Successfully bound pod to node" below its default
        # verbosity: a line per pod cost about 10 us of formatting and a write to stderr.
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "Bound pod %s (model %s, %s) to node %s, GPU %d (%s).",
                pod.key,
                pod.model_id,
                format_bytes(pod.request),
                placement.node,
                placement.gpu.index,
                placement.gpu.uuid,
                extra=subject(pod=pod.key, node=placement.node, model=pod.model_id),
            )

    def _report(self, pod: PodInfo, message: str, reason: str, was: str | None) -> None:
        """Record a FailedScheduling Event and set PodScheduled=False (`was`: PodScheduled's
        status as last written, None: not known), off the loop. The caller holds a bind slot,
        released with the outcome."""

        def write() -> None:
            self._kube.record_event(
                pod.namespace,
                pod.name,
                pod.uid,
                reason="FailedScheduling",
                message=message,
                reporting_instance=self._identity,
            )
            self._count("event")
            self._kube.set_unschedulable(pod.namespace, pod.name, message, reason, was=was)
            self._count("condition")

        self._hand_over(write, partial(self._reported_why, pod))

    def _reported_why(self, pod: PodInfo, error: Exception | None) -> None:
        try:
            if error is None or isinstance(error, NotFoundError):
                return
            if isinstance(error, ApiError | OSError):
                self._reported.pop(pod.uid, None)
                log.warning(
                    "Recording why pod %s is pending has failed: %s.",
                    pod.key,
                    error,
                    extra=subject(pod=pod.key),
                )
            else:
                log.error(
                    "Reporting why pod %s is pending has failed: its work is abandoned.",
                    pod.key,
                    exc_info=error,
                    extra=subject(pod=pod.key),
                )
        finally:
            self._slots.release()

    async def drain(self, grace_seconds: float) -> None:
        """Let in-flight API writes finish (bounded), then abandon what is left: a write already
        on a worker thread ends there, its outcome ignored; a waiting one is never sent."""
        await asyncio.gather(
            self._writes.drain(grace_seconds), self._event_writes.drain(grace_seconds)
        )
