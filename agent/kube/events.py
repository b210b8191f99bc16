"""Events on model pods, so a refused or evicted pod says why in `kubectl describe pod`.

The agent records a Warning Event when it refuses a pod (not placed by the binder, model id owned
by another pod, tenant code not allowed) or takes a model out of Triton that it cannot vouch for,
and a Normal one when it puts an idle on-demand model to sleep to make room for another. A
tenant can call the agent in a loop, so each (pod, reason) is said at most once per period (a
repeat raises the first Event's count: the one rule of common/events.py), the remembered set is
bounded, and writing never delays the answer: it runs as its own task, and a failed write is
logged, not retried. A model host's replica's Events go on the host pod,
naming the replica (`<model>/<ordinal>`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol, Unpack

from agent.errors import KubeError
from agent.pods.modelpods import PodInfo
from common.events import EventText
from common.lifecycle import spawn
from common.logs import subject

log = logging.getLogger(__name__)

REPEAT_SECONDS = 600.0
REMEMBERED = 10_000


class EventWriter(Protocol):
    async def record_pod_event(
        self, namespace: str, name: str, uid: str, *, component: str, **said: Unpack[EventText]
    ) -> None: ...


class PodEvents:
    """Records Events on pods, deduplicated per pod and reason."""

    def __init__(
        self,
        kube: EventWriter,
        component: str,
        *,
        repeat_seconds: float = REPEAT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        replicas: Callable[[str, str], PodInfo | None],
    ) -> None:
        """`replicas(key, uid)`: the model host's replica of that uid, by its key or its host's
        (`NodePods.replica`), whose Events go on its host."""
        self._kube = kube
        self._replicas = replicas
        self.component = component
        self._repeat = repeat_seconds
        self._clock = clock
        self._written: dict[tuple[str, str, str], float] = {}
        """(pod key, uid, reason) -> when written: a replica's uid alone is not its own (a
        tenant can copy it into its host's annotation), so its Events are told apart by key."""
        self._tasks: set[asyncio.Task[None]] = set()

    def warn(self, pod_key: str, uid: str, reason: str, message: str) -> None:
        """Record the Event unless this pod got it within the period; returns at once."""
        self._record(pod_key, uid, reason, message, "Warning")

    def normal(self, pod_key: str, uid: str, reason: str, message: str) -> None:
        """A Normal Event (something the agent did, not a fault), deduplicated as `warn`."""
        self._record(pod_key, uid, reason, message, "Normal")

    def _record(self, pod_key: str, uid: str, reason: str, message: str, event_type: str) -> None:
        now = self._clock()
        last = self._written.get((pod_key, uid, reason))
        if last is not None and now - last < self._repeat:
            return
        if len(self._written) >= REMEMBERED:
            self._written.clear()
        self._written[(pod_key, uid, reason)] = now
        namespace, _, name = pod_key.partition("/")
        on = uid
        replica = self._replicas(pod_key, uid)
        if replica is not None:
            namespace, name, on = replica.namespace, replica.object_name, replica.object_uid
            message = f"replica {replica.name}: {message}"
        elif "/" in name:
            log.info("No Event %s for replica %s, gone from its host: %s", reason, pod_key, message)
            return
        spawn(
            f"Recording event {reason} on pod {namespace}/{name}",
            self._write(namespace, name, on, reason, message, event_type),
            consequence="the pod does not show it",
            keep=self._tasks,
        )

    async def _write(
        self, namespace: str, name: str, uid: str, reason: str, message: str, event_type: str
    ) -> None:
        try:
            await self._kube.record_pod_event(
                namespace,
                name,
                uid,
                reason=reason,
                message=message,
                component=self.component,
                event_type=event_type,
            )
        except KubeError as e:
            log.warning(
                "Recording event %s on pod %s/%s has failed: %s",
                reason,
                namespace,
                name,
                e,
                extra=subject(pod=f"{namespace}/{name}"),
            )

    async def close(self) -> None:
        """Let the Events being written finish (bounded)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5.0)
