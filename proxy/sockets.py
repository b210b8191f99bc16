"""The proxy's socket set-up, in one place: listening sockets and the options of connected ones.

Every listener (REST, gRPC relay, metrics) binds the same way, and every relayed connection (tenant
or Triton side) turns Nagle's algorithm off, because the relays write whole messages and a small
response held back for an ACK would add tens of milliseconds. What it must not do: any I/O beyond
setting options and binding.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import cast


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket on host:port (port 0 picks a free one)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.setblocking(False)
    return sock


def listens(sock: socket.socket) -> bool:
    """Whether `sock` is open and still listening: a listening socket that was shut down or
    closed refuses every connection to its port."""
    try:
        return bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
    except OSError:  # closed
        return False


def nodelay(transport: asyncio.BaseTransport) -> asyncio.Transport:
    """`transport` with TCP_NODELAY set, typed as the stream transport it is (uvloop's transports
    implement asyncio.Transport without subclassing it)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return cast(asyncio.Transport, transport)


def local_address(source_address: str) -> tuple[str, int] | None:
    """`local_addr` for a connection leaving from `source_address` (None: the kernel chooses)."""
    return (source_address, 0) if source_address else None
