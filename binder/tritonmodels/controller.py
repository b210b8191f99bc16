"""The TritonModel writer: places each model's replicas, writes its status, and keeps its
namespace's model hosts and its Service.

While this replica leads, a model the cache reports changed (`changed`) is reconciled in its turn of
the binder's one loop (`turn_of`): replicas past `spec.replicas` (those on previous files first,
then the highest ordinals) leave (`_leave`); each missing replica is placed at the lowest free
ordinal, while the namespace's ResourceQuotas allow it (`binder.framework.quota`), by the binder's
own `place` (every rule a pod is placed by, `as_replica`; several may share a node, a node without
one preferred), charged at once (assume) and signed (`binder.cluster.proofs.sign`: namespace, model,
ordinal and the model's uid, node, GPU, GPU memory and residency, so a proof copied to another
replica, model or node does not verify). Each replica keeps the storageUri it was placed with; a new
spec.storageUri rolls a step per reconcile (`binder.tritonmodels.rolling`: a surge replica first,
maxSurge 1 and maxUnavailable 0). Then, off the loop:

- `status` through the status subresource: `placements[]` ({replica, node, gpu, proof, host,
  ready, message, storageUri}), `nominations[]` (the rooms held for its replicas' preemptions:
  {replica, node, gpu, proof}, only while there are some), `replicas`, `readyReplicas` (and
  `availableReplicas`), `updatedReplicas`, `selector`, `observedGeneration`, the `Placed`
  condition (False with kube-scheduler's refusal when a replica fits nowhere, and a Warning
  Event `FailedScheduling` on the model, written only when the refusal changes), the `Ready`
  condition (False naming the replicas not served and why, and a Warning Event
  `ReplicaNotServed` per replica and reason the agent gives, or per message for a host's loader
  failing to load it: its reason, FetchFailed, ModelInvalid..., is then Ready's) and the
  `Progressing` condition (the roll);
- the namespace's model hosts (`binder.tritonmodels.hostwriter`: one pod per node with a replica
  there, or a model of it parked at zero replicas, `binder.autoscaler.parking`), each labelled
  `<prefix>serves-<model>` for a replica not draining that `binder.tritonmodels.serving` routes
  there (from the agent's loaded condition on the host, `host_changed`; awake first, judged on
  the autoscaler's readings, `observe_load`);
- the model's Service (same name, owned by the model): ports http 9000 and grpc 9001, selecting
  the hosts labelled `<prefix>serves-<model>`, so it reaches exactly the hosts where the model
  is loaded.

A replica that leaves while loaded is first marked `draining` with its label removed (one
write), and stays charged until its host's loaded condition is no longer True, or for
--host-drain-seconds at most; the host's loader and proxy drain and unload it meanwhile. A
replica wanted again meanwhile (scaled back up: a request at zero) on the same files is taken
back (`_take_back`: as Knative's activator keeps a revision's last pod): kept where it is, listed
not draining, back in its Service once loaded (its loader loads it again if it had unloaded it);
one preempted or on other files waits for its drain (`Placed` False, ReplicaDraining) and is then
placed as any new replica.

Priority and preemption are a pod's: the replicas take their priority from the model's
PriorityClass (`binder.cluster.priorities`; a missing class is refused, PriorityClassNotFound); a
replica that fits nowhere may take away lower-priority pods (evicted) and replicas
(`binder.framework.replicapreemption`); a replica preempted by one, or by a pod (`preempt`), drains
as one scaled away does and is placed again once gone (`Placed` False, reason Preempted, and a
`Preempted` Event, until it is).

Models are reconciled in turns by namespace, in the binder's one queue with its pods
(`binder.reconciler` takes the turns), so a namespace's thousands of models and pods delay
another namespace's by one of theirs. A model with a replica that fits nowhere waits as
kube-scheduler's pods do: retried on a cluster change once its backoff (doubling from
--backoff-initial, at most EVENT_BACKOFF_MAX_SECONDS) has passed, else after its whole wait (up to
--backoff-max). A reconcile costs O(nodes + replicas placed) whatever spec.replicas says: the
placements stop at the first refusal, or after PLACEMENTS_PER_TURN (the model's next turn comes
after the other namespaces'), and the rest is counted, never listed. A namespace whose new
host waits for its old one on the node to be gone, a model whose roll waits, and one whose
reconcile failed are tried again every RETRY_SECONDS. The ledger is the cache's: a restarted binder
charges the replicas whose proofs in status verify, and places the others again; a new leader
first holds again the rooms its predecessor's replica preemptions held (`status.nominations`,
`recover_nominations`), then charges the draining replicas the hosts list whose proofs verify,
counted as leaving, and drains them on (`recover_drains`).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Callable, Container, Iterable, Iterator, Mapping
from concurrent.futures import Executor
from dataclasses import replace
from typing import Any

from binder.api.kube import Kube
from binder.api.session import JsonObject
from binder.autoscaler.parking import park_node
from binder.autoscaler.room import Room, capacity
from binder.cluster.ledger import Ledger
from binder.cluster.modelviews import ModelInfo, event_object, is_replica, owner_reference
from binder.cluster.objects import PodInfo
from binder.cluster.priorities import CLASS_NOT_FOUND
from binder.cluster.proofs import proven, sign
from binder.errors import ApiError, ConflictError
from binder.framework.moves import PREEMPTED, PREEMPTING, EvictionRefusedError, evict_victims
from binder.framework.placement import Placement, Policy, place
from binder.framework.queue import SchedulingQueue
from binder.framework.quota import EXCEEDED_QUOTA, QuotaCheck, check_for, replica_class
from binder.framework.replicapreemption import REFUSED_RETRY_SECONDS, ReplicaPreemption
from binder.tritonmodels.hostwriter import HostWriter
from binder.tritonmodels.rolling import (
    PLACED,
    PROGRESSING,
    ROLLING_WITHOUT_SURGE,
    UNSUPPORTED_STORAGE,
    Roll,
    Rollout,
)
from binder.tritonmodels.serving import HOST_REFUSED, Serving, ordinal_of
from binder.tritonmodels.status import StatusWriter, Write
from common.conditions import Condition, condition_for, find
from common.contract import Keys
from common.hosted import (
    LOAD_FAILURE_REASONS,
    HostedError,
    decode_hosted,
    group_namespace,
    host_name,
    hosted_models_annotation,
    replica_uid,
    serves_label,
)
from common.modelpod import NodeAccess
from common.proofs import KeyRing

log = logging.getLogger(__name__)

RETRY_SECONDS = 1.0
PLACEMENTS_PER_TURN = 100
"""The most replicas one model's turn places; a model wanting more has another turn after the
other namespaces' (replicas may share nodes, so a scaled model is bounded by GPU memory, not by
the node count: a turn's cost stays bounded whatever spec.replicas says)."""
"""How often a model whose roll waits, or whose reconcile failed, is tried again."""
EVENT_BACKOFF_MAX_SECONDS = 10.0
"""The longest backoff of a refused model before a cluster change retries it (kube-scheduler's
podMaxBackoffDuration)."""
READY = "Ready"
"""The condition type: every wanted replica is loaded and served by its host."""
NOT_SERVED_EVENT = "ReplicaNotServed"
"""The Warning Event's reason when the agent reports a replica not loaded on its host."""
QUIET_REASONS = frozenset({"ModelPending", "ModelDrained"})
"""The agent's reasons of a replica on its way in or out: no fault, no Event (as on the host)."""
READY_REASONS_SHOWN = 3
"""Not-ready replicas the Ready condition's message names (then how many more)."""
SERVICE_PORTS = [
    {"name": "http", "port": 9000, "targetPort": "http", "appProtocol": "http"},
    {"name": "grpc", "port": 9001, "targetPort": "grpc", "appProtocol": "kubernetes.io/h2c"},
]
"""As a model pod's Service (deploy/example/model-service.yaml)."""


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


class TritonModelController:
    """Reconciles TritonModels one at a time, on the loop, while this replica leads."""

    def __init__(
        self,
        kube: Kube,
        ledger: Ledger,
        *,
        leading: asyncio.Event,
        keys: Keys,
        policy: Policy,
        placement_keys: Callable[[], KeyRing],
        executor: Executor,
        identity: str,
        scheduler_name: str,
        host_image: str,
        access: NodeAccess,
        drain_seconds: float,
        preemption: bool = True,
        clock: Callable[[], float] = time.monotonic,
        backoff_initial: float = RETRY_SECONDS,
        backoff_max: float = 120.0,
        queue: SchedulingQueue | None = None,
    ) -> None:
        """`queue` is the binder's one queue, shared with its pods (`binder.reconciler` takes
        the turns); None: one of the controller's own (`turn`, the benchmarks')."""
        self._kube = kube
        self._ledger = ledger
        self._leading = leading
        self._keys = keys
        self._policy = policy
        self._ring = placement_keys
        self._executor = executor
        self._identity = identity
        self._drain_seconds = drain_seconds
        self._clock = clock
        self._queue = (
            queue
            if queue is not None
            else SchedulingQueue(
                initial_seconds=backoff_initial,
                max_seconds=backoff_max,
                clock=clock,
                event_backoff_max=min(EVENT_BACKOFF_MAX_SECONDS, backoff_max),
            )
        )
        """The models to reconcile, in turns by namespace (with the pods, when shared); refused
        ones back off (capped: kube-scheduler's backoff)."""
        self._known: set[str] = set()
        """The uids told `changed` and not yet reconciled as gone: the queue's models."""
        self._tick = clock() + RETRY_SECONDS
        self._current: tuple[str, bool] | None = None
        """The model being reconciled, and whether it changed meanwhile."""
        self._retry: set[str] = set()
        """Models tried again every RETRY_SECONDS (a roll that waits, a reconcile that failed)."""
        self._unfinished: set[str] = set()
        """Models whose last turn placed PLACEMENTS_PER_TURN and wants more (`turn`)."""
        self._refused: dict[str, str] = {}
        """Model uid -> the refusal last reported (an Event only when it changes)."""
        self._namespaces: dict[str, str] = {}
        """Model uid -> namespace, to tidy its namespace's hosts once it is gone."""
        self._services: set[str] = set()
        """Models whose Service this replica has written."""
        self._hosts_for: dict[str, frozenset[tuple[int, str, bool, str, str, int]]] = {}
        self._awake_seen: set[tuple[str, str]] = set()
        """(model uid, node) where the model was last seen awake (`_awake_first`)."""
        self._room = Room()
        """The models whose awake replicas have no room: their sleeping ones are served too."""
        self._parked: dict[str, str] = {}
        """Model uid -> the node of the host it is parked on at zero replicas
        (`binder.autoscaler.parking`)."""
        """Model uid -> its (ordinal, node, draining, files) the hosts were last made to
        serve."""
        self._roll_said: dict[str, str] = {}
        """Model uid -> the roll's Warning last recorded as an Event (one per message)."""
        self._stale: set[str] = set()
        """Namespaces whose hosts are all to be checked again."""
        self._hosts_seen: set[tuple[str, str]] = set()
        """(namespace, node) of hosts whose labels, annotation or conditions changed."""
        self._reported: dict[str, str] = {}
        """Replica uid -> the agent's reason for not serving it last reported in an Event."""
        self._draining: dict[str, float] = {}
        """Replica uid -> when its drain ends at the latest (`clock`): past spec.replicas, out
        of its Service, still listed (draining) and charged until its host no longer has it
        loaded. Mirrored in the ledger's `draining`, which keeps the cache from freeing it."""
        self._scaled_away: set[str] = set()
        """The draining replicas this binder drained as their model was scaled down: the only
        ones taken back when wanted again (`_take_back`)."""
        self._writes = StatusWriter(
            kube, executor, identity, leading=leading, on_failed=self._write_failed
        )
        """The models' status writes and refusal Events, off the turns."""
        self._preemption = ReplicaPreemption(
            ledger, policy, enabled=preemption, drain=self.preempt, ring=placement_keys
        )
        self._serving = Serving(
            ledger,
            keys,
            self._draining,
            self._room,
            lambda where: self._hosts.refused.get(where),
        )
        """Whether each replica is served, and which hosts its Service selects."""
        self._rollout = Rollout(
            ledger,
            policy,
            loaded=self._serving.served,
            place_one=self._place_one,
            leave=self._leave,
            holds=self._preemption.holds,
            draining=self._draining,
        )
        self._hosts = HostWriter(
            kube,
            ledger,
            keys=keys,
            executor=executor,
            identity=identity,
            scheduler_name=scheduler_name,
            host_image=host_image,
            access=access,
            drain_seconds=drain_seconds,
            clock=clock,
            draining=self._draining,
            parked=self._parked,
            loaded=self._serving.routable,
            served=self._serving.served,
            serves_value=self._serving.serves_value,
            uri=self._rollout.uri,
            changed=self.changed,
        )
        """The namespace's model hosts (`binder.tritonmodels.hostwriter`)."""

    def hosts_changed(self, namespace: str) -> None:
        """A host of the namespace went away, or waits to: its hosts are all checked again."""
        models = self._ledger.by_namespace.get(namespace)
        if models:
            self._stale.add(namespace)
            self.changed(next(iter(models)))

    def recover_nominations(self) -> None:
        """On taking the lead, before anything is placed: the rooms the previous leader held
        for replicas whose preemption made them are held again (`ReplicaPreemption.restore`)."""
        self._preemption.restore()

    def recover_drains(self) -> None:
        """On taking the lead: the replicas the hosts list as draining, which the binder that
        led before began to drain (no status lists them), are charged again (their proofs
        checked as the cache checks a status's), counted as leaving (a preemptor waits for them
        instead of taking them again), and drain on, from now, to their end."""
        state = self._ledger.state
        now = self._clock()
        for group, hosts in self._ledger.hosts.items():
            namespace = group_namespace(group)
            for node, host in hosts.items():
                annotation = hosted_models_annotation(self._keys)
                value = ((host.get("metadata") or {}).get("annotations") or {}).get(annotation)
                try:
                    entries = decode_hosted(str(value or ""))
                except HostedError:
                    continue  # not the binder's writing: rewritten at the next reconcile
                for entry in entries:
                    model = self._ledger.models.get(entry.uid)
                    rid = entry.replica_uid
                    if (
                        not entry.draining
                        or model is None
                        or model.namespace != namespace
                        or model.name != entry.model
                        or state.is_accounted(rid)
                    ):
                        continue
                    replica = model.replica(entry.replica, node, entry.gpu, entry.proof)
                    verdict = proven(replica, self._ring())
                    if not isinstance(verdict, PodInfo):
                        continue
                    state.set_pod(replace(verdict, deleting=True))
                    self._rollout.files[rid] = entry.storage_uri
                    spans = self._ledger.spans
                    spans[model.uid] = max(spans.get(model.uid, 0), entry.replica + 1)
                    self._draining[rid] = now + self._drain_seconds
                    self._ledger.draining.add(rid)
                    self.changed(model.uid)

    def preempt(self, victim: PodInfo, by: str, node: str) -> None:
        """A replica chosen as a preemption victim (on the loop, by the binder's pod scheduling
        or by a replica of higher priority): it leaves its Service and drains from its host as
        a replica scaled away does, counted as leaving (no other preemption takes it again),
        and is placed again once gone: elsewhere, or `Placed` False saying why."""
        rid = victim.uid
        if self._preemption.is_held(rid):
            return  # the room held for a lower-priority replica: it tries again
        state = self._ledger.state
        charged = state.charged_pod(rid)
        if charged is None or rid in self._draining:
            return
        ordinal = rid.rpartition("/")[2]
        self._preemption.victim(rid, f"replica {ordinal} was preempted by {by} on node {node}")
        self._draining[rid] = self._clock() + self._drain_seconds
        self._ledger.draining.add(rid)
        state.set_pod(replace(charged, deleting=True))
        log.info(
            "Replica %s of TritonModel %s on node %s is preempted by %s: it drains from its "
            "host and is placed again once gone.",
            ordinal,
            victim.namespace + "/" + victim.name.rpartition("/")[0],
            node,
            by,
        )
        self.changed(rid.rpartition("/")[0])

    def host_changed(self, namespace: str, node: str) -> None:
        """A host's labels, annotation or loaded conditions changed (from the cache, on the
        loop): its labels follow its loaded conditions, and the models it serves see their
        ready replicas and drains again. Nothing is placed again."""
        self._hosts_seen.add((namespace, node))
        for pod, _ in self._ledger.state.pods_on(node):
            if pod.namespace == namespace and is_replica(pod.uid):
                self.changed(pod.uid.rpartition("/")[0])
                self._awake_first(pod.uid.rpartition("/")[0], node)
        self._queue.wake()

    def _awake_first(self, uid: str, node: str) -> None:
        """When model `uid` woke or fell asleep (or stopped being served) on `node`, the hosts
        of its other replicas are labelled again: whether a sleeping one is in the Service
        depends on this one being awake (`_serves_value`)."""
        model = self._ledger.models.get(uid)
        if model is None:
            return
        awake = self._serving.awake(model, node)
        if ((uid, node) in self._awake_seen) == awake:
            return
        if awake:
            self._awake_seen.add((uid, node))
        else:
            self._awake_seen.discard((uid, node))
        for rid in self._ledger.replica_uids(uid):
            charged = self._ledger.state.charged_pod(rid)
            if charged is not None:
                self._hosts_seen.add((model.namespace, charged.node_name))

    def observe_load(self, now: float, readings: Mapping[str, Mapping[str, float]]) -> None:
        """One reading of the proxies (the autoscaler's, on the loop): model uid -> node -> the
        cumulative seconds its requests were held there, for the models `binder.autoscaler.room`
        reads. When a model's awake replicas run out of room, or have had room again for a while,
        the hosts of its sleeping replicas are labelled again (`_serves_value`)."""
        flipped = self._room.keep(set(readings))
        for uid, counters in readings.items():
            model = self._ledger.models.get(uid)
            if model is None:
                continue
            awake = set()
            for rid in self._ledger.replica_uids(uid):
                charged = self._ledger.state.charged_pod(rid)
                if (
                    charged is not None
                    and rid not in self._draining
                    and self._serving.awake(model, charged.node_name, ordinal_of(charged))
                ):
                    awake.add(charged.node_name)
            room = capacity(model)
            if self._room.observe(uid, now, counters, awake, room):
                flipped.append(uid)
                log.info(
                    "The awake replicas of TritonModel %s held %.1f requests over the last "
                    "read, against room for %g: its sleeping replicas are %s.",
                    model.key,
                    self._room.busy(uid),
                    room * len(awake),
                    "served too (a request may wake one)"
                    if self._room.admits(uid)
                    else "out of its Service again",
                )
        for uid in flipped:
            for rid in self._ledger.replica_uids(uid):
                charged = self._ledger.state.charged_pod(rid)
                if charged is not None:
                    self._hosts_seen.add((charged.namespace, charged.node_name))
        if flipped:
            self._queue.wake()

    def changed(self, uid: str) -> None:
        """A model, or its placed replicas, changed (from the cache, on the loop)."""
        model = self._ledger.models.get(uid)
        namespace = model.namespace if model is not None else self._namespaces.get(uid, "")
        self._known.add(uid)
        self._queue.add(uid, namespace)
        if self._current is not None and self._current[0] == uid:
            self._current = (uid, True)
        self._queue.wake()

    def owns(self, uid: str) -> bool:
        """Whether `uid`, taken from the queue, is a model's (else a pod's)."""
        return uid in self._known

    def _write_failed(self, uid: str, event_owed: bool) -> None:
        """A status or Event write failed: the model is reconciled again, with its Event when
        that was not written (one written is not repeated: a refusal counts once)."""
        if event_owed:
            self._refused.pop(uid, None)
        self._retry.add(uid)

    async def run_writes(self, stop: asyncio.Event) -> None:
        """The models' status writes and refusal Events, off the turns, until `stop`."""
        await self._writes.run(stop)

    def tick_in(self) -> float:
        """Seconds until the next RETRY_SECONDS tick is due (`between`)."""
        return max(0.0, self._tick - self._clock())

    async def between(self, stop: asyncio.Event) -> None:
        """The work between two turns, while leading: every RETRY_SECONDS, however busy, the
        models to try again are queued (a drain's bound passes on its own); the hosts whose
        labels, annotation or conditions changed are updated."""
        if self._clock() >= self._tick:
            self._tick = self._clock() + RETRY_SECONDS
            for again in list(self._retry):
                self.changed(again)
            for draining in {rid.rpartition("/")[0] for rid in self._draining}:
                self.changed(draining)
            waiting, self._hosts.waiting = self._hosts.waiting, set()
            for namespace in waiting:
                self.hosts_changed(namespace)
        seen, self._hosts_seen = self._hosts_seen, set()
        for namespace, node in sorted(seen):
            if stop.is_set() or not self._leading.is_set():
                self._hosts_seen.add((namespace, node))
                continue
            try:
                await self._hosts.reconcile(namespace, {node})
            except ApiError as e:
                log.warning(
                    "Updating the model host of namespace %s on node %s has failed (%s): retrying.",
                    namespace,
                    node,
                    e,
                )
                self.hosts_changed(namespace)

    async def turn_of(self, uid: str) -> None:
        """Model `uid`'s turn, taken from the queue: reconciled, then backed off if a replica
        was refused, else out of the queue (unless it changed meanwhile: its turn comes
        again)."""
        self._current = (uid, False)
        try:
            refused = await self._reconcile(uid)
        except ApiError as e:
            log.warning("Reconciling TritonModel %s has failed (%s): retrying.", uid, e)
            self._retry.add(uid)
            refused = False
        except Exception:  # one model's failure must not stop the others'
            log.exception("Reconciling TritonModel %s has failed: retrying.", uid)
            self._retry.add(uid)
            refused = False
        current, self._current = self._current, None
        self._unfinished.discard(uid)  # `changed` keeps it queued
        if current is not None and current[1]:
            return  # changed meanwhile: its turn comes again
        if refused:
            self._queue.backoff(uid, capped=True)
        else:
            self._queue.remove(uid)
            if uid not in self._ledger.models and uid not in self._retry:
                self._known.discard(uid)

    # ---- one model -----------------------------------------------------------------------------

    async def _reconcile(self, uid: str) -> bool:
        """Reconcile the model; returns whether a replica of it was refused (it backs off)."""
        model = self._ledger.models.get(uid)
        if model is None:
            self._refused.pop(uid, None)
            self._retry.discard(uid)
            self._writes.forget(uid)
            self._hosts.forget(uid)
            self._services.discard(uid)
            for rid in [r for r in self._draining if r.rpartition("/")[0] == uid]:
                self._undrain(rid)  # deleted: garbage collection's, nothing to drain for
            for rid in [r for r in self._reported if r.rpartition("/")[0] == uid]:
                del self._reported[rid]
            self._rollout.forget(uid)
            self._roll_said.pop(uid, None)
            self._preemption.forget(uid)
            namespace = self._namespaces.pop(uid, None)
            if namespace is not None:
                before = self._hosts_for.get(uid, frozenset())
                await self._hosts.reconcile(namespace, {entry[1] for entry in before})
            self._hosts_for.pop(uid, None)
            self._parked.pop(uid, None)
            self._awake_seen = {k for k in self._awake_seen if k[0] != uid}
            self._room.forget(uid)
            return False
        self._namespaces[uid] = model.namespace
        quota = self._quota(model)
        placed, refusal, waiting, roll = self._place(model, quota)
        preemptions = self._preemption.preempted
        preempted = sorted(r for r in preemptions if r.rpartition("/")[0] == uid)
        reason = (
            CLASS_NOT_FOUND
            if refusal and model.priority_problem
            else PREEMPTED
            if preempted and (refusal or waiting)
            else UNSUPPORTED_STORAGE
            if refusal and model.storage_problem
            else EXCEEDED_QUOTA
            if quota is not None and quota.refused
            else "Unschedulable"
        )
        if preempted and refusal and not waiting:
            why = "; ".join(preemptions[r][0] for r in preempted)
            refusal = f"{why}; placed again when it fits: {refusal}"
        status = self._status(model, placed, refusal, waiting, roll, reason)
        changed = any(model.status.get(k) != v for k, v in status.items())
        new_refusal = refusal if refusal and self._refused.get(uid) != refusal else ""
        if changed or new_refusal:
            self._writes.put(Write(event_object(model), status if changed else None, new_refusal))
        if refusal:
            self._refused[uid] = refusal
        else:
            self._refused.pop(uid, None)
        if roll.retry and not refusal:
            self._retry.add(uid)
        else:
            self._retry.discard(uid)
        await self._report_not_served(model, placed)
        await self._report_preemptions(model)
        await self._report_roll(model, roll)
        self._park(model)
        hosted = self._as_hosted(model)
        last = self._hosts_for.get(uid)
        if model.namespace in self._stale:
            self._stale.discard(model.namespace)
            await self._hosts.reconcile(model.namespace, None)
        elif hosted != last:
            nodes = {entry[1] for entry in hosted | (last or frozenset())}
            await self._hosts.reconcile(model.namespace, nodes)
        self._hosts_for[uid] = hosted
        if uid not in self._services:
            try:
                await self._call(self._kube.create_service, model.namespace, self._service(model))
            except ConflictError:
                pass  # there already: the binder's own, or a name the namespace chose to reuse
            except ApiError as e:
                if e.status == 0 or e.status >= 500 or e.status == 429:
                    raise
                await self._call(
                    self._kube.record_object_event,
                    event_object(model),
                    reason="FailedCreateService",
                    message=f"the binder cannot create Service {model.name}: {e}",
                    reporting_instance=self._identity,
                )
            self._services.add(uid)
        return bool(refusal)

    def _as_hosted(self, model: ModelInfo) -> frozenset[tuple[int, str, bool, str, str, int]]:
        """The model's charged replicas as its hosts serve them: (ordinal, node, draining,
        files, storage Secret: which of the node's hosts, minAvailable: their budget)."""
        hosted = set()
        for rid in self._ledger.replica_uids(model.uid):
            charged = self._ledger.state.charged_pod(rid)
            if charged is not None:
                ordinal = int(rid.rpartition("/")[2])
                draining = rid in self._draining
                uri = self._rollout.uri(model, ordinal)
                secret, minimum = model.storage_secret, model.min_available
                hosted.add((ordinal, charged.node_name, draining, uri, secret, minimum))
        if model.uid in self._parked:
            # -1: parked there
            parked = self._parked[model.uid]
            hosted.add((-1, parked, False, "", model.storage_secret, model.min_available))
        return frozenset(hosted)

    def _park(self, model: ModelInfo) -> None:
        """Park `model` at zero replicas on a host of its namespace, or unpark it once a
        replica of it is served (`binder.autoscaler.parking`)."""
        nodes, served = [], False
        for rid in self._ledger.replica_uids(model.uid):
            charged = self._ledger.state.charged_pod(rid)
            if charged is not None:
                nodes.append(charged.node_name)
                served = served or (
                    rid not in self._draining and self._serving.served(model, charged).ready
                )
        node = park_node(
            model,
            current=self._parked.get(model.uid),
            replica_nodes=nodes,
            served=served,
            hosts=self._ledger.hosts.get(model.host_group, {}),
            keys=self._keys,
        )
        if node is None:
            self._parked.pop(model.uid, None)
        elif self._parked.get(model.uid) != node:
            log.info("TritonModel %s is at zero replicas: parked on node %s.", model.key, node)
            self._parked[model.uid] = node

    def _quota(self, model: ModelInfo) -> QuotaCheck | None:
        """The namespace's quotas on GPU memory, when a replica is to be placed."""
        live = self._live(model)
        if len(live) >= model.replicas and not self._rollout.old(model, live):
            return None
        return check_for(
            self._ledger, self._keys, model.namespace, replica_class(self._ledger, model)
        )

    def turn(self) -> tuple[ModelInfo, int, str] | None:
        """The placing half of the next model's turn, without its API writes (the benchmarks'):
        the model, its replicas placed, and its refusal; a refused one backs off. None: no
        model's turn is due."""
        uid = self._queue.pop_ready()
        model = self._ledger.models.get(uid) if uid is not None else None
        if uid is None or model is None:
            return None
        placed, refusal, _, _ = self._place(model)
        if refusal:
            self._queue.backoff(uid, capped=True)
        elif uid in self._unfinished:
            self._unfinished.discard(uid)  # its next turn after the other namespaces'
        else:
            self._queue.remove(uid)
        return model, len(placed), refusal

    def _place(
        self, model: ModelInfo, quota: QuotaCheck | None = None
    ) -> tuple[dict[int, PodInfo], str, str, Roll]:
        """The model's charged replicas after freeing or draining those it no longer wants,
        placing the missing ones that `quota` allows and taking its roll to new files a step
        (`_roll`); the refusal of the first refused or that fits nowhere ("" when all fit);
        which wanted replica waits for its previous placement to drain ("" when none); and
        where the roll stands."""
        state = self._ledger.state
        self._end_drains(model)
        placed = self._live(model)
        old = self._rollout.old(model, placed)
        allowed = model.replicas + (1 if old and model.replicas else 0)
        if len(placed) > allowed:
            # Scaled down: as a ReplicaSet, those not served leave first (the served ones keep
            # the model answering, and its minAvailable); then those on previous files, then
            # the highest.
            newer = sorted((o for o in placed if o not in old), reverse=True)
            order = sorted(old + newer, key=lambda o: self._serving.served(model, placed[o]).ready)
            for ordinal in order[: len(placed) - allowed]:
                leaving = placed.pop(ordinal)
                self._leave(model, leaving)
                if leaving.uid in self._draining:
                    self._scaled_away.add(leaving.uid)
            old = [o for o in old if o in placed]
        refusal = waiting = ""
        missing = Missing(model.uid, placed, model.replicas - len(placed))
        wanted: Container[str] = missing
        if old and model.replicas:
            wanted = Missing(model.uid, placed, missing.count, self._rollout.surge_uid(model))
        self._preemption.forget(model.uid, wanted, self._draining)
        turn_left = PLACEMENTS_PER_TURN
        for ordinal in missing.ordinals(self._kept(model)):
            rid = replica_uid(model.uid, ordinal)
            charged = state.charged_pod(rid)
            if charged is not None:
                kept = self._take_back(model, ordinal, charged, quota)
                if kept is not None:
                    placed[ordinal] = kept
                    continue
                # Preempted, or wanted again on other files: placed again, as any new replica,
                # once the old placement has left.
                preempted = self._preemption.preempted.get(rid)
                again = (
                    f"replica {ordinal} is placed again once its previous placement on node "
                    f"{charged.node_name} has drained"
                )
                waiting = waiting or (f"{preempted[0]}; {again}" if preempted else again)
                continue
            if refusal:
                self._preemption.take_room(rid)  # its held room given up: it waits its turn
                continue
            if turn_left == 0:
                self._unfinished.add(model.uid)
                self.changed(model.uid)
                break
            outcome = self._place_one(model, ordinal, quota)
            if isinstance(outcome, PodInfo):
                placed[ordinal] = outcome
                turn_left -= 1
            else:
                refusal = outcome
                missing.stop_at(ordinal)  # the rest only counted, but held rooms and drains
        if refusal or waiting or len(placed) < model.replicas:
            return placed, refusal, waiting, self._rollout.where(model, placed, old, "")
        return placed, refusal, waiting, self._rollout.step(model, placed, old, quota)

    def _take_back(
        self, model: ModelInfo, ordinal: int, charged: PodInfo, quota: QuotaCheck | None
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
            or rid in self._preemption.preempted
            or self._rollout.uri(model, ordinal) != model.storage_uri
        ):
            return None
        replica = model.replica(ordinal)
        if quota is not None and quota.refusal(replica.request, replica.allowance):
            return None
        node, gpu, proof = charged.node_name, charged.gpu_uuid, charged.placement
        if not isinstance(proven(model.replica(ordinal, node, gpu, proof), self._ring()), PodInfo):
            return None
        self._undrain(rid)
        self._ledger.state.assume(replica, node, gpu, proof)
        if quota is not None:
            quota.charge(replica.request)
        log.info(
            "Replica %d of TritonModel %s is wanted again while it drains: kept on node %s, "
            "served there again once loaded.",
            ordinal,
            model.key,
            node,
        )
        return replica.bound(node, gpu, proof)

    def _kept(self, model: ModelInfo) -> list[int]:
        """The ordinals of the model that hold something past a refusal: a charge (draining, or
        preempted), or a room its preemption held."""
        kept = {int(rid.rpartition("/")[2]) for rid in self._ledger.replica_uids(model.uid)}
        kept.update(self._preemption.held_ordinals(model.uid))
        return sorted(kept)

    def _place_one(self, model: ModelInfo, ordinal: int, quota: QuotaCheck | None) -> PodInfo | str:
        """Replica `ordinal` placed (on the room its preemption held first), charged (assumed)
        and signed, with spec.storageUri; or why it is not. One that fits nowhere may preempt
        lower-priority pods and replicas (`binder.framework.replicapreemption`)."""
        state = self._ledger.state
        replica = model.replica(ordinal)
        nominated = self._preemption.take_room(replica.uid)
        if nominated:
            replica = replace(replica, nominated_node=nominated)
        unfetchable = model.storage_problem
        if unfetchable:
            return f'tritonmodel "{model.name}" replica {ordinal}: {unfetchable}'
        if model.priority_problem:
            return f'tritonmodel "{model.name}" replica {ordinal}: {model.priority_problem}'
        clash = self._ledger.name_clash(model)
        if clash:
            return f'tritonmodel "{model.name}" replica {ordinal}: {clash}'
        exceeded = quota.refusal(replica.request, replica.allowance) if quota is not None else ""
        if exceeded:
            return f'tritonmodel "{model.name}" replica {ordinal}: {exceeded}'
        now = time.time()
        decision = place(state, replica, now=now, policy=self._policy)
        if not isinstance(decision, Placement):
            message = self._preemption.decide(model, ordinal, replica, decision, now)
            return f"replica {ordinal}: {message}"
        self._preemption.placed(replica.uid)
        proof = sign(self._ring(), replica, decision.node, decision.gpu.uuid)
        state.assume(replica, decision.node, decision.gpu.uuid, proof)
        spans = self._ledger.spans
        spans[model.uid] = max(spans.get(model.uid, 0), ordinal + 1)
        if quota is not None:
            quota.charge(replica.request)
        self._rollout.files[replica.uid] = model.storage_uri
        return replica.bound(decision.node, decision.gpu.uuid, proof)

    async def _report_preemptions(self, model: ModelInfo) -> None:
        """The `Preempted` Event of each replica of the model preempted since (Normal, as
        kube-scheduler writes a victim pod's); then the pods' evictions of the preemptions
        decided, and a `Preempting` Event on each preemptor (a refused eviction drops the held
        room: the replica tries again, as a pod does)."""
        for why in self._preemption.unwritten(model.uid):
            await self._call(
                self._kube.record_object_event,
                event_object(model),
                reason=PREEMPTED,
                message=why,
                reporting_instance=self._identity,
                event_type="Normal",
            )
        evictions, self._preemption.evictions = self._preemption.evictions, []
        for eviction in evictions:
            preemptor, ordinal, node = eviction.model, eviction.ordinal, eviction.node
            try:
                evicted = await self._run(
                    evict_victims,
                    self._kube,
                    eviction.pods,
                    eviction.by,
                    node,
                    self._identity,
                    _uncounted,
                )
            except (EvictionRefusedError, ApiError) as e:
                log.warning(
                    "Preempting pods for replica %d of TritonModel %s has failed (%s): its held "
                    "room is released; it tries again in %g s.",
                    ordinal,
                    preemptor.key,
                    e,
                    REFUSED_RETRY_SECONDS,
                )
                self._preemption.refused(replica_uid(preemptor.uid, ordinal), time.time())
                continue
            victims = evicted + eviction.drained
            if victims:
                await self._call(
                    self._kube.record_object_event,
                    event_object(preemptor),
                    reason=PREEMPTING,
                    message=f"replica {ordinal}: preempting {len(victims)} lower-priority "
                    f"pod(s) and replica(s) on node {node}: {', '.join(victims)}",
                    reporting_instance=self._identity,
                    event_type="Normal",
                )

    def _live(self, model: ModelInfo) -> dict[int, PodInfo]:
        """The model's charged replicas that are not draining, by ordinal."""
        state = self._ledger.state
        live = {}
        for rid in self._ledger.replica_uids(model.uid):
            charged = state.charged_pod(rid)
            if charged is not None and rid not in self._draining:
                live[int(rid.rpartition("/")[2])] = charged
        return live

    def _leave(self, model: ModelInfo, replica: PodInfo) -> None:
        """`replica` leaves: one loaded on its host drains first (out of the Service, listed as
        draining) until its host no longer has it loaded or the drain's bound passes
        (`_end_drains`); another is freed at once."""
        if self._serving.loaded(model, replica).ready:
            self._draining[replica.uid] = self._clock() + self._drain_seconds
            self._ledger.draining.add(replica.uid)
        else:
            self._free(replica.uid)

    def _free(self, rid: str) -> None:
        self._undrain(rid)
        self._rollout.files.pop(rid, None)
        self._ledger.state.remove_pod(rid)
        self._ledger.state.untrack_pod(rid)

    def _end_drains(self, model: ModelInfo) -> None:
        """Each drain of the model ends once its host no longer has the replica loaded or its
        bound passes (or, wanted again, it is taken back: `_take_back`)."""
        state = self._ledger.state
        now = self._clock()
        for rid in [r for r in self._draining if r.rpartition("/")[0] == model.uid]:
            charged = state.charged_pod(rid)
            if charged is None or not state.is_accounted(rid):
                self._undrain(rid)  # freed meanwhile (its node went away)
                self._rollout.files.pop(rid, None)
                continue
            if not self._serving.loaded(model, charged).ready:
                self._free(rid)
                continue
            if now < self._draining[rid]:
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
        self._draining.pop(rid, None)
        self._ledger.draining.discard(rid)

    async def _report_roll(self, model: ModelInfo, roll: Roll) -> None:
        """A Warning Event on the model when its roll goes on without a surge replica, or
        stalls on new files a replica does not serve (once per message)."""
        if roll.fallback:
            said = (ROLLING_WITHOUT_SURGE, roll.fallback)
        elif roll.status == "False":
            said = (roll.reason, roll.message)
        else:
            self._roll_said.pop(model.uid, None)
            return
        if self._roll_said.get(model.uid) == said[1]:
            return
        await self._call(
            self._kube.record_object_event,
            event_object(model),
            reason=said[0],
            message=said[1],
            reporting_instance=self._identity,
        )
        self._roll_said[model.uid] = said[1]

    async def _report_not_served(self, model: ModelInfo, placed: dict[int, PodInfo]) -> None:
        """A Warning Event on the model per replica and reason the agent gives for not serving
        it (once each, as the agent reports a model pod's)."""
        for ordinal, replica in sorted(placed.items()):
            loaded = self._serving.loaded(model, replica)
            if loaded.reason in ("", HOST_REFUSED):  # the refusal has its own Event
                self._reported.pop(replica.uid, None)
                continue
            if loaded.reason in QUIET_REASONS:
                continue  # no fault; the cause said last is not said again when it comes back
            # A host's loader's failures are told apart by cause (a 404, then a credential
            # refused); the agent's other reasons by reason (its messages carry counts).
            said = loaded.why if loaded.reason in LOAD_FAILURE_REASONS else loaded.reason
            if self._reported.get(replica.uid) == said:
                continue
            await self._call(
                self._kube.record_object_event,
                event_object(model),
                reason=NOT_SERVED_EVENT,
                message=f"replica {ordinal} on node {replica.node_name}: {loaded.why}",
                reporting_instance=self._identity,
            )
            self._reported[replica.uid] = said

    def _status(
        self,
        model: ModelInfo,
        placed: dict[int, PodInfo],
        refusal: str,
        waiting: str,
        roll: Roll,
        reason: str = "Unschedulable",
    ) -> JsonObject:
        if refusal:
            condition = self._condition(model, PLACED, "False", reason, refusal)
        elif waiting:
            why = reason if reason == PREEMPTED else "ReplicaDraining"
            condition = self._condition(model, PLACED, "False", why, waiting)
        else:
            message = f"{min(len(placed), model.replicas)} of {model.replicas} replicas placed"
            condition = self._condition(model, PLACED, "True", "AllReplicasPlaced", message)
        placements = []
        why_not: list[str] = []
        not_ready = "ReplicasNotReady"
        for ordinal, replica in sorted(placed.items()):
            ready, why, agent_reason = self._serving.served(model, replica)
            if agent_reason == HOST_REFUSED:
                not_ready = HOST_REFUSED
            elif agent_reason in LOAD_FAILURE_REASONS and not_ready == "ReplicasNotReady":
                not_ready = agent_reason  # the first replica's, by ordinal
            entry: dict[str, Any] = {
                "replica": ordinal,
                "node": replica.node_name,
                "gpu": replica.gpu_uuid,
                "proof": replica.placement,
                "host": host_name(replica.node_name, model.storage_secret),
                "ready": ready,
                "storageUri": self._rollout.uri(model, ordinal),
            }
            if why:
                entry["message"] = why
                why_not.append(f"replica {ordinal} on {replica.node_name}: {why}")
            placements.append(entry)
        ready_count = len(placements) - len(why_not)
        message = f"{min(ready_count, model.replicas)} of {model.replicas} replicas ready"
        if len(placed) < model.replicas:
            why_not.append(f"{model.replicas - len(placed)} not placed (see {PLACED})")
        if why_not and ready_count < model.replicas:
            shown = why_not[:READY_REASONS_SHOWN]
            if len(why_not) > len(shown):
                shown.append(f"{len(why_not) - len(shown)} more")
            ready_condition = self._condition(
                model, READY, "False", not_ready, f"{message}; {'; '.join(shown)}"
            )
        else:
            ready_condition = self._condition(model, READY, "True", "AllReplicasReady", message)
        status: JsonObject = {
            "observedGeneration": model.generation,
            "replicas": len(placed),
            "readyReplicas": ready_count,
            "availableReplicas": ready_count,
            "updatedReplicas": roll.updated,
            "selector": f"{serves_label(self._keys, model.name)}=true",
            "placements": placements,
            "conditions": [
                condition,
                ready_condition,
                self._condition(model, PROGRESSING, roll.status, roll.reason, roll.message),
                # Others' conditions (the autoscaler's, binder.autoscaler.loop) are kept as they
                # are.
                *(
                    c
                    for c in model.status.get("conditions") or []
                    if isinstance(c, dict) and c.get("type") not in (PLACED, READY, PROGRESSING)
                ),
            ],
        }
        nominations = self._preemption.nominations(model.uid)
        if nominations or model.status.get("nominations"):
            status["nominations"] = nominations or None  # a merge patch's null removes it
        return status

    def _condition(
        self, model: ModelInfo, kind: str, status: str, reason: str, message: str
    ) -> dict[str, Any]:
        """A condition of the model's status, its lastTransitionTime kept while its status
        stays, and kept whole while nothing of it changes."""
        old = find(model.status.get("conditions"), kind)
        new = Condition(kind, status, reason, message, observed_generation=model.generation)
        return condition_for(new, old)

    # ---- hosts and Services --------------------------------------------------------------------

    def _service(self, model: ModelInfo) -> JsonObject:
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": model.name,
                "namespace": model.namespace,
                "ownerReferences": [owner_reference(model, controller=True)],
            },
            "spec": {
                "selector": {serves_label(self._keys, model.name): "true"},
                "ports": SERVICE_PORTS,
            },
        }

    async def _call(self, fn: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    async def _run(self, fn: Callable[..., list[str]], *args: Any) -> list[str]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args))


def _uncounted(_: str) -> None:
    """The model controller keeps no count of its API writes."""
