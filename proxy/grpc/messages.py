"""Compressed gRPC request messages for the relay: the bounded inflate that lets a message's model
name be read (of a whole message, or of the first bytes of a large one), while the relay forwards
the tenant's original compressed bytes.

gRPC marks a compressed message with flag 1 in its length prefix and names the algorithm in the
stream's `grpc-encoding` request header. grpc's `gzip` is RFC 1952 (zlib wbits 31) and its
`deflate` is the zlib format of RFC 1950 (wbits 15), not raw deflate. Inflating never produces
more than the proxy's message limit, so a small "bomb" costs the proxy at most that much.

What it must not do: decide isolation, or touch frames and streams (pure functions only).
"""

from __future__ import annotations

import zlib
from typing import Final

from proxy.policy.refusals import BodyTooLargeError, MalformedRequestError

_WBITS: Final = {b"gzip": 31, b"deflate": 15}
"""zlib window bits for each grpc-encoding the relay can read."""


def _wbits(encoding: bytes | None) -> int:
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


def inflate(encoding: bytes | None, data: bytes, limit: int) -> bytes:
    """The decompressed bytes of one message with the compressed flag set.

    Raises MalformedRequestError when the stream names no usable encoding or the data is corrupt,
    BodyTooLargeError when it would inflate past `limit` bytes (stopping there): refusals the
    relay answers from `policy.refusals`' table (INVALID_ARGUMENT, RESOURCE_EXHAUSTED).
    """
    inflater = zlib.decompressobj(_wbits(encoding))
    try:
        # One byte past the limit tells "exactly the limit" from "more than the limit".
        out = inflater.decompress(data, limit + 1)
    except zlib.error as e:
        raise _corrupt(encoding or b"", str(e)) from None
    if len(out) > limit:
        raise BodyTooLargeError(
            f"the message inflates to more than the proxy's limit of {limit} bytes; send less "
            f"or raise --max-body",
        )
    if not inflater.eof or inflater.unused_data:
        raise _corrupt(encoding or b"", "truncated" if not inflater.eof else "data after its end")
    return out


def inflate_prefix(encoding: bytes | None, data: bytes, limit: int) -> bytes:
    """Up to `limit` bytes of what the first bytes `data` of a compressed message inflate to, for
    reading its name before the rest arrives. Raises MalformedRequestError as `inflate` does for an
    unusable encoding or corrupt data (a prefix that merely ends early is not an error)."""
    inflater = zlib.decompressobj(_wbits(encoding))
    try:
        return inflater.decompress(data, limit)
    except zlib.error as e:
        raise _corrupt(encoding or b"", str(e)) from None


def _corrupt(encoding: bytes, why: str) -> MalformedRequestError:
    return MalformedRequestError(
        f"a {encoding.decode('latin-1')}-compressed message cannot be decompressed ({why}); "
        f"send it compressed whole with the algorithm named in grpc-encoding",
    )
