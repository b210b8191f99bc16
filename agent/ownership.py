"""Who owns each model id on this node, kept on disk so that an agent restart keeps it.

A model id on a node belongs to one pod uid at a time: the first pod with a proven placement to
install it. The record also holds the digest of the manifest the agent installed for that owner,
which is how the agent later vouches for what Triton runs (after its own restart, or when
something loaded a model behind its back). Records live as one small JSON file per model id in
the state directory, outside Triton's repository (Triton would list a directory there as a model),
written to a temporary file and renamed, so a crash leaves the old record or the new one.

This module only stores; `agent.models` decides who may claim, under the model's lock.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from common.contract import is_valid_model_id

log = logging.getLogger(__name__)

SUFFIX = ".owner.json"


@dataclass(frozen=True)
class OwnerRecord:
    """The pod that owns a model id on this node."""

    uid: str
    pod: str
    """namespace/name, for logs and for checking whether the owner still lives."""
    digest: str = ""
    """Digest of the manifest the agent installed for this owner; empty until it installs."""

    @property
    def namespace(self) -> str:
        return self.pod.partition("/")[0]

    @property
    def name(self) -> str:
        return self.pod.partition("/")[2]

    def installed(self, digest: str) -> OwnerRecord:
        return replace(self, digest=digest)


class OwnerStore:
    """The records of one node, in memory and in `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._records: dict[str, OwnerRecord] = {}
        self.on_change: Callable[[], None] | None = None
        """Called after a record is put or dropped (the gateway's caller table follows owners)."""

    def load(self) -> None:
        """Read every record; an unreadable one is dropped with a warning (its model is then
        vouched for by no one, and removed by the reconciler)."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._records = {}
        for path in sorted(self.directory.glob(f"*{SUFFIX}")):
            model_id = path.name.removesuffix(SUFFIX)
            try:
                data = json.loads(path.read_text())
                record = OwnerRecord(str(data["uid"]), str(data["pod"]), str(data["digest"]))
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning(
                    "The owner record %s is unreadable (%s): model %s is vouched for by no pod.",
                    path,
                    e,
                    model_id,
                )
                continue
            if is_valid_model_id(model_id):
                self._records[model_id] = record

    def get(self, model_id: str) -> OwnerRecord | None:
        return self._records.get(model_id)

    def all(self) -> dict[str, OwnerRecord]:
        return dict(self._records)

    def put(self, model_id: str, record: OwnerRecord) -> None:
        path = self.directory / f"{model_id}{SUFFIX}"
        temporary = path.with_name(path.name + ".tmp")
        with temporary.open("w") as f:
            json.dump(asdict(record), f)
            f.flush()
            os.fsync(f.fileno())
        temporary.replace(path)
        self._records[model_id] = record
        self._changed()

    def drop(self, model_id: str) -> None:
        self._records.pop(model_id, None)
        with contextlib.suppress(FileNotFoundError):
            (self.directory / f"{model_id}{SUFFIX}").unlink()
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()
