"""`python -m proxy.gateway`: parse settings, configure logs, run the node gateway until SIGTERM.

Runs on uvloop when it is installed (`proxy.runner`).
"""

from __future__ import annotations

import logging
import sys

from common.logs import configure_logging
from common.version import VERSION
from proxy.gateway.app import run
from proxy.gateway.settings import parse_settings
from proxy.runner import event_loop_runner
from proxy.settings import SettingsError

log = logging.getLogger("gateway")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    try:
        settings = parse_settings(sys.argv[1:] if argv is None else argv)
    except SettingsError as e:
        print(f"gateway: {e}", file=sys.stderr)
        return 2
    configure_logging(
        settings.log_level, "json" if settings.log_format == "json" else "text", name="gateway"
    )
    log.info("The node gateway of tritonshare %s is starting.", VERSION)
    return event_loop_runner()(run(settings))


if __name__ == "__main__":
    sys.exit(main())
