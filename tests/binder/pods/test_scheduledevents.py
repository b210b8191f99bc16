"""The Scheduled Events' bound on what waits for their writer: past a burst's worth, a pod bound
gets none (counted), however many tokens the rate has left; each written one makes room again."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from binder.api.handover import Handover, Outcome
from binder.api.kube import Kube
from binder.cluster.objects import pod_from_api
from binder.pods.scheduledevents import ScheduledEvents
from tests.binder.objects import KEYS, pod_obj


class HeldWrites:
    """A writer that runs nothing until the test says: what was handed over, in order."""

    def __init__(self) -> None:
        self.held: list[tuple[Callable[[], None], Outcome]] = []

    def submit(self, work: Callable[[], None], outcome: Outcome) -> None:
        self.held.append((work, outcome))


def test_a_pod_bound_while_a_bursts_worth_of_events_wait_gets_none() -> None:
    writes = HeldWrites()
    skipped: list[None] = []
    ticks = iter(range(0, 10_000, 10))  # 10 s between readings: the rate always has a token
    events = ScheduledEvents(
        cast(Kube, None),
        cast(Handover, writes),
        per_second=1.0,  # a burst of 2
        identity="binder-0",
        count=lambda call: None,
        skipped=lambda: skipped.append(None),
        monotonic=lambda: float(next(ticks)),
    )
    pods = [pod_from_api(pod_obj(f"m-{i}"), KEYS) for i in range(5)]
    for pod in pods[:4]:
        events.bound(pod, "gpu-1", 0, "GPU-0")
    assert (len(writes.held), len(skipped)) == (2, 2)
    _, outcome = writes.held[0]
    outcome(None)  # one written: room for one more
    events.bound(pods[4], "gpu-1", 0, "GPU-0")
    assert (len(writes.held), len(skipped)) == (3, 2)
