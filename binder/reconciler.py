"""The binder's one loop: pods and TritonModel replicas placed from one queue, in turns.

A pending pod and a TritonModel whose replicas need placing, leaving or writing back wait in one
queue (`binder.framework.queue`), taken one namespace at a time: a namespace's thousands of pods and
models together delay another namespace's pod or model by one of theirs. Each uid taken goes to the
writer of its kind, both on the one placement core (`binder.framework.placement.place`, the cache's
state, charged at once): a pod to `binder.pods.controller` (bound, or told why not), a model to
`binder.tritonmodels.controller` (its replicas placed or drained, its status, hosts and Service
written). Between two turns the hosts whose conditions changed are updated and, every second, the
models whose roll or drain waits are queued again. A pod's API writes run off the loop (at most the
bind workers' slots ahead); a model's turn awaits its own, as it writes its namespace's hosts.

Runs while this replica leads; a uid taken as the lead is lost is put back.
"""

from __future__ import annotations

import asyncio
import contextlib

from binder.framework.queue import SchedulingQueue
from binder.pods.controller import PodController
from binder.tritonmodels.controller import TritonModelController

YIELD_EVERY = 32
"""Pods decided in a row, without waiting, before the loop lets its other callbacks run."""


class Reconciler:
    """Takes the turns of the binder's pods and TritonModels from their one queue."""

    def __init__(
        self,
        queue: SchedulingQueue,
        pods: PodController,
        models: TritonModelController,
        *,
        leading: asyncio.Event,
    ) -> None:
        self._queue = queue
        self._pods = pods
        self._models = models
        self._leading = leading

    async def run(self, stop: asyncio.Event) -> None:
        """Reconcile while leading, until `stop`."""
        writes = asyncio.create_task(self._models.run_writes(stop), name="model-status-writer")
        try:
            await self._loop(stop)
        finally:
            writes.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writes

    async def _loop(self, stop: asyncio.Event) -> None:
        queue, pods, models, leading = self._queue, self._pods, self._models, self._leading
        stopped = asyncio.create_task(stop.wait(), name="reconciler-stop")
        stopped.add_done_callback(lambda _: queue.wake())
        in_a_row = 0
        try:
            while not stop.is_set():
                if not leading.is_set():
                    lead = asyncio.create_task(leading.wait(), name="reconciler-lead")
                    await asyncio.wait({lead, stopped}, return_when=asyncio.FIRST_COMPLETED)
                    lead.cancel()
                    continue
                queue.clear_wake()
                await models.between(stop)
                uid = queue.pop_ready()
                if uid is None:
                    in_a_row = 0
                    due = queue.due_in()
                    tick = models.tick_in()
                    await queue.woken(tick if due is None else min(due, tick))
                    continue
                if stop.is_set():
                    queue.add(uid)
                    break
                if models.owns(uid):
                    await models.turn_of(uid)
                    in_a_row = 0
                    await asyncio.sleep(0)  # one model per turn: the loop's other work between
                    continue
                in_a_row += 1
                if in_a_row % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
                await pods.slot()
                if not leading.is_set():
                    pods.release_slot()
                    queue.add(uid)
                    continue
                try:
                    pods.schedule_one(uid)
                except Exception:
                    pods.release_slot()
                    raise
        finally:
            stopped.cancel()
