"""`python -m proxy`: parse settings, configure logs, run the proxy until SIGTERM.

Runs on uvloop when it is installed (`proxy.runner`).
"""

from __future__ import annotations

import logging
import sys

from common.logs import configure_logging, subject
from common.version import VERSION
from proxy.app import run
from proxy.runner import event_loop_runner
from proxy.settings import SettingsError, parse_settings

log = logging.getLogger("proxy")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    try:
        settings = parse_settings(sys.argv[1:] if argv is None else argv)
    except SettingsError as e:
        print(f"proxy: {e}", file=sys.stderr)
        return 2
    configure_logging(
        settings.log_level,
        "json" if settings.log_format == "json" else "text",
        name="proxy",
        fields=subject(model=settings.model_id),
    )
    log.info("The proxy of tritonshare %s is starting for model %s.", VERSION, settings.model_id)
    return event_loop_runner()(run(settings))


if __name__ == "__main__":
    sys.exit(main())
