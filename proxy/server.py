"""The metrics and health endpoint (aiohttp), on its own port away from tenant traffic.

The only module of the proxy that imports aiohttp's server. It serves /metrics (the process's
registry, as Prometheus scrapes it), /healthz (the process is up) and /readyz (the pod's
readiness: the own model is ready in Triton and the proxy is not draining), and holds the state
the transports share. Tenant traffic never reaches it: the REST relay is `http1.listener`, gRPC is
`grpc.grpcio`.
"""

from __future__ import annotations

import logging

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from proxy.metrics import ProxyMetrics
from proxy.settings import Settings
from proxy.sockets import bind, local_address
from proxy.state import ProxyState

log = logging.getLogger(__name__)


class MetricsServer:
    """Serves /metrics, /healthz and /readyz on their own port, away from tenant traffic."""

    def __init__(self, settings: Settings, metrics: ProxyMetrics, state: ProxyState) -> None:
        self._settings = settings
        self._metrics = metrics
        self._state = state
        self._runner: web.ServerRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0

    async def start(self) -> None:
        """Start listening."""
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=5),
            connector=aiohttp.TCPConnector(local_addr=local_address(self._settings.source_address)),
        )
        server = web.Server(self.handle, access_log=None)
        self._runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        host, port = self._settings.listen_metrics
        sock = bind(host, port)
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        log.info("Serving metrics and health on port %d.", self.port)

    async def stop(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def own_model_ready(self) -> bool:
        """True when Triton reports the pod's model ready."""
        if self._session is None:
            return False
        url = f"http://{self._settings.triton_http_url}/v2/models/{self._settings.model_id}/ready"
        try:
            async with self._session.get(url) as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Answer /metrics, /healthz and /readyz."""
        if request.path == "/metrics":
            return web.Response(
                body=generate_latest(self._metrics.registry),
                headers={"Content-Type": CONTENT_TYPE_LATEST},
            )
        if request.path == "/healthz":
            return web.Response(text="ok")
        if request.path == "/readyz":
            if self._state.draining:
                return web.Response(status=503, text="draining: the pod is shutting down")
            if await self.own_model_ready():
                return web.Response(text="ready")
            return web.Response(
                status=503, text=f"model {self._settings.model_id} is not ready in Triton"
            )
        return web.Response(status=404, text="not found: try /metrics, /healthz or /readyz")
