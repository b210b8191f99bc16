"""Blocking work handed from the event loop to worker threads, and its outcome handed back.

The controller decides on the loop and writes to the API server off it. No task and no asyncio
future per piece of work: each is a job in a deque, run by at most `workers` runners on the
executor, and the outcomes come back to the loop through the Inbox in batches (one wake-up for
all that finished meanwhile). A runner that finishes a job takes the next waiting one at once
instead of sleeping until woken: those hand-offs between threads cost more CPU than the writes.

Owns no domain logic: it runs what it is given and tells the loop how it ended. At most
`workers` jobs run at once; how many may wait is the caller's bound (the controller's bind slots).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor

from binder.api.inbox import Inbox

Outcome = Callable[[Exception | None], None]
"""What the loop does once a job has run: called with its error, or None when it worked."""

_Job = tuple[Callable[[], None], Outcome]


class Handover:
    """Jobs from the loop to at most `workers` runners on `executor`; outcomes back in order."""

    def __init__(self, executor: Executor, workers: int, *, inbox: Inbox) -> None:
        self._executor = executor
        self._workers = workers
        self.inbox = inbox
        """Where outcomes are handed back (one shared with other threads, so a burst costs the
        loop one wake-up)."""
        self._lock = threading.Lock()
        self._jobs: deque[_Job] = deque()
        """Jobs handed over, waiting for a runner."""
        self._runners = 0
        self._outstanding = 0
        """Jobs handed over whose outcome the loop has not taken yet (read on the loop only)."""
        self._idle = asyncio.Event()
        """Set while no job is outstanding."""
        self._idle.set()
        self._abandoned = False

    def submit(self, work: Callable[[], None], outcome: Outcome) -> None:
        """Run `work` on a worker thread, then `outcome(its error or None)` on the loop."""
        self._idle.clear()
        self._outstanding += 1
        with self._lock:
            self._jobs.append((work, outcome))
            if self._runners >= self._workers:
                return
            self._runners += 1
        try:
            self._executor.submit(self._run)
        except BaseException:
            with self._lock:
                self._runners -= 1
                self._jobs.remove((work, outcome))
            self._outstanding -= 1
            raise

    async def drain(self, grace_seconds: float) -> None:
        """Let outstanding jobs finish (bounded), then abandon what is left: a job already on a
        worker thread ends there, its outcome ignored; a waiting one never runs."""
        if self._outstanding:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), grace_seconds)
        if self._outstanding:
            self._abandoned = True
            with self._lock:
                self._jobs.clear()

    def _run(self) -> None:
        """A runner, on a worker thread: jobs until none is waiting."""
        while True:
            with self._lock:
                if not self._jobs:
                    self._runners -= 1
                    return
                work, outcome = self._jobs.popleft()
            error: Exception | None = None
            try:
                work()
            except Exception as e:  # every outcome, even a bug's, is the loop's to judge
                error = e
            self.inbox.post(self._take_outcome, outcome, error)

    def _take_outcome(self, outcome: Outcome, error: Exception | None) -> None:
        if self._abandoned:
            return
        self._outstanding -= 1
        try:
            outcome(error)
        finally:
            if not self._outstanding:
                self._idle.set()
