"""The TritonModel replicas' placer: which replicas of a model leave, drain, are kept or are
placed in its turn, and why one is not. No I/O.

Replicas past spec.replicas (those not served first, then those on previous files, then the highest
ordinals) leave: one loaded on its host drains (out of its Service, still charged) until its host
no longer has it loaded, or for the drain's bound; one wanted again meanwhile on the same files is
taken back where it is. Each missing replica is placed at the lowest free ordinal, while the
namespace's ResourceQuotas allow it (`binder.framework.quota`), by the binder's own `place`, charged
at once and signed (`binder.cluster.chargedpods.sign`), at most PLACEMENTS_PER_TURN a turn: placing
stops at the first refusal, the rest only counted (`Missing`). A replica that fits nowhere may
preempt lower-priority pods and replicas (`binder.framework.replicapreemption`); one preempted
drains as one scaled away does. A new spec.storageUri rolls a step per turn
(`binder.tritonmodels.rolling`). A model whose only served host is replaced wants one replica more,
a stand-in on no node of that host (`binder.tritonmodels.hostreplace`). A replica on a lost node
(tainted `unreachable` or `not-ready` NoExecute, its host evicted) is placed again elsewhere. A
model at zero replicas is parked on a host of its namespace (`binder.autoscaler.parkedmodels`).
What lets a turn place (`Admission`: the model's problems, the quotas' room) is read once at its
start. Changes the ledger's charges, drains and parkings only; the controller writes what it
decides.
"""

from __future__ import annotations

import bisect
import logging
import sys
import time
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import NamedTuple

from binder.autoscaler.parkedmodels import park_node, parked_on
from binder.cluster.chargedpods import proven, sign
from binder.cluster.ledger import Ledger
from binder.cluster.modelviews import ModelInfo
from binder.cluster.objects import PodInfo
from binder.cluster.priorities import CLASS_NOT_FOUND
from binder.framework.moves import PREEMPTED
from binder.framework.placement import Placement, Policy, place
from binder.framework.quota import EXCEEDED_QUOTA, QuotaCheck, replica_quota
from binder.framework.replicapreemption import ReplicaPreemption
from binder.tritonmodels.replicabook import ReplicaBook
from binder.tritonmodels.rolling import UNSUPPORTED_STORAGE, Roll, Rollout
from binder.tritonmodels.serving import Serving, node_lost
from common.contract import Keys
from common.hosted import (
    HostedError,
    decode_hosted,
    group_namespace,
    hosted_models_annotation,
    replica_uid,
)
from common.proofs import KeyRing

log = logging.getLogger(__name__)

PLACEMENTS_PER_TURN = 100
"""The most replicas one model's turn places; a model wanting more has another turn after the
other namespaces' (replicas may share nodes, so a scaled model is bounded by GPU memory, not by
the node count: a turn's cost stays bounded whatever spec.replicas says)."""


Hosted = frozenset[tuple[int, str, bool, str, str, int, bool | None]]
"""A model's charged replicas as its hosts serve them: (ordinal, node, draining, files, storage
Secret: which of the node's hosts, minAvailable: their budget, idempotent: what their proxy does
with a lost call); ordinal -1: parked on that node's host at zero replicas."""


class Outcome(NamedTuple):
    """What a model's turn came to, for its status."""

    placed: dict[int, PodInfo]
    """The model's charged replicas not draining, by ordinal."""
    refusal: str
    """Why the first refused replica is not placed ("" when all are)."""
    waiting: str
    """Which wanted replica waits for its previous placement to drain ("" when none)."""
    roll: Roll
    reason: str = "Unschedulable"
    """The `Placed` condition's reason while a replica is refused or waits."""
    unfinished: bool = False
    """PLACEMENTS_PER_TURN were placed and more are wanted: the model has another turn."""
    hosted: Hosted = frozenset()
    """The model's charged replicas as its hosts are to serve them (`Hosted`)."""


@dataclass
class Admission:
    """Whether a model's replicas may be placed in its turn, decided once at its start: why none
    may be (its files, its PriorityClass, another model of its id), and how many more the
    namespace's GPU memory quotas allow (`binder.framework.quota`), counted down as they are
    placed."""

    problem: str = ""
    room: int = sys.maxsize
    exceeded: str = ""
    """The quotas' refusal of the replica past `room`."""
    quota: QuotaCheck | None = None
    booked: int = 0
    """Bytes booked for the replicas placed in this turn."""
    refused: bool = False
    """Whether a quota refused a replica (the condition's reason is then EXCEEDED_QUOTA)."""

    def allows(self) -> bool:
        """Whether the quotas allow one more replica."""
        self.refused = self.refused or self.room <= 0
        return self.room > 0

    def take(self, request: int) -> None:
        """A replica placed, booking `request` bytes."""
        self.room -= 1
        self.booked += request

    def refusal_once_gone(self, leaving: int, request: int, allowance: int) -> str:
        """The quotas' refusal of a replica of `request` bytes once a placement of `leaving`
        bytes has left ("" when they allow it)."""
        if self.quota is None:
            return ""
        exceeded = self.quota.refusal_after(self.booked - leaving, request, allowance)
        self.refused = self.refused or bool(exceeded)
        return exceeded


class Missing(Container[str]):
    """The replicas of a model to place: the `count` lowest ordinals not in `placed` (and a
    roll's surge replica `extra`), never listed, so a model of 10^9 replicas costs what its
    placed ones do."""

    def __init__(self, model_uid: str, placed: Iterable[int], count: int, extra: str = "") -> None:
        self._uid = model_uid
        self._placed = sorted(placed)
        self._placed_set = set(self._placed)
        self.count = max(0, count)
        self._extra = extra
        self._stop: int | None = None

    def __contains__(self, uid: object) -> bool:
        if uid == self._extra:
            return True
        if not isinstance(uid, str) or uid.rpartition("/")[0] != self._uid:
            return False
        ordinal = int(uid.rpartition("/")[2])
        rank = ordinal - bisect.bisect_left(self._placed, ordinal)  # free ordinals before it
        return ordinal not in self._placed_set and rank < self.count

    def stop_at(self, ordinal: int) -> None:
        """Past `ordinal`, only the ordinals that hold something are walked."""
        self._stop = ordinal

    def ordinals(self, kept: list[int]) -> Iterator[int]:
        """The missing ordinals in order: every one up to `stop_at`, then those of `kept`."""
        given = ordinal = 0
        while given < self.count:
            if self._stop is not None:
                for later in kept:
                    if later > self._stop and f"{self._uid}/{later}" in self:
                        yield later
                return
            if ordinal not in self._placed_set:
                given += 1
                yield ordinal
            ordinal += 1


def listed_draining(
    ledger: Ledger, keys: Keys, ring: KeyRing
) -> Iterator[tuple[ModelInfo, PodInfo, str]]:
    """The replicas the hosts list as draining that the ledger does not charge, whose proofs
    verify for their models as they are now: (model, replica as charged, its files)."""
    state = ledger.state
    annotation = hosted_models_annotation(keys)
    for group, hosts in ledger.hosts.items():
        namespace = group_namespace(group)
        for node, host in hosts.items():
            value = ((host.get("metadata") or {}).get("annotations") or {}).get(annotation)
            try:
                entries = decode_hosted(str(value or ""))
            except HostedError:
                continue  # not the binder's writing: rewritten at the next reconcile
            for entry in entries:
                model = ledger.models.get(entry.uid)
                if (
                    not entry.draining
                    or model is None
                    or model.namespace != namespace
                    or model.name != entry.model
                    or state.is_accounted(entry.replica_uid)
                ):
                    continue
                replica = model.replica(entry.replica, node, entry.gpu, entry.proof)
                verdict = proven(replica, ring)
                if isinstance(verdict, PodInfo):
                    yield model, verdict, entry.storage_uri


def listed_parked(ledger: Ledger, keys: Keys) -> Iterator[tuple[ModelInfo, str]]:
    """The models the hosts' parked-models annotations name, each with the node of the first
    host (by node) that names it: (model, node). Only a model that the built-in autoscaler
    scales, of the host's namespace and storage Secret."""
    by_name = {(m.namespace, m.name, m.storage_secret): m for m in ledger.models.values()}
    seen: set[str] = set()
    for group, hosts in ledger.hosts.items():
        namespace, _, secret = group.partition("/")
        for node in sorted(hosts):
            for name in parked_on(hosts[node], keys):
                model = by_name.get((namespace, name, secret))
                if model is not None and model.autoscaling is not None and model.uid not in seen:
                    seen.add(model.uid)
                    yield model, node


def wanted_replicas(model: ModelInfo, old: list[int], stand_in: bool) -> int:
    """spec.replicas, and one more while a stand-in serves the model as its host is replaced
    (`stand_ins`: for a model at zero, parked on that host, the one replica that holds its
    requests meanwhile; none during a roll: its surge stands in)."""
    return model.replicas + (1 if not old and stand_in else 0)


def no_room_once_gone(
    ledger: Ledger,
    policy: Policy,
    model: ModelInfo,
    ordinal: int,
    leaving: PodInfo,
    admission: Admission,
) -> str:
    """Why replica `ordinal` would fit nowhere on spec.storageUri once `leaving` (its placement
    on previous files) is gone ("" when it would fit)."""
    template = model.template  # every replica's request
    exceeded = admission.refusal_once_gone(leaving.request, template.request, template.allowance)
    if exceeded:
        return exceeded
    replica = model.replica(ordinal)
    state = ledger.state
    with state.without([leaving.uid]):
        decision = place(state, replica, now=time.time(), policy=policy)
    return "" if isinstance(decision, Placement) else decision.message


class ReplicaPlacer:
    """Places, keeps and drains the replicas of the ledger's models, on the loop."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        keys: Keys,
        policy: Policy,
        placement_keys: Callable[[], KeyRing],
        serving: Serving,
        book: ReplicaBook,
        drain_seconds: float,
        preemption: bool,
        clock: Callable[[], float],
        changed: Callable[[str], None],
    ) -> None:
        """`book`: the replicas' drains and the models' parks, written here; their stand-ins
        (`binder.tritonmodels.hostreplace`'s), read: a model with one wants one replica more, on
        no such node, until the new host serves it (`binder.tritonmodels.replicabook`).
        `changed(uid)`: a model whose replicas changed outside its turn (a replica preempted,
        a drain recovered) is reconciled again."""
        self._ledger = ledger
        self._keys = keys
        self._policy = policy
        self._ring = placement_keys
        self._serving = serving
        self._book = book
        self._drain_seconds = drain_seconds
        self._clock = clock
        self._changed = changed
        self._scaled_away: set[str] = set()
        """The draining replicas this binder drained as their model was scaled down: the only
        ones taken back when wanted again (`_take_back`)."""
        self.preemption = ReplicaPreemption(
            ledger, policy, enabled=preemption, drain=self.preempt, ring=placement_keys
        )
        """The rooms held for the replicas' preemptions, and the evictions decided."""
        self.rollout = Rollout(
            ledger,
            loaded=serving.served,
            leave=self._leave,
            holds=self.preemption.holds,
            book=book,
        )
        """The replicas' files, and the rolls to new ones."""

    def place(self, model: ModelInfo) -> Outcome:
        """The model's replicas after its turn: those it no longer wants freed or draining, the
        missing ones the namespace's quotas allow placed, its roll a step further, the model
        parked or unparked; why one is refused or waits, with the `Placed` condition's reason;
        and what its hosts are to serve."""
        live, old, admission = self._start(model)
        self._end_drains(model)
        outcome = self._place(model, admission, live, old)
        refusal, waiting = outcome.refusal, outcome.waiting
        preemptions = self.preemption.preempted
        preempted = sorted(r for r in preemptions if r.rpartition("/")[0] == model.uid)
        reason = (
            CLASS_NOT_FOUND
            if refusal and model.priority_problem
            else PREEMPTED
            if preempted and (refusal or waiting)
            else UNSUPPORTED_STORAGE
            if refusal and model.storage_problem
            else EXCEEDED_QUOTA
            if admission.refused
            else "Unschedulable"
        )
        if preempted and refusal and not waiting:
            why = "; ".join(preemptions[r][0] for r in preempted)
            refusal = f"{why}; placed again when it fits: {refusal}"
        return outcome._replace(refusal=refusal, reason=reason, hosted=self._hosted(model))

    def forget(self, model_uid: str) -> None:
        """The model is gone (deleted: garbage collection's, nothing to drain for)."""
        for rid in self._book.drains_of(model_uid):
            self._undrain(rid)
        self.rollout.forget(model_uid)
        self.preemption.forget(model_uid)

    def _hosted(self, model: ModelInfo) -> Hosted:
        """The model's charged replicas as its hosts are to serve them, after it is parked at
        zero replicas on a host of its namespace, or unparked once a replica of it is served
        (`binder.autoscaler.parkedmodels`)."""
        secret, minimum = model.storage_secret, model.min_available
        hosted, nodes, served = set(), [], False
        for rid in self._ledger.replica_uids(model.uid):
            charged = self._ledger.state.charged_pod(rid)
            if charged is None:
                continue
            ordinal, node, draining = (
                int(rid.rpartition("/")[2]),
                charged.node_name,
                self._book.draining(rid),
            )
            uri = self.rollout.uri(model, ordinal)
            hosted.add((ordinal, node, draining, uri, secret, minimum, model.idempotent))
            nodes.append(node)
            served = served or (not draining and self._serving.served(model, charged).ready)
        parked = park_node(
            model,
            current=self._book.parked_at(model.uid),
            replica_nodes=nodes,
            served=served,
            hosts=self._ledger.hosts.get(model.host_group, {}),
            keys=self._keys,
        )
        if parked is None:
            self._book.unpark(model.uid)
        else:
            if self._book.park(model.uid, parked):
                log.info(
                    "TritonModel %s is at zero replicas: parked on node %s.", model.key, parked
                )
            hosted.add((-1, parked, False, "", secret, minimum, False))
        return frozenset(hosted)

    def recover_drains(self) -> None:
        """On taking the lead: the replicas the hosts list as draining, which the binder that
        led before began to drain (no status lists them), are charged again (their proofs
        checked as the cache checks a status's), counted as leaving (a preemptor waits for them
        instead of taking them again), and drain on, from now, to their end. The models the
        hosts park are parked there again before any host is written (or replaced)."""
        for model, node in listed_parked(self._ledger, self._keys):
            if self._book.parked_at(model.uid) is None:
                self._book.park(model.uid, node)
        state = self._ledger.state
        for model, replica, uri in listed_draining(self._ledger, self._keys, self._ring()):
            rid = replica.uid
            state.set_pod(replace(replica, deleting=True))
            self.rollout.files[rid] = uri
            spans = self._ledger.spans
            spans[model.uid] = max(spans.get(model.uid, 0), int(rid.rpartition("/")[2]) + 1)
            self._book.drain(rid)
            self._changed(model.uid)

    def preempt(self, victim: PodInfo, by: str, node: str) -> None:
        """A replica chosen as a preemption victim (on the loop, by the binder's pod scheduling
        or by a replica of higher priority): it leaves its Service and drains from its host as
        a replica scaled away does, counted as leaving (no other preemption takes it again),
        and is placed again once gone: elsewhere, or `Placed` False saying why."""
        rid = victim.uid
        if self.preemption.is_held(rid):
            return  # the room held for a lower-priority replica: it tries again
        state = self._ledger.state
        charged = state.charged_pod(rid)
        if charged is None or self._book.draining(rid):
            return
        ordinal = rid.rpartition("/")[2]
        self.preemption.victim(rid, f"replica {ordinal} was preempted by {by} on node {node}")
        self._book.drain(rid)
        state.set_pod(replace(charged, deleting=True))
        log.info(
            "Replica %s of TritonModel %s on node %s is preempted by %s: it drains from its "
            "host and is placed again once gone.",
            ordinal,
            victim.namespace + "/" + victim.name.rpartition("/")[0],
            node,
            by,
        )
        self._changed(rid.rpartition("/")[0])

    def _start(self, model: ModelInfo) -> tuple[dict[int, PodInfo], list[int], Admission]:
        """What the model's turn starts from: its live replicas (those draining aside: the same
        once their drains end), those of them on previous files, and what lets replicas be
        placed when one is to be (fewer live than wanted, or some on previous files)."""
        live = self._live(model)
        old = self.rollout.old(model, live)
        stand_in = self._book.stand_in(model.uid) is not None
        if len(live) >= wanted_replicas(model, old, stand_in) and not old:
            return live, old, Admission()
        problem = model.storage_problem or model.priority_problem or self._ledger.name_clash(model)
        quota = replica_quota(self._ledger, self._keys, model)
        if quota is None:
            return live, old, Admission(problem)
        return live, old, Admission(problem, quota.room, quota.exceeded, quota.check)

    def _place(
        self, model: ModelInfo, admission: Admission, placed: dict[int, PodInfo], old: list[int]
    ) -> Outcome:
        """The model's charged replicas after freeing or draining those it no longer wants,
        placing the missing ones that `admission` allows and taking its roll to new files a step
        (`binder.tritonmodels.rolling`); the refusal of the first refused or that fits nowhere
        ("" when all fit); which wanted replica waits for its previous placement to drain (""
        when none); where the roll stands; and whether more are wanted than a turn places.
        `placed`: its live replicas (changed here); `old`: those on previous files."""
        state = self._ledger.state
        wanted_count = wanted_replicas(model, old, self._book.stand_in(model.uid) is not None)
        allowed = wanted_count + (1 if old and model.replicas else 0)
        if len(placed) > allowed:
            # Scaled down: as a ReplicaSet, those not served leave first (the served ones keep
            # the model answering, and its minAvailable); then those on previous files, then
            # the highest.
            newer = sorted((o for o in placed if o not in old), reverse=True)
            order = sorted(old + newer, key=lambda o: self._serving.served(model, placed[o]).ready)
            for ordinal in order[: len(placed) - allowed]:
                leaving = placed.pop(ordinal)
                self._leave(model, leaving)
                if self._book.draining(leaving.uid):
                    self._scaled_away.add(leaving.uid)
            old = [o for o in old if o in placed]
        refusal = waiting = ""
        missing = Missing(model.uid, placed, wanted_count - len(placed))
        wanted: Container[str] = missing
        if old and model.replicas:
            wanted = Missing(model.uid, placed, missing.count, self.rollout.surge_uid(model))
        held = self.preemption.keep(model.uid, wanted, set(self._book.drains_of(model.uid)))
        turn_left, unfinished = PLACEMENTS_PER_TURN, False
        for ordinal in missing.ordinals(self._kept(model, held)):
            rid = replica_uid(model.uid, ordinal)
            charged = state.charged_pod(rid)
            if charged is not None:
                kept = self._take_back(model, ordinal, charged, admission)
                if kept is not None:
                    placed[ordinal] = kept
                    continue
                # Preempted, or wanted again on other files: placed again, as any new replica,
                # once the old placement has left.
                preempted = self.preemption.preempted.get(rid)
                again = (
                    f"replica {ordinal} is placed again once its previous placement on node "
                    f"{charged.node_name} has drained"
                )
                waiting = waiting or (f"{preempted[0]}; {again}" if preempted else again)
                continue
            if refusal:
                self.preemption.take_room(rid)  # its held room given up: it waits its turn
                continue
            if turn_left == 0:
                unfinished = True
                break
            outcome = self._place_one(model, ordinal, admission)
            if isinstance(outcome, PodInfo):
                placed[ordinal] = outcome
                turn_left -= 1
            else:
                refusal = outcome
                missing.stop_at(ordinal)  # the rest only counted, but held rooms and drains
        if refusal and len(placed) >= model.replicas:
            refusal = ""  # a stand-in's: the model is served; its host's replacement waits
        if refusal or waiting or len(placed) < model.replicas:
            roll = self.rollout.where(model, placed, old, "")
        else:
            roll = self.rollout.step(
                model,
                placed,
                old,
                place_surge=lambda ordinal: self._place_one(model, ordinal, admission),
                no_room_once_gone=lambda ordinal, leaving: no_room_once_gone(
                    self._ledger, self._policy, model, ordinal, leaving, admission
                ),
            )
        return Outcome(placed, refusal, waiting, roll, unfinished=unfinished)

    def _take_back(
        self, model: ModelInfo, ordinal: int, charged: PodInfo, admission: Admission
    ) -> PodInfo | None:
        """Replica `ordinal`, wanted again while its previous placement drains, kept where it
        is (as Knative's activator keeps a revision's last pod): its drain ends, it is charged
        as placed now (assumed until the status shows it) and listed on its host as not
        draining, back in its Service once loaded there (its host's loader loads it again if
        it had unloaded it). Only one this binder saw scaled away (not preempted, nor a drain
        a new leader found under way, whose cause it cannot know), on spec.storageUri, whose
        proof verifies for the model as it is now, and that the namespace's quotas allow;
        None: it drains on."""
        rid = charged.uid
        if (
            rid not in self._scaled_away
            or rid in self.preemption.preempted
            or self.rollout.uri(model, ordinal) != model.storage_uri
        ):
            return None
        if not admission.allows():
            return None
        node, gpu, proof = charged.node_name, charged.gpu_uuid, charged.placement
        replica = model.replica(ordinal)
        if not isinstance(proven(replica.bound(node, gpu, proof), self._ring()), PodInfo):
            return None
        self._undrain(rid)
        self._ledger.state.assume(replica, node, gpu, proof)
        admission.take(replica.request)
        log.info(
            "Replica %d of TritonModel %s is wanted again while it drains: kept on node %s, "
            "served there again once loaded.",
            ordinal,
            model.key,
            node,
        )
        return replica.bound(node, gpu, proof)

    def _kept(self, model: ModelInfo, held: list[int]) -> list[int]:
        """The ordinals of the model that hold something past a refusal: a charge (draining, or
        preempted), or a room its preemption `held`."""
        kept = {int(rid.rpartition("/")[2]) for rid in self._ledger.replica_uids(model.uid)}
        kept.update(held)
        return sorted(kept)

    def _place_one(self, model: ModelInfo, ordinal: int, admission: Admission) -> PodInfo | str:
        """Replica `ordinal` placed (on the room its preemption held first), charged (assumed)
        and signed, with spec.storageUri; or why it is not. One that fits nowhere may preempt
        lower-priority pods and replicas (`binder.framework.replicapreemption`)."""
        state = self._ledger.state
        replica = model.replica(ordinal)
        avoid = self._book.stand_in(model.uid)
        if avoid:  # a stand-in, and any replica placed beside it: not where the host is replaced
            replica = replace(replica, constraints=replica.constraints.avoiding(avoid))
        nominated = self.preemption.take_room(replica.uid)
        if nominated:
            replica = replace(replica, nominated_node=nominated)
        refused = admission.problem or ("" if admission.allows() else admission.exceeded)
        if refused:
            return f'tritonmodel "{model.name}" replica {ordinal}: {refused}'
        now = time.time()
        decision = place(state, replica, now=now, policy=self._policy)
        if not isinstance(decision, Placement):
            message = self.preemption.decide(model, ordinal, replica, decision, now)
            return f"replica {ordinal}: {message}"
        self.preemption.placed(replica.uid)
        proof = sign(self._ring(), replica, decision.node, decision.gpu.uuid)
        state.assume(replica, decision.node, decision.gpu.uuid, proof)
        spans = self._ledger.spans
        spans[model.uid] = max(spans.get(model.uid, 0), ordinal + 1)
        admission.take(replica.request)
        self.rollout.files[replica.uid] = model.storage_uri
        return replica.bound(decision.node, decision.gpu.uuid, proof)

    def _live(self, model: ModelInfo) -> dict[int, PodInfo]:
        """The model's charged replicas that are not draining, by ordinal. One on a lost node
        (`_lost`) is freed, to be placed again elsewhere."""
        state = self._ledger.state
        live = {}
        for rid in self._ledger.replica_uids(model.uid):
            charged = state.charged_pod(rid)
            if charged is not None and self._lost(model, charged.node_name):
                log.warning(
                    "Replica %s of TritonModel %s: node %s is lost (unreachable or not ready)"
                    " and its host evicted: placed again elsewhere.",
                    rid.rpartition("/")[2],
                    model.key,
                    charged.node_name,
                )
                self._free(rid)
                continue
            if charged is not None and not self._book.draining(rid):
                live[int(rid.rpartition("/")[2])] = charged
        return live

    def _lost(self, model: ModelInfo, node: str) -> bool:
        """Whether `node` is lost to the model's replicas: tainted NoExecute `unreachable` or
        `not-ready` (kube's node lifecycle controller: its kubelet silent past its grace) and
        the namespace's host there evicted or gone. Its kubelet gone, an evicted host stays
        Terminating until the node comes back, as a ReplicaSet's pod does; as a ReplicaSet,
        the model replaces it elsewhere (the taint keeps placements off the node)."""
        if not node_lost(self._ledger, node):
            return False
        host = self._ledger.hosts.get(model.host_group, {}).get(node)
        return host is None or bool((host.get("metadata") or {}).get("deletionTimestamp"))

    def _leave(self, model: ModelInfo, replica: PodInfo) -> None:
        """`replica` leaves: one loaded on its host drains first (out of the Service, listed as
        draining) until its host no longer has it loaded or the drain's bound passes
        (`_end_drains`); another is freed at once."""
        if self._serving.loaded(model, replica).ready:
            self._book.drain(replica.uid)
        else:
            self._free(replica.uid)

    def _free(self, rid: str) -> None:
        self._undrain(rid)
        self.rollout.files.pop(rid, None)
        self._ledger.state.remove_pod(rid)
        self._ledger.state.untrack_pod(rid)

    def _end_drains(self, model: ModelInfo) -> None:
        """Each drain of the model ends once its host no longer has the replica loaded or its
        bound passes (or, wanted again, it is taken back: `_take_back`)."""
        state = self._ledger.state
        now = self._clock()
        for rid in self._book.drains_of(model.uid):
            charged = state.charged_pod(rid)
            if charged is None or not state.is_accounted(rid):
                self._undrain(rid)  # freed meanwhile (its node went away)
                self.rollout.files.pop(rid, None)
                continue
            if not self._serving.loaded(model, charged).ready:
                self._free(rid)
                continue
            if now < self._book.drain_ends(rid):
                continue
            log.warning(
                "Replica %s of TritonModel %s is still loaded on node %s after the "
                "%g s drain bound: removing it from its host.",
                rid.rpartition("/")[2],
                model.key,
                charged.node_name,
                self._drain_seconds,
            )
            self._free(rid)

    def _undrain(self, rid: str) -> None:
        self._scaled_away.discard(rid)
        self._book.undrain(rid)
