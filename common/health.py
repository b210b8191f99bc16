"""The health and metrics endpoints every long-running part serves (/healthz, /readyz,
/metrics), and the one HTTP server every part runs them on (the webhook adds its admission route
and serves it over TLS).

/healthz answers while the event loop runs and `not_alive()` (the gateway's listeners), when
the part gives one, has no reason. A part whose loop tenants may keep busy (the agent) serves them
off its loop (`HttpServer(home=LoopBeat(loop))`): on a thread and loop of their own,
/healthz answering at once while the part's loop has turned in the last `STALLED` seconds,
/readyz and /metrics computed on the part's loop. /readyz answers 200 when `not_ready()` gives no
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

import asyncio
import concurrent.futures
import contextlib
import inspect
import json
import platform
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from common.version import VERSION

T = TypeVar("T")

STALLED = 120.0
"""Seconds without a turn of the part's loop after which an off-loop /healthz answers 503: a
busy loop is alive, one stuck this long is not."""

NotReady = Callable[[], list[str] | Awaitable[list[str]]]
"""Why the part is not ready (empty when it is), answered at once or awaited."""

NotAlive = Callable[[], list[str]]
"""Why the part is not alive (empty when it is): asked at each /healthz, on the server's loop, so
it only reads what the part keeps."""


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
    home: LoopBeat | None = None,
    *,
    not_alive: NotAlive | None = None,
    documents: Mapping[str, Callable[[], object]] | None = None,
) -> web.Application:
    """An app with only the health endpoints (see `add_health_routes`), and a JSON answer of
    `documents[path]()` at each of its paths (the proxy's /autoscaling)."""
    app = web.Application()
    add_health_routes(
        app, registry, not_ready, ready_text, not_ready_status, home, not_alive=not_alive
    )
    for path, document in (documents or {}).items():
        app.router.add_get(path, _json_handler(document))
    return app


class LoopBeat:
    """The part's own loop, for an app served off it: when it last turned, and running work
    there."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, clock: Callable[[], float] = time.monotonic
    ):
        self.loop = loop
        self._clock = clock
        self.last = clock()
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        """Beat once a second on the part's loop (call from it)."""
        self.last = self._clock()
        self._handle = self.loop.call_later(1.0, self.start)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def alive(self) -> bool:
        return self._clock() - self.last < STALLED

    async def run(self, work: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """`work()` run on the part's loop, awaited from the server's."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work(), self.loop))


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
    home: LoopBeat | None = None,
    *,
    not_alive: NotAlive | None = None,
) -> None:
    """Add /healthz, /readyz and /metrics to `app`. `not_ready()` says why the part is not ready
    (empty when it is); `ready_text()` is the /readyz body when ready (default "ready"), asked at
    each request. `home`: the part's loop when the app is served off it (see the module).
    `not_alive()` says why the part is not alive beyond its loop (by default, never)."""
    ready_line = ready_text or _ready
    build = generate_latest(build_info())

    async def healthz(request: web.Request) -> web.Response:
        if home is not None and not home.alive():
            return web.Response(
                status=503, text=f"the event loop has not turned for {STALLED:g} s\n"
            )
        reasons = not_alive() if not_alive is not None else []
        if reasons:
            return web.Response(status=503, text="; ".join(reasons) + "\n")
        return web.Response(text="ok\n")

    async def ready() -> tuple[list[str], str]:
        answer = not_ready()
        reasons = await answer if inspect.isawaitable(answer) else answer
        return reasons, ("" if reasons else ready_line())

    async def readyz(request: web.Request) -> web.Response:
        reasons, text = await (home.run(ready) if home is not None else ready())
        if reasons:
            return web.Response(
                status=not_ready_status, text="not ready: " + "; ".join(reasons) + "\n"
            )
        return web.Response(text=text + "\n")

    async def render() -> bytes:
        return generate_latest(registry)

    async def metrics(request: web.Request) -> web.Response:
        body = await (home.run(render) if home is not None else render())
        response = web.Response(body=body + build)
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)


class HttpServer:
    """Runs the app on host:port, over TLS when given a context; `port` is the bound port once
    started (useful with port 0). With `home` (the part's loop, as the app was built with), it
    runs on a thread and loop of its own (see the module).

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
        home: LoopBeat | None = None,
    ) -> None:
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
        self._ssl_context = ssl_context
        self._host = host
        self.port = port
        self._started = False
        self._home = home
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        if self._home is None:
            await self._serve()
            return
        self._home.start()
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="http-off-loop")
        self._thread.start()
        await asyncio.wrap_future(ready)

    async def _serve(self) -> None:
        await self._runner.setup()
        self._started = True
        site = web.TCPSite(self._runner, self._host, self.port, ssl_context=self._ssl_context)
        await site.start()
        addresses = self._runner.addresses
        if addresses:
            self.port = int(addresses[0][1])

    def _run(self, ready: concurrent.futures.Future[None]) -> None:
        loop = self._loop = asyncio.new_event_loop()
        try:
            try:
                loop.run_until_complete(self._serve())
            except BaseException as e:
                ready.set_exception(e)
                return
            ready.set_result(None)
            loop.run_forever()
        finally:
            if self._started:
                self._started = False
                loop.run_until_complete(self._runner.cleanup())
            loop.close()

    async def stop(self) -> None:
        """Stop serving; safe to call when start() never ran or failed half-way."""
        if self._thread is not None and self._loop is not None:
            assert self._home is not None
            self._home.stop()
            with contextlib.suppress(RuntimeError):  # its loop already ended (a failed start)
                self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.to_thread(self._thread.join)
            self._thread = None
            return
        if self._started:
            self._started = False
            await self._runner.cleanup()
