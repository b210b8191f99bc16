"""The binder's one loop (`binder.reconciler`) with stand-ins for its two writers: pods and
models taken from one queue in turns by namespace, each by its writer, only while leading."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from binder.framework.queue import SchedulingQueue
from binder.reconciler import Reconciler
from tests.binder.simcluster import eventually


class Pods:
    def __init__(self, seen: list[str], slots: int = 4) -> None:
        self.seen = seen
        self.slots = asyncio.Semaphore(slots)

    async def slot(self) -> None:
        await self.slots.acquire()

    def release_slot(self) -> None:
        self.slots.release()

    def schedule_one(self, uid: str) -> None:
        self.seen.append(uid)
        self.slots.release()


class Models:
    def __init__(self, seen: list[str], queue: SchedulingQueue) -> None:
        self.seen = seen
        self.queue = queue
        self.known: set[str] = set()
        self.between_calls = 0

    def changed(self, uid: str, namespace: str) -> None:
        self.known.add(uid)
        self.queue.add(uid, namespace)

    def owns(self, uid: str) -> bool:
        return uid in self.known

    async def run_writes(self, stop: asyncio.Event) -> None:
        await stop.wait()

    def tick_in(self) -> float:
        return 1.0

    async def between(self, stop: asyncio.Event) -> None:
        self.between_calls += 1

    async def turn_of(self, uid: str) -> None:
        await asyncio.sleep(0)  # a model's turn awaits its writes
        self.seen.append(uid)
        self.queue.remove(uid)


def parts() -> tuple[SchedulingQueue, list[str], Pods, Models]:
    queue = SchedulingQueue(event_backoff_max=10.0, capped_by_default=False)
    seen: list[str] = []
    return queue, seen, Pods(seen), Models(seen, queue)


async def test_pods_and_models_take_their_namespaces_turns_from_one_queue() -> None:
    queue, seen, pods, models = parts()
    for i in range(3):
        queue.add(f"pod-{i}", "greedy")
        models.changed(f"model-{i}", "greedy")
    queue.add("their-pod", "team-b")
    models.changed("their-model", "team-b")
    leading, stop = asyncio.Event(), asyncio.Event()
    leading.set()
    loop = Reconciler(queue, cast(Any, pods), cast(Any, models), leading=leading)
    task = asyncio.create_task(loop.run(stop))
    try:
        await eventually(lambda: len(seen) == 8, what="every uid's turn")
    finally:
        stop.set()
        await task
    # The greedy namespace's pods and models first in, first out; team-b's between them.
    assert seen == [
        "pod-0",
        "their-pod",
        "model-0",
        "their-model",
        "pod-1",
        "model-1",
        "pod-2",
        "model-2",
    ]
    assert models.between_calls >= 8, "the hosts are seen to between every two turns"


async def test_nothing_is_taken_while_not_leading_and_a_taken_pod_is_put_back() -> None:
    queue, seen, pods, models = parts()
    leading, stop = asyncio.Event(), asyncio.Event()
    loop = Reconciler(queue, cast(Any, pods), cast(Any, models), leading=leading)
    task = asyncio.create_task(loop.run(stop))
    queue.add("pod", "a")
    models.changed("model", "a")
    for _ in range(20):
        await asyncio.sleep(0)
    assert seen == [] and len(queue) == 2

    await pods.slots.acquire()  # every slot busy: the loop waits for one with "pod" taken
    for _ in range(3):
        await pods.slots.acquire()
    leading.set()
    await eventually(lambda: "pod" not in queue, what="the pod taken")
    leading.clear()
    pods.slots.release()
    await eventually(lambda: "pod" in queue, what="the pod put back, undecided")
    assert "pod" not in seen
    leading.set()
    await eventually(lambda: set(seen) == {"pod", "model"}, what="both decided")
    stop.set()
    await asyncio.wait_for(task, 5)
