"""Models measured above their GPU memory request: warned, or evicted with their pods failed; and
models unloaded, their pods failed, for their namespace's share of Triton's host memory.

A loaded model measured above its request plus the tolerance (`agent.gpus.memory`) gets a
Warning Event, or with enforcement `evict` (`--gpu-mem-enforcement`) is unloaded and its pod
marked Failed (GPUMemoryExceeded). Never on a figure another tenant could have inflated: a
doubtful excess only warns, and says why it is not evicted. The agent's log warns once per
model while it stays over; a model back under its request is warned again should it go over
once more.
A namespace whose models' own processes grew past its share of Triton's host memory
(`agent.models.tritonram.HostMemory.over_share`, on figures no other tenant can inflate) loses its
largest such models: each is unloaded and its pod marked Failed (HostMemoryExceeded), whatever
`--gpu-mem-enforcement` says, as one more load would.
Each reconciliation pass (`agent.models.reconcile`) asks this for the models over their
request or share, which come first in its plan, and carries out their eviction or warning here.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from agent.errors import AgentError
from agent.gpus.memory import Excess
from agent.kube.events import PodEvents
from agent.metrics import AgentMetrics
from agent.models.nodemodels import Models
from agent.models.passplan import Action
from agent.models.tritonram import OverShare
from agent.phases import Event
from agent.pods.provenpods import Proven
from common.logs import subject
from common.quantity import format_bytes

log = logging.getLogger(__name__)


class OverRequest:
    """Enforces the GPU memory requests of this node's wanted models."""

    def __init__(
        self,
        models: Models,
        metrics: AgentMetrics,
        events: PodEvents,
        enforcement: str,
        fail_pod: Callable[[str, str, str, str], Awaitable[None]],
    ) -> None:
        self.models = models
        self.metrics = metrics
        self.events = events
        self.enforcement = enforcement
        self._fail_pod = fail_pod
        self._warned: set[str] = set()
        self._over_share: list[OverShare] = []

    async def measure(self) -> None:
        """Read, off the event loop, which models their namespace's share of Triton's host
        memory no longer holds (before each pass's plan)."""
        self._over_share = await self.models.over_share()

    def actions(self, wanted: dict[str, Proven]) -> list[Action]:
        """An eviction (or warning) for each wanted model over its request or its namespace's
        host-memory share, unless busy."""
        actions = {}
        for over in self.models.ledger.over():
            name = over.model.model_id
            owner = wanted.get(name)
            if owner is None or self.models.records.is_busy(name):
                continue
            actions[name] = Action(name, Event.OVER_REQUEST, owner, over)
        for host in self._over_share:
            owner = wanted.get(host.name)
            if owner is None or self.models.records.is_busy(host.name):
                continue
            actions[host.name] = Action(host.name, Event.OVER_REQUEST, owner, host=host)
        return list(actions.values())

    async def enforce_host(self, name: str, pod: Proven, over: OverShare) -> None:
        """Unload a model whose namespace holds more of Triton's host memory than its share, and
        fail its pod: its processes hold memory no other namespace's model may be refused for."""
        message = (
            f"model {pod.model_id} ({name} in Triton) holds {format_bytes(over.bytes)} of "
            f"Triton's host memory in its own processes, and namespace {over.namespace}'s "
            f"models {format_bytes(over.held)}, more than the {format_bytes(over.share)} each "
            f"namespace may hold on this node (--triton-memory-namespace-percent)"
        )
        log.warning("%s: unloading it.", message, extra=subject(pod=pod.key, model=pod.model_id))
        try:
            await self.models.unload(
                name,
                reason="its namespace held more of Triton's host memory than its share",
                cause=Event.OVER_REQUEST,
            )
            await self._fail_pod(
                pod.namespace,
                pod.pod.name,
                "HostMemoryExceeded",
                f"{message}; the tritonshare agent unloaded it. Make the model hold less "
                f"host memory, and recreate it",
            )
        except AgentError as e:
            log.warning(
                "Unloading model %s for its namespace's host memory failed (%s): retrying.",
                name,
                e,
                extra=subject(pod=pod.key, model=pod.model_id),
            )
            return
        self.events.warn(pod.key, pod.uid, "HostMemoryExceeded", f"{message}; unloaded")

    def forget_the_rest(self) -> None:
        """Models no longer over their request are warned again should they go over again."""
        self._warned &= {e.model.model_id for e in self.models.ledger.over()}

    async def enforce(self, name: str, pod: Proven, over: Excess) -> None:
        message = (
            f"model {pod.model_id} ({name} in Triton) uses {format_bytes(over.model.bytes)} of "
            f"GPU memory on {pod.gpu_uuid}, more than the {format_bytes(pod.request)} its pod "
            f"requested (tritonshare.io/gpu-mem) plus the tolerance"
        )
        # Never evict on a figure another tenant could have inflated: only a warning then.
        doubt = over.doubt() if not over.sure(self.models.ledger.allowed(pod.request)) else ""
        if self.enforcement != "evict" or doubt:
            if doubt:
                message += f" ({doubt}; it is not evicted for them)"
            if name not in self._warned:
                self._warned.add(name)
                self.metrics.gpu_memory_over.labels("warned").inc()
                log.warning(
                    "%s: raise the pod's request, or the agent may evict it.",
                    message,
                    extra=subject(pod=pod.key, model=pod.model_id),
                )
            self.events.warn(
                pod.key, pod.uid, "GPUMemoryOverRequest", f"{message}; raise the request"
            )
            return
        log.warning(
            "%s: evicting it (--gpu-mem-enforcement=evict).",
            message,
            extra=subject(pod=pod.key, model=pod.model_id),
        )
        try:
            await self.models.unload(
                name,
                reason="it used more GPU memory than it requested",
                cause=Event.OVER_REQUEST,
            )
            await self._fail_pod(
                pod.namespace,
                pod.pod.name,
                "GPUMemoryExceeded",
                f"{message}; the tritonshare agent unloaded it. Raise the request and recreate it",
            )
        except AgentError as e:
            log.warning(
                "Evicting model %s failed (%s): retrying.",
                name,
                e,
                extra=subject(pod=pod.key, model=pod.model_id),
            )
            return
        self.metrics.gpu_memory_over.labels("evicted").inc()
        self.events.warn(pod.key, pod.uid, "GPUMemoryExceeded", f"{message}; evicted")
