"""What the agent remembers of each model on the node beyond the disk and Triton, and its lock.

Each model, by its name in Triton, has a lock that every operation on it holds (so operations on
one model run one after another while different models proceed in parallel) and a record: its
public id, its `Life` (`agent.phases`, moved here only, by `ModelRecords.step`), its GPU, its
pod and when it was last used. A lock lives only while used; a record from the first time the
agent looks at the model until its files are removed. What the moves mean is `agent.phases`'.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from agent.installs.repository import Repository
from agent.phases import Event, Life, Phase, Rules, step
from agent.pods.ownership import OwnerStore
from agent.pods.provenpods import Proven

__all__ = ["ModelRecord", "ModelRecords"]

log = logging.getLogger(__name__)


@dataclass
class ModelRecord:
    """What the agent remembers about a model beyond the disk and Triton."""

    model_id: str = ""
    """The public id, once an owner acted on the model (for status and logs)."""
    life: Life = field(default_factory=Life)
    """Its phase on the node (`agent.phases`), stepped only through `ModelRecords.step`."""
    gpu_uuid: str = ""
    gpu_index: int = -1
    pod: str = ""
    last_activity: float = 0.0
    vouched_at: float = 0.0
    """When the agent last checked that Triton runs what it installed (monotonic seconds)."""


class ModelRecords:
    """Every model's record and lock, by its name in Triton."""

    def __init__(
        self,
        repository: Repository,
        owners: OwnerStore,
        rules: Rules,
        clock: Callable[[], float],
    ) -> None:
        self.repository = repository
        self.owners = owners
        self.rules = rules
        self.clock = clock
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        """Name -> its lock and how many operations hold or await it: a lock lives only while
        used, so names of pods long gone (every rollout brings new ones) cost nothing."""
        self._records: dict[str, ModelRecord] = {}

    @contextlib.asynccontextmanager
    async def lock(self, name: str) -> AsyncIterator[None]:
        """Hold the lock of the model named `name` in Triton (operations on one model run one
        after another)."""
        lock, users = self._locks.setdefault(name, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._locks[name]

    def is_busy(self, name: str) -> bool:
        return name in self._locks

    def get(self, name: str) -> ModelRecord | None:
        """The model's record, if the agent remembers it (none is made)."""
        return self._records.get(name)

    def record(self, name: str) -> ModelRecord:
        record = self._records.get(name)
        if record is None:
            # Remembered from now on: files already on disk (an agent restart) are at rest.
            phase = Phase.INSTALLED if self.repository.model_dir(name).exists() else Phase.ABSENT
            record = self._records[name] = ModelRecord(life=Life(phase), last_activity=self.clock())
        return record

    def forget(self, name: str) -> None:
        self._records.pop(name, None)

    def step(self, name: str, record: ModelRecord, event: Event, reason: str = "") -> None:
        """Move the model's life by `event` (the only writer of `ModelRecord.life`)."""
        before = record.life.phase
        record.life = step(record.life, event, self.clock(), reason, self.rules)
        if record.life.phase is not before:
            log.debug(
                "Model %s: %s -> %s (%s).", name, before.value, record.life.phase.value, event.value
            )

    def note(self, name: str, event: Event) -> None:
        """An event the reconciler observed for a model no operation holds (Triton lost it,
        or runs it vouched for again)."""
        self.step(name, self.record(name), event)

    def known(self) -> dict[str, ModelRecord]:
        """What the agent remembers, by the model's name in Triton."""
        return dict(self._records)

    def touch(self, name: str, owner: Proven | None = None) -> ModelRecord:
        record = self.record(name)
        record.last_activity = self.clock()
        if owner is not None:
            record.model_id = owner.model_id
        return record

    def held_loaded(self, name: str) -> bool:
        record = self._records.get(name)
        return record is not None and record.life.held_loaded

    def public_id(self, name: str) -> str:
        """The public id of the model named `name` in Triton, as far as the agent knows."""
        record = self._records.get(name)
        owned = self.owners.get(name)
        return (record.model_id if record else "") or (owned.model_id if owned else "") or name
