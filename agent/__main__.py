"""`python -m agent`: parse the settings, configure logging, run the agent until SIGTERM.

Exit codes: 0 after a clean stop, 1 if a long-lived task failed, 2 for bad settings or a start
that failed (the log says why).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence

from agent.app import Agent
from agent.errors import AgentError
from agent.gpus.nvml import PYNVML
from agent.settings import Settings, SettingsError, parse_settings
from common.lifecycle import serve
from common.logs import configure_logging, subject
from common.version import VERSION

log = logging.getLogger("agent")


async def run(settings: Settings) -> int:
    # Built on the running loop, as every part is: nothing of it outlives this run.
    agent = Agent(settings, nvml=PYNVML)
    drain = settings.stop_drain_seconds + settings.stop_unroute_seconds
    signalled = agent.stopping.signalled
    return await serve(agent, cleanup_timeout=max(30.0, drain + 5), on_signal=signalled)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = parse_settings(argv)
    except SettingsError as e:
        print(f"agent: {e}", file=sys.stderr)
        return 2
    configure_logging(
        settings.log_level,
        "json" if settings.log_format == "json" else "text",
        fields=subject(node=settings.node_name),
    )
    log.info("The agent of tritonshare %s is starting on node %s.", VERSION, settings.node_name)
    try:
        return asyncio.run(run(settings))
    except (AgentError, OSError) as e:
        log.error("The agent for node %s cannot start: %s", settings.node_name, e)
        return 2


if __name__ == "__main__":
    sys.exit(main())
