"""A TritonModel's roll to a new spec.storageUri, as the replica placer
(`binder.tritonmodels.placer`) takes it a step per turn: which files each replica was given
(a replica's files never change: new files come as a new replica), which replicas are on previous
files and leave first, and the roll's next step, as a Deployment's RollingUpdate with maxSurge 1 and
maxUnavailable 0. A surge replica takes the lowest ordinal not charged, and may preempt as any
replica (it then waits for its victims); with no room for a surge, one replica on the previous files
drains and is placed again as a missing replica; files no host fetches, or a missing PriorityClass,
stop the roll with every replica on its files. Where the roll stands is the `Progressing` condition
(`Roll`). Placing and draining are the placer's (`place_surge`, `leave`); no I/O.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import NamedTuple

from binder.cluster.ledger import Ledger
from binder.cluster.modelviews import ModelInfo
from binder.cluster.objects import PodInfo
from binder.cluster.priorities import CLASS_NOT_FOUND
from binder.tritonmodels.replicabook import ReplicaView
from binder.tritonmodels.status import PLACED
from common.hosted import NOT_LOADED_REASON, replica_uid

UNSUPPORTED_STORAGE = "UnsupportedStorage"
"""The Placed condition's reason for a model whose files no model host can fetch (and the
Progressing condition's, for a roll to them)."""
ROLL_COMPLETE = "NewFilesServed"
ROLL_UPDATING = "ReplicaUpdating"
ROLL_STALLED = "NewFilesNotServed"
"""Progressing False: a replica on the new files is not served; the old ones go on serving."""
NO_ROOM = "NoRoomToRoll"
"""Progressing False: neither a surge replica nor a replacement fits; nothing leaves."""
ROLLING_WITHOUT_SURGE = "RollingWithoutSurge"
"""No room for a surge replica: one replica at a time drains and is placed again on the new
files (also the Event's reason)."""
LOADING_REASONS = frozenset({"ModelPending", "ModelMissing", NOT_LOADED_REASON, "ModelDrained"})
"""The agent's loaded-condition reasons of a replica on its way (not yet installed or loaded, or
the drained one's before it on the host, not yet rewritten); any other stalls a roll."""


class Roll(NamedTuple):
    """Where a model's roll to its spec.storageUri stands: the Progressing condition."""

    status: str
    reason: str
    message: str
    updated: int
    """Replicas on spec.storageUri (`updatedReplicas`)."""
    fallback: str = ""
    """Why the roll goes on without a surge replica, when it just did (a Warning Event)."""
    retry: bool = False
    """The roll waits on what no event announces (room to be made or freed): the controller
    tries the model again every second."""


class Loaded(NamedTuple):
    """A replica's state on its host, from the agent's loaded condition there."""

    ready: bool
    why: str
    """Why it is not served ("" when it is)."""
    reason: str = ""
    """The agent's reason, when it reports the replica not loaded."""


class Rollout:
    """The placer's roll bookkeeping and steps, changed on the loop only."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        loaded: Callable[[ModelInfo, PodInfo], Loaded],
        leave: Callable[[ModelInfo, PodInfo], None],
        holds: Callable[[str], bool],
        book: ReplicaView,
    ) -> None:
        """`loaded(model, replica)`: whether the replica's host serves it through its Service
        (loaded there, the host Ready);
        `leave(model,
        replica)`: it drains or is freed; `holds(rid)`: its preemption holds a room for it;
        `book`: the replicas draining (the placer's)."""
        self._ledger = ledger
        self._loaded = loaded
        self._leave = leave
        self._holds = holds
        self._book = book
        self.files: dict[str, str] = {}
        """Replica uid -> the storage URI it was given (`uri`)."""
        self._without_surge: dict[str, str] = {}
        """Model uid -> why its roll goes on without a surge replica, until every replica is
        on the new files and served."""

    def forget(self, model_uid: str) -> None:
        """The model is gone."""
        for rid in [r for r in self.files if r.rpartition("/")[0] == model_uid]:
            del self.files[rid]
        self._without_surge.pop(model_uid, None)

    def surge_uid(self, model: ModelInfo) -> str:
        """The uid a roll's surge replica takes: the lowest ordinal not charged."""
        state = self._ledger.state
        return next(
            rid
            for o in itertools.count()
            if state.charged_pod(rid := replica_uid(model.uid, o)) is None
        )

    def uri(self, model: ModelInfo, ordinal: int) -> str:
        """The files replica `ordinal` was given: spec.storageUri when it was placed."""
        rid = replica_uid(model.uid, ordinal)
        return self.files.get(rid) or model.placed_uris.get(ordinal) or model.storage_uri

    def old(self, model: ModelInfo, placed: dict[int, PodInfo]) -> list[int]:
        """The ordinals of `placed` on files other than spec.storageUri, in the order they
        leave: those not served first (a surge on files since replaced), then the highest."""
        old = [o for o in placed if self.uri(model, o) != model.storage_uri]
        return sorted(old, key=lambda o: (self._loaded(model, placed[o]).ready, -o))

    def step(
        self,
        model: ModelInfo,
        placed: dict[int, PodInfo],
        old: list[int],
        *,
        place_surge: Callable[[int], PodInfo | str],
        no_room_once_gone: Callable[[int, PodInfo], str],
    ) -> Roll:
        """One step of the roll to spec.storageUri, as a Deployment's RollingUpdate with
        maxSurge 1 and maxUnavailable 0: once every replica on the new files is served, one on
        the previous files drains if a surge replica stands in for it, else a surge replica is
        placed on the new files (on another node: a host holds one replica of a model). With
        no room for a surge, one on the previous files drains, and is placed again as a
        missing replica once gone, unless that leaves fewer ready than spec.minAvailable.
        `place_surge(ordinal)`: the surge replica placed, or why not; `no_room_once_gone(ordinal,
        leaving)`: why replica `ordinal` would fit nowhere on the new files once `leaving` is gone
        ("" when it would fit)."""
        unfetchable = model.storage_problem
        if old and unfetchable:
            message = f"{unfetchable}; the replicas stay on their files"
            return Roll("False", UNSUPPORTED_STORAGE, message, len(placed) - len(old))
        if old and model.priority_problem:
            message = f"{model.priority_problem}; the replicas stay on their files"
            return Roll("False", CLASS_NOT_FOUND, message, len(placed) - len(old))
        if not old or self._waits_for_new(model, placed, old):
            return self.where(model, placed, old, "")
        if len(placed) > model.replicas:
            # The surge serves: a replica on the previous files leaves.
            self._leave(model, placed.pop(old.pop(0)))
            return self.where(model, placed, old, "")
        if self._book.drains_of(model.uid):
            return self.where(model, placed, old, "")  # its node is free once it has left
        surge = self.surge_uid(model)
        ordinal = int(surge.rpartition("/")[2])
        outcome = place_surge(ordinal)
        if isinstance(outcome, PodInfo):
            placed[ordinal] = outcome
            return self.where(model, placed, old, "")
        if self._holds(surge):
            # Its preemption made room: the surge waits for its victims to leave.
            message = (
                f"{len(placed) - len(old)} of {model.replicas} replicas updated; surge replica "
                f"{ordinal} waits for the lower-priority pods and replicas it preempts to leave"
            )
            return Roll("True", ROLL_UPDATING, message, len(placed) - len(old), retry=True)
        # No room for a surge: one replica on the previous files leaves (it drains), and is
        # placed again on the new files once gone, as a new replica; unless even its own room
        # would not take it (a larger gpuMemory, other node rules): then nothing leaves.
        no_room = no_room_once_gone(old[0], placed[old[0]])
        if no_room:
            message = (
                f"no room for a surge replica on the new files ({outcome}), nor for replica "
                f"{old[0]} on them once gone ({no_room}): the replicas stay on their files; "
                f"add room, or raise the quota"
            )
            return Roll("False", NO_ROOM, message, len(placed) - len(old), retry=True)
        ready = sum(self._loaded(model, replica).ready for replica in placed.values())
        if self._loaded(model, placed[old[0]]).ready and ready - 1 < model.min_available:
            message = (
                f"no room for a surge replica on the new files ({outcome}), and replica "
                f"{old[0]} draining would leave {ready - 1} ready, fewer than spec.minAvailable "
                f"{model.min_available}: the replicas stay on their files; add room, or lower "
                f"spec.minAvailable"
            )
            return Roll("False", NO_ROOM, message, len(placed) - len(old), retry=True)
        leaving = placed.pop(old.pop(0))
        self._leave(model, leaving)
        fallback = (
            f"no room for a surge replica on the new files ({outcome}): replica "
            f"{leaving.name.rpartition('/')[2]} on node {leaving.node_name} drains and is placed "
            f"again on the new files, serving nothing meanwhile"
        )
        self._without_surge[model.uid] = fallback
        return self.where(model, placed, old, fallback)

    def _waits_for_new(self, model: ModelInfo, placed: dict[int, PodInfo], old: list[int]) -> bool:
        """Whether a replica on the new files is not served yet (the roll waits for it)."""
        return any(
            not self._loaded(model, replica).ready
            for ordinal, replica in placed.items()
            if ordinal not in old
        )

    def where(
        self, model: ModelInfo, placed: dict[int, PodInfo], old: list[int], fallback: str
    ) -> Roll:
        """Where the roll to spec.storageUri stands (the Progressing condition)."""
        updated = len(placed) - len(old)
        without_surge = self._without_surge.get(model.uid, "")
        if not old and not without_surge:
            message = f"{updated} of {model.replicas} replicas run the current files"
            return Roll("True", ROLL_COMPLETE, message, updated)
        progress = f"{updated} of {model.replicas} replicas updated"
        note = ""
        for ordinal, replica in sorted(placed.items()):
            if ordinal in old:
                continue
            loaded = self._loaded(model, replica)
            if loaded.ready:
                continue
            where = f"replica {ordinal} on node {replica.node_name}"
            if loaded.reason and loaded.reason not in LOADING_REASONS:
                served = (
                    f"the {len(old)} replicas on the previous files stay served"
                    if old
                    else "nothing else is replaced meanwhile"
                )
                message = (
                    f"{progress}; {where} does not serve the new files ({loaded.why}): the "
                    f"roll waits, and {served}"
                )
                return Roll("False", ROLL_STALLED, message, updated)
            note = note or f"; {where}: {loaded.why}"
        if not old and not note and len(placed) >= model.replicas:
            del self._without_surge[model.uid]  # the roll without a surge is done
            message = f"{updated} of {model.replicas} replicas run the current files"
            return Roll("True", ROLL_COMPLETE, message, updated)
        if without_surge:
            return Roll("True", ROLLING_WITHOUT_SURGE, without_surge, updated, fallback)
        if not note and len(placed) < model.replicas:
            note = f"; waiting for every wanted replica to be placed (see {PLACED})"
        return Roll("True", ROLL_UPDATING, progress + note, updated)
