"""`python -m webhook`: parse the settings, configure logging, serve HTTPS until a signal."""

from __future__ import annotations

import asyncio
import logging
import sys

from common.lifecycle import Lifecycle
from common.logs import configure_logging
from webhook.server import tls_context, webhook_server
from webhook.settings import Settings, SettingsError, parse_settings

log = logging.getLogger("webhook")


async def _run(settings: Settings) -> int:
    assert settings.tls_cert is not None and settings.tls_key is not None
    server = webhook_server(settings, tls_context(settings.tls_cert, settings.tls_key))
    lifecycle = Lifecycle()
    lifecycle.install_signal_handlers()

    async def start(lc: Lifecycle) -> None:
        await server.start()
        lc.on_shutdown("webhook server", server.stop)
        log.info(
            "The webhook completes model pods on https://%s:%d/mutate-pods.",
            settings.listen[0],
            server.port,
        )

    return await lifecycle.run(start)


def main(argv: list[str] | None = None) -> int:
    try:
        settings = parse_settings(sys.argv[1:] if argv is None else argv)
        if settings.tls_cert is None or settings.tls_key is None:
            raise SettingsError(
                "--tls-cert and --tls-key are required: the API server calls webhooks over HTTPS"
            )
        configure_logging("INFO", settings.log_format, name="webhook")
        return asyncio.run(_run(settings))
    except (SettingsError, ValueError) as e:
        print(f"webhook: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
