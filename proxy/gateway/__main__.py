"""`python -m proxy.gateway`: parse settings, configure logs, run the node gateway until SIGTERM.

With `--keep-listening` this process binds the listeners and keeps the gateway running as its
child (`proxy.gateway.keep`); the child, started with the sockets, serves on them. Runs on uvloop
when it is installed (`proxy.runner`).
"""

from __future__ import annotations

import logging
import os
import sys

from common.logs import configure_logging
from common.version import VERSION
from proxy.gateway.keep import keep, kept, watch_keeper
from proxy.gateway.settings import parse_settings
from proxy.settings import SettingsError

log = logging.getLogger("gateway")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = sys.argv[1:] if argv is None else argv
    try:
        settings = parse_settings(args)
        inherited = kept(os.environ)
    except SettingsError as e:
        print(f"gateway: {e}", file=sys.stderr)
        return 2
    configure_logging(
        settings.log_level, "json" if settings.log_format == "json" else "text", name="gateway"
    )
    if settings.keep_listening and inherited.keeper is None:
        return keep(settings, args)
    # Here, not above: the keeper needs none of the gateway's own modules.
    from proxy.gateway.app import run
    from proxy.runner import event_loop_runner

    if inherited.keeper is not None:
        watch_keeper(inherited.keeper)
    log.info(
        "The node gateway of tritonshare %s is starting%s.",
        VERSION,
        f" (start {inherited.starts} under its keeper)" if inherited.keeper is not None else "",
    )
    return event_loop_runner()(run(settings, inherited))


if __name__ == "__main__":
    sys.exit(main())
