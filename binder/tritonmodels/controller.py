"""The TritonModel controller: each model's turn in the binder's one loop, while this replica leads.

A model the cache reports changed (`changed`), or one whose host changed (`host_changed`), waits in
the binder's one queue with the pods, in turns by namespace (`binder.reconciler` takes the turns).
Its turn (`turn_of`): its replicas placed, kept or drained, and the model parked at zero replicas
or not (`binder.tritonmodels.placer`); its status and Events told (`binder.tritonmodels.reporting`);
its namespace's model hosts made to serve it (`binder.tritonmodels.hostwriter`, labelled as
`binder.tritonmodels.serving` says: awake first, on the autoscaler's readings, `observe_load`); and
its Service created (`binder.tritonmodels.servicewriter`). A model with a replica refused backs
off as kube-scheduler's pods do; one whose roll or drain waits, or whose turn failed, is tried again
every RETRY_SECONDS. A new leader first holds again the rooms its predecessor's replica preemptions
held (`recover_nominations`), then charges the drains under way and parks again what its hosts
park (`recover_drains`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Any

from binder.api.kube import Kube
from binder.autoscaler.room import Room, capacity
from binder.cluster.ledger import Ledger
from binder.cluster.modelsizes import DEFAULT_SIZING, Sizing
from binder.cluster.modelviews import ModelInfo, is_replica
from binder.cluster.objects import PodInfo
from binder.framework.moves import EvictionRefusedError, evict_victims
from binder.framework.placement import Policy
from binder.framework.queue import SchedulingQueue
from binder.framework.replicapreemption import REFUSED_RETRY_SECONDS
from binder.tritonmodels.hostwriter import HostWriter
from binder.tritonmodels.meshwriter import MeshWriter
from binder.tritonmodels.placer import Hosted, ReplicaPlacer
from binder.tritonmodels.replicabook import ReplicaBook
from binder.tritonmodels.reporting import Reporter
from binder.tritonmodels.servicewriter import ServiceWriter
from binder.tritonmodels.serving import Serving, ordinal_of
from binder.tritonmodels.status import StatusWriter
from common.contract import Keys
from common.hosted import replica_uid
from common.kubeapi.errors import ApiError
from common.modelpod import NodeAccess
from common.proofs import KeyRing

log = logging.getLogger(__name__)

RETRY_SECONDS = 1.0
"""How often a model whose roll or drain waits, or whose turn failed, is tried again."""
EVENT_BACKOFF_MAX_SECONDS = 10.0
"""The longest backoff of a refused model before a cluster change retries it (kube-scheduler's
podMaxBackoffDuration)."""


class TritonModelController:
    """Reconciles TritonModels one at a time, on the loop, while this replica leads."""

    def __init__(
        self,
        kube: Kube,
        ledger: Ledger,
        *,
        queue: SchedulingQueue,
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
        sizing: Sizing = DEFAULT_SIZING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`queue` is the binder's one queue, shared with its pods (`binder.reconciler` takes
        the turns); refused models back off there (capped: kube-scheduler's backoff);
        `sizing`: how a model that declares no GPU memory is booked
        (`binder.cluster.modelsizes`)."""
        self._ledger = ledger
        self._leading = leading
        self._keys = keys
        self._executor = executor
        self._identity = identity
        self._clock = clock
        self._queue = queue
        self._kube = kube
        self._known: set[str] = set()
        """The uids told `changed` and not yet reconciled as gone: the queue's models."""
        self._tick = clock() + RETRY_SECONDS
        self._current: tuple[str, bool] | None = None
        """The model being reconciled, and whether it changed meanwhile."""
        self._retry: set[str] = set()
        """Models tried again every RETRY_SECONDS (a roll that waits, a reconcile that failed)."""
        self._namespaces: dict[str, str] = {}
        """Model uid -> namespace, to tidy its namespace's hosts once it is gone."""
        self._hosts_for: dict[str, Hosted] = {}
        """Model uid -> its replicas as the hosts were last made to serve them."""
        self._awake_seen: set[tuple[str, str]] = set()
        """(model uid, node) where the model was last seen awake (`_awake_first`)."""
        self._room = Room()
        """The models whose awake replicas have no room: their sleeping ones are served too."""
        self._stale: set[str] = set()
        """Namespaces whose hosts are all to be checked again."""
        self._hosts_seen: set[tuple[str, str]] = set()
        """(namespace, node) of hosts whose labels, annotation or conditions changed."""
        self._book = ReplicaBook(ledger, drain_seconds=drain_seconds, clock=clock)
        """Drains and parks (the placer's), stand-ins and host refusals (the host writer's)."""
        self._serving = Serving(ledger, keys, self._book, self._room)
        """Whether each replica is served, and which hosts its Service selects."""
        self._placer = ReplicaPlacer(
            ledger,
            keys=keys,
            policy=policy,
            placement_keys=placement_keys,
            serving=self._serving,
            book=self._book,
            drain_seconds=drain_seconds,
            preemption=preemption,
            clock=clock,
            changed=self.changed,
        )
        self._reporter = Reporter(
            kube,
            executor,
            identity=identity,
            keys=keys,
            leading=leading,
            serving=self._serving,
            rollout=self._placer.rollout,
            preemption=self._placer.preemption,
            retry=self._retry.add,
            nodes=ledger.state.nodes,
            sizing=sizing,
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
            book=self._book,
            loaded=self._serving.routable,
            served=self._serving.served,
            serves_value=self._serving.serves_value,
            uri=self._placer.rollout.uri,
            changed=self.changed,
        )
        """The namespace's model hosts (`binder.tritonmodels.hostwriter`)."""
        self._services = ServiceWriter(kube, executor, keys=keys, identity=identity)
        self._mesh = MeshWriter(kube, executor, keys=keys)
        """The ModelMesh namespaces' `modelmesh-serving` and routes."""

    @property
    def status_writer(self) -> StatusWriter:
        """The one writer of the models' status; the autoscaler hands it its verdicts."""
        return self._reporter.writer

    def hosts_changed(self, namespace: str) -> None:
        """A host of the namespace went away, or waits to: its hosts are all checked again."""
        models = self._ledger.by_namespace.get(namespace)
        if models:
            self._stale.add(namespace)
            self.changed(next(iter(models)))

    def recover_nominations(self) -> None:
        """On taking the lead, before anything is placed: the rooms the previous leader held
        for replicas whose preemption made them are held again (`ReplicaPreemption.restore`)."""
        self._placer.preemption.restore()

    def recover_drains(self) -> None:
        """On taking the lead: the drains the binder that led before began are charged again
        and drain on, and its parks are kept (`ReplicaPlacer.recover_drains`)."""
        self._placer.recover_drains()

    def preempt(self, victim: PodInfo, by: str, node: str) -> None:
        """A replica chosen as a preemption victim by the binder's pod scheduling: it drains
        from its host and is placed again once gone (`ReplicaPlacer.preempt`)."""
        self._placer.preempt(victim, by, node)

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
        depends on this one being awake (`Serving.serves_value`)."""
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
        self._relabel(uid)

    def observe_load(self, now: float, readings: Mapping[str, Mapping[str, float]]) -> None:
        """One reading of the proxies (the autoscaler's, on the loop): model uid -> node -> the
        cumulative seconds its requests were held there, for the models `binder.autoscaler.room`
        reads. When a model's awake replicas run out of room, or have had room again for a while,
        the hosts of its sleeping replicas are labelled again (`Serving.serves_value`)."""
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
                    and not self._book.draining(rid)
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
            self._relabel(uid)
        if flipped:
            self._queue.wake()

    def _relabel(self, uid: str) -> None:
        """The hosts of model `uid`'s replicas are labelled again (between two turns)."""
        for rid in self._ledger.replica_uids(uid):
            charged = self._ledger.state.charged_pod(rid)
            if charged is not None:
                self._hosts_seen.add((charged.namespace, charged.node_name))

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

    async def run_writes(self, stop: asyncio.Event) -> None:
        """The models' status writes and refusal Events, off the turns, until `stop`."""
        await self._reporter.run_writes(stop)

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
            for draining in self._book.draining_models():
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
        if current is not None and current[1]:
            return  # changed meanwhile: its turn comes again
        if refused:
            self._queue.backoff(uid, capped=True)
        else:
            self._queue.remove(uid)
            if uid not in self._ledger.models and uid not in self._retry:
                self._known.discard(uid)

    async def _reconcile(self, uid: str) -> bool:
        """Model `uid`'s turn: its replicas placed, its status and Events told, its hosts and
        Service written; returns whether a replica of it was refused (it backs off)."""
        model = self._ledger.models.get(uid)
        if model is None:
            await self._forget(uid)
            return False
        self._namespaces[uid] = model.namespace
        outcome = self._placer.place(model)
        if outcome.unfinished:
            self.changed(uid)  # its next turn after the other namespaces'
        self._reporter.status(model, outcome)
        if outcome.roll.retry and not outcome.refusal:
            self._retry.add(uid)
        else:
            self._retry.discard(uid)
        await self._evict()
        await self._reporter.events(model, outcome)
        await self._write_hosts(model, outcome.hosted)
        await self._services.create(model)
        await self._mesh.model_written(model)
        return bool(outcome.refusal)

    async def _forget(self, uid: str) -> None:
        """Model `uid` is gone: nothing of it is placed or written any more, and the hosts that
        served it are made again without it."""
        self._retry.discard(uid)
        self._reporter.forget(uid)
        self._hosts.forget(uid)
        self._services.forget(uid)
        await self._mesh.forget(uid)
        self._placer.forget(uid)
        namespace = self._namespaces.pop(uid, None)
        if namespace is not None:
            before = self._hosts_for.get(uid, frozenset())
            await self._hosts.reconcile(namespace, {entry[1] for entry in before})
        self._hosts_for.pop(uid, None)
        self._book.unpark(uid)
        self._awake_seen = {k for k in self._awake_seen if k[0] != uid}
        self._room.forget(uid)

    async def _evict(self) -> None:
        """The pods' evictions of the preemptions decided, and a `Preempting` Event on each
        preemptor (a refused eviction drops the held room: the replica tries again, as a pod
        does)."""
        preemption = self._placer.preemption
        evictions, preemption.evictions = preemption.evictions, []
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
                preemption.refused(replica_uid(preemptor.uid, ordinal), time.time())
                continue
            victims = evicted + eviction.drained
            if victims:
                await self._reporter.preempting(preemptor, ordinal, node, victims)

    async def _write_hosts(self, model: ModelInfo, hosted: Hosted) -> None:
        """The hosts of the model's namespace made to serve it as it is now placed (`hosted`):
        those of its replicas' nodes before and now, or all of them when they are to be checked
        again."""
        uid = model.uid
        last = self._hosts_for.get(uid)
        if model.namespace in self._stale:
            self._stale.discard(model.namespace)
            await self._hosts.reconcile(model.namespace, None)
        elif hosted != last:
            nodes = {entry[1] for entry in hosted | (last or frozenset())}
            await self._hosts.reconcile(model.namespace, nodes)
        self._hosts_for[uid] = hosted

    async def _run(self, fn: Callable[..., list[str]], *args: Any) -> list[str]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args))


def _uncounted(_: str) -> None:
    """The model controller keeps no count of its API writes."""
