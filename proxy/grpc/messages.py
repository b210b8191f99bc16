"""Compressed gRPC request messages for the relay: the bounded inflate that lets a message's model
name be read (of a whole message, or of the first bytes of a large one), while the relay forwards
the tenant's original compressed bytes.

gRPC marks a compressed message with flag 1 in its length prefix and names the algorithm in the
stream's `grpc-encoding` request header. grpc's `gzip` is RFC 1952 (zlib wbits 31) and its
`deflate` is the zlib format of RFC 1950 (wbits 15), not raw deflate. Inflating here never
produces more than a small bound (a message that inflates to more is read in pieces, under the
proxy's inflate cap, by `policy.inflation`), so a small "bomb" costs the proxy at most that.

What it must not do: decide isolation, or touch frames and streams (pure functions only).
"""

from __future__ import annotations

import zlib
from typing import Final

from proxy.policy.refusals import MalformedRequestError

_WBITS: Final = {b"gzip": 31, b"deflate": 15}
"""zlib window bits for each grpc-encoding the relay can read."""


def wbits(encoding: bytes | None) -> int:
    if encoding is None or encoding == b"identity":
        raise MalformedRequestError(
            "a message is marked compressed but the call's grpc-encoding header names no "
            "compression; send grpc-encoding gzip or deflate with it, or send it uncompressed",
        )
    wbits = _WBITS.get(encoding)
    if wbits is None:
        raise MalformedRequestError(
            f"the model proxy cannot read messages compressed with "
            f"{encoding.decode('latin-1')!r}; use gzip or deflate, or send them uncompressed",
        )
    return wbits


def inflate_small(encoding: bytes | None, data: bytes, limit: int) -> bytes | None:
    """The decompressed bytes of one whole message with the compressed flag set, if they are at
    most `limit` bytes (a small limit: this runs inline on the event loop); None when they would be
    more (stopping there): such a message is read in pieces (`policy.inflation`,
    `wire.MessageScan`) under the proxy's inflate cap.

    Raises MalformedRequestError when the stream names no usable encoding or the data is corrupt:
    a refusal the relay answers from `policy.refusals`' table (INVALID_ARGUMENT).
    """
    inflater = zlib.decompressobj(wbits(encoding))
    try:
        # One byte past the limit tells "exactly the limit" from "more than the limit".
        out = inflater.decompress(data, limit + 1)
    except zlib.error as e:
        raise _corrupt(encoding or b"", str(e)) from None
    if len(out) > limit:
        return None
    if not inflater.eof or inflater.unused_data:
        raise _corrupt(encoding or b"", "truncated" if not inflater.eof else "data after its end")
    return out


def inflate_prefix(encoding: bytes | None, data: bytes, limit: int) -> bytes:
    """Up to `limit` bytes of what the first bytes `data` of a compressed message inflate to, for
    reading its name before the rest arrives. Raises MalformedRequestError as `inflate` does for an
    unusable encoding or corrupt data (a prefix that merely ends early is not an error)."""
    inflater = zlib.decompressobj(wbits(encoding))
    try:
        return inflater.decompress(data, limit)
    except zlib.error as e:
        raise _corrupt(encoding or b"", str(e)) from None


def _corrupt(encoding: bytes, why: str) -> MalformedRequestError:
    return MalformedRequestError(
        f"a {encoding.decode('latin-1')}-compressed message cannot be decompressed ({why}); "
        f"send it compressed whole with the algorithm named in grpc-encoding",
    )
