"""The audit log: one record per API request, so tests can count writes and check RBAC.

Each record names who called (User-Agent, and the service account if the request carried a
token this server minted), the verb, API group, resource, subresource, namespace, name and the
response code, as the real API server's audit events do. The log is bounded (oldest records are
dropped) and safe to read from another thread while the server appends. No I/O.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import overload

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass(frozen=True)
class AuditRecord:
    time: float
    """Seconds since the epoch (the server's clock) when the request arrived."""
    user_agent: str
    user: str
    """`system:serviceaccount:<ns>:<sa>` for a minted bearer token, else ""."""
    verb: str
    api_group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int
    peer: str = ""
    """`host:port` of the client's end of the TCP connection that carried the request, so a
    test can count the connections a client opened."""
    annotations: tuple[tuple[str, str], ...] = ()
    """The audit annotations admission added, as (key, value) pairs: Pod Security's
    `pod-security.kubernetes.io/audit-violations` and `enforce-policy`."""

    @property
    def is_write(self) -> bool:
        return self.verb in WRITE_VERBS


class AuditLog:
    """A bounded, thread-safe sequence of `AuditRecord`s, oldest first."""

    def __init__(self, max_records: int = 200_000) -> None:
        self._records: deque[AuditRecord] = deque(maxlen=max_records)
        self._lock = threading.Lock()

    def append(self, record: AuditRecord) -> None:
        with self._lock:
            self._records.append(record)

    def snapshot(self) -> list[AuditRecord]:
        with self._lock:
            return list(self._records)

    def __iter__(self) -> Iterator[AuditRecord]:
        return iter(self.snapshot())

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)

    @overload
    def __getitem__(self, index: int) -> AuditRecord: ...

    @overload
    def __getitem__(self, index: slice) -> list[AuditRecord]: ...

    def __getitem__(self, index: int | slice) -> AuditRecord | list[AuditRecord]:
        if isinstance(index, slice):
            return self.snapshot()[index]
        with self._lock:
            return self._records[index]

    def clear(self) -> None:
        with self._lock:
            self._records.clear()

    def writes(self, user_agent: str | None = None) -> list[AuditRecord]:
        """Write requests (create/update/patch/delete), optionally from one User-Agent prefix."""
        return [
            r
            for r in self.snapshot()
            if r.is_write and (user_agent is None or r.user_agent.startswith(user_agent))
        ]
