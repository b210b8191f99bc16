"""Gathered writes: what one connection writes while it handles a read leaves in one write.

Each connection of the gRPC relay (a tenant's, and the channel to Triton) owns an `Outbox`. A
connection handling a read holds the `Scheduler` (the listener, `server.GrpcRelay`) and flushes
it when the read is done, so everything one read from a tenant produces for Triton (and for that
tenant) leaves in one write at once, and all that one read from Triton produces for a tenant
reaches it in one. A write made outside a read (a timer, a task that got its slot) is flushed at
the end of the event-loop turn. Flushing at the end of the read rather than of the turn spares
a call the wait for one more loop turn on its way to Triton; on this 2-core box the effect was
within the noise (docs/proxy.md, Performance), and the calls of several tenants no longer share
one write to Triton (c=16 throughput did not drop).

What it must not do: look at what it writes, or write while there is no transport (frames wait).
"""

from __future__ import annotations

import asyncio
from typing import Protocol


class Scheduler(Protocol):
    """Flushes marked outboxes when a read is done, or at the end of the event-loop turn."""

    def mark(self, outbox: Outbox) -> None:
        """`outbox` has bytes to send: flush it at the end of this read, or of this turn."""

    def hold(self) -> None:
        """Writes from now on wait for the caller's `flush` (the end of its read)."""

    def flush(self) -> None:
        """Write what every connection gathered."""


class Outbox:
    """The frames one connection wrote this turn, and its transport."""

    __slots__ = ("_frames", "_mark", "dirty", "transport")

    def __init__(self, scheduler: Scheduler, frames: list[bytes] | None = None) -> None:
        # Bound once: compiled (mypyc), a call through the Protocol looks `mark` up every time.
        self._mark = scheduler.mark
        self._frames: list[bytes] = frames or []
        self.dirty = bool(self._frames)  # frames given at birth wait for the caller's mark
        self.transport: asyncio.Transport | None = None

    def write(self, frames: bytes) -> None:
        """Queue `frames`; they leave with everything else written this turn."""
        self._frames.append(frames)
        if not self.dirty:
            self.dirty = True
            self._mark(self)

    def write_data(self, header: bytes, payload: bytes) -> None:
        """Queue a DATA frame's header and its payload (not joined: the payload is not copied)."""
        self._frames.append(header)
        self._frames.append(payload)
        if not self.dirty:
            self.dirty = True
            self._mark(self)

    def flush(self) -> None:
        """Write what was queued (kept while there is no transport)."""
        if self.transport is None:
            return
        self.dirty = False
        if self._frames:
            data = b"".join(self._frames)
            self._frames.clear()
            self.transport.write(data)
