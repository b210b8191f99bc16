"""The pod's caller key for the node gateway (`common.callerkeys`), asked of the node's agent and
kept up to date.

The agent answers a pod's projected token with that pod's key; the proxy puts it, as the preamble
its connections to the gateway begin with, in `ProxyState.caller_key`, where the REST pool, the
gRPC channel and the readiness check read it at each new connection (never per request). It asks
once before the proxy serves and again every `REFRESH_SECONDS`, so a key the node changed (a
replaced node pod makes a new secret) is followed within that, or within `RETRY_MAX_SECONDS` of
the new agent answering when the old one stopped answering first; while the agent cannot answer
the last key stays, and with none the gateway knows the pod by its address. What it must not do:
open connections to the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from common.callerkeys import CallerKeyError, preamble
from proxy.agentclient import AgentClient, AgentUnavailableError
from proxy.processflags import ProxyState

log = logging.getLogger(__name__)

REFRESH_SECONDS: Final = 30.0
"""Seconds between asks while the agent answers."""
RETRY_SECONDS: Final = 1.0
"""Seconds before asking again after an ask failed, doubling up to `RETRY_MAX_SECONDS`."""
RETRY_MAX_SECONDS: Final = 4.0
"""An agent that does not answer is most often a replaced node pod's, whose new agent answers
with a new key within seconds of starting: asked again this often at most while it fails."""


class CallerKeyKeeper:
    """Asks the agent for the pod's key and keeps it in `state`."""

    def __init__(self, agent: AgentClient, state: ProxyState) -> None:
        self._agent = agent
        self._state = state
        self._failing = ""

    async def ask(self) -> bool:
        """Ask once; True when the agent answered with a key."""
        try:
            key = await self._agent.caller_key()
            wire = preamble(key)
        except (AgentUnavailableError, CallerKeyError) as e:
            if str(e) != self._failing:
                log.warning(
                    "Cannot get the pod's caller key from the agent (%s): %s.",
                    e,
                    "keeping the one it gave before"
                    if self._state.caller_key
                    else "the node gateway knows this pod by its address alone meanwhile",
                )
            self._failing = str(e)
            return False
        if wire != self._state.caller_key:
            log.info(
                "The node gateway knows this pod by its caller key from now on%s.",
                " (the node's agent gave a new one)" if self._state.caller_key else "",
            )
        self._failing = ""
        self._state.caller_key = wire
        return True

    async def keep(self, stop: asyncio.Event) -> None:
        """Ask every REFRESH_SECONDS (sooner after a failure) until `stop`."""
        wait = RETRY_SECONDS
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)
            if stop.is_set():
                return
            wait = REFRESH_SECONDS if await self.ask() else min(wait * 2, RETRY_MAX_SECONDS)
