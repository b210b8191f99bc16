"""Whether the agent vouches for what Triton runs for a pod, and what happens when it does not.

A wanted model Triton already runs but the agent does not remember (the agent restarted) is
adopted only if the agent can vouch for it (`Models.vouch`: its own install for this owner,
files intact, pinned to the owner's GPU); otherwise it is taken out of Triton, and loaded again
from the owner's files when those are intact, with a Warning Event on the pod (ModelNotVouched)
either way. A model the agent holds loaded is checked again once per resync period, the same
way: is what Triton runs still what the agent installed?
The reconciliation pass (`agent.models.reconcile`) decides when (a `Check` of
`agent.models.passplan`); this module carries the check out, raising ADOPTED or UNVOUCHED, and
asks for another pass after taking a model out (which loads it again when its files are intact).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from agent.errors import AgentError
from agent.kube.events import PodEvents
from agent.metrics import AgentMetrics
from agent.models.nodemodels import Models
from agent.phases import Event
from agent.pods.provenpods import Proven
from common.logs import subject

log = logging.getLogger(__name__)


class Vouching:
    """Adopts, rechecks and takes out of Triton the models it runs for this node's pods."""

    def __init__(
        self,
        models: Models,
        metrics: AgentMetrics,
        events: PodEvents,
        trigger: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`trigger` asks for a reconciliation pass now."""
        self.models = models
        self.metrics = metrics
        self.events = events
        self._trigger = trigger
        self._clock = clock

    async def adopt(self, name: str, pod: Proven) -> None:
        why = await self.models.vouch(name, pod)
        if not why:
            self.models.adopt(name, pod)
            self.metrics.reconciles.labels("adopted").inc()
            log.info(
                "Model %s is already loaded in Triton for pod %s: adopting it.",
                name,
                pod.key,
                extra=subject(pod=pod.key, model=pod.model_id),
            )
            return
        await self._evict(name, pod, why)

    async def recheck(self, name: str, pod: Proven) -> None:
        """Once per resync period: is what Triton runs still what the agent installed?"""
        why = await self.models.vouch(name, pod)
        if not why:
            self.models.records.record(name).vouched_at = self._clock()
            self.models.records.note(name, Event.ADOPTED)
            return
        await self._evict(name, pod, why)

    async def _evict(self, name: str, pod: Proven, why: str) -> None:
        log.warning(
            "Triton runs model %s for pod %s, but the agent cannot vouch for it (%s): taking it "
            "out of Triton.",
            name,
            pod.key,
            why,
            extra=subject(pod=pod.key, model=pod.model_id),
        )
        try:
            await self.models.evict_unvouched(name, pod, why)
        except AgentError as e:
            log.warning(
                "Taking unvouched model %s out of Triton failed (%s): retrying.",
                name,
                e,
                extra=subject(pod=pod.key, model=pod.model_id),
            )
            return
        self.metrics.reconciles.labels("unvouched_removed").inc()
        files = self.models.repository.installed_manifest(name) is not None
        self.events.warn(
            pod.key,
            pod.uid,
            "ModelNotVouched",
            f"Triton ran model {pod.model_id} ({name}) in a way the tritonshare agent cannot "
            f"vouch for ({why}); "
            + (
                "it is loaded again from the files installed for this pod"
                if files
                else "its files are gone: delete the pod so its loader installs it again"
            ),
        )
        self._trigger()
