"""After Triton exits, the models it held are loaded again before the load it died under.

Triton restarts empty; the reconciler's next pass loads again what it held (`Reconciler`). A pod
whose load was in flight when Triton died often asks for it again at once (its loader retries
the moment the agent answers); that load waits until the pass has acted, at most `WAIT_SECONDS`,
so that a load that took Triton down does not take it down again in the middle of the restore
while the node gateway holds the other models' requests for it. Owns only this waiting; it knows
nothing of Triton or the pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Final

WAIT_SECONDS: Final = 20.0
"""The longest such a load waits for the restore (the gateway holds requests as long for it)."""


class RestoreGate:
    """Closed from Triton's exit until the reconciler's first pass after it has acted."""

    def __init__(self, on_gone: Callable[[], None]) -> None:
        """`on_gone` is called at each exit (the crash ledger names the next Triton process)."""
        self._on_gone = on_gone
        self._open = asyncio.Event()
        self._open.set()
        self.generation = 0
        """Counts the exits: a pass that began before the latest one opens nothing."""

    @property
    def restoring(self) -> bool:
        return not self._open.is_set()

    def gone(self) -> None:
        """Triton exited: what it held is loaded again first."""
        self.generation += 1
        self._open.clear()
        self._on_gone()

    def restored(self, generation: int) -> None:
        """A reconciler pass that began at `generation` has acted: open, unless Triton exited
        again since it began."""
        if generation == self.generation:
            self._open.set()

    async def wait(self, seconds: float = WAIT_SECONDS) -> float:
        """Wait until open, at most `seconds`; the seconds waited."""
        if self._open.is_set():
            return 0.0
        began = time.monotonic()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._open.wait(), seconds)
        return time.monotonic() - began
