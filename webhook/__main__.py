"""`python -m webhook`: parse the settings, configure logging, serve HTTPS until a signal."""

from __future__ import annotations

import asyncio
import logging
import sys

from common.lifecycle import serve
from common.logs import configure_logging
from common.version import VERSION
from webhook.server import Webhook
from webhook.settings import Settings, SettingsError, parse_settings

log = logging.getLogger("webhook")


async def _run(settings: Settings) -> int:
    return await serve(Webhook(settings))


def main(argv: list[str] | None = None) -> int:
    try:
        settings = parse_settings(sys.argv[1:] if argv is None else argv)
        if settings.tls_cert is None or settings.tls_key is None:
            raise SettingsError(
                "--tls-cert and --tls-key are required: the API server calls webhooks over HTTPS"
            )
        configure_logging("INFO", settings.log_format, name="webhook")
        log.info("The webhook of tritonshare %s is starting.", VERSION)
        return asyncio.run(_run(settings))
    except (SettingsError, ValueError) as e:
        print(f"webhook: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
