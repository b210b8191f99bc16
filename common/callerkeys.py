"""Caller keys: how a model pod's proxy proves to the node gateway which pod it is.

Each pod the agent would let reach Triton has a key: HMAC-SHA256 of the pod's uid under a secret of
the node (`node_secret`, a file beside the caller table that only the agent and the gateway's
volume hold, created once and kept across agent restarts). The agent hands a pod its key through
its authenticated API (the pod's own projected token names the pod), and writes only the key's
digest into the caller table (`common.callers.Caller.key`), so the table names no key. The proxy
sends `preamble(key)` as the first bytes of every connection to the gateway; the gateway reads
those bytes once per connection (`PREAMBLE_BYTES`, never more, so the protocol's own bytes stay in
the socket) and finds the pod by the digest. The first byte is NUL, which neither an HTTP/1.1
request nor the HTTP/2 preface begins with, so a connection without a key is told apart by its
first byte. What it must not do: decide who is a caller (the agent) or read sockets (the gateway).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import Final

MAGIC: Final = b"\x00tsid01\n"
"""The preamble's first bytes: a NUL (no HTTP request starts so), a name and a version."""
KEY_BYTES: Final = 32
PREAMBLE_BYTES: Final = len(MAGIC) + KEY_BYTES
SECRET_BYTES: Final = 32


class CallerKeyError(ValueError):
    """A preamble or a node secret is malformed; the message says which and what to do."""


def preamble(key: bytes) -> bytes:
    """The bytes a proxy sends first on each connection to the gateway."""
    if len(key) != KEY_BYTES:
        raise CallerKeyError(f"a caller key has {KEY_BYTES} bytes, not {len(key)}")
    return MAGIC + key


def key_in(data: bytes) -> bytes:
    """The key of a whole preamble; raises CallerKeyError when `data` is no preamble."""
    if len(data) != PREAMBLE_BYTES or not data.startswith(MAGIC):
        raise CallerKeyError("the connection's first bytes are no caller key of this version")
    return data[len(MAGIC) :]


def digest(key: bytes) -> str:
    """What the caller table holds of a key: its SHA-256, in hex."""
    return hashlib.sha256(key).hexdigest()


def derive(secret: bytes, pod_uid: str) -> bytes:
    """The key of the pod with `pod_uid` on the node whose secret is `secret`."""
    return hmac.new(secret, b"tritonshare.io/caller-key\x00" + pod_uid.encode(), "sha256").digest()


def node_secret(path: Path) -> bytes:
    """The node's secret at `path`, created (readable by its owner only) when there is none."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        fresh = secrets.token_bytes(SECRET_BYTES)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            data = path.read_bytes()  # another agent process made it first
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(fresh)
            return fresh
    if len(data) != SECRET_BYTES:
        raise CallerKeyError(
            f"the node's caller-key secret {path} has {len(data)} bytes, not {SECRET_BYTES}: "
            "delete it and restart the agent (the pods' proxies fetch their new keys)"
        )
    return data
