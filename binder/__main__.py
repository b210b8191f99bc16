"""`python -m binder`: parse the settings, configure logging, run one binder replica until a
signal (SIGTERM/SIGINT), then stop it in the order binder.app documents."""

from __future__ import annotations

import asyncio
import logging
import sys

from binder.app import Binder
from binder.errors import BinderError, SettingsError
from binder.settings import Settings, parse_settings
from common.lifecycle import Lifecycle
from common.logs import configure_logging

log = logging.getLogger("binder")


async def _run(settings: Settings) -> int:
    lifecycle = Lifecycle()
    lifecycle.install_signal_handlers()
    binder = Binder(settings)

    async def serve() -> None:
        await binder.start()
        log.info(
            "The binder %s serves on %s:%d and schedules pods with schedulerName %s (%s).",
            settings.identity,
            settings.listen_http[0],
            binder.http.port,
            settings.scheduler_name,
            settings.policy,
        )
        await binder.stopped.wait()
        if binder.failure is not None:
            lifecycle.fail("the binder", binder.failure)  # logged where it failed; exit 1
        lifecycle.request_stop("the binder stopped")

    async def start(lc: Lifecycle) -> None:
        lc.on_shutdown("binder", binder.stop)
        # Started as a task, so a signal also stops a binder still waiting for its caches.
        lc.spawn("binder", serve())

    return await lifecycle.run(start)


def main(argv: list[str] | None = None) -> int:
    try:
        settings = parse_settings(sys.argv[1:] if argv is None else argv)
    except SettingsError as e:
        print(f"binder: {e}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format, name="binder")
    try:
        return asyncio.run(_run(settings))
    except BinderError as e:
        log.error("The binder cannot run: %s", e)
        return 1


if __name__ == "__main__":
    sys.exit(main())
