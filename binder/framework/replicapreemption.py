"""Preemption for TritonModel replicas, as the replica placer (`binder.tritonmodels.placer`)
decides it: the rooms held for replicas whose preemption made them, the record of replicas
preempted, and the pods' evictions still to carry out.

A replica that fits nowhere may take away lower-priority pods and replicas where
`binder.framework.preemption` finds room (as for a pod; not with preemptionPolicy Never). The room
is held for it in the ledger under `held_uid` (never its own uid, which would read as placed) until
it is placed there or gives up; the victim replicas are handed to `drain` (the placer's),
the victim pods queued as an `Eviction` for the controller to carry out off the loop. A replica
whose victims are still leaving (still charged, or terminating) waits for them instead of preempting
again. Each held room is written in its model's `status.nominations` with a proof signed for the
held uid (so it never proves a placement); a new leader holds those whose proofs verify again before
it places anything (`restore`), and drops one whose node or GPU is gone, whose replica is placed, or
whose model changed its GPU memory or is gone. No I/O, no clock (time is passed in).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container
from dataclasses import dataclass, replace

from binder.cluster.chargedpods import sign
from binder.cluster.ledger import Ledger
from binder.cluster.modelviews import ModelInfo
from binder.cluster.objects import PodInfo
from binder.framework.placement import (
    Policy,
    Unschedulable,
    choose_gpu,
    fit_message,
    resolvable_nodes,
)
from binder.framework.preemption import NoPreemption, lower_holds, preempt, stale_room
from common.hosted import replica_uid
from common.proofs import KeyRing

log = logging.getLogger(__name__)

HELD = "#nominated"
REFUSED_RETRY_SECONDS = 10.0
"""How long a replica whose victims' eviction the API server refused (their PodDisruptionBudget)
waits before it preempts again (a pod waits out its backoff)."""


def held_uid(rid: str) -> str:
    """The uid under which the room a replica's preemption made is held: no pod's or replica's
    (a "#")."""
    return f"{rid}{HELD}"


def _model_of(rid: str) -> str:
    return rid.rpartition("/")[0]


@dataclass(frozen=True)
class Nomination:
    """The room a replica's preemption holds: its node, GPU and the proof of the hold."""

    node: str
    gpu: str
    proof: str
    victims: frozenset[str] = frozenset()
    """The uids of the pods and replicas taken away for it on its node, known to the leader that
    decided it only (a new leader sees them terminating or draining)."""


def _held(model: ModelInfo, ordinal: int) -> PodInfo:
    """The replica as its held room is charged and signed: under `held_uid`."""
    replica = model.replica(ordinal)
    return replace(replica, uid=held_uid(replica.uid))


@dataclass(frozen=True)
class Eviction:
    """A preemption decided for a replica whose victim pods are still to be evicted."""

    model: ModelInfo
    ordinal: int
    node: str
    pods: list[PodInfo]
    drained: list[str]
    """The keys of the victim replicas, drained already."""

    @property
    def by(self) -> str:
        """The preemptor, as a victim's Event names it (by uid, as kube-scheduler names pods)."""
        return f"TritonModel replica {self.model.uid}/{self.ordinal}"


class ReplicaPreemption:
    """The placer's preemption bookkeeping, changed on the loop only."""

    def __init__(
        self,
        ledger: Ledger,
        policy: Policy,
        *,
        enabled: bool,
        drain: Callable[[PodInfo, str, str], None],
        ring: Callable[[], KeyRing],
    ) -> None:
        """`drain(victim, by, node)`: take a victim replica away (the placer's);
        `ring`: the placement keys the held rooms' proofs are signed and verified with."""
        self._ledger = ledger
        self._policy = policy
        self._enabled = enabled
        self._drain = drain
        self._ring = ring
        self.preempted: dict[str, tuple[str, bool]] = {}
        """Replica uid -> why it was preempted, and whether its Event is written: until it is
        placed again (or scaled away)."""
        self._nominations: dict[str, Nomination] = {}
        """Replica uid -> the room its preemption made."""
        self.evictions: list[Eviction] = []
        self._refused: dict[str, float] = {}
        """Replica uid -> when (seconds since the epoch) it may preempt again."""

    def victim(self, rid: str, why: str) -> None:
        self.preempted[rid] = (why, False)

    def is_held(self, uid: str) -> bool:
        """Whether the uid is a held room's (a victim of a higher priority: it is given up)."""
        if not uid.endswith(HELD):
            return False
        self.drop(uid.removesuffix(HELD))
        return True

    def take_room(self, rid: str) -> str:
        """Before the replica is placed: its held room is its own to take, on that node first
        (the node returned, "" without one); held again only if it still waits (`decide`)."""
        held = self._nominations.get(rid)
        if held is None:
            return ""
        self._ledger.state.release_nomination(held_uid(rid))
        return held.node

    def placed(self, rid: str) -> None:
        self._nominations.pop(rid, None)
        self.preempted.pop(rid, None)
        self._refused.pop(rid, None)

    def refused(self, rid: str, now: float) -> None:
        """The eviction of the replica's victims was refused: its held room is given up, and it
        preempts again no sooner than REFUSED_RETRY_SECONDS."""
        self.drop(rid)
        self._refused[rid] = now + REFUSED_RETRY_SECONDS

    def drop(self, rid: str) -> None:
        """The replica gives up its held room."""
        if self._nominations.pop(rid, None) is not None:
            self._ledger.state.release_nomination(held_uid(rid))

    def held_ordinals(self, model_uid: str) -> list[int]:
        """The ordinals of the model's replicas that hold a room."""
        return [int(r.rpartition("/")[2]) for r in self._nominations if _model_of(r) == model_uid]

    def holds(self, rid: str) -> bool:
        """Whether the replica holds a room its preemption made (it waits for its victims)."""
        return rid in self._nominations

    def forget(self, model_uid: str) -> None:
        """The model is gone: what its replicas held or were preempted."""
        self.keep(model_uid, (), ())

    def keep(self, model_uid: str, wanted: Container[str], draining: Container[str]) -> list[int]:
        """What the model's replicas other than the `wanted` ones (those to be placed) held or
        were preempted is dropped (the model was scaled down, or its roll ended), but the
        preemptions of those still draining; returns the ordinals of its replicas that still
        hold a room."""
        for rid in [r for r in self._nominations if _model_of(r) == model_uid]:
            if rid not in wanted:
                self.drop(rid)
        for rid in [r for r in self.preempted if _model_of(r) == model_uid]:
            if rid not in wanted and rid not in draining:
                del self.preempted[rid]
        for rid in [r for r in self._refused if _model_of(r) == model_uid]:
            if rid not in wanted:
                del self._refused[rid]
        return self.held_ordinals(model_uid)

    def nominations(self, model_uid: str) -> list[dict[str, object]]:
        """The model's `status.nominations`: the rooms held for its replicas in the ledger."""
        nominated = self._ledger.state.nominated
        held = sorted(
            (
                (int(rid.rpartition("/")[2]), room)
                for rid, room in self._nominations.items()
                if _model_of(rid) == model_uid and held_uid(rid) in nominated
            ),
            key=lambda pair: pair[0],
        )
        return [
            {"replica": ordinal, "node": room.node, "gpu": room.gpu, "proof": room.proof}
            for ordinal, room in held
        ]

    def restore(self) -> None:
        """On taking the lead, before anything is placed: the rooms the models' statuses say
        are held (a leader before wrote them) are held again in the ledger, and what this
        replica held when it led before is forgotten. One whose proof does not verify, whose
        node or GPU is gone, whose replica is placed, or whose model changed its GPU memory is
        dropped (its status loses it at the next reconcile)."""
        for rid in list(self._nominations):
            self.drop(rid)
        ring = self._ring()
        for model in list(self._ledger.models.values()):
            for ordinal, (node, gpu, proof) in sorted(model.nominated.items()):
                why = self._stale(model, ordinal, Nomination(node, gpu, proof), ring)
                if why:
                    log.info(
                        "Replica %d of TritonModel %s no longer holds the room on node %s its "
                        "preemption made under the previous leader (%s): it is placed anew.",
                        ordinal,
                        model.key,
                        node,
                        why,
                    )
                    continue
                self._ledger.state.nominate(_held(model, ordinal), node, gpu)
                self._nominations[replica_uid(model.uid, ordinal)] = Nomination(node, gpu, proof)
                log.info(
                    "Replica %d of TritonModel %s holds its room on node %s (GPU %s), which its "
                    "preemption made under the previous leader: it waits there for its victims.",
                    ordinal,
                    model.key,
                    node,
                    gpu,
                )

    def _stale(self, model: ModelInfo, ordinal: int, room: Nomination, ring: KeyRing) -> str:
        """Why a room a status says is held for the replica is not held again ("" if it is)."""
        state = self._ledger.state
        if state.is_accounted(replica_uid(model.uid, ordinal)):
            return "the replica is placed"
        held = _held(model, ordinal)
        return stale_room(state, held, room.node, room.gpu, room.proof, ring)

    def unwritten(self, model_uid: str) -> list[str]:
        """Why each replica of the model preempted since the last call was, now written."""
        found = []
        for rid, (why, written) in sorted(self.preempted.items()):
            if not written and _model_of(rid) == model_uid:
                self.preempted[rid] = (why, True)
                found.append(why)
        return found

    def decide(
        self, model: ModelInfo, ordinal: int, replica: PodInfo, result: Unschedulable, now: float
    ) -> str:
        """A replica that fits nowhere (`result`): hold the room where taking away
        lower-priority pods and replicas lets it in, drain those replicas and queue the pods'
        eviction; or keep the held room while its victims are still leaving. Returns the
        refusal to report: kube-scheduler's, with its `preemption: ...` counts when preemption
        cannot help."""
        state = self._ledger.state
        rid = replica.uid
        held = self._nominations.get(rid)
        if (
            not self._enabled
            or result.condition_reason != "Unschedulable"
            or not state.tallies.has_lower_priority(replica.priority)
            or now < self._refused.get(rid, 0.0)
        ):
            self.drop(rid)
            return result.message
        if held is not None and any(pod.uid in held.victims for pod, _ in state.pods_on(held.node)):
            # Its victims are still leaving its node, even before the cache shows them so.
            state.nominate(replace(replica, uid=held_uid(rid)), held.node, held.gpu)
            return result.message
        outcome = preempt(
            state,
            replica,
            resolvable_nodes(state, replica, now),
            now=now,
            budgets=self._ledger.all_budgets(),
        )
        if isinstance(outcome, NoPreemption):
            if outcome.waiting and held is not None and held.node in state.nodes:
                state.nominate(replace(replica, uid=held_uid(rid)), held.node, held.gpu)
                return result.message
            self.drop(rid)
            if not outcome.reasons:
                return result.message
            counts = fit_message(len(state.names), outcome.reasons)
            return f"{result.message} preemption: {counts}"
        with state.without([v.uid for v in outcome.victims] + lower_holds(state, replica)):
            gpu = choose_gpu(
                state, outcome.node, replica.request, self._policy, on_demand=replica.on_demand
            )
        if gpu is None:
            return result.message
        room = replace(replica, uid=held_uid(rid))
        state.nominate(room, outcome.node, gpu.uuid)
        proof = sign(self._ring(), room, outcome.node, gpu.uuid)
        victims = frozenset(v.uid for v in outcome.victims)
        self._nominations[rid] = Nomination(outcome.node, gpu.uuid, proof, victims)
        replicas = [v for v in outcome.victims if v.host is not None]
        eviction = Eviction(
            model,
            ordinal,
            outcome.node,
            [v for v in outcome.victims if v.host is None],
            [v.key for v in replicas],
        )
        log.info(
            "Replica %d of TritonModel %s (priority %d) fits nowhere: preempting %d "
            "lower-priority pod(s) and replica(s) on node %s (%s); GPU %s is held for it.",
            ordinal,
            model.key,
            replica.priority,
            len(outcome.victims),
            outcome.node,
            ", ".join(v.key for v in outcome.victims),
            gpu.uuid,
        )
        for victim in replicas:
            self._drain(victim, eviction.by, outcome.node)
        self.evictions.append(eviction)
        return result.message
