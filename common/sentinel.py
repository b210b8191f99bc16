"""Knowing the moment Triton's process goes away: an idle connection of our own to its port.

A process's death closes every socket it had at once, its listening sockets too, so the sentinel
connection is closed the moment Triton dies, and a new connection is refused until Triton is
started again. A closed sentinel with a new connection accepted, and still open after
`confirm_seconds`, is no death (an idle close, a proxy in between): the sentinel is simply held
again (`on_dropped` says so). A dying process's port may still accept a connection while its
sockets are being torn down, which then closes at once: that is the same death, not Triton there.
Polling Triton's liveness can miss a death when Triton is started again between two polls; the
sentinel misses one only when its own event loop stalls past Triton's restart: its connection
then shows a drop, and the new connection is accepted by a new Triton (`on_dropped` lets its
owner look for other evidence of a death).
Both the node gateway (`gateway.witness`) and the agent (`agent.status.requestcrash`) hold one. What
it must not do: decide what a death means.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


def host_and_port(url: str) -> tuple[str, int]:
    """The host and port of `url` ("host:port", or a URL with a scheme)."""
    _, _, rest = url.rpartition("://")
    host, _, port = rest.split("/", 1)[0].rpartition(":")
    return host.strip("[]"), int(port)


class Sentinel(Generic[T]):
    """Holds the connection to `url` and calls back when Triton goes away and comes back."""

    def __init__(
        self,
        url: str,
        on_lost: Callable[[], T],
        on_gone: Callable[[T], None],
        on_back: Callable[[], None] | None = None,
        *,
        on_up: Callable[[], None] | None = None,
        on_dropped: Callable[[T], None] | None = None,
        retry_seconds: float = 0.2,
        confirm_seconds: float = 0.25,
    ) -> None:
        """`on_lost()` runs the moment the connection closes, before anything is known (what it
        returns is handed to `on_gone`); `on_gone(lost)` once a new connection is refused;
        `on_back()` when a connection is accepted again after that; `on_up()` whenever one is
        accepted (Triton is there); `on_dropped(lost)`, just before that `on_up`, when the
        connection closed and a new one was accepted at once (a drop, or a death the loop was
        too late to see)."""
        self.host, self.port = host_and_port(url)
        self._on_lost = on_lost
        self._on_gone = on_gone
        self._on_back = on_back
        self._on_up = on_up
        self._on_dropped = on_dropped
        self.retry_seconds = retry_seconds
        self.confirm_seconds = confirm_seconds
        """How long a connection accepted just after the sentinel closed must stay open to
        show that Triton is still there."""
        self.deaths = 0
        """Deaths seen since start."""
        self.held: asyncio.StreamWriter | None = None
        """The sentinel connection while it is held."""

    async def run(self, stop: asyncio.Event) -> None:
        """Hold the sentinel until `stop`."""
        connection = None
        gone = False
        try:
            while not stop.is_set():
                if connection is None:
                    connection = await self._connect()
                    if connection is None:  # Triton is not up (yet, or again)
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(stop.wait(), self.retry_seconds)
                        continue
                    if gone:
                        gone = False
                        if self._on_back is not None:
                            self._on_back()
                    if self._on_up is not None:
                        self._on_up()
                reader, writer = connection
                self.held = writer
                read = asyncio.ensure_future(reader.read(1))
                stopping = asyncio.ensure_future(stop.wait())
                await asyncio.wait({read, stopping}, return_when=asyncio.FIRST_COMPLETED)
                stopping.cancel()
                if not read.done():
                    read.cancel()
                    break
                try:
                    if read.result():
                        continue  # Triton said something on an idle connection: still there
                except OSError:
                    pass  # reset: as closed
                self.held = None
                lost = self._on_lost()
                writer.close()
                connection = await self._connect()
                if connection is not None and await self._closes_soon(connection):
                    connection[1].close()
                    connection = None
                if connection is None:
                    gone = True
                    self.deaths += 1
                    self._on_gone(lost)
                    continue
                if self._on_dropped is not None:
                    self._on_dropped(lost)
                if self._on_up is not None:
                    self._on_up()
        finally:
            self.held = None
            if connection is not None:
                connection[1].close()

    def closed_now(self) -> bool:
        """Whether Triton has closed the held connection already, though the event loop has not
        given the sentinel its turn yet (a peek at the socket: nothing is read). A process's
        death closes it before a new process can listen, so an answer from a Triton started
        again comes after this is true."""
        writer = self.held
        if writer is None:
            return False
        held = writer.get_extra_info("socket")
        if held is None:
            return False
        try:
            with socket.socket(held.family, held.type, fileno=os.dup(held.fileno())) as peek:
                return not peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False  # open, nothing to read
        except OSError:
            return True  # reset

    async def _closes_soon(
        self, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ) -> bool:
        """Whether `connection`, just accepted, closes within `confirm_seconds`."""
        try:
            async with asyncio.timeout(self.confirm_seconds):
                said = await connection[0].read(1)
        except TimeoutError:
            return False
        except OSError:
            return True
        return not said

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            return await asyncio.open_connection(self.host, self.port)
        except OSError:
            return None
