"""Who may call the gateway: the agent's caller table, followed as it changes.

The table (`common.callers`) maps a pod's address to its model. The book rereads the file when its
identity changes (a stat per poll: inode, size, mtime), and answers `lookup(address)` from memory
on every accepted connection. It fails closed: no table, an unreadable first table, or a table the
agent has not refreshed within `max_age` means no caller at all; an unreadable later table keeps
the last good one until that one is too old. Whenever a caller disappears or changes (the pod was
deleted, its model moved, the table went stale), `on_revoke` gets its address, so the gateway can
drop that pod's open connections at once. What it must not do: accept connections or relay bytes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from common.callers import Caller, CallerTable, CallerTableError, read_table

log = logging.getLogger(__name__)


class CallerBook:
    """The callers of the agent's latest table, by address."""

    def __init__(
        self,
        path: Path,
        *,
        max_age: float,
        on_revoke: Callable[[set[str]], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.max_age = max_age
        self.on_revoke = on_revoke
        self._clock = clock
        self._table: CallerTable | None = None
        self._callers: dict[str, Caller] = {}
        self._identity: tuple[int, int, int] | None = None
        self.problem = "the caller table has not been read yet"
        """Why no pod may call now (empty while the table is fresh)."""

    def lookup(self, address: str) -> Caller | None:
        """The caller at `address`, or None: not a proven model pod of this node, or no fresh
        table."""
        if self.problem:
            return None
        return self._callers.get(address)

    @property
    def callers(self) -> dict[str, Caller]:
        return dict(self._callers) if not self.problem else {}

    def age(self) -> float | None:
        """Seconds since the agent wrote the table in hand; None without one."""
        return None if self._table is None else self._clock() - self._table.written_at

    def check(self) -> None:
        """Reread the file if it changed, then apply the age bound."""
        try:
            stat = self.path.stat()
        except OSError as e:
            self._fail(
                f"no caller table at {self.path} ({e.strerror}); check that the node's agent "
                "runs with --gateway-table naming this file, on a volume shared with the gateway"
            )
            return
        identity = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if identity != self._identity:
            try:
                table = read_table(self.path)
            except CallerTableError as e:
                if self._table is None:
                    self._fail(str(e))
                    return
                log.error("%s: keeping the previous caller table while it is fresh.", e)
            else:
                self._identity = identity
                self._adopt(table)
        age = self.age()
        if age is not None and age > self.max_age:
            self._fail(
                f"the caller table was last written {age:.0f} s ago, more than --table-max-age "
                f"({self.max_age:g} s): the node's agent is not refreshing it"
            )
        elif self._table is not None and self.problem:
            log.info("Following the caller table: %d callers.", len(self._callers))
            self.problem = ""

    def _adopt(self, table: CallerTable) -> None:
        before = self.callers
        self._table = table
        self._callers = table.by_address()
        fresh = self._clock() - table.written_at <= self.max_age
        after = self._callers if fresh else {}
        self._revoke({a for a, c in before.items() if after.get(a) != c})

    def _fail(self, problem: str) -> None:
        if problem != self.problem:
            log.error("Refusing every pod: %s", problem)
        before = self.callers
        self.problem = problem
        self._revoke(set(before))

    def _revoke(self, addresses: set[str]) -> None:
        if addresses and self.on_revoke is not None:
            self.on_revoke(addresses)

    async def run(self, stop: asyncio.Event, poll_seconds: float) -> None:
        """Check the table every `poll_seconds` until `stop`."""
        while not stop.is_set():
            self.check()
            try:
                await asyncio.wait_for(stop.wait(), poll_seconds)
            except TimeoutError:
                continue
