"""The scheduling loop: take a pending pod from the queue, place it, bind it or say why not.

While this replica leads: pop a pod, decide on the cache's state (no API reads), charge the pod
to the chosen GPU at once (assume), then, off the loop, patch the pod's GPU annotation and post
the Binding. A 404 or 409 (deleted, or bound by someone else) drops the assumption; other
failures drop it and retry the pod with backoff. A pod that fits nowhere gets a FailedScheduling
Event and PodScheduled=False (only when the message changes, so a pod waiting for hours does not
flood the API) and waits out its backoff, or less if the cluster changes in a way that helps.

Owns the decisions and the API writes they cause; reads the cluster only through the cache.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any

from binder.errors import ApiError, ConflictError, NotFoundError
from binder.kube import Kube
from binder.metrics import Metrics
from binder.model import PodInfo
from binder.placement import Placement, Policy, place
from binder.queue import SchedulingQueue
from binder.state import ClusterState
from common.contract import Keys
from common.lifecycle import spawn
from common.placement import Claim, KeyRing
from common.quantity import format_bytes

log = logging.getLogger(__name__)

YIELD_EVERY = 32
"""Pods decided in a row, without waiting, before the loop lets its other callbacks run."""

REPORT_INTERVAL_SECONDS = 10.0
"""Shortest time between two FailedScheduling writes for one pod whose reason changed."""


class Controller:
    """Decides and binds; the cache's listener."""

    def __init__(
        self,
        kube: Kube,
        *,
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
    ) -> None:
        self._kube = kube
        self._keys = keys
        self._policy = policy
        self.queue = queue
        self._metrics = metrics
        self._executor = executor
        self._slots = asyncio.Semaphore(bind_workers)
        self._identity = identity
        self._placement_keys = placement_keys
        self._clock = clock
        self.state: ClusterState | None = None
        self.pending: dict[str, PodInfo] = {}
        self._in_flight: set[str] = set()
        self._reported: dict[str, tuple[str, float]] = {}
        """Per pod: the last message written and when (monotonic seconds)."""
        self._report_interval = report_interval
        self._monotonic = monotonic
        self._tasks: set[asyncio.Task[None]] = set()
        self.bound = 0

    # ---- listener of the cache -------------------------------------------------------------------

    def pending_changed(self, pod: PodInfo, relevant: bool) -> None:
        self._metrics.pending.set(len(self.pending))
        if pod.uid in self._in_flight:
            return
        if relevant or pod.uid not in self.queue:
            self.queue.add(pod.uid)

    def pending_gone(self, uid: str) -> None:
        self.queue.remove(uid)
        self._reported.pop(uid, None)
        self._metrics.pending.set(len(self.pending))

    def cluster_changed(self, why: str) -> None:
        moved = self.queue.move_all_to_active()
        if moved:
            log.debug("%s: retrying %d unschedulable pods now.", why, moved)

    # ---- the loop --------------------------------------------------------------------------------

    async def run(self, leading: asyncio.Event, stop: asyncio.Event) -> None:
        """Schedule while leading, until `stop`."""
        in_a_row = 0
        while not stop.is_set():
            if not leading.is_set():
                await _first(leading.wait(), stop.wait())
                continue
            # A pod already waiting is taken at once: no tasks to wait on (they cost more than
            # the decision). Every so often the loop is let through to its other work.
            uid = self.queue.pop_ready()
            in_a_row = in_a_row + 1 if uid is not None else 0
            if in_a_row % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)
            if uid is None:
                popped = spawn("Waiting for a pod to schedule", self.queue.pop())
                stopped = spawn("Waiting for the binder to stop", stop.wait())
                done, _ = await asyncio.wait({popped, stopped}, return_when=asyncio.FIRST_COMPLETED)
                stopped.cancel()
                if popped not in done:
                    popped.cancel()
                    break
                uid = popped.result()
            if not leading.is_set():
                self.queue.add(uid)
                continue
            await self._slots.acquire()
            try:
                self.schedule_one(uid)
            except Exception:
                self._slots.release()
                raise

    def schedule_one(self, uid: str) -> None:
        """Decide for one pod. Holds a bind slot, released when its API writes are done."""
        state = self.state
        pod = self.pending.get(uid)
        if state is None or pod is None or state.is_accounted(uid) or uid in self._in_flight:
            self._slots.release()
            return
        result = place(state, pod, now=self._clock(), policy=self._policy)
        if isinstance(result, Placement):
            state.assume(pod, result.node, result.gpu.uuid)
            self._in_flight.add(uid)
            self._spawn(f"Binding pod {pod.key}", self._bind(pod, result))
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
        )
        if self._should_report(uid, result.message):
            self._reported[uid] = (result.message, self._monotonic())
            self._spawn(
                f"Reporting why pod {pod.key} is pending",
                self._report(pod, result.message, result.condition_reason),
            )
        else:
            self._slots.release()

    def _should_report(self, uid: str, message: str) -> bool:
        """Write a pod's first reason at once; a changed reason at most once per interval (the
        largest free block moves with every bind elsewhere); an unchanged one never again."""
        last = self._reported.get(uid)
        if last is None:
            return True
        return last[0] != message and self._monotonic() - last[1] >= self._report_interval

    def _spawn(self, name: str, coroutine: Coroutine[Any, Any, None]) -> None:
        spawn(name, coroutine, keep=self._tasks)

    async def _call(self, function: Callable[[], None]) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, function)

    async def _bind(self, pod: PodInfo, placement: Placement) -> None:
        state = self.state
        assert state is not None
        claim = Claim(
            pod.uid,
            pod.namespace,
            pod.name,
            placement.node,
            placement.gpu.uuid,
            pod.model_id,
            pod.request,
        )
        # The proof rides in the same patch as the GPU: still two API writes per pod.
        annotations = {
            self._keys.gpu: placement.gpu.uuid,
            self._keys.placement: self._placement_keys().sign(claim),
        }

        def write() -> None:
            # Both writes in one trip to a worker thread: half the hand-offs between threads.
            self._kube.patch_pod_annotations(pod.namespace, pod.name, annotations)
            self._metrics.api_calls.labels("annotate").inc()
            self._kube.bind(pod.namespace, pod.name, pod.uid, placement.node)
            self._metrics.api_calls.labels("bind").inc()

        try:
            await self._call(write)
        except (NotFoundError, ConflictError) as e:
            state.forget_assumed(pod.uid)
            self.queue.remove(pod.uid)
            self._metrics.attempts.labels("error").inc()
            log.info(
                "Pod %s was not bound to %s (%s): it was deleted or bound elsewhere; dropping it.",
                pod.key,
                placement.node,
                e.reason or e.status,
            )
        except (ApiError, OSError) as e:
            state.forget_assumed(pod.uid)
            self._metrics.attempts.labels("error").inc()
            delay = self.queue.backoff(pod.uid)
            log.warning(
                "Binding pod %s to %s has failed (%s): released its GPU memory, retrying in "
                "%.0f s.",
                pod.key,
                placement.node,
                e,
                delay,
            )
        else:
            self.bound += 1
            self._metrics.attempts.labels("scheduled").inc()
            if pod.created:
                self._metrics.latency.observe(max(0.0, self._clock() - pod.created))
            self.queue.remove(pod.uid)
            self._reported.pop(pod.uid, None)
            # DEBUG, as kube-scheduler keeps "Successfully bound pod to node" below its default
            # verbosity: a line per pod cost about 10 us of formatting and a write to stderr.
            log.debug(
                "Bound pod %s (model %s, %s) to node %s, GPU %d (%s).",
                pod.key,
                pod.model_id,
                format_bytes(pod.request),
                placement.node,
                placement.gpu.index,
                placement.gpu.uuid,
            )
        finally:
            self._in_flight.discard(pod.uid)
            self._slots.release()

    async def _report(self, pod: PodInfo, message: str, reason: str) -> None:
        try:
            await self._call(
                lambda: self._kube.record_event(
                    pod.namespace,
                    pod.name,
                    pod.uid,
                    reason="FailedScheduling",
                    message=message,
                    reporting_instance=self._identity,
                )
            )
            self._metrics.api_calls.labels("event").inc()
            await self._call(
                lambda: self._kube.set_unschedulable(pod.namespace, pod.name, message, reason)
            )
            self._metrics.api_calls.labels("condition").inc()
        except NotFoundError:
            pass
        except (ApiError, OSError) as e:
            self._reported.pop(pod.uid, None)
            log.warning("Recording why pod %s is pending has failed: %s.", pod.key, e)
        finally:
            self._slots.release()

    async def drain(self, grace_seconds: float) -> None:
        """Let in-flight API writes finish (bounded), then cancel what is left."""
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=grace_seconds)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)


async def _first(*aws: Coroutine[Any, Any, Any]) -> None:
    tasks = [spawn("Waiting for the first of several events", a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
