"""`python -m sim.apiserver`: serve the simulated API server until SIGTERM or SIGINT.

Prints one line, `sim-apiserver listening on http://HOST:PORT`, once it accepts connections (so a
parent process can read the URL), then logs to stderr.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from common.logs import configure_logging
from sim.apiserver.server import serve
from sim.apiserver.settings import ApiServerSettings, SettingsError, parse_settings

log = logging.getLogger("sim.apiserver")


async def _main(settings: ApiServerSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def announce(url: str) -> None:
        print(f"sim-apiserver listening on {url}", flush=True)
        log.info("The simulated API server is listening on %s.", url)

    await serve(settings, stop, announce)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = parse_settings(argv)
    except SettingsError as e:
        print(f"sim.apiserver: {e}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format)
    try:
        asyncio.run(_main(settings))
    except OSError as e:
        log.error(
            "The simulated API server cannot listen on %s:%d: %s.", settings.host, settings.port, e
        )
        return 1
    except ValueError as e:  # --crds names something that is not a valid CRD
        log.error("The simulated API server cannot start: %s", e)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
