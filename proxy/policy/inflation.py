"""Counting what a compressed body or message inflates to, as its compressed bytes pass.

Triton inflates a gzip or deflate REST body (Content-Encoding) and a compressed gRPC message
(grpc-encoding) whole, with no bound of its own: half a MiB on the wire can make it allocate half a
GiB, and a relay that inflated such a message in one go would do the same to itself and stall its
event loop. An `Inflation` inflates the compressed bytes as they arrive, in slices of at most
SLICE bytes, and refuses the body or message the moment it inflates past the cap; whoever holds
it forwards only bytes that were counted (so Triton never holds a complete body or message that
inflates past the cap). The inflated bytes are handed to a `Sink` slice by slice (the gRPC relay
reads the model name from them) and never kept.

Work per call is bounded by a budget: `feed` stops taking input once it has inflated that many
bytes and says how much it took, so the caller can let the event loop run other connections and
come back (measured: a call_soon round trip costs about 7 us, handing each slice to a thread
about 90 us, and a 256 KiB slice about 0.4 ms to inflate). zlib holds no more than a few hundred
bytes of output back once its input is consumed, so input taken is input counted.

What it must not do: touch sockets, frames or streams, or decide anything but the size.
"""

from __future__ import annotations

import zlib
from typing import Final, Protocol

from proxy.policy.refusals import BodyTooLargeError, MalformedRequestError

SLICE: Final = 256 * 1024
"""The most one zlib call inflates: the largest piece of inflated output ever held."""
BUDGET: Final = 1024 * 1024
"""The inflated bytes one connection may produce before it lets the event loop run others
(about 1.5 ms of CPU here)."""
GZIP: Final = 31
"""zlib window bits of gzip (RFC 1952): grpc's `gzip`, HTTP's `gzip`."""
DEFLATE: Final = 15
"""zlib window bits of the zlib format (RFC 1950): grpc's and Triton's `deflate`."""


class Sink(Protocol):
    """Where the inflated bytes go, slice by slice (`wire.MessageScan`)."""

    def feed(self, data: bytes) -> None: ...


class Inflation:
    """One compressed body or message being inflated and counted; see the module docstring."""

    __slots__ = ("_inflater", "_limit_text", "ended", "limit", "name", "size")

    def __init__(self, wbits: int, limit: int, name: str, limit_text: str) -> None:
        self._inflater = zlib.decompressobj(wbits)
        self.limit = limit
        self.name = name  # "the request body", "the message": for the refusals' text
        self._limit_text = limit_text  # the flag that sets the limit, for the refusals' text
        self.size = 0
        self.ended = False

    def feed(self, data: bytes, budget: int, sink: Sink | None = None) -> int:
        """Inflate from `data` until it is all taken or `budget` inflated bytes were made; how
        many bytes of `data` were taken (all of them were counted). Raises BodyTooLargeError
        past the limit, MalformedRequestError for corrupt data or bytes after the end."""
        if self.ended:
            if data:
                raise self._corrupt("data after its end")
            return 0
        inflater = self._inflater
        tail = data
        made = 0
        while True:
            try:
                out = inflater.decompress(tail, SLICE)
            except zlib.error as e:
                raise self._corrupt(str(e)) from None
            self.size += len(out)
            if self.size > self.limit:
                raise BodyTooLargeError(
                    f"{self.name} inflates to more than the limit of {self.limit} bytes; send "
                    f"it uncompressed, or less, or raise {self._limit_text}"
                )
            if sink is not None and out:
                sink.feed(out)
            made += len(out)
            tail = inflater.unconsumed_tail
            if inflater.eof:
                self.ended = True
                if inflater.unused_data or tail:
                    raise self._corrupt("data after its end")
                return len(data)
            if not tail and len(out) < SLICE:
                return len(data)  # all taken, nothing held back
            if tail and made >= budget:
                return len(data) - len(tail)

    def finish(self) -> None:
        """The compressed bytes are all here: raise MalformedRequestError unless they ended."""
        if not self.ended:
            raise self._corrupt("truncated")

    def _corrupt(self, why: str) -> MalformedRequestError:
        return MalformedRequestError(
            f"{self.name} cannot be decompressed ({why}); send it compressed whole with the "
            f"algorithm it names, or uncompressed"
        )
