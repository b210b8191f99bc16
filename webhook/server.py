"""The webhook's HTTPS app (aiohttp): POST /mutate-pods answers AdmissionReviews; /healthz,
/readyz and /metrics are common/health.py's, and so is the server that runs it all.

The only module of the webhook that imports aiohttp's server side; TLS comes from the certificate
and key files (cert-manager's Secret, or your own), read once at start.
"""

from __future__ import annotations

import json
import logging
import ssl
from pathlib import Path

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


def make_app(settings: Settings) -> web.Application:
    async def mutate(request: web.Request) -> web.Response:
        try:
            body = await request.json()
            answer = review(body, settings)
        except (json.JSONDecodeError, ReviewError) as e:
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

    app = web.Application(client_max_size=8 * 1024 * 1024)
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
