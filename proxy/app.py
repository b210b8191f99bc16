"""Assembles the proxy and owns its shutdown order.

The shape of every part (`common.lifecycle`): `Proxy(settings)` builds the concurrency limiter,
the metrics, the relays and the readiness (for a model host, --models-file, the table of models
whose entries each get their own limiter, metrics and, when on-demand, residency: proxy/table.py);
`start(lifecycle)` reads the table and follows its file, then opens the REST port, the gRPC port
and then the metrics and health port (the startup probe's /healthz answers once the others
listen), the idle watch of the on-demand models (--residency on-demand, or a host's on-demand
entries), and (with --model-dir) the watch that reinstalls the model when the node has lost it.
On SIGTERM (Kubernetes starts terminating the pod) the order is fixed:
  0. stop the reinstall watch (and a loader it runs), the idle watch and the models file's watch,
     so nothing installs, sleeps or joins the table after the unload;
  1. report not ready (REST /v2/health/ready, gRPC ServerReady, /readyz) so the endpoints drop us;
  2. keep serving for the drain period, as requests routed before the endpoint update still come;
  3. stop listening and let in-flight requests finish, up to the finish timeout;
  4. ask the agent to unload the model (a host: each model of its table), authenticated as the pod;
  5. stop the metrics port and exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging

from common.contract import PROXY_AUTOSCALING_PATH, RESIDENCY_ON_DEMAND
from common.health import HttpServer, build_health_app
from common.lifecycle import Lifecycle, serve
from common.modelconfig import calls_may_run_twice
from proxy.agentclient import AgentCalls, AgentClient
from proxy.callerkey import CallerKeyKeeper
from proxy.grpc.grpcio import GrpcProxy
from proxy.grpc.server import GrpcRelay
from proxy.http1.listener import RestRelay
from proxy.mesh import RELAYED_IN_FLIGHT, MeshTable, Route
from proxy.metrics import ProxyMetrics
from proxy.parking import MOST_WAITING, Parking
from proxy.policy.limiter import Limiter
from proxy.processflags import ProxyState
from proxy.readiness import ASLEEP, PARKED, OwnModel, Readiness
from proxy.reinstall import LoaderProcess, Reinstaller, ReinstallTiming, loader_flags
from proxy.residency import IdlePolicy, Residencies, Residency
from proxy.settings import Settings
from proxy.table import ConfigReads, Entry, ModelTable, Served

log = logging.getLogger(__name__)

LEARN_BACKOFF_ROUNDS = 32
"""The most `model_check_seconds` rounds between two reads of a sleeping model's config
(`ProxyApp.learn_resends`): about a minute at the default 2 s."""


class Proxy:
    """The running parts of one proxy process: `Proxy(settings)` builds them (nothing listens
    yet), `start(lifecycle)` listens (the shape of every part, `common.lifecycle`)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.state = ProxyState()
        self.limiter = Limiter(
            settings.container_concurrency,
            settings.queue_limit,
            settings.queue_timeout_seconds,
            window=settings.concurrency_window_seconds,
        )
        self.metrics = ProxyMetrics(self.limiter, settings.model_id)
        """A model pod's model's metrics; in a host, those of requests naming no model."""
        self.table: ModelTable
        """The models served: a model pod's one, with the pod's limiter and metrics; with
        --models-file, the host's, each with its own."""
        if settings.models_file is None:
            own = Served(
                settings.model_id,
                self.limiter,
                self.metrics,
                Entry(
                    settings.model_id,
                    residency=settings.residency,
                    idempotent=settings.idempotent,
                ),
            )
            self.table = ModelTable.of_one(own)
        else:
            self.table = ModelTable(
                self.served,
                drain_seconds=settings.finish_timeout_seconds,
                limits=self.limits,
                on_remove=self.removed,
                on_retune=self.retuned,
            )
        self.own_model = OwnModel(settings, self.state, self.node_stop)
        self._leaving_node = False
        self.rest = RestRelay(settings, self.limiter, self.metrics, self.state, self.table)
        self.grpc: GrpcProxy | GrpcRelay
        if settings.grpc_mode == "relay":
            self.grpc = GrpcRelay(settings, self.limiter, self.metrics, self.state, self.table)
        else:
            self.grpc = GrpcProxy(settings, self.limiter, self.metrics, self.state)
        self.mesh: MeshTable | None = None
        """With the mesh ports: the namespace's models, served here or relayed (`proxy.mesh`)."""
        self.mesh_rest: RestRelay | None = None
        self.mesh_grpc: GrpcRelay | None = None
        if settings.listen_mesh_http is not None or settings.listen_mesh_grpc is not None:
            self.mesh = MeshTable(self.table, self.relayed)
            self.mesh.on_change = self.routes_changed
            if settings.listen_mesh_http is not None:
                self.mesh_rest = RestRelay(
                    settings, self.limiter, self.metrics, self.state, self.table, self.mesh
                )
            if settings.listen_mesh_grpc is not None and settings.grpc_mode == "relay":
                self.mesh_grpc = GrpcRelay(
                    settings, self.limiter, self.metrics, self.state, self.table, self.mesh
                )
        self.table.on_change = self.table_changed
        self._agent_calls: AgentCalls | None = None
        """With the agent: sleeps and wakes the on-demand models (one channel for them all)."""
        if settings.agent_address and settings.token_file is not None:
            self._agent_calls = AgentCalls(
                AgentClient(
                    settings.agent_address, settings.token_file, settings.agent_timeout_seconds
                ),
                settings.agent_timeout_seconds,
            )
        self.caller_key: CallerKeyKeeper | None = None
        """With the agent: the pod's key for the node gateway (grpc.aio's connections, in
        --grpc-mode grpcio, present none)."""
        if settings.agent_address and settings.token_file is not None:
            self.caller_key = CallerKeyKeeper(
                AgentClient(
                    settings.agent_address, settings.token_file, settings.agent_timeout_seconds
                ),
                self.state,
            )
        self.parking = Parking(MOST_WAITING)
        """The models parked on this host at zero replicas, and their waiting requests."""
        self.residencies = Residencies(
            None
            if settings.models_file is None or self._agent_calls is None
            else self._agent_calls.asleep
        )
        """The on-demand models (proxy/residency.py): the pod's with --residency on-demand, or
        each on-demand entry of the host's table; in a host, each is looked up at the agent
        when it joins or seems unloaded (a model pod's reinstall watch does that)."""
        self.residency: Residency | None = None
        """With --residency on-demand: sleeps the pod's idle model and wakes it."""
        if settings.residency == RESIDENCY_ON_DEMAND:
            self.residency = self.on_demand(
                settings.model_id, settings.idle_seconds, self.limiter, self.metrics
            )
        self.loader: LoaderProcess | None = None
        self.reinstaller: Reinstaller | None = None
        """With --model-dir: reinstalls the model when the node has lost it (proxy/reinstall.py)."""
        if (
            settings.model_dir is not None
            and settings.agent_address
            and settings.token_file is not None
        ):
            self.loader = LoaderProcess(
                loader_flags(
                    settings.model_dir,
                    settings.model_id,
                    settings.agent_address,
                    settings.token_file,
                    log_level=settings.log_level,
                    log_format=settings.log_format,
                )
            )
            self.reinstaller = Reinstaller(
                settings.model_id,
                AgentClient(
                    settings.agent_address, settings.token_file, settings.agent_timeout_seconds
                ),
                self.own_model.ready,
                self.loader.run,
                ReinstallTiming(
                    settings.model_check_seconds, settings.reinstall_backoff_max_seconds
                ),
                residency=self.residency,
            )
        reinstaller = self.reinstaller
        self.readiness = Readiness(
            self.state,
            self.own_model,
            self.table.names,
            (lambda: reinstaller.reason) if reinstaller is not None else lambda: "",
            self.asleep_as,
        )
        host, port = settings.listen_metrics
        self.metrics_server = HttpServer(
            build_health_app(
                self.metrics.registry,
                self.readiness.not_ready,
                self.readiness.ready_text,
                documents={PROXY_AUTOSCALING_PATH: self.metrics.counts},
            ),
            host,
            port,
        )
        """/metrics, /healthz, /readyz (common/health.py) and the counts the binder's
        autoscaler reads (/autoscaling), on their own port."""
        self._watch_task: asyncio.Task[None] | None = None
        self._idle_task: asyncio.Task[None] | None = None
        self._table_task: asyncio.Task[None] | None = None
        self._learn_task: asyncio.Task[None] | None = None

    def limits(self, entry: Entry) -> tuple[int, int]:
        """A host model's (concurrency limit, queue limit): its `maxConcurrency`, else
        --container-concurrency; its queue as --queue-size says for that limit."""
        settings = self.settings
        if not entry.max_concurrency:
            return settings.container_concurrency, settings.queue_limit
        queue = settings.queue_size
        return entry.max_concurrency, 10 * entry.max_concurrency if queue is None else queue

    def served(self, entry: Entry) -> Served:
        """A new entry of the host's table: the model's own limiter and metrics."""
        settings = self.settings
        limit, queue_limit = self.limits(entry)
        limiter = Limiter(
            limit,
            queue_limit,
            settings.queue_timeout_seconds,
            window=settings.concurrency_window_seconds,
        )
        model_id = entry.model
        metrics = ProxyMetrics(limiter, model_id, shared=self.metrics)
        served = Served(model_id, limiter, metrics, entry)
        if entry.parked:
            self.park(served)
        elif entry.residency == RESIDENCY_ON_DEMAND:
            self.on_demand(model_id, entry.idle_seconds or settings.idle_seconds, limiter, metrics)
        return served

    def relayed(self, route: Route) -> Served:
        """A model of the namespace another host serves, relayed to its Service from the mesh
        ports: a limiter of its own, bounded (`mesh.RELAYED_IN_FLIGHT`), and metrics of its own
        that are not exported (its requests count where they are served)."""
        settings = self.settings
        limit = route.max_concurrency or settings.container_concurrency or RELAYED_IN_FLIGHT
        queue = 10 * limit if settings.queue_size is None else settings.queue_size
        limiter = Limiter(
            limit,
            queue,
            settings.queue_timeout_seconds,
            window=settings.concurrency_window_seconds,
        )
        entry = Entry(route.model, route.max_concurrency)
        served = Served(route.model, limiter, ProxyMetrics(limiter, route.model), entry)
        served.route = (route.address, route.http, route.grpc)
        return served

    def routes_changed(self) -> None:
        """The routes file changed: the router's REST relay decides its heads again."""
        if self.mesh_rest is not None:
            self.mesh_rest.forget_heads()

    def park(self, served: Served) -> None:
        """Hold the requests of a model parked here at zero replicas (`proxy.parking`)."""
        limiter = served.limiter
        self.residencies.remove(served.model_id)  # no sleeps or wakes: no replica here
        limiter.residency = self.parking.park(
            served.model_id,
            # Its queue limit, or the host's bound alone for a model without a limit.
            lambda: limiter.queue_limit or MOST_WAITING,
            self.settings.wake_timeout_seconds,
        )
        self.sleep_changed()

    def on_demand(
        self, model_id: str, idle_seconds: float, limiter: Limiter, metrics: ProxyMetrics
    ) -> Residency | None:
        """Make `model_id` on-demand: asleep after `idle_seconds` with nothing held, woken by
        its next request, through the agent (None, said once, without one)."""
        calls = self._agent_calls
        if calls is None:
            log.error(
                "Model %s is on-demand but this proxy has no --agent-address: it stays loaded.",
                model_id,
            )
            return None
        residency = Residency(
            model_id,
            calls.of(model_id),
            limiter,
            self.state,
            IdlePolicy(
                idle_seconds=idle_seconds,
                # A sleep comes between 1 and 1.25 idle periods after the last request.
                check_seconds=idle_seconds / 4,
                wake_timeout_seconds=self.settings.wake_timeout_seconds,
            ),
            on_wake=metrics.woke,
            on_change=self.sleep_changed,
        )
        limiter.residency = residency
        metrics.residency(residency)
        metrics.on_not_usable = residency.suspect
        self.residencies.add(residency)
        if model_id != self.settings.model_id:  # a host's (start() says a model pod's)
            log.info(
                "Model %s is on-demand: unloaded after %.0f s with no request, loaded again by "
                "the next one.",
                model_id,
                idle_seconds,
            )
        return residency

    def retuned(self, served: Served) -> None:
        """A host model's line changed: a parked one now served here lets its requests go on;
        an on-demand one takes its new idle time; an idempotent one is sent again; a leaving
        one's idle streams end."""
        entry = served.entry
        served.judge()
        if entry.leaving:
            self.end_unserved()
        if entry.parked != self.parking.asleep(served.model_id):
            if entry.parked:
                self.park(served)
                return
            self.parking.unpark(served.model_id)
            served.limiter.residency = None
            if entry.residency == RESIDENCY_ON_DEMAND:
                idle = entry.idle_seconds or self.settings.idle_seconds
                self.on_demand(served.model_id, idle, served.limiter, served.metrics)
            self.sleep_changed()
            return
        residency = self.residencies.models.get(served.model_id)
        idle_seconds = served.entry.idle_seconds or self.settings.idle_seconds
        if residency is None or residency.policy.idle_seconds == idle_seconds:
            return
        residency.policy = dataclasses.replace(
            residency.policy, idle_seconds=idle_seconds, check_seconds=idle_seconds / 4
        )
        log.info("Model %s is now unloaded after %.0f s idle.", served.model_id, idle_seconds)

    def table_changed(self) -> None:
        """Models joined or left the host's table: the REST relay forgets its prepared heads,
        and the requests of a parked model that left are answered (`Parking.unpark`)."""
        self.rest.forget_heads()
        if self.mesh is not None:
            self.mesh.rebuild()
        if self.mesh_rest is not None:
            self.mesh_rest.forget_heads()
        for model_id in [m for m in self.parking.models if m not in self.table.names]:
            self.parking.unpark(model_id, gone=True)
        self.sleep_changed()
        self.end_unserved()

    def end_unserved(self) -> None:
        """A model leaves the host or left its table: its idle gRPC streams end now, the others
        after their answers, so that their clients open them again through the Service."""
        for relay in (self.grpc, self.mesh_grpc):
            if isinstance(relay, GrpcRelay):
                relay.end_unserved()

    def removed(self, served: Served) -> None:
        """A model left the host's table: no more sleeps or wakes of it from here."""
        self.residencies.remove(served.model_id)
        self.parking.unpark(served.model_id, gone=True)
        self.sleep_changed()

    def asleep_as(self, model_id: str) -> str:
        """What keeps `model_id` out of Triton for now, its next request undoing it: `PARKED`
        here at zero replicas, or on-demand and `ASLEEP`; '' when neither (Triton should have
        it loaded)."""
        if self.parking.asleep(model_id):
            return PARKED
        if self.residencies.asleep(model_id):
            return ASLEEP
        return ""

    def sleep_changed(self) -> None:
        """A model slept or woke, was parked or unparked, joined or left the table: the pod
        answers its readiness itself, ready (`ProxyState.model_asleep`), while its table is not
        empty and every model of it is asleep or parked. Triton has none of them loaded then,
        and a host's node gateway no longer knows a host with nothing loaded, so asking them
        would take the pod out of its models' Services, whose next requests are the ones that
        wake them. One rule for a model pod (a table of one) and a host."""
        names = self.table.names
        self.state.model_asleep = bool(names) and all(self.asleep_as(m) for m in names)

    async def start(self, lifecycle: Lifecycle) -> None:
        """Listen on the metrics, REST and gRPC ports; with --model-dir, watch the model."""
        lifecycle.on_shutdown("the model proxy", self.drain_and_stop)
        if self.settings.models_file is not None:
            # Read before listening, so the first requests find their models.
            self.table.reread(self.settings.models_file)
            self._table_task = lifecycle.spawn(
                "the models file's watch",
                self.table.follow(
                    self.settings.models_file,
                    self.settings.models_check_seconds,
                    lifecycle.stop_event,
                ),
                consequence="models added to or removed from the host are no longer followed",
                vital=False,
            )
        if self.mesh is not None and self.settings.routes_file is not None:
            self.mesh.reread(self.settings.routes_file)
            lifecycle.spawn(
                "the routes file's watch",
                self.mesh.follow(
                    self.settings.routes_file,
                    self.settings.models_check_seconds,
                    lifecycle.stop_event,
                ),
                consequence="models of the namespace added or moved are no longer relayed to",
                vital=False,
            )
        if self.caller_key is not None:
            # Before the first connection to the gateway, which it names the pod on.
            await self.caller_key.ask()
            lifecycle.spawn(
                "the caller key's refresh",
                self.caller_key.keep(lifecycle.stop_event),
                consequence="a caller key the node changes is no longer followed",
                vital=False,
            )
        await self.own_model.start()
        await self.rest.start()
        await self.grpc.start()
        for mesh in (self.mesh_rest, self.mesh_grpc):
            if mesh is not None:
                await mesh.start()
        # Last: /healthz is the startup probe's, and the kubelet probes readiness (on the REST
        # port) as soon as it passes; a REST port not yet listening then would cost a whole
        # readiness period.
        await self.metrics_server.start()
        log.info("Serving metrics and health on port %d.", self.metrics_server.port)
        self._idle_task = lifecycle.spawn(
            "the models' idle watch",
            self.residencies.watch(lifecycle.stop_event),
            consequence="idle on-demand models are no longer unloaded",
            vital=False,
        )
        if self.residency is not None:
            log.info(
                "Model %s is on-demand: unloaded after %.0f s with no request, loaded again by "
                "the next one (which waits up to %.0f s).",
                self.settings.model_id,
                self.settings.idle_seconds,
                self.settings.wake_timeout_seconds,
            )
        self._learn_task = lifecycle.spawn(
            "the models' config reads",
            self.learn_resends(lifecycle.stop_event, self.settings.model_check_seconds),
            consequence="a model that sets no idempotent has no lost call sent again",
            vital=False,
        )
        if self.reinstaller is None and self.settings.models_file is None:
            # Without a reinstall watch (no --model-dir), its look alone: whether the node
            # gateway says the node pod stops and takes this pod out of its Service.
            self._watch_task = lifecycle.spawn(
                "the model's readiness watch",
                self.own_model.watch(lifecycle.stop_event, self.settings.model_check_seconds),
                consequence="a node pod's stop no longer closes this pod's clients' connections",
                vital=False,
            )
        if self.reinstaller is not None:
            self._watch_task = lifecycle.spawn(
                "the model's reinstall watch",
                self.reinstaller.watch(lifecycle.stop_event),
                consequence="a model the node loses is no longer reinstalled by this pod",
                vital=False,
            )
            log.info(
                "Watching that the node serves model %s every %.1f s: reinstalled from %s if "
                "the node loses it.",
                self.settings.model_id,
                self.settings.model_check_seconds,
                self.settings.model_dir,
            )

    async def learn_resends(self, stopping: asyncio.Event, period: float) -> None:
        """Read, until read, the config in Triton of each model that says neither way whether
        its calls may run twice (`Entry.idempotent` unset), and send again a lost call of it
        from then on if the config allows (`calls_may_run_twice`). A model not loaded now
        (asleep, parked, loading) is asked again as `ConfigReads` says: at once after a request
        of it has gone to Triton, otherwise after twice as many `period`s as the last time."""
        reads = ConfigReads(LEARN_BACKOFF_ROUNDS)
        while not stopping.is_set():
            models = self.table.models
            reads.keep(set(models))
            for served in list(models.values()):
                if served.entry.idempotent is not None or served.learned is not None:
                    continue
                if not reads.due(served):
                    continue
                config = await self.own_model.config(served.model_id)
                if config is None:
                    reads.missed(served)
                    continue
                reads.read(served)
                served.learned = calls_may_run_twice(config)
                served.judge()
                log.info(
                    "Model %s %s (its config in Triton; the model sets no idempotent).",
                    served.model_id,
                    "has a call lost in flight sent again"
                    if served.learned
                    else "is stateful or streams (a sequence batcher, decoupled or an "
                    "ensemble): a call lost in flight fails",
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), period)

    def node_stop(self, why: str) -> None:
        """The node gateway says the node pod stops and takes this pod out of its Service
        (`why`), or no longer says so (''): meanwhile the relays close their clients'
        connections after their answers, so that the clients' next requests go through the
        Service to the model's replicas on other nodes."""
        leaving = bool(why)
        if leaving == self._leaving_node:
            return
        self._leaving_node = leaving
        if leaving:
            log.warning(
                "Leaving the Service of model %s (%s): closing each client's connection after "
                "its answer.",
                self.settings.model_id,
                why,
            )
        else:
            log.info(
                "The node serves model %s again: connections kept alive.", self.settings.model_id
            )
        self.rest.leave(leaving)
        if isinstance(self.grpc, GrpcRelay):  # grpc.aio (--grpc-mode grpcio) keeps its own
            self.grpc.leave(leaving)
        for mesh in (self.mesh_rest, self.mesh_grpc):
            if mesh is not None:
                mesh.leave(leaving)

    def model_ids(self) -> list[str]:
        """The models this proxy serves: the pod's, or the host's table's."""
        return sorted(self.table.names)

    async def stop_watch(self) -> None:
        """Step 0: no reinstall may start or go on once the pod is going away (the watch has
        seen the stop event)."""
        if self.loader is not None:
            await self.loader.stop(grace=5.0)
        for task in (self._watch_task, self._idle_task, self._table_task, self._learn_task):
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task  # a failure was logged where it failed

    async def drain_and_stop(self) -> None:
        """Steps 1 to 5 of the shutdown order in the module docstring."""
        settings = self.settings
        await self.stop_watch()
        self.state.draining = True
        log.info(
            "Reporting model %s not ready and serving for %.1f s more while endpoints drain.",
            settings.model_id,
            settings.drain_seconds,
        )
        await asyncio.sleep(settings.drain_seconds)
        log.info(
            "Stopped taking new requests: waiting up to %.1f s for %d in-flight ones.",
            settings.finish_timeout_seconds,
            self.limiter.in_flight,
        )
        meshes = [m.stop() for m in (self.mesh_rest, self.mesh_grpc) if m is not None]
        await asyncio.gather(self.rest.stop(), self.grpc.stop(), *meshes)
        if self._agent_calls is not None:
            await self._agent_calls.close()
        if settings.agent_address and settings.token_file is not None:
            client = AgentClient(
                settings.agent_address, settings.token_file, settings.agent_timeout_seconds
            )
            for model_id in self.model_ids():
                await client.unload(model_id)
        else:
            log.info(
                "No agent address is set: leaving model %s loaded.",
                ", ".join(self.model_ids()) or "(none)",
            )
        await self.metrics_server.stop()
        await self.own_model.stop()


def shutdown_seconds(settings: Settings) -> float:
    """How long stopping may take: the drain period, the in-flight requests' finish timeout and
    the unload call, with 10 s to spare."""
    return (
        settings.drain_seconds
        + settings.finish_timeout_seconds
        + settings.agent_timeout_seconds
        + 10.0
    )


async def run(settings: Settings) -> int:
    """Run until SIGTERM/SIGINT, then drain and stop; the process exit code."""
    return await serve(Proxy(settings), cleanup_timeout=shutdown_seconds(settings))
