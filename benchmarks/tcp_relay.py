"""A bare TCP relay: the floor of one extra Python hop, for the proxy benchmark to compare against.

Each accepted connection gets its own connection to the upstream and bytes are copied both ways as
they arrive, with nothing parsed, checked or counted: what any proxy in Python on uvloop pays for
the hop itself (two more reads, two more writes and two more wake-ups per exchange). It is a
benchmark instrument, not a product part: it has no limits, no isolation and no error handling.

    python -m benchmarks.tcp_relay UPSTREAM_HOST:PORT LISTEN_HOST:PORT [UPSTREAM LISTEN ...]

One process serves every pair given, as one proxy process serves both REST and gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
from typing import cast

import uvloop


def _nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _Side(asyncio.Protocol):
    """One end of a relayed pair; whatever it reads is written to its peer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self.pending: list[bytes] = []  # bytes read before the peer connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        _nodelay(transport)

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self.pending.append(data)
        elif peer.transport.is_closing():  # the other side has gone: so does this one
            self.close()
        else:
            peer.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None:
            self.peer.close()


async def _listen(upstream: str, listen: str) -> asyncio.Server:
    loop = asyncio.get_running_loop()
    up_host, _, up_port = upstream.rpartition(":")
    host, _, port = listen.rpartition(":")
    connecting: set[asyncio.Task[None]] = set()

    def accepted() -> _Side:
        tenant = _Side()

        async def connect() -> None:
            try:
                _, side = await loop.create_connection(_Side, up_host, int(up_port))
            except OSError:
                tenant.close()
                return
            if tenant.transport is None or tenant.transport.is_closing():
                side.close()  # the tenant left while the upstream was connecting
                return
            side.peer, tenant.peer = tenant, side
            for reader, writer in ((tenant, side), (side, tenant)):
                for data in reader.pending:
                    assert writer.transport is not None
                    writer.transport.write(data)
                reader.pending.clear()

        task = loop.create_task(connect())
        connecting.add(task)
        task.add_done_callback(connecting.discard)
        return tenant

    return await loop.create_server(accepted, host, int(port), backlog=1024)


async def _serve(pairs: list[tuple[str, str]]) -> None:
    servers = [await _listen(upstream, listen) for upstream, listen in pairs]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    for server in servers:
        server.close()


def main() -> int:
    args = sys.argv[1:]
    if not args or len(args) % 2:
        print(__doc__, file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(_serve(list(zip(args[::2], args[1::2], strict=True))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
