"""The tenant-facing KServe v2 REST endpoint and the metrics/health endpoint (aiohttp).

The only module of the proxy that imports aiohttp's server. One pooled, keep-alive ClientSession
carries every forwarded request to Triton. The hot path stays lean: routing looks only at the
method and the raw path (never the body), small bodies are read once and sent as bytes, large
bodies and server-sent events are streamed chunk by chunk, and a client that disconnects cancels
its upstream request (aiohttp's handler cancellation), which closes that upstream connection.

What it must not do: decide isolation (that is `routing`), parse or rewrite bodies, or expose
/metrics on the tenant port.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from yarl import URL

from proxy import errors
from proxy.limiter import Limiter
from proxy.metrics import ProxyMetrics
from proxy.routing import Answer, HttpRouter
from proxy.settings import Settings

log = logging.getLogger(__name__)

# Bodies up to this size are read whole and sent as bytes (fastest); larger ones are streamed.
BUFFER_LIMIT = 1024 * 1024
STREAM_CHUNK = 256 * 1024
_HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
    )
)


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.setblocking(False)
    return sock


def _copy_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in _HOP_BY_HOP)


def _json_error(status: int, message: str) -> web.Response:
    return web.Response(
        status=status,
        body=b'{"error":' + json.dumps(message).encode() + b"}",
        content_type="application/json",
    )


class ProxyState:
    """What the transports share about the process: whether it is draining."""

    def __init__(self) -> None:
        self.draining = False


class RestProxy:
    """Serves the tenant REST port and forwards allowed requests to Triton."""

    def __init__(
        self,
        settings: Settings,
        limiter: Limiter,
        metrics: ProxyMetrics,
        state: ProxyState,
    ) -> None:
        self._settings = settings
        self._router = HttpRouter(settings.model_id)
        self._limiter = limiter
        self._metrics = metrics
        self._state = state
        self._base = f"http://{settings.triton_http_url}"
        self._max_body = settings.max_body_bytes
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.ServerRunner | None = None
        self.port = 0

    async def start(self) -> None:
        """Open the upstream session and start listening."""
        connector = aiohttp.TCPConnector(
            limit=0, keepalive_timeout=60.0, enable_cleanup_closed=True
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0),
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        )
        server = web.Server(self.handle, handler_cancellation=True, access_log=None)
        self._runner = web.ServerRunner(
            server, handle_signals=False, shutdown_timeout=self._settings.finish_timeout_seconds
        )
        await self._runner.setup()
        host, port = self._settings.listen_http
        sock = _bind(host, port)
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        log.info(
            "Serving KServe v2 REST for model %s on port %d.", self._settings.model_id, self.port
        )

    async def stop(self) -> None:
        """Stop listening, let in-flight requests finish (up to the finish timeout), close."""
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
        url = f"{self._base}/v2/models/{self._settings.model_id}/ready"
        try:
            async with self._session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r:
                return r.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Route one request: answer locally or forward it."""
        started = time.perf_counter()
        decision = self._router.decide(request.method, request.raw_path)
        if isinstance(decision, Answer):
            response: web.StreamResponse = web.Response(
                status=decision.status, body=decision.body, content_type=decision.content_type
            )
            self._metrics.observe(
                "http", decision.route, str(decision.status), time.perf_counter() - started
            )
            return response
        route = decision.route
        try:
            if decision.readiness and self._state.draining:
                raise errors.DrainingError(
                    "the model proxy is shutting down: send requests to another replica"
                )
            if decision.limited:
                await self._limiter.acquire()
                try:
                    response = await self._forward(request, decision.path)
                finally:
                    self._limiter.release()
            else:
                response = await self._forward(request, decision.path)
        except errors.ProxyError as e:
            if isinstance(e, (errors.OverloadedError, errors.QueueTimeoutError)):
                self._metrics.rejected(type(e).__name__)
            response = _json_error(errors.http_status(e), str(e))
        self._metrics.observe("http", route, str(response.status), time.perf_counter() - started)
        return response

    async def _request_body(self, request: web.BaseRequest) -> bytes | AsyncIterator[bytes] | None:
        if not request.body_exists:
            return None
        length = request.content_length
        if length is not None:
            if length > self._max_body:
                raise errors.BodyTooLargeError(
                    f"the request body is {length} bytes, over the proxy's limit of "
                    f"{self._max_body}; send a smaller request or raise --max-body"
                )
            if length <= BUFFER_LIMIT:
                return await request.content.readexactly(length)
        return self._stream_body(request)

    async def _stream_body(self, request: web.BaseRequest) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in request.content.iter_chunked(STREAM_CHUNK):
            seen += len(chunk)
            if seen > self._max_body:
                raise errors.BodyTooLargeError(
                    f"the request body is over the proxy's limit of {self._max_body} bytes; "
                    f"send a smaller request or raise --max-body"
                )
            yield chunk

    async def _forward(self, request: web.BaseRequest, path: str) -> web.StreamResponse:
        assert self._session is not None
        try:
            body = await self._request_body(request)
        except asyncio.IncompleteReadError as e:
            raise errors.MalformedRequestError(
                "the request body ended before its Content-Length"
            ) from e
        headers = _copy_headers(request.headers)
        if request.content_length is not None:
            headers["Content-Length"] = str(request.content_length)
        try:
            async with self._session.request(
                request.method,
                URL(self._base + path, encoded=True),
                data=body,
                headers=headers,
                allow_redirects=False,
            ) as upstream:
                length = upstream.content_length
                out_headers = _copy_headers(upstream.headers)
                if length is not None and length <= BUFFER_LIMIT:
                    return web.Response(
                        status=upstream.status, body=await upstream.read(), headers=out_headers
                    )
                # Server-sent events (generate_stream) and big answers go out as they arrive.
                response = web.StreamResponse(status=upstream.status, headers=out_headers)
                if length is not None:
                    response.content_length = length
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except aiohttp.ClientError as e:
            cause = e.__cause__ or e.__context__
            if isinstance(cause, errors.ProxyError):
                raise cause from e
            raise errors.UpstreamError(
                f"Triton at {self._settings.triton_http_url} did not answer ({e}); retry shortly"
            ) from e


class MetricsServer:
    """Serves /metrics, /healthz and /readyz on their own port, away from tenant traffic."""

    def __init__(
        self,
        settings: Settings,
        metrics: ProxyMetrics,
        state: ProxyState,
        own_model_ready: Callable[[], Awaitable[bool]],
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._state = state
        self._ready = own_model_ready
        self._runner: web.ServerRunner | None = None
        self.port = 0

    async def start(self) -> None:
        """Start listening."""
        server = web.Server(self.handle, access_log=None)
        self._runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        host, port = self._settings.listen_metrics
        sock = _bind(host, port)
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()
        log.info("Serving metrics and health on port %d.", self.port)

    async def stop(self) -> None:
        """Stop listening."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

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
            if await self._ready():
                return web.Response(text="ready")
            return web.Response(
                status=503, text=f"model {self._settings.model_id} is not ready in Triton"
            )
        return web.Response(status=404, text="not found: try /metrics, /healthz or /readyz")
