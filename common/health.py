"""The health and metrics endpoints the agent and the binder serve: /healthz, /readyz, /metrics.

/healthz answers while the event loop runs. /readyz answers 200 when `not_ready()` gives no
reason, else 503 (or the part's own status) with the reasons. /metrics renders the part's own
Prometheus registry. The part decides what readiness means and what its ready text says; this
module only serves, it never changes anything. It is the one module of the agent and the binder
that imports aiohttp's server pieces (tests/test_boundaries.py checks).
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def _ready() -> str:
    return "ready"


def build_health_app(
    registry: CollectorRegistry,
    not_ready: Callable[[], list[str]],
    ready_text: Callable[[], str] | None = None,
    not_ready_status: int = 503,
) -> web.Application:
    """`not_ready()` says why the part is not ready (empty when it is); `ready_text()` is the
    /readyz body when ready (default "ready"), asked at each request."""
    ready_line = ready_text or _ready

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        reasons = not_ready()
        if reasons:
            return web.Response(
                status=not_ready_status, text="not ready: " + "; ".join(reasons) + "\n"
            )
        return web.Response(text=ready_line() + "\n")

    async def metrics(request: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(registry))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


class HttpServer:
    """Runs the app on host:port; `port` is the bound port once started (useful with port 0)."""

    def __init__(self, app: web.Application, host: str, port: int) -> None:
        self._runner = web.AppRunner(app, access_log=None)
        self._host = host
        self.port = port
        self._started = False

    async def start(self) -> None:
        await self._runner.setup()
        self._started = True
        site = web.TCPSite(self._runner, self._host, self.port)
        await site.start()
        addresses = self._runner.addresses
        if addresses:
            self.port = int(addresses[0][1])

    async def stop(self) -> None:
        """Stop serving; safe to call when start() never ran or failed half-way."""
        if self._started:
            self._started = False
            await self._runner.cleanup()
