"""Who may call the gateway: the agent's caller table, followed as it changes.

The table (`common.callers`) maps a pod's address to its model. The book rereads the file when its
identity changes (a stat per poll: inode, size, mtime), and answers `lookup(address)` from memory
on every accepted connection. It fails closed: no table, an unreadable first table, or a table
already older than `max_age` when this book first reads it means no caller at all; an unreadable
later table keeps the last good one while it is fresh.

A lost agent stops rewriting the table while Triton runs. Past `max_age` the book keeps serving
the callers of the last table it saw fresh, and no one else (a table read while stale can only
take callers away), for `stale_grace` more seconds; then no caller at all until the agent writes
again. The risk it bounds is revocation: a pod deleted meanwhile keeps its access, and a pod that
gets its address reaches that pod's model only, until the grace ends. A missing file ends the
grace at once, and a restarted gateway has no last fresh table, so it fails closed.

An address has one row per model its pod serves (a model pod one, a model host one per replica:
`common.callers`). Whenever an address's pod changes or its every row goes (the pod was deleted, the
grace ended), or a model pod's row changes but for its probation (its model moved), `on_revoke`
gets the address, so the gateway can drop that pod's open connections at once; when a model host
keeps a row while others come, go or change (a replica placed on or removed from the host, one
quarantined, one moved to another replica of its model, one joining or leaving a row's spread),
`on_rows` gets the address and its rows now, and the connections stay: a host's rows are its
models', each served on its own, so one model's change touches only that model's requests. A row
whose probation or hold alone changed is neither, `on_probation` gets it. What it must not do:
accept connections or relay bytes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from common.callers import Caller, CallerTable, CallerTableError, read_table

log = logging.getLogger(__name__)

Rows = Mapping[str, Caller]
"""One address's rows by model id."""


class CallerBook:
    """The callers of the agent's latest table, by address."""

    def __init__(
        self,
        path: Path,
        *,
        max_age: float,
        stale_grace: float = 0.0,
        on_revoke: Callable[[set[str]], None] | None = None,
        on_probation: Callable[[Caller], None] | None = None,
        on_rows: Callable[[str, Rows], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self.max_age = max_age
        self.stale_grace = stale_grace
        self.on_revoke = on_revoke
        self.on_probation = on_probation
        self.on_rows = on_rows
        self._clock = clock
        self._table: CallerTable | None = None
        self._identity: tuple[int, int, int] | None = None
        self._fresh: dict[str, dict[str, Caller]] = {}
        """The callers of the last table this book saw fresh: all a stale table may serve."""
        self._fresh_table: CallerTable | None = None
        self._serving: dict[str, dict[str, Caller]] = {}
        self._stale_table: CallerTable | None = None
        """The stale table `_serving` was last narrowed by."""
        """Who may call now; empty whenever `problem` is set."""
        self._keys: dict[str, str] = {}
        """The address of each served pod by its caller key's digest."""
        self.problem = "the caller table has not been read yet"
        """Why no pod may call now (empty while the table is fresh or within its grace)."""
        self.stale = ""
        """Why the callers served are the last fresh table's (empty unless within the grace)."""

    def lookup(self, address: str) -> Rows | None:
        """The rows of the caller at `address` by model id, or None: not a proven model pod or
        host of this node, or no fresh table (nor a stale one within its grace)."""
        return self._serving.get(address)

    def by_key(self, key_digest: str) -> tuple[str, Rows] | None:
        """The address and rows of the caller whose key has `key_digest`, or None (as
        `lookup`)."""
        address = self._keys.get(key_digest)
        return None if address is None else (address, self._serving[address])

    @property
    def callers(self) -> dict[str, Rows]:
        """Every address served now, with its rows."""
        return dict(self._serving)

    def age(self) -> float | None:
        """Seconds since the agent wrote the table in hand; None without one."""
        return None if self._table is None else self._clock() - self._table.written_at

    def check(self) -> None:
        """Reread the file if it changed, then apply the age bound and the grace."""
        try:
            stat = self.path.stat()
        except OSError as e:
            # Whatever removed the file (a replaced node pod, a wiped volume) is no lost agent:
            # the last fresh table is forgotten, and only a fresh one serves again.
            self._fresh, self._fresh_table = {}, None
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
                self._table = table
        if self._table is not None:
            self._apply(self._table)

    def _apply(self, table: CallerTable) -> None:
        now = self._clock()
        if now - table.written_at <= self.max_age:
            if table is not self._fresh_table:
                self._fresh, self._fresh_table = table.by_address(), table
            if self.problem or self.stale:
                log.info("Following the caller table: %d callers.", len(self._fresh))
                self.problem = self.stale = ""
            self._serve(self._fresh)
            return
        last_fresh = None if self._fresh_table is None else self._fresh_table.written_at
        if last_fresh is not None and now - last_fresh <= self.max_age + self.stale_grace:
            serving = self._serving
            if table is not self._stale_table or not self.stale:
                # Once per table read, not per poll: a stale table stays in hand for minutes.
                current = table.by_address()
                serving = {}
                for address, rows in self._fresh.items():
                    rows_now = current.get(address, {})
                    kept = {m: c for m, c in rows.items() if rows_now.get(m) == c}
                    if kept:
                        serving[address] = kept
                self._stale_table = table
            if not self.stale:
                self.stale = (
                    f"the caller table was last written at {_when(last_fresh)}, more than "
                    f"--table-max-age ({self.max_age:g} s) ago: the node's agent is not "
                    "refreshing it; serving only the pods of the last fresh table, admitting no "
                    f"other, until {_when(last_fresh + self.max_age + self.stale_grace)} "
                    f"(--table-stale-grace {self.stale_grace:g} s)"
                )
                log.error("Serving a stale caller table: %s.", self.stale)
            self._serve(serving)
            return
        if last_fresh is not None:
            grace = f" and --table-stale-grace ({self.stale_grace:g} s)" if self.stale_grace else ""
            problem = (
                f"the caller table was last written at {_when(last_fresh)}, more than "
                f"--table-max-age ({self.max_age:g} s){grace} ago: the node's agent is not "
                "refreshing it"
            )
        else:
            problem = (
                f"the caller table was written at {_when(table.written_at)}, more than "
                f"--table-max-age ({self.max_age:g} s) ago: the node's agent is not refreshing "
                "it (a gateway that never saw it fresh serves no one from it)"
            )
        self._fail(problem)

    def _fail(self, problem: str) -> None:
        if problem != self.problem:
            log.error("Refusing every pod: %s", problem)
        self.problem = problem
        self.stale = ""
        self._serve({})

    def _serve(self, serving: dict[str, dict[str, Caller]]) -> None:
        if serving is self._serving:
            return
        before, self._serving = self._serving, serving
        self._keys = {
            key: address
            for address, rows in serving.items()
            if (key := next(iter(rows.values())).key)
        }
        revoked = set()
        for address, rows in before.items():
            now = serving.get(address)
            if now == rows:
                continue
            verdict = _compare(rows, now or {})
            if verdict is None:
                revoked.add(address)
                continue
            probation, changed = verdict
            if changed and self.on_rows is not None and now is not None:
                self.on_rows(address, now)
            if self.on_probation is not None:
                for caller in probation:
                    self.on_probation(caller)
        if revoked and self.on_revoke is not None:
            self.on_revoke(revoked)

    async def run(self, stop: asyncio.Event, poll_seconds: float) -> None:
        """Check the table every `poll_seconds` until `stop`."""
        while not stop.is_set():
            self.check()
            try:
                await asyncio.wait_for(stop.wait(), poll_seconds)
            except TimeoutError:
                continue


def _compare(before: Rows, now: Rows) -> tuple[list[Caller], bool] | None:
    """How an address's rows changed: None when the address is revoked (it has no row now,
    its pod changed, or a model pod's row changed but for its probation); else the rows whose
    probation or hold alone changed, and whether any other row came, went or changed (a row
    whose spread alone changed stays, and is changed)."""
    pod = next(iter(before.values())).pod
    if not now or any(row.pod != pod for row in now.values()):
        return None
    # A model host's rows are replicas of its namespace's models: any of them may come, go,
    # move or change while the host serves the others.
    host = all(row.replica for row in (*before.values(), *now.values()))
    probation = []
    stayed = changed = False
    for model, caller in before.items():
        row = now.get(model)
        if row is None:
            changed = True
        elif not host and row.name_in_triton != caller.name_in_triton:
            return None
        elif row == caller:
            stayed = True
        elif caller.alike(row):
            probation.append(row)
            stayed = True
        elif caller.alike(replace(row, spread=caller.spread)):
            stayed = changed = True  # the same replica, others joined or left its spread
        else:
            changed = True
    if not stayed and not host:
        return None
    if any(model not in before for model in now):
        changed = True
    return probation, changed


def _when(unix_seconds: float) -> str:
    """A moment for a log sentence: 2026-11-23T12:00:01Z."""
    moment = datetime.fromtimestamp(unix_seconds, UTC).replace(microsecond=0)
    return moment.isoformat().replace("+00:00", "Z")
