"""The webhook's HTTPS server (aiohttp): POST /mutate-pods answers AdmissionReviews, GET /healthz.

The only module that imports aiohttp's server side; TLS comes from the certificate and key files
(cert-manager's Secret, or your own), read once at start.
"""

from __future__ import annotations

import json
import logging
import ssl
from pathlib import Path

from aiohttp import web

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
            log.info("Refused pod: %s", response["status"]["message"])
        return web.json_response(answer)

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application(client_max_size=8 * 1024 * 1024)
    app.router.add_post("/mutate-pods", mutate)
    app.router.add_get("/healthz", healthz)
    return app


class WebhookServer:
    """The running HTTPS listener; `port` is the bound one (useful with port 0)."""

    def __init__(self, settings: Settings, context: ssl.SSLContext) -> None:
        self._settings = settings
        self._context = context
        self._runner = web.AppRunner(make_app(settings), access_log=None)
        self.port = 0

    async def start(self) -> None:
        await self._runner.setup()
        host, port = self._settings.listen
        site = web.TCPSite(self._runner, host, port, ssl_context=self._context)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else port

    async def stop(self) -> None:
        await self._runner.cleanup()
