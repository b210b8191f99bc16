"""The health and metrics endpoints every long-running part serves (/healthz, /readyz,
/metrics), and the one HTTP server every part runs them on (the webhook adds its admission route
and serves it over TLS).

/healthz answers while the event loop runs. /readyz answers 200 when `not_ready()` gives no
reason, else 503 (or the part's own status) with the reasons; `not_ready` may be a coroutine
function when readiness needs a question to another process (the proxy asks Triton). /metrics
renders the part's own Prometheus registry. The part decides what readiness means and what its
ready text says; this module only serves, it never changes anything. Every /metrics also carries
`tritonshare_build_info{version, python}` (always 1), so a dashboard or an alert sees which
version each process runs, as a rollout mixes them. It is the one module of the
agent, the binder and the proxy that imports aiohttp's server pieces (tests/test_boundaries.py
checks); the webhook also imports it, for its admission handler.
"""

from __future__ import annotations

import inspect
import json
import platform
import ssl
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from common.version import VERSION

NotReady = Callable[[], list[str] | Awaitable[list[str]]]
"""Why the part is not ready (empty when it is), answered at once or awaited."""


def _ready() -> str:
    return "ready"


def build_info() -> CollectorRegistry:
    """A registry with `tritonshare_build_info`: the version (common.version) and Python's."""
    registry = CollectorRegistry()
    Gauge(
        "tritonshare_build_info",
        "Always 1; the labels say which tritonshare version and Python this process runs.",
        ["version", "python"],
        registry=registry,
    ).labels(VERSION, platform.python_version()).set(1)
    return registry


def build_health_app(
    registry: CollectorRegistry,
    not_ready: NotReady,
    ready_text: Callable[[], str] | None = None,
    not_ready_status: int = 503,
    *,
    documents: Mapping[str, Callable[[], object]] | None = None,
) -> web.Application:
    """An app with only the health endpoints (see `add_health_routes`), and a JSON answer of
    `documents[path]()` at each of its paths (the proxy's /autoscaling)."""
    app = web.Application()
    add_health_routes(app, registry, not_ready, ready_text, not_ready_status)
    for path, document in (documents or {}).items():
        app.router.add_get(path, _json_handler(document))
    return app


def _json_handler(
    document: Callable[[], object],
) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def answer(request: web.Request) -> web.Response:
        return web.Response(
            body=json.dumps(document(), separators=(",", ":")).encode(),
            content_type="application/json",
        )

    return answer


def add_health_routes(
    app: web.Application,
    registry: CollectorRegistry,
    not_ready: NotReady,
    ready_text: Callable[[], str] | None = None,
    not_ready_status: int = 503,
) -> None:
    """Add /healthz, /readyz and /metrics to `app`. `not_ready()` says why the part is not ready
    (empty when it is); `ready_text()` is the /readyz body when ready (default "ready"), asked at
    each request."""
    ready_line = ready_text or _ready
    build = generate_latest(build_info())

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        answer = not_ready()
        reasons = await answer if inspect.isawaitable(answer) else answer
        if reasons:
            return web.Response(
                status=not_ready_status, text="not ready: " + "; ".join(reasons) + "\n"
            )
        return web.Response(text=ready_line() + "\n")

    async def metrics(request: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(registry) + build)
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)


class HttpServer:
    """Runs the app on host:port, over TLS when given a context; `port` is the bound port once
    started (useful with port 0).

    Stopping waits at most `shutdown_timeout` seconds for requests in progress: these endpoints
    answer at once, and a part's shutdown must not wait on a slow scrape."""

    def __init__(
        self,
        app: web.Application,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        shutdown_timeout: float = 1.0,
    ) -> None:
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
        self._ssl_context = ssl_context
        self._host = host
        self.port = port
        self._started = False

    async def start(self) -> None:
        await self._runner.setup()
        self._started = True
        site = web.TCPSite(self._runner, self._host, self.port, ssl_context=self._ssl_context)
        await site.start()
        addresses = self._runner.addresses
        if addresses:
            self.port = int(addresses[0][1])

    async def stop(self) -> None:
        """Stop serving; safe to call when start() never ran or failed half-way."""
        if self._started:
            self._started = False
            await self._runner.cleanup()
