"""The `Scheduled` Event on a pod the binder has bound, as kube-scheduler records one
("Successfully assigned ns/pod to node"), naming the GPU too, so `kubectl describe pod` and
`kubectl get events` show where a pod went and by whom.

Why bounded: the Event is a second API write per pod, about as costly as the Binding itself. So,
as kube-scheduler's own Events are bounded by its client's rate (--kube-api-qps 50, burst 100) and
a queue that drops what it cannot send, at most --scheduled-events-per-second are written (a
token bucket, a burst of twice as many): a pod bound while none is left gets no Event, counted in
`tritonshare_binder_scheduled_events_skipped_total`. Pods created at a steady pace under that rate
each get theirs. Recording is best effort: a failed write is logged, never retried, and never
undoes or delays the binding: it runs after it, as its own write, on a writer of its own (the
controller's EVENT_WRITERS), so an Event the API server is slow to take holds no bind worker; while
a burst's worth of Events still wait for that writer, a pod bound gets none (skipped too).

Owns the decision (on the loop) and hands the write to the writer it is given.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from binder.api.handover import Handover
from binder.api.kube import Kube
from binder.cluster.objects import PodInfo
from binder.pods.tokenbucket import TokenBucket
from common.kubeapi.errors import ApiError, NotFoundError
from common.logs import subject

log = logging.getLogger(__name__)

REASON = "Scheduled"
ACTION = "Binding"
"""kube-scheduler's reason and action for the Event."""


def scheduled_message(namespace: str, name: str, node: str, gpu_index: int, gpu_uuid: str) -> str:
    """kube-scheduler's words, and the GPU."""
    return f"Successfully assigned {namespace}/{name} to {node}, GPU {gpu_index} ({gpu_uuid})"


class ScheduledEvents:
    """Records a bound pod's `Scheduled` Event while the rate allows."""

    def __init__(
        self,
        kube: Kube,
        writes: Handover,
        *,
        per_second: float,
        identity: str,
        count: Callable[[str], None],
        skipped: Callable[[], None],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`per_second`: the most a second (0: none); `writes`: the Events' own writer (never the
        bindings'); `count(call)` counts a write made; `skipped()` counts a pod bound without its
        Event."""
        self._kube = kube
        self._writes = writes
        self._identity = identity
        self._count = count
        self._skipped = skipped
        self._bucket = (
            TokenBucket(per_second, monotonic, burst=2 * per_second) if per_second else None
        )
        self._most_waiting = max(1, int(2 * per_second))
        """Events handed to the writer and not yet written, at most: a burst's worth."""
        self._waiting = 0

    def bound(self, pod: PodInfo, node: str, gpu_index: int, gpu_uuid: str) -> None:
        """The pod is bound to `node`'s GPU: its Event, if the rate allows (on the loop)."""
        if self._bucket is None:
            return
        if self._waiting >= self._most_waiting or not self._bucket.take():
            self._skipped()
            return
        message = scheduled_message(pod.namespace, pod.name, node, gpu_index, gpu_uuid)

        def write() -> None:
            self._kube.record_event(
                pod.namespace,
                pod.name,
                pod.uid,
                reason=REASON,
                message=message,
                event_type="Normal",
                action=ACTION,
                reporting_instance=self._identity,
            )
            self._count("event")

        def recorded(error: Exception | None) -> None:
            self._waiting -= 1
            if error is None or isinstance(error, NotFoundError):
                return  # the pod's namespace is gone with it
            level = logging.WARNING if isinstance(error, ApiError | OSError) else logging.ERROR
            log.log(
                level,
                "Recording the Scheduled event of pod %s has failed (%s): it is bound all the "
                "same.",
                pod.key,
                error,
                extra=subject(pod=pod.key, node=node),
            )

        self._writes.submit(write, recorded)
        self._waiting += 1
