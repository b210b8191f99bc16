"""Turns at each GPU's load slot: who uses the GPU next, for how long at most, and who waits.

Everything that changes what a GPU holds (loads, unloads, wakes, evictions) takes the GPU's one
slot, so that the GPU's memory change over the turn is the turn's own (`agent.memory` bills it).
This module decides the order: one queue per GPU, first come first served, and each turn's time
budget (none by default). It is pure: time is passed in, nothing waits here; `agent.models`
turns its decisions into waits and I/O. Turns by namespace, backoff and per-load time budgets
that grow with model size are changes to `GpuQueue._next` and `Budget`, not to the callers.
"""

from __future__ import annotations

import enum
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


class Work(enum.Enum):
    """What a turn does with the GPU."""

    LOAD = "load"
    UNLOAD = "unload"
    WAKE = "wake"
    EVICT = "evict"


@dataclass(frozen=True)
class Turn:
    """One use of a GPU's slot, asked for at `asked_at`."""

    number: int
    gpu: str
    work: Work
    name: str
    """The model's name in Triton."""
    namespace: str
    asked_at: float


Budget = Callable[[Turn], float | None]
"""The most seconds a turn may hold its GPU once granted (None: no bound)."""


def unbounded(turn: Turn) -> float | None:
    return None


@dataclass
class _Slot:
    holder: Turn | None = None
    granted_at: float = 0.0
    waiting: deque[Turn] = field(default_factory=deque)


class GpuQueue:
    """The slots of every GPU of the node and the turns waiting for them."""

    def __init__(self, budget: Budget = unbounded) -> None:
        self._budget = budget
        self._slots: dict[str, _Slot] = {}
        self._numbers = itertools.count(1)

    def ask(self, gpu: str, work: Work, name: str, namespace: str, now: float) -> Turn:
        """A new turn on `gpu`; granted at once when the slot is free (see `holder`)."""
        turn = Turn(next(self._numbers), gpu, work, name, namespace, now)
        slot = self._slots.setdefault(gpu, _Slot())
        if slot.holder is None:
            slot.holder, slot.granted_at = turn, now
        else:
            slot.waiting.append(turn)
        return turn

    def holder(self, gpu: str) -> Turn | None:
        slot = self._slots.get(gpu)
        return slot.holder if slot else None

    def waiting(self, gpu: str) -> list[Turn]:
        slot = self._slots.get(gpu)
        return list(slot.waiting) if slot else []

    def done(self, turn: Turn, now: float) -> Turn | None:
        """End `turn`, granted or still waiting (its caller gave up); returns the turn granted
        the slot in its place, if any."""
        slot = self._slots.get(turn.gpu)
        if slot is None:
            return None
        if slot.holder != turn:
            if turn in slot.waiting:
                slot.waiting.remove(turn)
            return None
        slot.holder = self._next(slot)
        slot.granted_at = now
        if slot.holder is None and not slot.waiting:
            del self._slots[turn.gpu]  # GPUs come and go: an idle slot costs nothing
        return slot.holder

    def deadline(self, gpu: str) -> float | None:
        """When the current turn on `gpu` has used its budget (None: no turn, or unbounded)."""
        slot = self._slots.get(gpu)
        if slot is None or slot.holder is None:
            return None
        budget = self._budget(slot.holder)
        return None if budget is None else slot.granted_at + budget

    def overdue(self, now: float) -> list[Turn]:
        """The turns holding a slot past their budget at `now`."""
        late = []
        for gpu, slot in self._slots.items():
            deadline = self.deadline(gpu)
            if slot.holder is not None and deadline is not None and now >= deadline:
                late.append(slot.holder)
        return late

    @staticmethod
    def _next(slot: _Slot) -> Turn | None:
        # First come, first served: the one rule turns by namespace will replace.
        return slot.waiting.popleft() if slot.waiting else None
