"""Which pod an accepted connection is: its caller key, checked once, and its source address only
where the two disagree.

A proxy sends its pod's caller key (`common.callerkeys`) as the connection's first bytes.
`KeyReader` takes exactly those bytes off the socket (never more: the protocol's own bytes stay
for the relay), or tells at the first byte that none comes (no key starts otherwise). `identify`
then decides: a key names its pod wherever the connection comes from (a masquerading CNI makes
every pod's source the node's address, or a bridge's), unless it comes from another caller's
address, where the address is evidence of a stolen key and the connection is refused. A
connection with no key, or with a key the table does not hold (a replaced node pod's new secret
makes every proxy's key stale until it asks again), is known by its address, or refused under
`--caller-identity key`.
Nothing here is done per request. What it must not do: relay bytes or decide who is a caller
(the agent's table does).
"""

from __future__ import annotations

import socket
from typing import Final

from common.callerkeys import MAGIC, PREAMBLE_BYTES, CallerKeyError, digest, key_in
from proxy.gateway.callerbook import CallerBook, Rows

NO_KEY: Final = b""
"""What `KeyReader.step` returns for a connection that presents no key."""
MAX_WAITING: Final = 1024
"""Connections waiting for their first bytes at once; past it the longest-waiting of the source
address that holds the most is closed (a proxy's key comes with its first packet, so only a flood
of silent connections waits that long). Each address holds at most
`--max-silent-connections-per-address` of them."""


class ClosedError(Exception):
    """The peer closed the connection before its key was whole."""


class KeyReader:
    """Reads a connection's caller key off its non-blocking socket, a step per readable event."""

    __slots__ = ("_buffer", "_sock")

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buffer = b""

    def step(self) -> bytes | None:
        """The whole preamble, `NO_KEY` when the connection's first byte starts none, or None
        while bytes are still due; raises ClosedError when the peer closed first."""
        try:
            if not self._buffer:
                first = self._sock.recv(1, socket.MSG_PEEK)
                if not first:
                    raise ClosedError
                if first != MAGIC[:1]:
                    return NO_KEY
            # A NUL first byte commits to a preamble: its bytes are taken off as they come (a
            # peek of a partial one would be read again and again).
            data = self._sock.recv(PREAMBLE_BYTES - len(self._buffer))
        except (BlockingIOError, InterruptedError):
            return None
        if not data:
            raise ClosedError
        self._buffer += data
        return self._buffer if len(self._buffer) == PREAMBLE_BYTES else None


def identify(book: CallerBook, keys_only: bool, source: str, first: bytes) -> Rows | str:
    """The rows of the pod a connection from `source` whose first bytes were `first` (a
    preamble, or `NO_KEY`) speaks for, or why it is refused (a metric's reason)."""
    if not first:
        if keys_only:
            return "no_key"
        rows = book.lookup(source)
        return "not_a_caller" if rows is None else rows
    try:
        key = key_in(first)
    except CallerKeyError:
        return "bad_key"
    found = book.by_key(digest(key))
    if found is None:
        # A key the table does not hold: made under a secret the node no longer has (its node
        # pod was replaced, and the proxy has not asked for its new key yet) or forged. Under
        # key-or-address it counts for nothing: the connection is known by its address, as one
        # without a key would be.
        rows = None if keys_only else book.lookup(source)
        return "not_a_caller" if rows is None else rows
    address, rows = found
    if address != source and book.lookup(source) is not None:
        return "address_mismatch"
    return rows
