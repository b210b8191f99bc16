"""Connecting to the upstream (the node gateway, or Triton behind it) again while it restarts.

A request that has not reached its upstream yet, because nothing listens there (the gateway or
Triton is restarting: a container restart, a node pod replaced), is safe to send once it listens
again: Triton never saw it. `connect_retrying` tries again for up to the proxy's
--connect-retry seconds, waiting 50 ms doubling to 0.5 s between tries, and gives up with the
last refusal. At the node gateway a refusal while the request's model is restoring (Triton exited
and the model is not READY in it again, `gateway.restore`) waits for the restore instead, at most
its bound, then tries again as before: the request goes to the restarted Triton once its model is
back rather than failing while Triton restarts. A restore that begins between a refusal and the
next try (the gateway sees the exit a moment after Triton's sockets refuse) is waited for too, and
so is one under way before the first try: Triton's keeper starts it again at once, so a request
admitted before the exit may find it listening without its model, never refused. A
connection that breaks once a request is on its way is never retried here: Triton may have run
it (an inference is not idempotent), and the relays answer its failure instead. Owns only the
retry schedule; it must not read or write a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

T = TypeVar("T")

FIRST_WAIT: Final = 0.05
LONGEST_WAIT: Final = 0.5

Restoring = Callable[[], tuple[asyncio.Event, float] | None]
"""The restore a refused connection may wait for, and its bound in seconds; None: none."""


async def connect_retrying(
    connect: Callable[[], Awaitable[T]],
    seconds: float,
    clock: Callable[[], float] = time.monotonic,
    restoring: Restoring | None = None,
) -> T:
    """`connect()`, tried again while it is refused (nothing listens) for up to `seconds`;
    raises the last ConnectionRefusedError past them, and any other error at once. The first
    refusal during a restore (`restoring`) waits for its end, at most its bound, and the
    `seconds` start again from there; so does a restore that began while it waited to try
    again, or before the first try."""
    waited = await _restored(restoring)
    deadline = clock() + seconds
    wait = FIRST_WAIT
    while True:
        try:
            return await connect()
        except ConnectionRefusedError:
            if not waited and await _restored(restoring):
                waited = True
                deadline = clock() + seconds
                continue
            if clock() + wait > deadline:
                raise
        await asyncio.sleep(wait)
        wait = min(wait * 2, LONGEST_WAIT)
        # Refused before the gateway saw Triton's exit, the next try may find Triton listening
        # again without the request's model: a restore that began meanwhile is waited for first.
        if not waited and await _restored(restoring):
            waited = True
            deadline = clock() + seconds


async def _restored(restoring: Restoring | None) -> bool:
    """Wait for the restore under way, if any, at most its bound; whether there was one."""
    restore = None if restoring is None else restoring()
    if restore is None:
        return False
    event, bound = restore
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), bound)
    return True
