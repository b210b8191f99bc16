"""Turns at each GPU's load slot: who uses the GPU next, for how long at most, and who waits.

Everything that changes what a GPU holds (loads, unloads, wakes, evictions) takes the GPU's one
slot, so that the GPU's memory change over the turn is the turn's own (`agent.memory` bills it).
This module decides the order and each turn's time budget. The slot goes round the namespaces
waiting: the next turn is the oldest of the namespace served least recently (one that has not
been served while it waited goes first), so a namespace with many loads queued delays another's
one by at most one turn, however many pods it has. Within a namespace, turns keep the order
asked. A turn's budget (`Budget`; `load_budget` grows with the model's size) runs from its grant.
It is pure: time is passed in, nothing waits here; `agent.models` turns its decisions into waits,
timeouts and I/O.
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
    size: int = 0
    """Bytes of the model's files (what a load reads), 0 when unknown or not a load."""


Budget = Callable[[Turn], float | None]
"""The most seconds a turn may hold its GPU once granted (None: no bound)."""


def unbounded(turn: Turn) -> float | None:
    return None


GIB = 1024**3


def load_budget(base: float, per_gib: float, cap: float) -> Budget:
    """Loads and wakes may take `base` seconds plus `per_gib` seconds per GiB of the model's
    files, at most `cap` seconds; unloads and evictions have their own bound (none here)."""

    def budget(turn: Turn) -> float | None:
        if turn.work not in (Work.LOAD, Work.WAKE):
            return None
        return min(base + per_gib * turn.size / GIB, cap)

    return budget


@dataclass
class _Slot:
    holder: Turn | None = None
    granted_at: float = 0.0
    waiting: deque[Turn] = field(default_factory=deque)
    """In the order asked."""
    served: dict[str, int] = field(default_factory=dict)
    """Namespace -> the number of the grant it was last served by, for namespaces holding or
    waiting (forgotten when it has neither: a namespace coming back starts afresh)."""
    grants: int = 0


class GpuQueue:
    """The slots of every GPU of the node and the turns waiting for them."""

    def __init__(self, budget: Budget = unbounded) -> None:
        self._budget = budget
        self._slots: dict[str, _Slot] = {}
        self._numbers = itertools.count(1)

    def ask(
        self, gpu: str, work: Work, name: str, namespace: str, now: float, size: int = 0
    ) -> Turn:
        """A new turn on `gpu`; granted at once when the slot is free (see `holder`)."""
        turn = Turn(next(self._numbers), gpu, work, name, namespace, now, size)
        slot = self._slots.setdefault(gpu, _Slot())
        if slot.holder is None:
            self._grant(slot, turn, now)
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
        following = self._next(slot)
        slot.holder = None
        if following is not None:
            self._grant(slot, following, now)
        waiting = {t.namespace for t in slot.waiting}
        held: set[str] = {slot.holder.namespace} if slot.holder else set()
        for namespace in set(slot.served) - waiting - held:
            del slot.served[namespace]
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
    def _grant(slot: _Slot, turn: Turn, now: float) -> None:
        slot.grants += 1
        slot.holder, slot.granted_at = turn, now
        slot.served[turn.namespace] = slot.grants

    @staticmethod
    def _next(slot: _Slot) -> Turn | None:
        """The oldest turn of the namespace served least recently (never: first); ties, between
        namespaces never served, go to the one that has waited longest."""
        oldest: dict[str, Turn] = {}
        for turn in slot.waiting:
            oldest.setdefault(turn.namespace, turn)
        if not oldest:
            return None
        chosen = min(oldest.values(), key=lambda t: (slot.served.get(t.namespace, 0), t.number))
        slot.waiting.remove(chosen)
        return chosen
