"""The binder's HTTP endpoints: /healthz, /readyz and /metrics (the only aiohttp.web importer).

/healthz answers while the event loop runs. /readyz answers 200 once every cache has listed the
cluster (a follower with warm caches is ready: it can take over at once), else 503 with the
reasons; its body says whether this replica leads. /metrics renders the binder's own registry.
It serves; it never changes anything.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from binder.errors import NotReadyError, http_status


def build_app(
    registry: CollectorRegistry,
    not_ready: Callable[[], list[str]],
    role: Callable[[], str],
) -> web.Application:
    """`not_ready()` says why the binder is not ready (empty when it is); `role()` is
    "leader" or "follower"."""

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        reasons = not_ready()
        if reasons:
            error = NotReadyError("; ".join(reasons))
            return web.Response(status=http_status(error), text=f"not ready: {error}\n")
        return web.Response(text=f"ready ({role()})\n")

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
    """Runs the app on host:port; `port` is the bound port (useful with port 0)."""

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
        if self._started:
            self._started = False
            await self._runner.cleanup()
