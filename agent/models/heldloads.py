"""Loads of held namespaces go alone: last, with nothing else loading, then a quiet period.

A namespace one of whose files was quarantined on this node is held
(`agent.quarantine.crashledger`): its next exit of Triton must be told apart from everyone else's
loads, whatever new files it sends. So a held namespace's load begins only when no other load is
under way on the node, and no load begins while it runs, nor for a quiet period after it is READY
(during which an exit of Triton still counts against it, `CrashLedger.quiet_seconds`). Other loads
go first: a held load waits while any other is under way or waits, so another namespace's load waits
for one held load and its quiet period at most. What it must not do: decide who is held (the ledger
does) or touch Triton.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable


class HeldLoads:
    """The node's loads under way, and whether a held namespace's load or quiet period is."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.loads = 0
        """Loads under way on the node."""
        self.alone = False
        """A held namespace's load is under way: nothing else begins."""
        self.quiet_until = 0.0
        """Nothing begins before this (`clock` seconds): a held load's quiet period."""
        self._others_waiting = 0
        """Loads not held that wait: a held one lets them go first."""
        self._change = asyncio.Event()

    def _may_begin(self, held: bool) -> bool:
        if self.alone or self._clock() < self.quiet_until:
            return False
        return not held or (self.loads == 0 and self._others_waiting == 0)

    async def begin(self, held: bool) -> None:
        """Wait for a load's turn: a held namespace's when nothing else loads, any other's when
        no held load runs or keeps the node quiet."""
        if not held:
            self._others_waiting += 1
        try:
            while not self._may_begin(held):
                change = self._change
                quiet = self.quiet_until - self._clock()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(change.wait(), quiet if quiet > 0 else None)
        finally:
            if not held:
                self._others_waiting -= 1
                self._changed()
        self.loads += 1
        self.alone = held

    def end(self, held: bool, quiet: float) -> None:
        """The load begun is over; a held one keeps the node quiet `quiet` seconds more."""
        self.loads -= 1
        if held:
            self.alone = False
            self.quiet_until = max(self.quiet_until, self._clock() + quiet)
        self._changed()

    def _changed(self) -> None:
        self._change.set()
        self._change = asyncio.Event()
