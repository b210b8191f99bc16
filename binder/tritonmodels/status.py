"""The TritonModel controller's status writes and FailedScheduling Events, off its turns.

A reconcile decides a model's status (and whether its refusal is new, for one Event per refusal)
and hands it here; the writer sends it on its own task, so a namespace whose thousands of models
are refused makes the placing loop wait for none of their writes. Each model keeps only its
latest status (a newer one replaces one not yet sent, with its Event if the newer has none);
models are written in turns by namespace (`binder.framework.queue`), so another namespace's
placement reaches its status after at most one of theirs. A write the API server refuses for the
model (deleted, or recreated under its name: 404, 409) is dropped; another failure is tried again
with backoff, its Event again only if it was not written (a refusal counts once).

Owns no decision; writes only through `binder.api.kube`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from binder.api.kube import Kube
from binder.framework.queue import SchedulingQueue
from common.kubeapi.errors import ApiError, ConflictError, NotFoundError
from common.kubeapi.session import JsonObject

log = logging.getLogger(__name__)

FAILED_SCHEDULING = "FailedScheduling"


@dataclass
class Write:
    """What to write for one model: its status (None: unchanged) and a refusal's Event ("")."""

    involved: JsonObject
    """The model as an Event's involvedObject (apiVersion, kind, namespace, name, uid)."""
    status: JsonObject | None
    refusal: str


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

    def __len__(self) -> int:
        return len(self._pending)

    def put(self, write: Write) -> None:
        """Send `write` for its model, replacing one not sent yet (keeping its Event when
        `write` has none)."""
        uid = str(write.involved["uid"])
        old = self._pending.get(uid)
        if old is not None:
            write.status = write.status if write.status is not None else old.status
            write.refusal = write.refusal or old.refusal
        self._pending[uid] = write
        self._queue.add(uid, str(write.involved["namespace"]))

    def forget(self, uid: str) -> None:
        """The model is gone: nothing of it is written."""
        self._pending.pop(uid, None)
        self._queue.remove(uid)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            uid = await self._queue.pop()
            write = self._pending.pop(uid, None)
            if write is None or not self._leading.is_set():
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
        if write.status is not None:
            status = write.status
            await loop.run_in_executor(
                self._executor,
                lambda: self._kube.patch_model_status(namespace, name, uid, status),
            )
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
