"""Wiring of one binder replica: API client, caches, queue, controller, leader election, HTTP.

`Binder(settings)` builds everything; `start(lifecycle)` (the shape of every part,
`common.lifecycle`) starts, in order: the HTTP endpoints (so /healthz answers while caches fill),
the informers (nodes, leases, pods, TritonModels, KServe's InferenceServices and runtimes), then,
once the caches are warm, leader election, the one loop that places pods and TritonModels
(`binder.reconciler`), the InferenceService controller and the watch on dead agents. Stop
order is the reverse, fixed by the order the cleanups are registered: stop scheduling and release
the leader lease (the tasks see the stop event), let in-flight API writes finish, end the
watches, stop the HTTP endpoints, close the API client and its worker threads. The tasks get
DRAIN_SECONDS (then are cancelled), the writes DRAIN_SECONDS, the watches 5 s: the stop takes at
most 2 x 10 + 5 s before the HTTP endpoints
close, within the 30 s Kubernetes gives a pod by default.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from binder.api.inbox import Inbox
from binder.api.informer import Informer
from binder.api.kube import Kube
from binder.api.leader import LeaderElector
from binder.api.listwatch import (
    BUDGETS,
    NAMESPACES,
    NODES,
    PODS,
    PRIORITY_CLASSES,
    QUOTAS,
    TRITONMODELS,
    leases_in,
)
from binder.autoscaler.loop import Autoscaling
from binder.autoscaler.targets import Index
from binder.cluster.cache import ClusterCache
from binder.cluster.clusterstate import ClusterState
from binder.cluster.ledger import Ledger
from binder.cluster.modelsizes import Sizing
from binder.errors import NotReadyError, SettingsError, http_status
from binder.framework.noderules import NODE_RULES
from binder.framework.queue import SchedulingQueue
from binder.framework.quota import check_for
from binder.inferenceservices.controller import Config as InferenceServiceConfig
from binder.inferenceservices.controller import InferenceServiceController, Watched
from binder.metrics import Metrics
from binder.nodescaling.loop import Config as NodeScalingConfig
from binder.nodescaling.loop import NodeScaling
from binder.pods.agentdown import AgentDown, Rules
from binder.pods.controller import EVENT_WRITERS, PodController
from binder.reconciler import Reconciler
from binder.settings import Settings
from binder.tritonmodels.controller import EVENT_BACKOFF_MAX_SECONDS, TritonModelController
from common.contract import BINDER_LEADER_LEASE, DEFAULT_PROXY_METRICS_PORT
from common.health import HttpServer, build_health_app
from common.kubeapi.session import JsonObject, RetryPolicy
from common.lifecycle import Lifecycle
from common.modelpod import NodeAccess
from common.proofs import KeyDirectory, PlacementKeyError

log = logging.getLogger(__name__)

DRAIN_SECONDS = 10.0


class Binder:
    """One replica. `start(lifecycle)` returns once it schedules; the lifecycle stops it."""

    def __init__(self, settings: Settings) -> None:
        """Built on the running loop, in dependency order: what several parts share (the
        leadership flag, the cache's ledger, the inbox to the loop) is made first and handed to
        each, so nothing is wired after construction."""
        self.settings = settings
        if settings.placement_key_dir is None:
            raise SettingsError("the binder needs --placement-key-dir to sign its placements")
        try:
            self.placement_keys = KeyDirectory(settings.placement_key_dir)
        except PlacementKeyError as e:
            raise SettingsError(str(e)) from e
        # Set by the elector while this replica leads; the writers and the scheduling loop read it.
        leading = asyncio.Event()
        # A write retries no longer than the leader may go unrenewed, and only while it leads.
        self.kube = Kube(
            settings.kubeconfig,
            retry=RetryPolicy(budget_seconds=settings.renew_deadline_seconds),
            retry_while=leading.is_set,
        )
        # Kept by the cache, read by the controller and the metrics.
        self.ledger = Ledger(ClusterState(rules=NODE_RULES, reserve=settings.gpu_mem_reserve))
        self.metrics = Metrics(state=self.ledger.state, unproven=self.ledger.unproven_reasons)
        # Pods and TritonModels wait in one queue, in turns by namespace; a model backs off
        # as kube-scheduler's pods do (capped), a pod is retried at any helpful change.
        self.queue = SchedulingQueue(
            initial_seconds=settings.backoff_initial_seconds,
            max_seconds=settings.backoff_max_seconds,
            event_backoff_max=min(EVENT_BACKOFF_MAX_SECONDS, settings.backoff_max_seconds),
            capped_by_default=False,
        )
        # The bind workers, the Scheduled Events' writer and two for the rest (leases, models).
        self._executor = ThreadPoolExecutor(
            max_workers=settings.bind_workers + EVENT_WRITERS + 2, thread_name_prefix="binder-api"
        )
        # One inbox for every thread that hands work to the loop (the watches, the writers): one
        # wake-up per burst.
        self._inbox = Inbox(asyncio.get_running_loop())
        self.models = TritonModelController(
            self.kube,
            self.ledger,
            leading=leading,
            keys=settings.keys,
            policy=settings.policy,
            placement_keys=self.placement_keys.ring,
            executor=self._executor,
            identity=settings.identity,
            scheduler_name=settings.scheduler_name,
            host_image=settings.host_image,
            access=NodeAccess(
                settings.agent_port,
                settings.triton_http_port,
                settings.triton_grpc_port,
                settings.audience,
            ),
            drain_seconds=settings.host_drain_seconds,
            preemption=settings.preemption,
            sizing=Sizing(
                settings.gpu_memory_estimate,
                settings.gpu_memory_margin,
                settings.gpu_memory_margin_min,
                settings.min_gpu_mem,
            ),
            queue=self.queue,
        )
        self.controller = PodController(
            self.kube,
            self.ledger,
            leading=leading,
            keys=settings.keys,
            policy=settings.policy,
            queue=self.queue,
            metrics=self.metrics,
            executor=self._executor,
            bind_workers=settings.bind_workers,
            identity=settings.identity,
            placement_keys=self.placement_keys.ring,
            consolidate_moves=settings.consolidate_moves,
            preemption=settings.preemption,
            scheduled_events_per_second=settings.scheduled_events_per_second,
            inbox=self._inbox,
            preempt_replica=self.models.preempt,
        )
        self.reconciler = Reconciler(self.queue, self.controller, self.models, leading=leading)
        self.cache = ClusterCache(
            settings.keys,
            self.ledger,
            scheduler_name=settings.scheduler_name,
            listener=self.controller,
            placement_keys=self.placement_keys.ring,
            tenant_code=settings.tenant_code_namespaces,
            min_gpu_mem=settings.min_gpu_mem,
            allowance=settings.gpu_mem_process_allowance,
            estimate=settings.gpu_memory_estimate,
            on_model=self.models.changed,
            on_host_gone=self.models.hosts_changed,
            on_host=self.models.host_changed,
        )
        self.elector = LeaderElector(
            self.kube,
            leading,
            namespace=settings.system_namespace,
            name=BINDER_LEADER_LEASE,
            identity=settings.identity,
            lease_duration=settings.lease_duration_seconds,
            renew_deadline=settings.renew_deadline_seconds,
            retry_period=settings.retry_period_seconds,
            executor=self._executor,
            on_change=self._leadership_changed,
            annotations={
                settings.keys.gpu_mem_reserve: str(settings.gpu_mem_reserve),
                settings.keys.gpu_mem_process_allowance: str(settings.gpu_mem_process_allowance),
                settings.keys.tenant_code_namespaces: ",".join(settings.tenant_code_namespaces),
            },
        )
        self.http = HttpServer(
            build_health_app(
                self.metrics.registry,
                self.not_ready,
                ready_text=lambda: f"ready ({self.role()})",
                # The binder's one error table decides the status, as for every other answer.
                not_ready_status=http_status(NotReadyError("caches not synced")),
            ),
            *settings.listen_http,
        )
        self.agent_down = AgentDown(
            self.kube,
            Rules(
                settings.scheduler_name,
                settings.keys.model_loaded,
                settings.agent_down_grace_seconds,
            ),
            deletions_per_second=settings.agent_down_deletions_per_second,
            replace_seconds=settings.agent_down_replace_seconds,
            identity=settings.identity,
        )
        self.autoscaling = Autoscaling(
            self.kube,
            self.ledger,
            Index(settings.keys),
            leading=leading,
            executor=self._executor,
            inbox=self._inbox,
            period=settings.autoscale_period_seconds,
            port=DEFAULT_PROXY_METRICS_PORT,
            identity=settings.identity,
            verdicts=self.models.status_writer.autoscaling,
            keys=settings.keys,
            on_load=self.models.observe_load,
        )
        self.node_scaling = (
            NodeScaling(
                self.kube,
                NodeScalingConfig(
                    settings.keys,
                    settings.scheduler_name,
                    settings.system_namespace,
                    settings.placeholder_image,
                    settings.placeholder_node_selector,
                    settings.placeholder_grace_seconds,
                    settings.identity,
                    settings.node_group_gpu_mem,
                    settings.gpu_mem_reserve,
                    settings.placeholder_pending_seconds,
                    settings.placeholder_gpu_memory_label,
                ),
                serves=self._serves,
                leading=leading.is_set,
                executor=self._executor,
                largest_gpu=self._largest_gpu,
                quota_room=self._quota_room,
            )
            if settings.node_autoscaling
            else None
        )
        self.inferenceservices = (
            InferenceServiceController(
                self.kube,
                leading=leading,
                executor=self._executor,
                identity=settings.identity,
                keys=settings.keys,
                config=InferenceServiceConfig(
                    tenant_code=frozenset(settings.tenant_code_namespaces),
                    config_namespaces=(settings.system_namespace, settings.kserve_namespace),
                    namespace_label=settings.modelmesh_namespace_label,
                ),
            )
            if settings.inferenceservices
            else None
        )
        self._informers: list[Informer] = []

    def _serves(self, node: str) -> bool:
        """The node has published GPUs and a live agent: it can serve models."""
        state = self.ledger.state
        info = state.nodes.get(node)
        return info is not None and bool(info.gpus) and state.leases.get(node, 0.0) > time.time()

    def _largest_gpu(self) -> int:
        """The bytes the largest healthy GPU of the cluster offers a model, after the reserve."""
        return self.ledger.state.memory.largest_usable()

    def _quota_room(self, namespace: str) -> int | None:
        """The GPU memory the namespace's quotas leave for one more replica, in bytes (None: no
        quota binds its replicas)."""
        check = check_for(self.ledger, self.settings.keys, namespace, None)
        if check is None:
            return None
        room, _ = check.room(1)
        return None if room == sys.maxsize else room

    def role(self) -> str:
        return "leader" if self.elector.is_leader else "follower"

    def not_ready(self) -> list[str]:
        if not self._informers:
            return ["not started"]
        grace = self.settings.watch_failure_grace_seconds
        problems = []
        for informer in self._informers:
            failing = informer.failing_for()
            if not informer.synced.is_set():
                problems.append(f"the {informer.kind} cache is not filled yet")
            elif failing > grace:
                problems.append(
                    f"the {informer.kind} watch has been failing for {failing:.0f} s "
                    f"(more than {grace:g} s): the cache may be stale"
                )
        return problems

    def _leadership_changed(self, leading: bool) -> None:
        self.metrics.leader.set(1 if leading else 0)
        if leading:
            # The rooms the previous leader's preemptions held are held again before anything
            # is placed.
            self.controller.restore_nominations()
            self.models.recover_nominations()
            # A new leader starts from what its warm caches say is pending, and reports the
            # unproven pods (the old leader's record of what it reported died with it).
            ledger = self.ledger
            for uid, pod in ledger.pending.items():
                self.queue.add(uid, pod.namespace)
            for verdict in list(ledger.unproven.values()):
                if ledger.on_tritonshare_node(verdict.pod):
                    self.controller.unproven_seen(verdict)
            # And reconciles every TritonModel: what the old leader left half done, the drains
            # and parks it began included.
            self.models.recover_drains()
            for uid in list(ledger.models):
                self.models.changed(uid)
            if self.inferenceservices is not None:
                self.inferenceservices.resync()

    async def start(self, lifecycle: Lifecycle) -> None:
        """Serve HTTP, fill the caches, then elect and schedule; each cleanup is registered
        right before what it undoes starts."""
        settings = self.settings
        lifecycle.on_shutdown("the API client", self._close_api_client)
        lifecycle.on_shutdown("the HTTP endpoints", self.http.stop)
        await self.http.start()
        lifecycle.on_shutdown("the watches", self._stop_watches)
        await self._fill_caches()
        lifecycle.on_shutdown("the in-flight API writes", self._drain_writes)
        # The tasks see the stop event: scheduling ends, and the elector releases the lease.
        lifecycle.on_shutdown_finish_tasks("the binder's tasks", DRAIN_SECONDS)
        stop = lifecycle.stop_event
        if settings.leader_elect:
            lifecycle.spawn(
                "The binder's leader election",
                self.elector.run(stop),
                consequence="stopping this replica",
            )
        else:
            self.elector.leading.set()
            self._leadership_changed(True)
        lifecycle.spawn(
            "The binder's scheduling",
            self.reconciler.run(stop),
            consequence="stopping this replica",
        )
        lifecycle.spawn(
            "The binder's watch on dead agents",
            self.agent_down.run(
                lambda: self.ledger.state.leases, self.elector.leading.is_set, stop, self._executor
            ),
            consequence="pods of nodes whose agent died are no longer marked or replaced",
            vital=False,
        )
        if settings.autoscale_period_seconds:
            lifecycle.spawn(
                "The binder's autoscaler",
                self.autoscaling.run(stop),
                consequence="TritonModels with spec.autoscaling are no longer scaled",
                vital=False,
            )
        if self.node_scaling is not None:
            lifecycle.spawn(
                "The binder's node autoscaling",
                self.node_scaling.run(stop),
                consequence="no placeholders are made or deleted, no node guards written",
                vital=False,
            )
        if self.inferenceservices is not None:
            lifecycle.spawn(
                "The binder's InferenceService controller",
                self.inferenceservices.run(stop),
                consequence="ModelMesh InferenceServices are no longer served as TritonModels",
                vital=False,
            )
        lifecycle.on_shutdown("the leadership", partial(self._end_leadership, lifecycle))
        log.info(
            "The binder %s serves on %s:%d and schedules pods with schedulerName %s (%s).",
            settings.identity,
            settings.listen_http[0],
            self.http.port,
            settings.scheduler_name,
            settings.policy,
        )

    async def _fill_caches(self) -> None:
        """Start the informers and wait until each has listed its kind."""
        loop = asyncio.get_running_loop()
        cache = self.cache
        kinds: list[Watched] = [
            (NODES, self._nodes_listed, self._node_changed),
            (
                leases_in(self.settings.system_namespace),
                cache.replace_leases,
                cache.apply_lease,
            ),
            (NAMESPACES, self._namespaces_listed, self._namespace_changed),
            (BUDGETS, cache.replace_budgets, cache.apply_budget),
            (QUOTAS, cache.replace_quotas, cache.apply_quota),
            (
                PRIORITY_CLASSES,
                cache.models.replace_priority_classes,
                cache.models.apply_priority_class,
            ),
            (PODS, self._pods_listed, self._pod_changed),
            (TRITONMODELS, self._models_listed, self._model_changed),
        ]
        optional = {TRITONMODELS.name}
        if self.inferenceservices is not None:
            # KServe's kinds: absent (no CRD), the controller stays idle and asks again.
            kinds.extend(self.inferenceservices.kinds())
            optional |= {kind.name for kind, _, _ in self.inferenceservices.kinds()}
        for kind, on_list, on_event in kinds:
            informer = Informer(
                self.kube,
                kind,
                loop,
                on_list=on_list,
                on_event=on_event,
                inbox=self._inbox,
                optional=kind.name in optional,
            )
            self._informers.append(informer)
            informer.start()
        for informer in self._informers:
            await informer.synced.wait()
        log.info(
            "Caches are warm: %d nodes, %d assigned pods, %d pending pods.",
            len(cache.state.nodes),
            len(cache.state.account_uids()),
            len(cache.pending),
        )

    def _pods_listed(self, items: list[JsonObject]) -> None:
        """The pod watch feeds the cache, the autoscaler's model pod addresses and node
        autoscaling (as do the node and TritonModel watches)."""
        self.cache.replace_pods(items)
        self.autoscaling.index.replace_pods(items)
        if self.node_scaling is not None:
            self.node_scaling.replace_pods(items)

    def _pod_changed(self, event: str, obj: JsonObject) -> None:
        self.cache.apply_pod(event, obj)
        self.autoscaling.index.apply_pod(event, obj)
        if self.node_scaling is not None:
            self.node_scaling.apply_pod(event, obj)

    def _nodes_listed(self, items: list[JsonObject]) -> None:
        self.cache.replace_nodes(items)
        if self.node_scaling is not None:
            self.node_scaling.replace_nodes(items)

    def _node_changed(self, event: str, obj: JsonObject) -> None:
        self.cache.apply_node(event, obj)
        if self.node_scaling is not None:
            self.node_scaling.apply_node(event, obj)

    def _models_listed(self, items: list[JsonObject]) -> None:
        self.cache.models.replace_models(items)
        if self.node_scaling is not None:
            self.node_scaling.replace_models(items)
        if self.inferenceservices is not None:
            self.inferenceservices.replace_models(items)

    def _model_changed(self, event: str, obj: JsonObject) -> None:
        self.cache.models.apply_model(event, obj)
        if self.node_scaling is not None:
            self.node_scaling.apply_model(event, obj)
        if self.inferenceservices is not None:
            self.inferenceservices.apply_model(event, obj)

    def _namespaces_listed(self, items: list[JsonObject]) -> None:
        """The namespace watch feeds the cache and the InferenceService controller (their
        modelmesh-enabled label)."""
        self.cache.replace_namespaces(items)
        if self.inferenceservices is not None:
            self.inferenceservices.replace_namespaces(items)

    def _namespace_changed(self, event: str, obj: JsonObject) -> None:
        self.cache.apply_namespace(event, obj)
        if self.inferenceservices is not None:
            self.inferenceservices.apply_namespace(event, obj)

    async def _end_leadership(self, lifecycle: Lifecycle) -> None:
        """A replica that does not release the lease (a task failed, or a crash is simulated with
        `elector.release_on_stop = False`) stops leading at once, so no write is retried on
        behalf of a leader that is going away."""
        if lifecycle.failure is not None or not self.elector.release_on_stop:
            self.elector.leading.clear()

    async def _drain_writes(self) -> None:
        await self.controller.drain(DRAIN_SECONDS)

    async def _stop_watches(self) -> None:
        informers = [*self._informers, *self.autoscaling.informers]
        for informer in informers:
            informer.stop()
        self.kube.close_watches()
        # Joined side by side: 5 s at most for all of them, not 5 s each.
        loop = asyncio.get_running_loop()
        await asyncio.gather(
            *(loop.run_in_executor(self._executor, informer.join, 5.0) for informer in informers)
        )

    async def _close_api_client(self) -> None:
        self._executor.shutdown(wait=True)
        self.kube.close()
