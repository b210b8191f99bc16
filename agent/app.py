"""Assembling the agent from its parts, starting it, and stopping it in a fixed order.

The shape of every part (`common.lifecycle`): `Agent(settings, nvml=...)` builds everything, in
the order the parts depend on each other, each from what is built before it; `start(lifecycle)`
binds the servers, logs "Agent for node N is serving gRPC on HOST:PORT", writes the ports file,
spawns the long-lived tasks and registers the cleanups. Shutdown (reverse order of registration):
stop accepting gRPC calls (in-flight ones get a grace period), stop HTTP, let the loops finish
their current step (then cut them off), release NVML, stop the pod watch, then close the Triton,
file and Kubernetes clients. `nvml` is `agent.gpus.nvml.PYNVML`; tests build an Agent in-process
with a mock NVML module.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import grpc

from agent import __version__
from agent.api.auth import Authorizer
from agent.api.callgate import MAX_MESSAGE_BYTES, Gate
from agent.api.service import AgentService, add_to_server
from agent.errors import AgentError
from agent.gpus.apart import ApartMemory
from agent.gpus.foreign import ForeignWatch
from agent.gpus.inventory import GpuSnapshot
from agent.gpus.memory import MemoryLedger
from agent.gpus.nvml import GpuReader
from agent.gpus.processes import TritonProcesses
from agent.gpus.relayclient import RelayedNvml
from agent.installs.filecache import FileCache, NamespaceDisk
from agent.installs.modelconfig import ModelPolicy
from agent.installs.repository import Repository, check_apart
from agent.kube.client import KubeClient, PodWatch
from agent.kube.events import PodEvents
from agent.metrics import AgentMetrics
from agent.models.evictor import Evictor
from agent.models.node import Node
from agent.models.nodemodels import ModelLimits, Models
from agent.models.probationhold import ProbationHold, latest_use
from agent.models.quietwindow import QuietWindow
from agent.models.reconcile import ReconcilePolicy, Reconciler
from agent.models.tritonram import HostMemory, HostMemoryRules
from agent.pods.callerkeys import CallerKeys, secret_beside
from agent.pods.callertable import CallerPublisher, nobody_on_probation, nobody_quarantined
from agent.pods.loadfailures import LoadFailures
from agent.pods.nodepods import NodePods
from agent.pods.ownership import OwnerStore
from agent.pods.provenpods import PlacementVerifier, Proven
from agent.quarantine.crashledger import CrashLedger, CrashRecord
from agent.quarantine.published import NodeQuarantine
from agent.quarantine.suspects import CallerRecord
from agent.settings import Settings
from agent.status.conditions import NO_REFUSALS, ModelConditions
from agent.status.memoryreadings import MemoryReadings
from agent.status.node import NodePublisher, NodeSettings
from agent.status.requestcrash import RequestCrashes
from agent.status.stopping import NodeStop
from agent.status.tritonversion import read_triton_version
from agent.triton import TritonClient
from common.activity import ActivityTableError
from common.activity import read_table as read_activity
from common.crashwitness import path_beside
from common.health import HttpServer, LoopBeat, build_health_app
from common.hosted import host_name, loaded_condition
from common.lifecycle import Lifecycle
from common.proofs import KeyDirectory, PlacementKeyError

log = logging.getLogger(__name__)

# Replies are small (a model's status, the node's GPUs); 4 MiB is grpc's own default.
MAX_SEND_BYTES = 4 * 1024 * 1024
GRPC_GRACE_SECONDS = 10.0
# A reconciliation step (an unload waiting for Triton) may take this long before it is cut off.
LOOPS_GRACE_SECONDS = 15.0
# Triton's container starts the NVML relay beside Triton; the agent waits this long for it.
RELAY_START_SECONDS = 60.0
RELAY_RETRY_SECONDS = 0.5
RELAY_REMEDY = (
    "with --gpu-source=triton, Triton's container must be given every GPU of the node (its "
    "nvidia.com/gpu request) and run the NVML relay, whose socket the agent reaches at "
    '--nvml-relay-socket (docs/deploy.md, "Requirements")'
)


def _split(host_port: str) -> tuple[str, int]:
    host, _, port = host_port.rpartition(":")
    return host.strip("[]"), int(port)


def _model_limits(settings: Settings) -> ModelLimits:
    return ModelLimits(
        policy=ModelPolicy(
            safe_backends=frozenset(settings.safe_backends),
            tenant_code_namespaces=frozenset(settings.tenant_code_namespaces),
            max_instances=settings.max_model_instances,
            max_load_data_bytes=settings.max_load_data_bytes,
            max_threads=settings.max_model_threads,
            max_versions=settings.max_model_versions,
            max_queue_microseconds=round(settings.max_model_queue_seconds * 1_000_000),
        ),
        cpu_only=settings.cpu_only,
        unload_timeout=settings.unload_timeout_seconds,
        max_model_bytes=settings.max_model_bytes,
        install_deadline=settings.install_deadline_seconds,
        install_idle=settings.install_idle_seconds,
        install_first_chunk=settings.install_first_chunk_seconds,
        gpu_mem_reserve=settings.gpu_mem_reserve,
        load_timeout_base=settings.load_timeout_base_seconds,
        load_timeout_per_gib=settings.load_timeout_per_gib_seconds,
        load_timeout=settings.load_timeout_seconds,
        max_load_attempts=settings.max_load_attempts,
        parallel_loads=settings.parallel_loads,
    )


def _gpu_reader(settings: Settings, nvml: types.ModuleType) -> GpuReader:
    """NVML in the agent's container (`nvml`: a stand-in module), or in Triton's through the
    relay (`--gpu-source=triton`)."""
    if settings.gpu_source == "nvml":
        return GpuReader(nvml=nvml)
    return GpuReader(
        nvml=RelayedNvml(settings.nvml_relay_socket),
        remedy=RELAY_REMEDY,
        source="NVML in Triton's container",
    )


def _node_settings(settings: Settings) -> NodeSettings:
    return NodeSettings(
        node_name=settings.node_name,
        keys=settings.keys,
        system_namespace=settings.system_namespace,
        cpu_only=settings.cpu_only,
        advertise_gpu_mem=settings.advertise_gpu_mem,
        gpu_poll_seconds=settings.gpu_poll_seconds,
        lease_renew_seconds=settings.lease_renew_seconds,
        lease_duration_seconds=settings.lease_duration_seconds,
        node_resync_seconds=settings.node_resync_seconds,
        usage_publish_seconds=settings.usage_publish_seconds,
    )


class Agent:
    """Every part of one agent process, built in the order they depend on each other: the
    clients of outside systems, the node's GPUs and pods, the models, then what drives and serves
    them. Each takes only what is built before it."""

    def __init__(self, settings: Settings, *, nvml: types.ModuleType) -> None:
        self.settings = settings
        if settings.placement_key_dir is None:
            raise AgentError("the agent needs --placement-key-dir to check placements")
        try:
            self.placement_keys = KeyDirectory(settings.placement_key_dir)
        except PlacementKeyError as e:
            raise AgentError(str(e)) from e
        self.metrics = AgentMetrics()

        # Outside systems: the Kubernetes API (with this node's pods, which the Events of a
        # model host's replicas are written on), Triton, the model files, NVML.
        self.kube = KubeClient(settings.kubeconfig)
        self.verifier = PlacementVerifier(self.placement_keys.ring, settings.node_name)
        self.pods = NodePods(
            self.verifier,
            self.kube.get_pod,
            scheduler_name=settings.scheduler_name,
            keys=settings.keys,
            max_hosted=self._max_hosted,
        )
        self.events = PodEvents(
            self.kube, f"tritonshare-agent/{settings.node_name}", replicas=self.pods.replica
        )
        self.triton = TritonClient(
            settings.triton_http_url,
            settings.triton_grpc_url,
            admin_header=settings.triton_admin_header,
            load_timeout=settings.load_timeout_seconds,
        )
        self.repository = Repository(
            settings.model_repository,
            settings.staging_dir,
            namespace_bytes=settings.max_install_bytes_per_namespace,
        )
        self.cache = FileCache(
            settings.model_cache_dir or self.repository.root.parent / ".tritonshare-kept",
            settings.model_cache_bytes,
        )
        self.owners = OwnerStore(
            settings.state_dir or self.repository.root.parent / ".tritonshare-state"
        )
        self.crashes = CrashLedger(
            self.owners.directory,
            settings.crash_quarantine_after,
            settle_seconds=settings.crash_settle_seconds,
            probation_seconds=settings.crash_probation_seconds,
            namespace_quarantine_after=settings.crash_namespace_quarantine_after,
            expiry_seconds=settings.crash_quarantine_expiry_seconds,
        )
        self.hold = ProbationHold(
            settings.crash_hold_seconds, node_holds_per_file=settings.crash_quarantine_after
        )
        self._gpu_reader = _gpu_reader(settings, nvml)
        self._nvml_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-nvml")
        self.triton_processes = TritonProcesses(settings.triton_pid_file)
        self.apart = ApartMemory(
            self._gpu_reader, self.triton_processes, executor=self._nvml_thread
        )

        # The node: its GPUs (and the memory measured on them), its pods.
        self.ledger = MemoryLedger(tolerance_fraction=settings.gpu_mem_tolerance)
        self._reconcile_now = asyncio.Event()
        """Set to ask the reconciler for a pass now (a model uses more memory than it may)."""
        self.readings = MemoryReadings(self.ledger, self.apart, self.metrics, self._reconcile_now)
        self.node = NodePublisher(
            self.kube,
            self._gpu_reader,
            self.metrics,
            _node_settings(settings),
            nvml_executor=self._nvml_thread,
            on_snapshot=self.readings.observe,
            usage=self.ledger.annotation,
        )
        self.foreign = ForeignWatch(
            self._gpu_reader,
            self.triton_processes,
            self.kube,
            settings.node_name,
            period=settings.gpu_poll_seconds,
            executor=self._nvml_thread,
        )
        self.host_memory = HostMemory(
            self.triton_processes,
            HostMemoryRules(
                limit=settings.triton_memory_limit,
                reserve=settings.triton_memory_reserve,
                per_load=settings.triton_memory_per_load,
                floor=settings.triton_memory_floor,
                namespace_percent=settings.triton_memory_namespace_percent,
            ),
            quiet=QuietWindow(settings.activity_path, max_age=settings.activity_max_age_seconds),
        )

        # The models, and what keeps them in line with the pods.
        self.evictor = Evictor(
            settings.activity_path,
            max_age=settings.activity_max_age_seconds,
            min_idle=settings.evict_min_idle_seconds,
            events=self.events,
            metrics=self.metrics,
        )
        # The node as the models see it (`self.node` publishes the node's GPUs).
        models_node = Node(
            self.triton,
            self.repository,
            _model_limits(settings),
            gpus=self.node,
            ledger=self.ledger,
            host=self.host_memory,
            apart=self.apart,
            metrics=self.metrics,
        )
        self.models = Models(
            models_node,
            self.owners,
            self.pods,
            cache=self.cache,
            # No bound until `start` measures the repository's volume (`_prepare_cache`).
            namespace_disk=NamespaceDisk(0),
            crashes=self.crashes,
            evictor=self.evictor,
            hold=self.hold,
            events=self.events,
        )
        # Pods whose requests were at Triton when it exited, as the node's gateway witnessed.
        self.request_crashes = _request_crashes(
            settings, self.crashes, self.events, self.metrics, self._requests_quarantined
        )
        self.load_failures = LoadFailures()
        self.conditions = ModelConditions(
            self.kube,
            self.events,
            settings.keys.model_loaded,
            self.models.reports.status_for,
            refused=self.request_crashes.quarantine_of if self.request_crashes else NO_REFUSALS,
            quarantine=self.models.quarantine.for_pod,
            fail_pod=self.kube.fail_pod,
            hosts=self.pods,
            remove=self.kube.remove_pod_condition,
            load_failure=self.load_failures.of,
            replica_condition=partial(_replica_condition, settings),
        )
        self.reconciler = Reconciler(
            self.models,
            self.pods,
            self.metrics,
            self.events,
            policy=ReconcilePolicy(
                orphan_grace_seconds=settings.orphan_grace_seconds,
                resync_seconds=settings.resync_seconds,
                load_backoff_max_seconds=settings.load_backoff_max_seconds,
                max_load_attempts=settings.max_load_attempts,
                triton_poll_seconds=settings.triton_poll_seconds,
                enforcement=settings.gpu_mem_enforcement,
            ),
            fail_pod=self.conditions.fail,
            wake=self._reconcile_now,
        )
        self.quarantine = NodeQuarantine(
            self.crashes,
            self.kube,
            settings.node_name,
            settings.keys,
            self._quarantine_cleared,
            period=settings.lease_renew_seconds,
            on_callers_cleared=self._callers_cleared,
            wanting=self.models.quarantine.wanting,
        )
        self.caller_keys, self.callers = _caller_table(
            settings, self.reconciler, self.request_crashes, self.hold
        )
        if self.callers is not None:
            # The wiring after construction: the table is computed by the reconciler from
            # the owners and the pods, and is rewritten when either changes.
            self.reconciler.on_pods = self.owners.on_change = self.callers.changed
            self.hold.on_change = self.callers.publish
            self.hold.drained = partial(_held_drained, self.callers, settings.activity_path)
        if self.request_crashes is not None:
            # A load Triton died under, asked for again, waits until what it held is back.
            self.request_crashes.on_triton_gone = self.models.restore_gate.gone
            self.request_crashes.on_triton_up = partial(
                _triton_back, self.hold if self.callers is not None else None, self.reconciler
            )
        _watch_metrics(self)

        # Serving the pods: who may call, the service, the gate in front of it.
        self.authorizer = Authorizer(
            self.kube,
            self.verifier,
            node_name=settings.node_name,
            scheduler_name=settings.scheduler_name,
            keys=settings.keys,
            audience=settings.audience,
            platform_accounts=settings.platform_accounts,
            cache_seconds=settings.token_cache_seconds,
            failure_cache_seconds=settings.auth_failure_cache_seconds,
            watched_host=self.pods.watched_host,
            max_hosted=self._max_hosted,
        )
        self.service = AgentService(
            self.models,
            self.authorizer,
            self.metrics,
            self.gpu_snapshot,
            settings.node_name,
            self.events,
            on_reinstall=self.conditions.reinstalling,
            on_loaded=self.conditions.loaded,
            on_unloading=self.conditions.unloading,
            load_failures=self.load_failures,
            on_failures_reported=self.conditions.failures_reported,
            caller_keys=self.caller_keys,
        )
        self.gate = Gate(
            self.authorizer,
            self.metrics,
            max_calls=settings.max_calls,
            max_calls_per_namespace=settings.max_calls_per_namespace,
            max_calls_per_pod=settings.max_calls_per_pod,
            is_host=self.pods.is_host,
        )
        self.grpc_address = ""
        self.http_address = ""
        self._grpc: grpc.aio.Server | None = None
        self._http: HttpServer | None = None
        self._watch: PodWatch | None = None
        self.stopping = NodeStop(
            self.pods,
            self.conditions,
            self.kube.get_pod,
            self._node_stopping,
            self._triton_live,
            namespace=settings.system_namespace,
            pod_name=settings.pod_name,
            drain_seconds=settings.stop_drain_seconds,
            unroute_seconds=settings.stop_unroute_seconds,
            list_pods=self.kube.list_pods,
            leave_services=self.callers.leave_services if self.callers is not None else None,
        )

    def _requests_quarantined(self) -> None:
        if self.callers is not None:
            self.callers.changed()  # the gateway refuses the quarantined pods from now on

    def _quarantine_cleared(self, cleared: list[CrashRecord]) -> None:
        self.models.quarantine.cleared(cleared)
        self.reconciler.trigger()

    def _callers_cleared(self, cleared: list[CallerRecord]) -> None:
        if self.callers is not None:
            self.callers.changed()  # the gateway serves the cleared pods again

    def gpu_snapshot(self) -> GpuSnapshot | None:
        return self.node.snapshot

    def _max_hosted(self) -> int:
        """The most replicas one model host may name here (0 before the GPUs are read)."""
        snapshot = self.node.snapshot  # the pod watch starts after the node's first reading
        total = snapshot.healthy_memory_total if snapshot is not None else 0
        return total // max(self.settings.min_gpu_mem, 1)

    def not_ready(self) -> list[str]:
        """Why the agent is not ready; empty when it is."""
        reasons = []
        if not self.node.gpus_read:
            reasons.append(self.node.nvml_error or "the GPUs have not been read yet")
        if not self.reconciler.triton_live:
            reasons.append(f"Triton at {self.triton.base} is not reachable")
        if not self.pods.synced:
            reasons.append("this node's pods have not been listed yet")
        return reasons

    async def start(self, lifecycle: Lifecycle) -> None:
        settings = self.settings
        self.readings.loop = asyncio.get_running_loop()
        check_apart(self.repository.root, self.owners.directory, "state directory", "--state-dir")
        self.repository.prepare()
        self.models.installer.namespace_disk = _prepare_cache(
            self.repository,
            self.cache,
            self.owners,
            self.settings.max_installed_bytes_per_namespace,
        )
        self.owners.load()
        self.crashes.load()
        lifecycle.on_shutdown("the Kubernetes client", self.kube.close)
        lifecycle.on_shutdown("the pod events", self.events.close)
        lifecycle.on_shutdown("the ModelLoaded writes", self.conditions.close)
        lifecycle.on_shutdown("the file workers", self.models.close)
        lifecycle.on_shutdown("the Triton client", self.triton.close)
        lifecycle.on_shutdown("the pod watch", self._stop_watch)
        lifecycle.on_shutdown("NVML", self._close_nvml)
        # Runs after the servers stop and before the clients close: the loops see the stop
        # event and finish their current step, so none of them is cut off mid-call.
        lifecycle.on_shutdown_finish_tasks("the agent's loops", LOOPS_GRACE_SECONDS)

        await self.node.check_tenant_code(settings.tenant_code_namespaces)
        # The first GPU read happens before serving, so ListGpus and loads see the GPUs at once.
        await self.node.refresh_gpus()
        if settings.gpu_source == "triton":
            # Triton's container starts the NVML relay as the agent starts: give it a while.
            await self.node.wait_for_gpus(
                RELAY_START_SECONDS, RELAY_RETRY_SECONDS, "the NVML relay in Triton's container"
            )
        await self.node.check_gpu_count()
        # So do the quarantines a replaced node pod left on the Node: no load may precede them.
        try:
            await self.quarantine.sync()
        except AgentError as e:
            log.warning(
                "Reading the node's quarantines before serving has failed (%s): they are read "
                "again every %g s.",
                e,
                self.quarantine.period,
            )

        # Both servers' stops are registered before either starts, so a stop that cancels the
        # start (a signal) stops what did start; the gRPC server stops first.
        http_host, http_port = _split(settings.listen_http)
        # Off the agent's loop: a loop kept busy by tenants' pod writes does not fail liveness.
        home = LoopBeat(asyncio.get_running_loop())
        self._http = HttpServer(
            build_health_app(self.metrics.registry, self.not_ready, home=home),
            http_host,
            http_port,
            home=home,
        )
        lifecycle.on_shutdown("the HTTP server", self._http.stop)
        lifecycle.on_shutdown("the gRPC server", self._stop_grpc)
        # First of all at a stop, while the gRPC server still answers the hosts' loaders.
        lifecycle.on_shutdown("the model hosts' drain", self.stopping.drain)
        self._grpc, self.grpc_address = _grpc_server(
            self.service, self.gate, settings.listen_grpc, settings.idle_connection_seconds
        )
        await self._grpc.start()
        await self._http.start()
        self.http_address = f"{http_host}:{self._http.port}"

        stop = lifecycle.stop_event
        lifecycle.spawn("the node publisher", self.node.run(stop))
        lifecycle.spawn(
            "the Triton version reader",
            read_triton_version(self.triton, settings.keys, self.node.set_triton, stop),
            consequence="the node publishes no Triton version",
            vital=False,
        )
        lifecycle.spawn(
            "the foreign GPU process check",
            self.foreign.run(stop, self.gpu_snapshot),
            consequence="GPU processes are no longer checked",
            vital=False,
        )
        lifecycle.spawn("the Triton watch", self.reconciler.watch_triton(stop))
        lifecycle.spawn("the reconciler", self.reconciler.run(stop))
        lifecycle.spawn("the node's quarantine annotations", self.quarantine.run(stop))
        lifecycle.spawn(
            "the ModelLoaded conditions",
            self.conditions.run(
                stop, self._proven_pods, self._triton_live, settings.triton_poll_seconds
            ),
        )
        if self.callers is not None:
            lifecycle.spawn("the gateway's caller table", self.callers.run(stop))
        if self.request_crashes is not None:
            lifecycle.spawn("the Triton exit watch", self.request_crashes.run(stop))
        self._watch = self.kube.watch_pods(
            settings.node_name, self.reconciler.on_list, self.reconciler.on_event
        )
        log.info(
            "Agent for node %s is serving gRPC on %s (version %s; health and metrics on %s).",
            settings.node_name,
            self.grpc_address,
            __version__,
            self.http_address,
        )
        if settings.ports_file is not None:
            _write_ports(settings.ports_file, self.grpc_address, self.http_address)

    def _triton_live(self) -> bool:
        return self.reconciler.triton_live

    def _node_stopping(self) -> None:
        self.service.node_stopping = True  # ListHosted tells the hosts' loaders

    def _proven_pods(self) -> list[Proven] | None:
        """This node's live pods with a proven placement; None before the first pod list."""
        return self.pods.all_proven() if self.pods.synced else None

    async def _stop_grpc(self) -> None:
        if self._grpc is not None:
            await self._grpc.stop(GRPC_GRACE_SECONDS)
            self._grpc = None

    async def _close_nvml(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._nvml_thread, self._gpu_reader.close)
        self._nvml_thread.shutdown(wait=True)

    async def _stop_watch(self) -> None:
        if self._watch is not None:
            self._watch.stop()
            self._watch = None


def _watch_metrics(agent: Agent) -> None:
    """Point the agent's metrics at what they read when /metrics is scraped."""
    metrics, models, host, crashes = agent.metrics, agent.models, agent.host_memory, agent.crashes
    snapshot = agent.gpu_snapshot
    metrics.watch_memory(agent.ledger, snapshot)
    metrics.watch_kept(agent.cache.kept)
    metrics.watch_gpus(snapshot, models.reports.loaded_per_gpu)
    metrics.watch_foreign(agent.foreign.counts)
    metrics.watch_host_memory(host.used_bytes, host.limit, host.models)
    metrics.watch_models(agent.reconciler.callers)
    metrics.watch_quarantine(crashes.records, crashes.callers, crashes.namespaces)
    metrics.watch_residency(models.reports.residency_states)


def _replica_condition(settings: Settings, model: str, ordinal: int) -> tuple[str, str]:
    """The host pod on this node of a namespace's replica, and its loaded condition's type."""
    return host_name(settings.node_name), loaded_condition(settings.keys, model, ordinal)


def _triton_back(hold: ProbationHold | None, reconciler: Reconciler) -> None:
    """Triton is there again: the probation hold after an exit ends (where the gateway holds),
    and a pass loads again what it held (opening the restore gate)."""
    if hold is not None:
        hold.triton_back()
    reconciler.trigger()


def _request_crashes(
    settings: Settings,
    crashes: CrashLedger,
    events: PodEvents,
    metrics: AgentMetrics,
    quarantined: Callable[[], None],
) -> RequestCrashes | None:
    """The pods whose requests were at Triton when it exited, from the node gateway's witness
    file (None without the gateway's table: no witnesses)."""
    if settings.gateway_table is None:
        return None
    found = RequestCrashes(
        settings.triton_http_url,
        crashes,
        settings.crash_witness_file or path_beside(settings.gateway_table),
        events,
        metrics,
        quarantined,
    )
    # An exit the witnessed requests explain is not counted against a load.
    crashes.witnessed = found.requests_at
    return found


def _caller_table(
    settings: Settings,
    reconciler: Reconciler,
    requests: RequestCrashes | None,
    hold: ProbationHold,
) -> tuple[CallerKeys | None, CallerPublisher | None]:
    """The caller keys and the table the node gateway knows the pods by (none without
    `--gateway-table`)."""
    if settings.gateway_table is None:
        return None, None
    keys = CallerKeys(secret_beside(settings.gateway_table))
    table = CallerPublisher(
        settings.gateway_table,
        settings.node_name,
        reconciler.callers,
        refresh_seconds=settings.gateway_table_refresh_seconds,
        quarantine=requests.quarantine_of if requests else nobody_quarantined,
        probation=requests.on_probation if requests else nobody_on_probation,
        held=hold.holds,
        trial=hold.trial,
        key_of=keys.digest,
    )
    return keys, table


def _held_drained(callers: CallerPublisher, activity: Path | None, since: float) -> float | None:
    """Whether the gateway holds the pods the caller table holds, with none of their requests
    at Triton, as its activity table written since `since` says; then when their last request
    began or ended (`agent.models.probationhold.latest_use`)."""
    held = callers.held_names()
    try:
        table = read_activity(activity) if held and activity is not None else None
    except ActivityTableError:
        table = None
    return latest_use(held, table, since)


def _prepare_cache(
    repository: Repository, cache: FileCache, owners: OwnerStore, limit: int
) -> NamespaceDisk:
    """Check where kept files live (a rename away from the repository) and make the namespace
    disk bound, which defaults (`limit` 0) to half the repository's volume."""
    root = repository.root
    check_apart(root, cache.root, "kept-files directory", "--model-cache-dir")
    kept = cache.root.resolve()
    for other, flag in (
        (repository.staging_root, "--staging-dir"),
        (owners.directory.resolve(), "--state-dir"),
    ):
        if kept == other or other in kept.parents or kept in other.parents:
            raise AgentError(
                f"the kept-files directory {kept} overlaps the directory of {flag} ({other}); "
                f"the agent empties each of them of what it does not know, set "
                f"--model-cache-dir to a directory of its own"
            )
    cache.prepare()
    if cache.root.stat().st_dev != root.stat().st_dev:
        raise AgentError(
            f"the kept-files directory {cache.root} is on another filesystem than the "
            f"model repository {root}; keeping files would copy them, put both on one"
        )
    return NamespaceDisk(limit or shutil.disk_usage(root).total // 2)


def _grpc_server(
    service: AgentService, gate: Gate, listen: str, idle_seconds: float
) -> tuple[grpc.aio.Server, str]:
    """The agent's gRPC server bound to `listen` (not started), and the address it listens on;
    OSError saying what to do when it cannot listen there."""
    server = grpc.aio.server(
        interceptors=[gate],
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_SEND_BYTES),
            # BDP probing grows a connection's stream windows to megabytes, which grpc then
            # fills for calls the gate has not admitted; installs read their messages as they
            # come, so the 64 KiB window grows per message instead (benchmarks/agent_install).
            ("grpc.http2.bdp_probe", 0),
            # grpc's server bounds no connection count; idle connections go, so holding one
            # open costs a caller a call in progress, which the gate bounds.
            ("grpc.max_connection_idle_ms", int(idle_seconds * 1000)),
        ],
    )
    add_to_server(service, server)
    host, _ = _split(listen)
    try:
        port = server.add_insecure_port(listen)
    except RuntimeError as e:
        port = 0
        cause: Exception | None = e
    else:
        cause = None
    if port == 0:
        raise OSError(
            f"cannot listen for gRPC on {listen} (the port is taken or the "
            f"address is not local); choose another --listen-grpc"
        ) from cause
    return server, f"{host}:{port}"


def _write_ports(path: Path, grpc_address: str, http_address: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps({"grpc": grpc_address, "http": http_address}))
    temporary.replace(path)
