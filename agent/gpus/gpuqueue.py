"""Turns at each GPU's load slot: who uses the GPU next, for how long at most, and who waits.

Everything that changes what a GPU holds (loads, unloads, wakes, evictions) takes the GPU's one
slot, so that the GPU's memory change over the turn is the turn's own (`agent.gpus.memory` bills
it). One overlap is allowed: a load or wake may be granted beside an unload or eviction holding the
slot (one per such turn, and only when no turn waits before it), so that a wake does not wait
for an unrelated model's unload (1-2 s in Triton); Triton runs a load and an unload of two
models at once, and `agent.models.nodemodels` measures the pair as one window and sends a load that
does not fit without the unloading model's memory back to wait for it. Two loads measured by
their GPU's used memory never overlap; the turns of models measured **apart** (a model whose
backend runs in processes of its own, billed its own processes' memory as NVML lists it per
process: its loads, wakes, unloads and evictions) need no window of the GPU's: up to `parallel`
of them share the slot, beside each other but never beside any other turn, so that a burst of
wakes does not wait for a scale-down's unloads one by one. Turns of different GPUs never wait
for each other.
This module decides the order and each turn's time budget. The slot goes round the namespaces
waiting: the next turn is the oldest of the namespace served least recently (one that has not
been served while it waited goes first), so a namespace with many loads queued delays another's
one by at most one turn, however many pods it has. Within a namespace, turns keep the order
asked. A turn's budget (`Budget`; `load_budget` grows with the model's size) runs from its grant.
It is pure: time is passed in, nothing waits here; `agent.models.nodemodels` turns its decisions
into waits, timeouts and I/O.
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

    @property
    def adds(self) -> bool:
        return self in (Work.LOAD, Work.WAKE)


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
    alone: bool = False
    """Never granted beside another turn (a load that did not fit beside an unload)."""
    apart: bool = False
    """A load, wake, unload or eviction of a model measured by its own processes: granted
    beside other such turns."""


Budget = Callable[[Turn], float | None]
"""The most seconds a turn may hold its GPU once granted (None: no bound)."""


def unbounded(turn: Turn) -> float | None:
    return None


GIB = 1024**3


def load_budget(base: float, per_gib: float, cap: float) -> Budget:
    """Loads and wakes may take `base` seconds plus `per_gib` seconds per GiB of the model's
    files, at most `cap` seconds; unloads and evictions have their own bound (none here)."""

    def budget(turn: Turn) -> float | None:
        if not turn.work.adds:
            return None
        return min(base + per_gib * turn.size / GIB, cap)

    return budget


@dataclass
class _Slot:
    holder: Turn | None = None
    granted_at: float = 0.0
    beside: Turn | None = None
    """A load or wake granted beside the unload or eviction holding the slot."""
    beside_at: float = 0.0
    beside_given: bool = False
    """The holder's turn has had its one turn beside it."""
    shared: dict[Turn, float] = field(default_factory=dict)
    """The turns measured apart granted now (no holder meanwhile), with when each was."""
    waiting: deque[Turn] = field(default_factory=deque)
    """In the order asked."""
    served: dict[str, int] = field(default_factory=dict)
    """Namespace -> the number of the grant it was last served by, for namespaces holding or
    waiting (forgotten when it has neither: a namespace coming back starts afresh)."""
    grants: int = 0


class GpuQueue:
    """The slots of every GPU of the node and the turns waiting for them."""

    def __init__(self, budget: Budget = unbounded, *, parallel: int = 1) -> None:
        if parallel < 1:
            raise ValueError(f"parallel loads per GPU must be at least 1, not {parallel}")
        self._budget = budget
        self.parallel = parallel
        """The most turns measured apart granted at once on one GPU."""
        self._slots: dict[str, _Slot] = {}
        self._numbers = itertools.count(1)

    def ask(
        self,
        gpu: str,
        work: Work,
        name: str,
        namespace: str,
        now: float,
        size: int = 0,
        *,
        alone: bool = False,
        apart: bool = False,
    ) -> Turn:
        """A new turn on `gpu`; granted at once when the slot is free (see `holder`), beside
        the unload holding it (see `beside`) unless `alone`, or, `apart` (of a model measured by
        its own processes), beside the others granted so (see `shared`)."""
        apart = apart and not alone
        turn = Turn(next(self._numbers), gpu, work, name, namespace, now, size, alone, apart)
        slot = self._slots.setdefault(gpu, _Slot())
        if not slot.waiting and self._may_share(slot, turn):
            self._grant_shared(slot, turn, now)
        elif slot.holder is None and not slot.shared:
            self._grant(slot, turn, now)
        elif not slot.waiting and self._may_go_beside(slot, turn):
            self._grant_beside(slot, turn, now)
        else:
            slot.waiting.append(turn)
        return turn

    def holder(self, gpu: str) -> Turn | None:
        slot = self._slots.get(gpu)
        return slot.holder if slot else None

    def beside(self, gpu: str) -> Turn | None:
        """The load or wake granted beside the unload holding `gpu`'s slot, if any; it becomes
        the holder when that unload ends first."""
        slot = self._slots.get(gpu)
        return slot.beside if slot else None

    def shared(self, gpu: str) -> list[Turn]:
        """The turns measured apart granted on `gpu` now, in the order granted."""
        slot = self._slots.get(gpu)
        return list(slot.shared) if slot else []

    def granted(self, turn: Turn) -> bool:
        slot = self._slots.get(turn.gpu)
        return slot is not None and (turn in (slot.holder, slot.beside) or turn in slot.shared)

    def waiting(self, gpu: str) -> list[Turn]:
        slot = self._slots.get(gpu)
        return list(slot.waiting) if slot else []

    def done(self, turn: Turn, now: float) -> Turn | None:
        """End `turn`, granted or still waiting (its caller gave up); returns the turn granted
        the slot in its place, if any (a turn granted beside it then is `beside`'s; the turn
        beside an ending holder takes its place, granted already, and is not returned). See
        `done_all` for every turn granted."""
        following = self.done_all(turn, now)
        return following[0] if following else None

    def done_all(self, turn: Turn, now: float) -> list[Turn]:
        """`done`, returning every turn granted in its place (a holder and the turn beside it,
        or turns measured apart)."""
        slot = self._slots.get(turn.gpu)
        if slot is None:
            return []
        following: list[Turn] = []
        if turn in slot.shared:
            del slot.shared[turn]
            if not slot.shared:
                following = self._grant_next(slot, now)
            else:
                following = self._share_next(slot, now)
        elif slot.beside == turn:
            slot.beside = None
        elif slot.holder != turn:
            if turn in slot.waiting:
                slot.waiting.remove(turn)
                # The head of the line may have been it: who follows may go now.
                if slot.holder is None:
                    following = self._grant_next(slot, now) if not slot.shared else []
                    following = following or self._share_next(slot, now)
        elif slot.beside is not None:
            slot.holder, slot.granted_at = slot.beside, slot.beside_at
            slot.beside = None
        else:
            slot.holder = None
            following = self._grant_next(slot, now)
        waiting = {t.namespace for t in slot.waiting}
        held = {t.namespace for t in (slot.holder, slot.beside, *slot.shared) if t is not None}
        for namespace in set(slot.served) - waiting - held:
            del slot.served[namespace]
        if slot.holder is None and not slot.shared and not slot.waiting:
            del self._slots[turn.gpu]  # GPUs come and go: an idle slot costs nothing
        return following

    def _grant_next(self, slot: _Slot, now: float) -> list[Turn]:
        """The free slot to the next turn in line: turns measured apart, as many as may share
        it, or one holder (and a turn beside it, if one may go)."""
        following = self._next(slot, lambda t: True)
        if following is None:
            return []
        if following.apart:
            self._grant_shared(slot, following, now)
            return [following, *self._share_next(slot, now)]
        self._grant(slot, following, now)
        beside = self._next(slot, lambda t: self._may_go_beside(slot, t))
        if beside is not None:
            self._grant_beside(slot, beside, now)
            return [following, beside]
        return [following]

    def _share_next(self, slot: _Slot, now: float) -> list[Turn]:
        """Turns measured apart next in line, granted beside those sharing the slot while
        there is room; stops at the first turn in line that may not share it."""
        granted = []
        while slot.shared or slot.holder is None:
            turn = self._next(slot, lambda t: self._may_share(slot, t))
            if turn is None:
                break
            self._grant_shared(slot, turn, now)
            granted.append(turn)
        return granted

    def deadline(self, gpu: str) -> float | None:
        """When the turn holding `gpu`'s slot has used its budget (None: no turn, or unbounded)."""
        slot = self._slots.get(gpu)
        return None if slot is None or slot.holder is None else self.deadline_of(slot.holder)

    def deadline_of(self, turn: Turn) -> float | None:
        """When granted `turn` has used its budget (None: not granted, or unbounded)."""
        slot = self._slots.get(turn.gpu)
        if slot is None or not self.granted(turn):
            return None
        budget = self._budget(turn)
        if turn in slot.shared:
            granted_at = slot.shared[turn]
        else:
            granted_at = slot.granted_at if turn == slot.holder else slot.beside_at
        return None if budget is None else granted_at + budget

    def overdue(self, now: float) -> list[Turn]:
        """The granted turns past their budget at `now`."""
        late = []
        for slot in self._slots.values():
            for turn in (slot.holder, slot.beside, *slot.shared):
                deadline = None if turn is None else self.deadline_of(turn)
                if turn is not None and deadline is not None and now >= deadline:
                    late.append(turn)
        return late

    def _may_share(self, slot: _Slot, turn: Turn) -> bool:
        return (
            turn.apart
            and slot.holder is None
            and slot.beside is None
            and len(slot.shared) < self.parallel
        )

    @staticmethod
    def _may_go_beside(slot: _Slot, turn: Turn) -> bool:
        holder = slot.holder
        return (
            turn.work.adds
            and not turn.alone
            and not turn.apart
            and holder is not None
            and not holder.work.adds
            and slot.beside is None
            and not slot.beside_given
        )

    @staticmethod
    def _grant(slot: _Slot, turn: Turn, now: float) -> None:
        slot.grants += 1
        slot.holder, slot.granted_at = turn, now
        slot.served[turn.namespace] = slot.grants
        slot.beside_given = False

    @staticmethod
    def _grant_shared(slot: _Slot, turn: Turn, now: float) -> None:
        slot.grants += 1
        slot.shared[turn] = now
        slot.served[turn.namespace] = slot.grants

    @staticmethod
    def _grant_beside(slot: _Slot, turn: Turn, now: float) -> None:
        slot.grants += 1
        slot.beside, slot.beside_at, slot.beside_given = turn, now, True
        slot.served[turn.namespace] = slot.grants

    @staticmethod
    def _next(slot: _Slot, eligible: Callable[[Turn], bool]) -> Turn | None:
        """The oldest turn of the namespace served least recently (never: first), if
        `eligible`; ties, between namespaces never served, go to the one that has waited
        longest."""
        oldest: dict[str, Turn] = {}
        for turn in slot.waiting:
            oldest.setdefault(turn.namespace, turn)
        if not oldest:
            return None
        chosen = min(oldest.values(), key=lambda t: (slot.served.get(t.namespace, 0), t.number))
        if not eligible(chosen):
            return None
        slot.waiting.remove(chosen)
        return chosen
