"""Connecting to the upstream (the node gateway, or Triton behind it) again while it restarts.

A request that has not reached its upstream yet, because nothing listens there (the gateway or
Triton is restarting: a container restart, a node pod replaced), is safe to send once it listens
again: Triton never saw it. `connect_retrying` tries again for up to the proxy's
--connect-retry seconds, waiting 50 ms doubling to 0.5 s between tries, and gives up with the
last refusal. A connection that breaks once a request is on its way is never retried here:
Triton may have run it (an inference is not idempotent), and the relays answer its failure
instead. Owns only the retry schedule; it must not read or write a request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

T = TypeVar("T")

FIRST_WAIT: Final = 0.05
LONGEST_WAIT: Final = 0.5


async def connect_retrying(
    connect: Callable[[], Awaitable[T]],
    seconds: float,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """`connect()`, tried again while it is refused (nothing listens) for up to `seconds`;
    raises the last ConnectionRefusedError past them, and any other error at once."""
    deadline = clock() + seconds
    wait = FIRST_WAIT
    while True:
        try:
            return await connect()
        except ConnectionRefusedError:
            if clock() + wait > deadline:
                raise
        await asyncio.sleep(wait)
        wait = min(wait * 2, LONGEST_WAIT)
