"""Holding requests while Triton comes back from an exit, until their model is loaded again.

When Triton exits (a model crashed it, the operator restarted it), the node's agent starts it again
and loads the node's models anew; for a few seconds Triton listens without them and would answer
every request `unknown model` (404 / NOT_FOUND), and before it listens a request waits only
--connect-retry. The gateway's sentinel (`common.sentinel`, held by `gateway.witness`) sees the
exit the moment Triton's sockets close: from then, every model of the table is *restoring*
(`Limiter.restoring`), and a new request of it, REST or gRPC, waits before it takes a slot, at most
--restore-hold-seconds, counted as concurrency meanwhile. Once Triton accepts connections again,
the gateway asks it whether each model with requests waiting is READY (`GET /v2/models/NAME/ready`,
every `POLL_SECONDS`; a model with none waiting every second), and lets each model's requests go
the moment it is. --restore-hold-seconds after Triton came back every model goes on all the same (a
model the agent does not load again: its requests get Triton's own answer). A request at Triton
when it exited is not sent again: Triton may have run it. An exit during a restore starts it
again. A Triton that answers a request that it has no such model, for a model the table serves,
was started again before the sentinel's turn on the event loop (its connection is closed
already): that model is held the same way (`Restore.missing`), and the request is answered as
unanswered, so that a pod's proxy sends it again (Triton did not run it); the sentinel's turn
holds the others. With Triton the same, its answer passes on.

Bounds: the held requests are the pods' own, within their limiters' queues and the gateway's byte
budget as any waiting request; the checks are one small GET per model with requests waiting per
`POLL_SECONDS`, on one connection pool, only while Triton restores.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import Final
from urllib.parse import quote

import aiohttp

from proxy.gateway.tenants import Member, Tenant

log = logging.getLogger(__name__)

POLL_SECONDS: Final = 0.1
"""How often a model with requests waiting is asked about while Triton restores."""
IDLE_ROUNDS: Final = 10
"""A held model with no request waiting is asked about every this many rounds."""
CHECK_TIMEOUT_SECONDS: Final = 2.0
"""The most one readiness check waits for Triton's answer."""


class Restore:
    """The node's models held while Triton restores, and the checks that let them go."""

    def __init__(
        self,
        triton_http: str,
        members: Callable[[], Iterable[Member | Tenant]],
        hold_seconds: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        base = triton_http if "://" in triton_http else f"http://{triton_http}"
        self._models_url = base.rstrip("/") + "/v2/models/"
        self._members = members
        self.hold_seconds = hold_seconds
        self._clock = clock
        self._held: dict[Member | Tenant, asyncio.Event] = {}
        self._task: asyncio.Task[None] | None = None
        self._since = 0.0
        self.restores = 0
        """Exits of Triton that held the node's models, since start."""
        self.gone: Callable[[], bool] = lambda: False
        """Whether Triton's sentinel connection is closed though the sentinel has not had its
        turn yet (`common.sentinel.Sentinel.closed_now`, set by the crash witness)."""

    def lost(self) -> None:
        """Triton's sockets closed: hold every model of the table until it is READY again."""
        if self.hold_seconds <= 0:
            return
        if self._task is not None:
            self._task.cancel()  # an exit during a restore: it starts again
            self._task = None
        for member in self._members():
            self._hold(member)
        self.restores += 1
        log.warning(
            "Triton went away: holding the new requests of %d models until each is loaded "
            "again (each at most %.0f s).",
            len(self._held),
            self.hold_seconds,
        )

    def missing(self, member: Member | Tenant) -> bool:
        """Triton answered a request of `member`'s model that it has no such model, though the
        table serves it: whether that is because Triton was started again (the answer is then
        not passed on: its relay answers the request as unanswered, and Triton did not run it,
        so a pod's proxy sends it again). Either a restore is under way, or the sentinel's
        connection is closed already and its turn on the event loop has not come yet
        (`gone`): the model is then held until it is READY, as in a restore (at most
        `hold_seconds`); the sentinel's turn holds the rest a moment later. Otherwise Triton
        is the one the gateway knows and lacks the model indeed: its answer passes on."""
        if self.hold_seconds <= 0:
            return False
        limiter = member.limiter
        if limiter.restoring is not None:
            return True
        if not self.gone():
            return False
        self._hold(member)
        log.warning(
            "Triton answered that it has no model %s before the gateway saw it go: holding "
            "the model's requests until it is loaded again (at most %.0f s).",
            member.caller.model_id,
            self.hold_seconds,
        )
        self.up()
        return True

    def _hold(self, member: Member | Tenant) -> None:
        """Hold `member`'s new requests until its model is READY (at most `hold_seconds`)."""
        limiter = member.limiter
        if member not in self._held:
            self._held[member] = limiter.restoring = asyncio.Event()
        limiter.restore_seconds = self.hold_seconds
        if self._since == 0.0:
            self._since = self._clock()

    def up(self) -> None:
        """Triton accepts connections (again, or after a drop that was no exit): check the
        held models and let each go once READY."""
        if self._held and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._checks())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._release(list(self._held))

    async def _checks(self) -> None:
        since = self._since
        deadline = self._clock() + self.hold_seconds
        timeout = aiohttp.ClientTimeout(total=CHECK_TIMEOUT_SECONDS)
        rounds = 0
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                while self._held and self._clock() < deadline:
                    self._forget_gone()
                    # Models with requests waiting every round; the others every
                    # IDLE_ROUNDS, so that they need not wait for a round of their own.
                    asked = [
                        m
                        for m in self._held
                        if m.limiter.held > m.limiter.in_flight or rounds % IDLE_ROUNDS == 0
                    ]
                    ready = await asyncio.gather(*(self._ready(session, m) for m in asked))
                    self._release([m for m, r in zip(asked, ready, strict=True) if r])
                    rounds += 1
                    if self._held:
                        await asyncio.sleep(POLL_SECONDS)
        finally:
            self._task = None
        took = self._clock() - since
        if self._held:
            log.warning(
                "Triton has been back %.0f s and has not loaded %s again: their requests go on.",
                self.hold_seconds,
                ", ".join(sorted({m.caller.model_id for m in self._held})),
            )
            self._release(list(self._held))
        else:
            log.info("Triton has the node's models again, %.1f s after it went away.", took)

    async def _ready(self, session: aiohttp.ClientSession, member: Member | Tenant) -> bool:
        name = member.caller.name_in_triton
        try:
            async with session.get(f"{self._models_url}{quote(name, safe='')}/ready") as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    def _forget_gone(self) -> None:
        """A model that left the table meanwhile is no longer held here."""
        present = set(self._members())
        self._release([m for m in self._held if m not in present])

    def _release(self, members: list[Member | Tenant]) -> None:
        for member in members:
            event = self._held.pop(member, None)
            if event is not None:
                if member.limiter.restoring is event:
                    member.limiter.restoring = None
                event.set()
        if not self._held:
            self._since = 0.0
