"""Room made for a pending pod by moving smaller pods: the binder's consolidation, as a pod's turn
uses it.

When only split free memory keeps a pod out (a GPU would fit it if a few smaller pods went
elsewhere), `make` plans those moves (binder.framework.consolidation) and carries the plan out
off the loop (binder.framework.moves): the smaller pods are evicted with an Event each, their
controllers create replacements, and the waiting pod takes the block they leave. At most
--consolidate-moves pods a plan, and once per pod per cooldown whatever the answer, so a waiting
pod's retries do not plan again; the pods and nodes of a recent plan are left alone.

Owns the cooldowns and the API writes a plan causes (run through the controller's handover);
reads the cluster only through the cache's state. The pod controller (binder.pods.controller)
decides when a pod's turn calls for room.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial

from binder.api.handover import Handover
from binder.api.kube import Kube
from binder.cluster.clusterstate import ClusterState
from binder.cluster.objects import PodInfo
from binder.framework.consolidation import Cooldowns, plan
from binder.framework.moves import carry_out
from common.kubeapi.errors import ApiError
from common.logs import subject
from common.quantity import format_bytes

log = logging.getLogger(__name__)


class RoomMaking:
    """Plans and carries out moves that give a waiting pod a block of GPU memory."""

    def __init__(
        self,
        kube: Kube,
        state: ClusterState,
        *,
        leading: asyncio.Event,
        writes: Handover,
        count: Callable[[str], None],
        identity: str,
        clock: Callable[[], float],
        monotonic: Callable[[], float],
        max_moves: int,
    ) -> None:
        """`writes` runs the API writes off the loop (the controller's), and `count` counts
        each; `max_moves` is the binder's --consolidate-moves (0: no room is made)."""
        self._kube = kube
        self._state = state
        self._leading = leading
        self._writes = writes
        self._count = count
        self._identity = identity
        self._clock = clock
        self._monotonic = monotonic
        self.max_moves = max_moves
        self._cooldowns = Cooldowns()

    def make(self, pod: PodInfo) -> None:
        """Plan to move a few smaller pods when only split free memory keeps the pod out
        (binder.framework.consolidation), and carry the plan out off the loop
        (binder.framework.moves). Once per pod per cooldown, whatever the answer, so a waiting pod's
        retries do not plan again."""
        state = self._state
        now = self._monotonic()
        recent = self._cooldowns.pods(now)
        if not self._leading.is_set() or pod.uid in recent:
            return
        made = plan(
            state,
            pod,
            now=self._clock(),
            max_moves=self.max_moves,
            exempt=recent,
            cold_nodes=self._cooldowns.nodes(now),
        )
        self._cooldowns.planned(pod, made, now)
        if made is None:
            return
        log.info(
            "Pod %s waits only because its nodes' free GPU memory is split: moving %d smaller "
            "pod(s) off GPU %s on node %s gives it a block of %s.",
            pod.key,
            len(made.moves),
            made.gpu.uuid,
            made.node,
            format_bytes(made.freed),
            extra=subject(pod=pod.key, node=made.node, model=pod.model_id),
        )

        def work() -> None:
            carry_out(self._kube, made, pod, self._identity, self._count)

        self._writes.submit(work, partial(self._moved, pod))

    def _moved(self, pod: PodInfo, error: Exception | None) -> None:
        if error is None:
            return
        if isinstance(error, ApiError | OSError):
            log.warning(
                "Moving pods to make room for pod %s has failed: %s. It waits for room.",
                pod.key,
                error,
                extra=subject(pod=pod.key),
            )
        else:
            log.error(
                "Moving pods to make room for pod %s has failed: its work is abandoned.",
                pod.key,
                exc_info=error,
                extra=subject(pod=pod.key),
            )
