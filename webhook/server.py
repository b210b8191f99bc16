"""The webhook's HTTPS app (aiohttp): POST /mutate-pods answers AdmissionReviews; /healthz,
/readyz and /metrics are common/health.py's, and so is the server that runs it all.

The only module of the webhook that imports aiohttp's server side; TLS comes from the certificate
and key files (cert-manager's Secret, or your own), read once at start.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from pathlib import Path
from typing import Final

from aiohttp import web
from prometheus_client import CollectorRegistry

from common.health import HttpServer, add_health_routes
from common.lifecycle import Lifecycle
from common.logs import subject
from webhook.review import ReviewError, review
from webhook.settings import Settings

log = logging.getLogger("webhook")


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server TLS context from PEM files; the error says which file is wrong."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(
            f"cannot use the TLS certificate {cert} and key {key}: {e}; mount the webhook's "
            f"certificate Secret (tls.crt, tls.key) there"
        ) from e
    return context


MAX_REVIEW_BYTES: Final = 4 * 1024 * 1024
"""The largest body taken: the API server sends at most 3 MiB of object (its own request limit)
in a review. Anyone who reaches the port may post (a tenant's pod included): each body is held
whole while it is read."""
MAX_CONTAINERS: Final = 100_000
"""JSON objects and arrays one review may hold (a pod has hundreds): parsing makes each a Python
object of about 60 bytes, so `[{},{},...]` costs 25 times its size; strings and numbers about 10."""
READS_AT_ONCE: Final = 4
"""Bodies read at once; others wait for a turn holding only their connection. A parse never
yields, so one runs at a time: the webhook holds its base (about 40 MiB), READS_AT_ONCE bodies
and one parse (at most about 10 x MAX_REVIEW_BYTES of Python objects). Measured: 72 reviews of
3 to 8 MiB at once, 24 at a time, peaked at 168-182 MiB, under the chart's 256Mi limit (457 MiB
before these bounds)."""
READ_SECONDS: Final = 10.0
"""How long one body may take to arrive: the API server's own timeout for this webhook."""


def make_app(settings: Settings) -> web.Application:
    reading = asyncio.Semaphore(READS_AT_ONCE)

    async def mutate(request: web.Request) -> web.Response:
        try:
            async with reading, asyncio.timeout(READ_SECONDS):
                raw = await request.read()
        except TimeoutError:
            return web.json_response(
                {"error": f"the review did not arrive within {READ_SECONDS:g} s"}, status=408
            )
        if raw.count(b"{") + raw.count(b"[") > MAX_CONTAINERS:
            return web.json_response(
                {"error": f"not an AdmissionReview of a pod: over {MAX_CONTAINERS} JSON objects"},
                status=413,
            )
        try:
            body = json.loads(raw)
            answer = review(body, settings)
        except (ValueError, ReviewError) as e:
            return web.json_response({"error": f"not an AdmissionReview: {e}"}, status=400)
        response = answer["response"]
        if not response["allowed"]:
            asked = body.get("request") or {}
            metadata = (asked.get("object") or {}).get("metadata") or {}
            name = metadata.get("name") or metadata.get("generateName") or "(unnamed)"
            pod = f"{asked.get('namespace') or metadata.get('namespace', '')}/{name}"
            log.info(
                "Refused pod %s: %s",
                pod,
                response["status"]["message"],
                extra=subject(
                    pod=pod,
                    model=str((metadata.get("annotations") or {}).get(settings.keys.model_id, "")),
                ),
            )
        return web.json_response(answer)

    app = web.Application(client_max_size=MAX_REVIEW_BYTES)
    app.router.add_post("/mutate-pods", mutate)
    # No metrics of its own yet: an empty registry.
    add_health_routes(app, CollectorRegistry(), _never_unready)
    return app


def _never_unready() -> list[str]:
    """The webhook keeps no state: it is ready whenever it runs."""
    return []


def webhook_server(settings: Settings, context: ssl.SSLContext) -> HttpServer:
    """The HTTPS listener (not started); its `port` is the bound one once started."""
    host, port = settings.listen
    return HttpServer(make_app(settings), host, port, ssl_context=context)


class Webhook:
    """The webhook process, in the shape of every part (`common.lifecycle`): `Webhook(settings)`
    reads the TLS files and builds the HTTPS listener; `start(lifecycle)` listens."""

    def __init__(self, settings: Settings) -> None:
        assert settings.tls_cert is not None and settings.tls_key is not None  # __main__ checks
        self.settings = settings
        self.server = webhook_server(settings, tls_context(settings.tls_cert, settings.tls_key))

    async def start(self, lifecycle: Lifecycle) -> None:
        lifecycle.on_shutdown("webhook server", self.server.stop)
        await self.server.start()
        log.info(
            "The webhook completes model pods on https://%s:%d/mutate-pods.",
            self.settings.listen[0],
            self.server.port,
        )
