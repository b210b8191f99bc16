"""`python -m binder`: parse the settings, configure logging, run one binder replica until a
signal (SIGTERM/SIGINT), then stop it in the order binder.app documents.

Exit codes: 0 after a clean stop, 1 if a task failed or the replica cannot run (the log says
why), 2 for bad settings.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from binder.app import Binder
from binder.errors import BinderError, SettingsError
from binder.settings import Settings, parse_settings
from common.kubeapi.errors import ApiError
from common.lifecycle import serve
from common.logs import configure_logging
from common.version import VERSION

log = logging.getLogger("binder")


async def _run(settings: Settings) -> int:
    # Built on the running loop, as every part is: nothing of it outlives this run.
    return await serve(Binder(settings))


def main(argv: list[str] | None = None) -> int:
    try:
        settings = parse_settings(sys.argv[1:] if argv is None else argv)
    except SettingsError as e:
        print(f"binder: {e}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_format, name="binder")
    log.info("The binder of tritonshare %s is starting.", VERSION)
    try:
        return asyncio.run(_run(settings))
    except (BinderError, ApiError, OSError) as e:
        log.error("The binder cannot run: %s", e)
        return 1


if __name__ == "__main__":
    sys.exit(main())
