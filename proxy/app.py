"""Assembles the proxy and owns its shutdown order.

The shape of every part (`common.lifecycle`): `Proxy(settings)` builds the concurrency limiter,
the metrics, the relays and the readiness; `start(lifecycle)` opens the REST port, the gRPC
port and then the metrics and health port (the startup probe's /healthz answers once the others
listen), then (with --model-dir) the watch that reinstalls the model when the node
has lost it. On SIGTERM (Kubernetes starts terminating the pod) the order is fixed:
  0. stop the reinstall watch (and a loader it runs), so nothing installs after the unload;
  1. report not ready (REST /v2/health/ready, gRPC ServerReady, /readyz) so the endpoints drop us;
  2. keep serving for the drain period, as requests routed before the endpoint update still come;
  3. stop listening and let in-flight requests finish, up to the finish timeout;
  4. ask the agent to unload the model, authenticated as the pod;
  5. stop the metrics port and exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from common.health import HttpServer, build_health_app
from common.lifecycle import Lifecycle, serve
from proxy.agentclient import AgentClient
from proxy.grpc.grpcio import GrpcProxy
from proxy.grpc.server import GrpcRelay
from proxy.http1.listener import RestRelay
from proxy.metrics import ProxyMetrics
from proxy.policy.limiter import Limiter
from proxy.readiness import OwnModel, Readiness
from proxy.reinstall import LoaderProcess, Reinstaller, ReinstallTiming, loader_flags
from proxy.settings import Settings
from proxy.state import ProxyState

log = logging.getLogger(__name__)


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
        self.own_model = OwnModel(settings)
        self.rest = RestRelay(settings, self.limiter, self.metrics, self.state)
        relay = GrpcRelay if settings.grpc_mode == "relay" else GrpcProxy
        self.grpc: GrpcProxy | GrpcRelay = relay(settings, self.limiter, self.metrics, self.state)
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
            )
        reinstaller = self.reinstaller
        self.readiness = Readiness(
            settings.model_id,
            self.state,
            self.own_model,
            (lambda: reinstaller.reason) if reinstaller is not None else lambda: "",
        )
        host, port = settings.listen_metrics
        self.metrics_server = HttpServer(
            build_health_app(self.metrics.registry, self.readiness.not_ready), host, port
        )
        """/metrics, /healthz and /readyz (common/health.py), on their own port."""
        self._watch_task: asyncio.Task[None] | None = None

    async def start(self, lifecycle: Lifecycle) -> None:
        """Listen on the metrics, REST and gRPC ports; with --model-dir, watch the model."""
        lifecycle.on_shutdown("the model proxy", self.drain_and_stop)
        await self.own_model.start()
        await self.rest.start()
        await self.grpc.start()
        # Last: /healthz is the startup probe's, and the kubelet probes readiness (on the REST
        # port) as soon as it passes; a REST port not yet listening then would cost a whole
        # readiness period.
        await self.metrics_server.start()
        log.info("Serving metrics and health on port %d.", self.metrics_server.port)
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

    async def stop_watch(self) -> None:
        """Step 0: no reinstall may start or go on once the pod is going away (the watch has
        seen the stop event)."""
        if self.loader is not None:
            await self.loader.stop(grace=5.0)
        if self._watch_task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch_task  # a failure was logged where it failed

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
        await asyncio.gather(self.rest.stop(), self.grpc.stop())
        if settings.agent_address and settings.token_file is not None:
            client = AgentClient(
                settings.agent_address, settings.token_file, settings.agent_timeout_seconds
            )
            await client.unload(settings.model_id)
        else:
            log.info("No agent address is set: leaving model %s loaded.", settings.model_id)
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
