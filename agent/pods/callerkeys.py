"""The node's caller keys (`common.callerkeys`): the agent hands each pod its own, and writes
only their digests into the gateway's caller table.

The node's secret lives in a file beside the caller table, on the volume only the agent and the
gateway mount; it is made once and kept across agent restarts, so a pod's key (and the digest in
the table) stays the same for the pod's life on the node. A replaced node pod makes a new one:
the proxies then fetch their new keys. What it must not do: decide who is a caller (the table
lists only proven owners; a key of any other pod names no row).
"""

from __future__ import annotations

from pathlib import Path

from common.callerkeys import derive, digest, node_secret

SECRET_FILE = "caller-key-secret"  # noqa: S105 - a file name


def secret_beside(caller_table: Path) -> Path:
    """The node secret's file beside the caller table at `caller_table`."""
    return caller_table.with_name(SECRET_FILE)


class CallerKeys:
    """Each pod's caller key under the node's secret."""

    def __init__(self, secret_file: Path) -> None:
        self._secret = node_secret(secret_file)

    def key(self, pod_uid: str) -> bytes:
        """The key of the pod with `pod_uid` (a model host's own uid, not a replica's)."""
        return derive(self._secret, pod_uid)

    def digest(self, pod_uid: str) -> str:
        """What the caller table holds of the pod's key."""
        return digest(self.key(pod_uid))
