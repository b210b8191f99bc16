"""The agent's HTTP endpoints: /healthz, /readyz and /metrics (the only aiohttp.web importer).

/healthz answers while the event loop runs. /readyz answers 200 once the GPUs were read (or the
node is CPU-only) and Triton is reachable, else 503 with the reasons. /metrics renders the agent's
own registry. It serves; it never changes anything.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


def build_app(registry: CollectorRegistry, not_ready: Callable[[], list[str]]) -> web.Application:
    """`not_ready()` returns why the agent is not ready; empty when it is."""

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        reasons = not_ready()
        if reasons:
            return web.Response(status=503, text="not ready: " + "; ".join(reasons) + "\n")
        return web.Response(text="ready\n")

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
        self._port = port
        self.port = port

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        await self._runner.cleanup()
