"""The one writer of an InferenceService's status (`StatusWriter`): what
binder.inferenceservices.modelstatus derives from its TritonModel, or a refusal, written as a
merge patch of the status subresource when it differs from what the cache shows, with the
conditions composed through their declared set (their lastTransitionTime moves only with their
status), and a refusal's Warning Event once per reason and message. Writes only through
`binder.api.kube`, on the binder's worker threads.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor
from typing import Any

from binder.api.kube import Kube
from binder.inferenceservices.modelstatus import (
    CONDITIONS,
    Refusal,
    reading_of,
    status_of,
    with_storage_key,
)
from binder.inferenceservices.predictor import InvalidSpecError, parse
from binder.inferenceservices.tritonmodel import API_VERSION, KIND
from common.conditions import now_rfc3339
from common.kubeapi.errors import ConflictError, NotFoundError
from common.kubeapi.session import JsonObject

log = logging.getLogger(__name__)

Key = tuple[str, str]


def _pruned(value: Any) -> Any:
    """`value` without the None entries of its objects (a merge patch's deletions)."""
    if isinstance(value, dict):
        return {k: _pruned(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_pruned(v) for v in value]
    return value


def _storage_key(obj: JsonObject) -> str | None:
    """The storage key the InferenceService's files come from (None: none, or no valid spec)."""
    try:
        return parse(obj).storage.key
    except InvalidSpecError:
        return None


class StatusWriter:
    """Writes InferenceServices' status and their refusals' Events."""

    def __init__(self, kube: Kube, executor: Executor, identity: str) -> None:
        self._kube = kube
        self._executor = executor
        self._identity = identity
        self._evented: dict[Key, tuple[str, str]] = {}
        """(namespace, name) -> the refusal whose Event was recorded last."""

    def forget(self, key: Key) -> None:
        """The InferenceService is gone."""
        self._evented.pop(key, None)

    async def _call(self, call: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def write(
        self, obj: JsonObject, model: JsonObject | None, refusal: Refusal | None
    ) -> None:
        """The status `model`'s (None: not created) or `refusal` says, over `obj`'s."""
        meta = obj["metadata"]
        namespace, name = str(meta["namespace"]), str(meta["name"])
        old = obj.get("status") or {}
        reading = with_storage_key(reading_of(model, refusal), _storage_key(obj))
        fields, said = status_of(
            namespace, int(meta.get("generation") or 1), reading, old, now_rfc3339()
        )
        status = {**fields, "conditions": CONDITIONS.compose(old.get("conditions"), said)}
        if _pruned(status) != _pruned({k: old.get(k) for k in status}):
            uid = str(meta["uid"])
            try:
                await self._call(
                    lambda: self._kube.patch_inferenceservice_status(namespace, name, uid, status)
                )
            except (NotFoundError, ConflictError):
                return  # deleted or recreated: its watch event says what to do
        said_refusal = (refusal.reason, refusal.message) if refusal is not None else None
        if said_refusal is None:
            self._evented.pop((namespace, name), None)
        elif self._evented.get((namespace, name)) != said_refusal:
            assert refusal is not None
            involved = {
                "apiVersion": str(obj.get("apiVersion") or API_VERSION),
                "kind": KIND,
                "namespace": namespace,
                "name": name,
                "uid": str(meta["uid"]),
            }
            await self._call(
                lambda: self._kube.record_object_event(
                    involved,
                    reason=refusal.reason,
                    message=refusal.message,
                    reporting_instance=self._identity,
                    action="Serving",
                )
            )
            self._evented[(namespace, name)] = said_refusal
            log.info("InferenceService %s/%s is refused (%s): %s", namespace, name, *said_refusal)
