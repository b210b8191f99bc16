"""Warning Events for unproven pods: bound pods the binder does not charge, told why.

The cache judges the bound pods (binder.cluster.chargedpods): one whose proof of placement does not
verify is unproven, never charged, and handed here through the pod controller (`seen`). While this
replica leads, each such pod gets one Warning Event per reason (`NotPlacedByBinder`,
`PlacementKeyUnknown`, ...), so its owner learns why its GPU memory is not counted. A follower
writes nothing; a new leader reports what it finds (the old leader's record died with it).

One Event is written at a time, so however many pods a tenant creates, they hold at most one of
the `bind_workers` writers; the others keep binding. The (pod, reason) pairs reported are
remembered up to UNPROVEN_REMEMBERED; a report that went stale before its turn (the pod gone,
proven, or judged for another reason) is skipped.

Owns this record and its writes (run through the controller's handover); reads the cache's
unproven pods only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial

from binder.api.handover import Handover
from binder.api.kube import Kube
from binder.cluster.chargedpods import Unproven
from binder.cluster.objects import PodInfo
from common.kubeapi.errors import NotFoundError

log = logging.getLogger(__name__)

UNPROVEN_REMEMBERED = 10_000
"""(pod, reason) pairs remembered as reported; past it the record starts again (as the agent's)."""


class UnprovenReports:
    """One Warning Event per unproven pod and reason, one write at a time, by the leader only."""

    def __init__(
        self,
        kube: Kube,
        unproven: dict[str, Unproven],
        *,
        leading: asyncio.Event,
        writes: Handover,
        count: Callable[[str], None],
        identity: str,
    ) -> None:
        """`unproven` is the cache's (the same dict), to skip reports that went stale; `writes`
        runs the API writes off the loop (the controller's), and `count` counts each."""
        self._kube = kube
        self._unproven = unproven
        self._leading = leading
        self._writes = writes
        self._count = count
        self._identity = identity
        self._reported: set[tuple[str, str]] = set()
        self._waiting: dict[str, Unproven] = {}
        """Reports not yet written, oldest first; one is written at a time."""
        self._writing = False

    def seen(self, verdict: Unproven) -> None:
        """Report an unproven pod with a Warning Event, once per pod and reason. One such Event
        is written at a time, so however many pods a tenant creates, they hold at most one of
        the `bind_workers` writers; the others keep binding."""
        key = (verdict.pod.uid, verdict.reason)
        if not self._leading.is_set() or key in self._reported:
            return
        self._waiting[verdict.pod.uid] = verdict
        self._write()

    def _write(self) -> None:
        while self._waiting and not self._writing:
            uid = next(iter(self._waiting))
            verdict = self._waiting.pop(uid)
            current = self._unproven.get(uid)
            if current is None or current.reason != verdict.reason or not self._leading.is_set():
                continue  # gone, proven, changed reason (reported as such), or no longer ours
            if len(self._reported) >= UNPROVEN_REMEMBERED:
                self._reported.clear()
            self._reported.add((uid, verdict.reason))
            pod = verdict.pod

            def write(pod: PodInfo = pod, verdict: Unproven = verdict) -> None:
                self._kube.record_event(
                    pod.namespace,
                    pod.name,
                    pod.uid,
                    reason=verdict.reason,
                    message=verdict.message,
                    reporting_instance=self._identity,
                )
                self._count("event")

            self._writing = True
            self._writes.submit(write, partial(self._written, verdict))

    def _written(self, verdict: Unproven, error: Exception | None) -> None:
        self._writing = False
        if error is not None and not isinstance(error, NotFoundError):
            # Reported again at the next sight (a change of the pod, or of leadership).
            self._reported.discard((verdict.pod.uid, verdict.reason))
            log.warning(
                "Recording that pod %s is not charged has failed: %s.", verdict.pod.key, error
            )
        self._write()
