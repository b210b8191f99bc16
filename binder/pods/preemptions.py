"""The rooms a pending pod's preemption makes, and the pods this replica nominated for them.

When a pod fits nowhere, `preempt` has lower-priority tritonshare pods evicted (and TritonModel
replicas drained) where that lets it in (binder.framework.preemption), and holds the room for it:
the GPU is nominated in the cache's state, and the pod's nomination annotation says where, signed,
so that a new leader holds the same room (`restore`). A held room keeps out pods of equal and lower
priority until its pod is placed; a pod of higher priority that lands on the node takes it, and the
pods that held room there are tried again (`displace`).

Owns the nominations this replica started and the API writes a preemption causes (run off the loop
through the controller's handover); reads the cluster only through the cache's ledger. The pod
controller (binder.pods.controller) decides when a pod's turn calls for a preemption.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import replace
from functools import partial

from binder.api.handover import Handover
from binder.api.kube import Kube
from binder.cluster.chargedpods import sign
from binder.cluster.ledger import Ledger
from binder.cluster.objects import PodInfo
from binder.framework.moves import carry_out_preemption
from binder.framework.placement import (
    Policy,
    Unschedulable,
    choose_gpu,
    fit_message,
    resolvable_nodes,
)
from binder.framework.preemption import NoPreemption, preempt, stale_room
from binder.framework.queue import SchedulingQueue
from binder.framework.replicapreemption import held_uid
from common.contract import Keys
from common.logs import subject
from common.proofs import KeyRing

log = logging.getLogger(__name__)


class Preemptions:
    """The rooms held for pods whose preemption this replica started, and the preemptions."""

    def __init__(
        self,
        kube: Kube,
        ledger: Ledger,
        *,
        leading: asyncio.Event,
        keys: Keys,
        policy: Policy,
        queue: SchedulingQueue,
        writes: Handover,
        count: Callable[[str], None],
        identity: str,
        placement_keys: Callable[[], KeyRing],
        clock: Callable[[], float],
        enabled: bool,
        preempt_replica: Callable[[PodInfo, str, str], None],
    ) -> None:
        """`writes` runs the API writes off the loop (the controller's, so they share its
        `bind_workers`), and `count` counts each; `enabled` is the binder's --preemption;
        `preempt_replica(victim, by, node)` drains a TritonModel replica a pod preempts (the
        model controller's)."""
        self._kube = kube
        self._keys = keys
        self._policy = policy
        self._queue = queue
        self._writes = writes
        self._count = count
        self._identity = identity
        self._placement_keys = placement_keys
        self._clock = clock
        self._leading = leading
        self._enabled = enabled
        self._preempt_replica = preempt_replica
        self._state = ledger.state
        self._pending = ledger.pending
        self._budgets = ledger.all_budgets
        self._nominations: dict[str, tuple[str, str]] = {}
        """Pods whose preemption this replica started: (node, GPU uuid) of the room held."""

    def held(self, uid: str) -> tuple[str, str] | None:
        """The (node, GPU uuid) held for the pod by a preemption this replica started."""
        return self._nominations.get(uid)

    def forget(self, uid: str) -> None:
        """The pod holds no room of this replica's any more (placed, or bound)."""
        self._nominations.pop(uid, None)

    def release(self, uid: str) -> None:
        """The pod gives up the room held for it: forgotten, and free in the cache's state."""
        self._nominations.pop(uid, None)
        self._state.release_nomination(uid)

    def restore(self) -> None:
        """On taking the lead, before anything is placed: every pending pod whose preemption
        made room (its status.nominatedNodeName, and the binder's nomination annotation naming
        the GPU) holds that room again, so that nothing placed meanwhile takes it; what this
        replica held when it led before is forgotten. One without the annotation, or whose
        node or GPU is gone or whose proof is not the binder's for that pod's hold, holds
        nothing (the pod is placed anew): a tenant can write both fields on its own pod."""
        for uid in list(self._nominations):
            self._state.release_nomination(uid)
        self._nominations.clear()
        if not self._enabled:
            return
        ring = self._placement_keys()
        for uid, pod in self._pending.items():
            if not pod.nominated_node or self._state.is_accounted(uid):
                continue
            node, gpu, proof = pod.nomination or (pod.nominated_node, "", "")
            why = (
                f"its nomination annotation names node {node}"
                if node != pod.nominated_node
                else stale_room(self._state, _held(pod), node, gpu, proof, ring)
            )
            if why:
                log.info(
                    "Pod %s does not hold room on node %s, its nominated node (%s): it is "
                    "placed anew.",
                    pod.key,
                    pod.nominated_node,
                    why,
                    extra=subject(pod=pod.key, node=pod.nominated_node),
                )
                continue
            self._state.nominate(pod, node, gpu)
            self._nominations[uid] = (node, gpu)
            log.info(
                "Pod %s holds its room on node %s (GPU %s), which its preemption made: it waits "
                "there for its victims.",
                pod.key,
                node,
                gpu,
                extra=subject(pod=pod.key, node=node),
            )

    def displace(self, lower: list[str], node: str) -> None:
        """A higher-priority pod took room on `node`: the lower-priority pods holding room there
        give it up and are tried again (kube-scheduler clears their nomination likewise)."""
        for uid in lower:
            if self._state.nominated.get(uid) != node:
                continue
            self.release(uid)
            held = self._pending.get(uid)
            if held is not None:
                log.info(
                    "Pod %s gives up the room held for it on node %s: a pod of higher priority "
                    "takes it.",
                    held.key,
                    node,
                    extra=subject(pod=held.key, node=node),
                )
                self._queue.add(uid, held.namespace)

    def preempt(self, pod: PodInfo, result: Unschedulable) -> Unschedulable:
        """Have lower-priority tritonshare pods evicted where that lets the pod in, and hold the
        room for it (binder.framework.preemption); returns the result to report, with
        kube-scheduler's `preemption: ...` counts when preemption cannot help."""
        state = self._state
        if (
            not self._enabled
            or result.condition_reason != "Unschedulable"
            or not self._leading.is_set()
            or not state.tallies.has_lower_priority(pod.priority)
        ):
            return result
        now = self._clock()
        held = self._nominations.get(pod.uid)
        outcome = preempt(
            state,
            pod,
            resolvable_nodes(state, pod, now),
            now=now,
            budgets=self._budgets(),
        )
        if isinstance(outcome, NoPreemption):
            if outcome.waiting and held is not None and held[0] in state.nodes:
                state.nominate(pod, *held)  # its victims are still leaving: keep the room
                return result
            self._nominations.pop(pod.uid, None)
            if not outcome.reasons:
                return result
            counts = fit_message(len(state.names), outcome.reasons)
            return replace(result, message=f"{result.message} preemption: {counts}")
        victims = outcome.victims
        replicas = [v for v in victims if v.host is not None]
        drain = self._preempt_replica
        with state.without([v.uid for v in victims]):
            gpu = choose_gpu(
                state, outcome.node, pod.request, self._policy, on_demand=pod.on_demand
            )
        if gpu is None:  # fits_on said a GPU fits with the victims gone
            return result
        state.nominate(pod, outcome.node, gpu.uuid)
        self._nominations[pod.uid] = (outcome.node, gpu.uuid)
        room = {
            "node": outcome.node,
            "gpu": gpu.uuid,
            "proof": sign(self._placement_keys(), _held(pod), outcome.node, gpu.uuid),
        }
        nomination = {self._keys.nomination: json.dumps(room, separators=(",", ":"))}
        log.info(
            "Pod %s (priority %d) fits nowhere: preempting %d lower-priority pod(s) on node %s "
            "(%s); GPU %s is held for it.",
            pod.key,
            pod.priority,
            len(victims),
            outcome.node,
            ", ".join(v.key for v in victims),
            gpu.uuid,
            extra=subject(pod=pod.key, node=outcome.node, model=pod.model_id),
        )

        for victim in replicas:
            drain(victim, f"pod {pod.uid}", outcome.node)
        drained = [v.key for v in replicas]

        def work() -> None:
            # The GPU and proof first: a new leader holds the room only with both.
            self._kube.patch_pod_annotations(pod.namespace, pod.name, nomination)
            self._count("annotate")
            carry_out_preemption(
                self._kube, pod, outcome, self._identity, self._count, drained=drained
            )

        self._writes.submit(work, partial(self._preempted, pod))
        return result

    def _preempted(self, pod: PodInfo, error: Exception | None) -> None:
        if error is None:
            return
        self.release(pod.uid)
        log.warning(
            "Preempting pods for pod %s has failed (%s): its held room is released; it is "
            "retried with backoff.",
            pod.key,
            error,
            extra=subject(pod=pod.key),
        )


def _held(pod: PodInfo) -> PodInfo:
    """The pod as the room its preemption made is signed and checked: under `held_uid`, so the
    proof never proves a placement."""
    return replace(pod, uid=held_uid(pod.uid))
