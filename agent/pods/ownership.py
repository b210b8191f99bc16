"""Who owns each model in this node's Triton, kept on disk so that an agent restart keeps it.

Records are keyed by the model's name in Triton, which is also its repository directory: the
pod's private name (`common.tritonname`), or, for a model installed before private names, its
public model id. A name belongs to one pod uid at a time. The record carries the public model id
beside it, and the digest of the manifest the agent installed for that owner, which is how the
agent later vouches for what Triton runs (after its own restart, or when something loaded a
model behind its back). Records live as one small JSON file per name in the state directory,
outside Triton's repository (Triton would list a directory there as a model), written to a
temporary file and renamed, so a crash leaves the old record or the new one. A record written
before private names has no `modelId`: its name is its model id, and it is read as such (a
"legacy" record, served under its public name until its pod is replaced).

This module only stores; `agent.models.nodemodels` decides who may claim, under the model's lock.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from common.contract import is_valid_model_id

log = logging.getLogger(__name__)

SUFFIX = ".owner.json"


@dataclass(frozen=True)
class OwnerRecord:
    """The pod that owns a model in this node's Triton."""

    uid: str
    pod: str
    """namespace/name, for logs and for checking whether the owner still lives."""
    model_id: str
    """The model's public id (the pod's model-id annotation)."""
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
            name = path.name.removesuffix(SUFFIX)
            try:
                data = json.loads(path.read_text())
                # Written before private names: no modelId, the name is the model id.
                model_id = str(data.get("modelId") or name)
                record = OwnerRecord(
                    str(data["uid"]), str(data["pod"]), model_id, str(data["digest"])
                )
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                log.warning(
                    "The owner record %s is unreadable (%s): model %s is vouched for by no pod.",
                    path,
                    e,
                    name,
                )
                continue
            if is_valid_model_id(name) and is_valid_model_id(model_id):
                self._records[name] = record

    def get(self, name: str) -> OwnerRecord | None:
        """The record of the model named `name` in Triton."""
        return self._records.get(name)

    def all(self) -> dict[str, OwnerRecord]:
        """Every record, by the model's name in Triton."""
        return dict(self._records)

    def put(self, name: str, record: OwnerRecord) -> None:
        path = self.directory / f"{name}{SUFFIX}"
        temporary = path.with_name(path.name + ".tmp")
        document = {
            "uid": record.uid,
            "pod": record.pod,
            "modelId": record.model_id,
            "digest": record.digest,
        }
        with temporary.open("w") as f:
            json.dump(document, f)
            f.flush()
            os.fsync(f.fileno())
        temporary.replace(path)
        self._records[name] = record
        self._changed()

    def drop(self, name: str) -> None:
        self._records.pop(name, None)
        with contextlib.suppress(FileNotFoundError):
            (self.directory / f"{name}{SUFFIX}").unlink()
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()
