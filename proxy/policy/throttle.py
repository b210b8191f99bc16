"""One relayed connection's reading as its pod's share of the gateway's loop allows.

A connection stops reading its tenant's socket for either of two independent reasons: its own
back-pressure (the tenant does not read what is written to it), which the relay tracks, and its
pod being over its share of the loop or held by the node's byte budget (`policy.share`), which
this tracks. The socket reads again only once neither holds it. Both relays (`http1`, `grpc`)
keep one `Throttle` per connection and pass their own back-pressure in.
"""

from __future__ import annotations

import asyncio

from proxy.policy.share import LoopShare


class Throttle:
    """Whether the pod's share holds one connection's reading."""

    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = False

    def engage(self, transport: asyncio.Transport | None, paused: bool) -> None:
        """Read nothing until `release` (`paused`: the connection's own back-pressure has
        stopped reading already)."""
        if not self.on and transport is not None:
            self.on = True
            if not paused:
                transport.pause_reading()

    def release(self, transport: asyncio.Transport | None, paused: bool) -> bool:
        """Let the share's hold go, reading again unless `paused`; True when it held."""
        if self.on and transport is not None:
            self.on = False
            if not paused:
                transport.resume_reading()
            return True
        return False

    def engage_if_stopped(
        self, share: LoopShare | None, transport: asyncio.Transport | None, paused: bool
    ) -> None:
        """Engage when the pod's reading is stopped already (a new connection of a paused or
        held pod)."""
        if (
            share is not None
            and (share.paused or share.held)
            and transport is not None
            and not transport.is_closing()
        ):
            self.engage(transport, paused)
