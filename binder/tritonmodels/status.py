"""A TritonModel's status: its conditions, declared once (`CONDITIONS`), and the one writer of
its status (`StatusWriter`) with the FailedScheduling Events, off the controller's turns.

The conditions and who decides each: `Placed`, `Ready`, `Progressing` and `Loaded` the model's
turn (`binder.tritonmodels.reporting`), `Autoscaling` the built-in autoscaler
(`binder.autoscaler.loop`), which hands its verdict here. `Ready` also reads False while
`Loaded` does (files that failed to load before any replica of them was ready), and Unknown while
no replica of the current files has been ready yet: at zero replicas, Ready=True means a request
is answered (a replica of these files has loaded), never just "0 of 0".

One writer, so no write loses another's condition: every write carries the latest each owner
said (`ConditionSet.compose`), built over what this writer last wrote (fresher than the cache),
and a write goes out on one task, in order. A reconcile hands its status here and the writer
sends it on its own task, so a namespace whose thousands of models are refused makes the placing
loop wait for none of their writes. Each model keeps only its latest status (a newer one replaces
one not yet sent, with its Event if the newer has none); models are written in turns by namespace
(`binder.framework.queue`), so another namespace's placement reaches its status after at most one
of theirs. A write the API server refuses for the model (deleted, or recreated under its name:
404, 409) is dropped; another failure is tried again with backoff, its Event again only if it was
not written (a refusal counts once).

Owns no decision; writes only through `binder.api.kube`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from binder.api.kube import Kube
from binder.framework.queue import SchedulingQueue
from common.conditions import Condition, ConditionSet, find
from common.kubeapi.errors import ApiError, ConflictError, NotFoundError
from common.kubeapi.session import JsonObject

log = logging.getLogger(__name__)

FAILED_SCHEDULING = "FailedScheduling"

PLACED = "Placed"
"""Every wanted replica is placed."""
READY = "Ready"
"""Every wanted replica is loaded and served by its host, and the current files have loaded."""
PROGRESSING = "Progressing"
"""Where the roll to a new spec.storageUri stands."""
LOADED = "Loaded"
"""A replica of the current files (spec.storageUri) has been ready: True from then on (at zero
replicas too); False with the load's failure (FetchFailed, ModelInvalid, ...) while none has
been; Unknown before either."""
AUTOSCALING = "Autoscaling"
"""Who scales the model (the built-in autoscaler's verdict)."""
TURN = "turn"
"""The owner of a model's placement conditions: its turn in the controller."""
AUTOSCALER = "autoscaler"
CONDITIONS = ConditionSet(
    happy=READY,
    dependents=(LOADED,),
    owners={
        PLACED: TURN,
        READY: TURN,
        PROGRESSING: TURN,
        LOADED: TURN,
        AUTOSCALING: AUTOSCALER,
    },
)
"""A TritonModel's conditions, their owners, and Ready's dependents."""
REWRITE_SECONDS = 5.0
"""A verdict written that the cache does not show after this long is written again."""

Verdict = tuple[str, str, str]
"""(status, reason, message) of a condition, as its owner decides it."""


@dataclass
class Write:
    """What to write for one model: its status fields other than the conditions (None: none
    changed), the conditions its turn says, and a refusal's Event ("")."""

    involved: JsonObject
    """The model as an Event's involvedObject (apiVersion, kind, namespace, name, uid)."""
    status: JsonObject | None
    refusal: str
    said: dict[str, Condition | None] = field(default_factory=dict)
    """Conditions by type, as their owner says them now (None: removed)."""
    current: list[Any] = field(default_factory=list)
    """The model's conditions as the cache has them (for their lastTransitionTime)."""


class StatusWriter:
    """Writes the models' statuses and refusal Events on its own task, in turns by namespace."""

    def __init__(
        self,
        kube: Kube,
        executor: Executor,
        identity: str,
        *,
        leading: asyncio.Event,
        on_failed: Callable[[str, bool], None],
    ) -> None:
        """`on_failed(uid, event_owed)`: a write failed for a reason other than the model's own
        (the controller reconciles it again); `event_owed`: its refusal's Event was not
        written."""
        self._kube = kube
        self._executor = executor
        self._identity = identity
        self._leading = leading
        self._on_failed = on_failed
        self._pending: dict[str, Write] = {}
        self._queue = SchedulingQueue()
        self._said: dict[str, dict[str, Condition | None]] = {}
        """Model uid -> each owner's latest conditions: every write carries them all."""
        self._written: dict[str, list[Any]] = {}
        """Model uid -> the conditions this writer last wrote (fresher than the cache)."""
        self._verdict_at: dict[str, float] = {}
        """Model uid -> when the autoscaler's verdict was last handed to be written."""
        self._clock = time.monotonic

    def __len__(self) -> int:
        return len(self._pending)

    def put(self, write: Write) -> None:
        """Send `write` for its model, replacing one not sent yet (keeping its Event when
        `write` has none); the conditions it says are the model's owner's latest from now."""
        uid = str(write.involved["uid"])
        if write.said:
            self._said.setdefault(uid, {}).update(write.said)
        old = self._pending.get(uid)
        if old is not None:
            write.status = write.status if write.status is not None else old.status
            write.refusal = write.refusal or old.refusal
        self._pending[uid] = write
        self._queue.add(uid, str(write.involved["namespace"]))

    def autoscaling(
        self,
        involved: JsonObject,
        current: Iterable[Any] | None,
        verdict: Verdict | None,
        generation: int,
    ) -> bool:
        """The autoscaler's verdict on a model (None: it does not scale it): written when
        neither the cache (`current`, its conditions) shows it nor it was handed here within
        REWRITE_SECONDS. Returns whether a write was queued."""
        uid = str(involved["uid"])
        old = find(current, AUTOSCALING)
        shown = (old.get("status"), old.get("reason"), old.get("message")) if old else None
        if shown == verdict:
            return False
        said = self._said.get(uid, {})
        if AUTOSCALING in said:
            was = said[AUTOSCALING]
            same = (was.status, was.reason, was.message) == verdict if was else verdict is None
            if same and self._clock() - self._verdict_at.get(uid, 0.0) < REWRITE_SECONDS:
                return False  # handed, and the cache has not seen it yet
        condition = (
            None
            if verdict is None
            else Condition(AUTOSCALING, *verdict, observed_generation=generation)
        )
        self._verdict_at[uid] = self._clock()
        self.put(Write(involved, None, "", {AUTOSCALING: condition}, list(current or ())))
        return True

    def forget(self, uid: str) -> None:
        """The model is gone: nothing of it is written."""
        self._pending.pop(uid, None)
        self._said.pop(uid, None)
        self._written.pop(uid, None)
        self._verdict_at.pop(uid, None)
        self._queue.remove(uid)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            uid = await self._queue.pop()
            write = self._pending.pop(uid, None)
            if not self._leading.is_set():
                # What a follower knows of the models' conditions ages: a new lead starts
                # from the cache and its owners' new words.
                self._written.clear()
                self._said.clear()
                self._verdict_at.clear()
                continue
            if write is None:
                continue
            try:
                await self._send(write)
            except (NotFoundError, ConflictError):
                continue  # deleted or recreated: its DELETED event ends the model's work
            except ApiError as e:
                log.warning(
                    "Writing the status of TritonModel %s/%s has failed (%s): retrying.",
                    write.involved["namespace"],
                    write.involved["name"],
                    e,
                )
                self._on_failed(uid, bool(write.refusal))
            except Exception:  # one model's failure must not stop the others' writes
                log.exception(
                    "Writing the status of TritonModel %s/%s has failed: retrying.",
                    write.involved["namespace"],
                    write.involved["name"],
                )
                self._on_failed(uid, bool(write.refusal))

    async def _send(self, write: Write) -> None:
        """The status, then the Event; `write.refusal` is emptied once its Event is written."""
        loop = asyncio.get_running_loop()
        model = write.involved
        namespace, name, uid = str(model["namespace"]), str(model["name"]), str(model["uid"])
        status = dict(write.status or {})
        said = self._said.get(uid)
        conditions = None
        if said:
            old = self._written.get(uid, write.current)
            conditions = CONDITIONS.compose(old, said)
            if conditions != old:
                status["conditions"] = conditions
        if status:
            await loop.run_in_executor(
                self._executor,
                lambda: self._kube.patch_model_status(namespace, name, uid, status),
            )
            if conditions is not None:
                self._written[uid] = conditions
        if write.refusal:
            await loop.run_in_executor(
                self._executor,
                lambda: self._kube.record_object_event(
                    model,
                    reason=FAILED_SCHEDULING,
                    message=write.refusal,
                    reporting_instance=self._identity,
                ),
            )
            write.refusal = ""
