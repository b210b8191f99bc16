"""A model host's fetch slots: how many replicas are fetched and loaded at once, and who may take
a free slot, so that no model of the host holds up its others.

`parallel` slots in all (--host-parallel). A model holds one at most: its replicas on the host
take turns. Models retrying after a failure (a fetch past its deadline, a bucket over its
bounds, a load refused) hold `parallel - 1` at most, so with two slots or more one is always
left to the models that have not failed. A free slot goes to the longest waiting replica that
may take it, a model's first replica before the other replicas of models a slot already went to
(until such a model has no replica holding or waiting): in a wake of many models at once, every
model's first replica is loaded before any model's second, so each model's held requests wait
for one load of each model only. Owns these rules only: no I/O, no clock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass


@dataclass
class _Waiter:
    model: str
    retrying: bool
    granted: asyncio.Future[None]


class Slots:
    """`parallel` slots, shared as the module says."""

    def __init__(self, parallel: int) -> None:
        self.parallel = parallel
        self.retry_share = max(1, parallel - 1)
        """Slots the models retrying after a failure may hold together."""
        self._held: dict[str, bool] = {}
        """model -> whether it holds its slot for a retry."""
        self._waiting: list[_Waiter] = []
        self._begun: set[str] = set()
        """Models a slot went to that have a replica holding or waiting since: their other
        replicas wait behind other models' first ones."""

    @contextlib.asynccontextmanager
    async def hold(self, model: str, *, retrying: bool) -> AsyncIterator[None]:
        """Hold a slot for `model` (one of its replicas) while inside; `retrying`: its last
        attempt failed."""
        waiter = _Waiter(model, retrying, asyncio.get_running_loop().create_future())
        self._waiting.append(waiter)
        self._grant()
        try:
            await waiter.granted
        except asyncio.CancelledError:
            if waiter in self._waiting:
                self._waiting.remove(waiter)
                self._forget_if_idle(model)
            elif waiter.granted.done() and not waiter.granted.cancelled():
                self._release(model)  # granted as it was cancelled
            raise
        try:
            yield
        finally:
            self._release(model)

    def held(self) -> dict[str, bool]:
        """The models holding a slot now, each with whether it is retrying."""
        return dict(self._held)

    def _fits(self, waiter: _Waiter) -> bool:
        if waiter.model in self._held or len(self._held) >= self.parallel:
            return False
        return not waiter.retrying or sum(self._held.values()) < self.retry_share

    def _release(self, model: str) -> None:
        del self._held[model]
        self._forget_if_idle(model)
        self._grant()

    def _forget_if_idle(self, model: str) -> None:
        """`model` begins afresh once none of its replicas holds or waits for a slot."""
        if model not in self._held and all(w.model != model for w in self._waiting):
            self._begun.discard(model)

    def _grant(self) -> None:
        for waiter in [w for w in self._waiting if w.granted.done()]:  # cancelled while waiting
            self._waiting.remove(waiter)
            self._forget_if_idle(waiter.model)
        # First replicas first, each kind in the order asked (the sort is stable).
        for waiter in sorted(self._waiting, key=lambda w: w.model in self._begun):
            if self._fits(waiter):
                self._waiting.remove(waiter)
                self._held[waiter.model] = waiter.retrying
                self._begun.add(waiter.model)
                waiter.granted.set_result(None)
