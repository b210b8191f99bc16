"""Assembles the proxy and owns its shutdown order.

Start: the concurrency limiter and metrics, then the metrics port, the REST port and the gRPC
port, then (with --model-dir) the watch that reinstalls the model when the node has lost it. On
SIGTERM (Kubernetes starts terminating the pod) the order is fixed:
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
from dataclasses import dataclass

from common.health import HttpServer, build_health_app
from common.lifecycle import Lifecycle, spawn
from proxy.agentclient import AgentClient
from proxy.grpc.grpcio import GrpcProxy
from proxy.grpc.server import GrpcRelay
from proxy.http1.listener import RestRelay
from proxy.metrics import ProxyMetrics
from proxy.policy.limiter import Limiter
from proxy.readiness import Readiness
from proxy.reinstall import LoaderProcess, Reinstaller, ReinstallTiming, loader_flags
from proxy.settings import Settings
from proxy.state import ProxyState

log = logging.getLogger(__name__)


@dataclass
class Proxy:
    """The running parts of one proxy process."""

    settings: Settings
    state: ProxyState
    limiter: Limiter
    metrics: ProxyMetrics
    rest: RestRelay
    grpc: GrpcProxy | GrpcRelay
    readiness: Readiness
    metrics_server: HttpServer
    """/metrics, /healthz and /readyz (common/health.py), on their own port."""
    reinstaller: Reinstaller | None = None
    """With --model-dir: reinstalls the model when the node has lost it (proxy/reinstall.py)."""
    loader: LoaderProcess | None = None
    watch_stopping: asyncio.Event | None = None
    watch_task: asyncio.Task[None] | None = None

    @classmethod
    def build(cls, settings: Settings) -> Proxy:
        """Create every part; nothing listens yet."""
        state = ProxyState()
        limiter = Limiter(
            settings.container_concurrency,
            settings.queue_limit,
            settings.queue_timeout_seconds,
            window=settings.concurrency_window_seconds,
        )
        metrics = ProxyMetrics(limiter, settings.model_id)
        readiness = Readiness(settings, state)
        host, port = settings.listen_metrics
        reinstaller, loader = None, None
        if (
            settings.model_dir is not None
            and settings.agent_address
            and settings.token_file is not None
        ):
            loader = LoaderProcess(
                loader_flags(
                    settings.model_dir,
                    settings.model_id,
                    settings.agent_address,
                    settings.token_file,
                    log_level=settings.log_level,
                    log_format=settings.log_format,
                )
            )
            reinstaller = Reinstaller(
                settings.model_id,
                AgentClient(
                    settings.agent_address, settings.token_file, settings.agent_timeout_seconds
                ),
                readiness.own_model_ready,
                loader.run,
                ReinstallTiming(
                    settings.model_check_seconds, settings.reinstall_backoff_max_seconds
                ),
            )
            watching = reinstaller
            readiness.why_not_served = lambda: watching.reason
        return cls(
            settings=settings,
            state=state,
            limiter=limiter,
            metrics=metrics,
            rest=RestRelay(settings, limiter, metrics, state),
            grpc=(GrpcRelay if settings.grpc_mode == "relay" else GrpcProxy)(
                settings, limiter, metrics, state
            ),
            readiness=readiness,
            metrics_server=HttpServer(
                build_health_app(metrics.registry, readiness.not_ready), host, port
            ),
            reinstaller=reinstaller,
            loader=loader,
        )

    async def start(self) -> None:
        """Listen on the metrics, REST and gRPC ports."""
        await self.readiness.start()
        await self.metrics_server.start()
        log.info("Serving metrics and health on port %d.", self.metrics_server.port)
        await self.rest.start()
        await self.grpc.start()
        if self.reinstaller is not None:
            self.watch_stopping = asyncio.Event()
            self.watch_task = spawn(
                "the model's reinstall watch",
                self.reinstaller.watch(self.watch_stopping),
                consequence="a model the node loses is no longer reinstalled by this pod",
            )
            log.info(
                "Watching that the node serves model %s every %.1f s: reinstalled from %s if "
                "the node loses it.",
                self.settings.model_id,
                self.settings.model_check_seconds,
                self.settings.model_dir,
            )

    async def stop_watch(self) -> None:
        """Step 0: no reinstall may start or go on once the pod is going away."""
        if self.watch_stopping is not None:
            self.watch_stopping.set()
        if self.loader is not None:
            await self.loader.stop(grace=5.0)
        if self.watch_task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self.watch_task

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
        await self.readiness.stop()


async def run(settings: Settings) -> int:
    """Run until SIGTERM/SIGINT, then drain and stop; the process exit code."""
    lifecycle = Lifecycle(
        cleanup_timeout=settings.drain_seconds
        + settings.finish_timeout_seconds
        + settings.agent_timeout_seconds
        + 10.0
    )
    proxy = Proxy.build(settings)

    async def main(lc: Lifecycle) -> None:
        lc.install_signal_handlers()
        lc.on_shutdown("the model proxy", proxy.drain_and_stop)
        await proxy.start()

    return await lifecycle.run(main)
