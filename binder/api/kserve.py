"""KServe's objects, for the InferenceService controller, over a common.kubeapi.session.Session:
an InferenceService's status, the cluster's `inferenceservice-config` ConfigMap (its default
deployment mode), a namespace's `storage-config` Secret (ModelMesh's storage keys), and the
Secret of KServe's keys a storage key's credential becomes in the same namespace. Every write is
retried as the session says; a read is tried once.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
from urllib.parse import quote

from common.kubeapi.errors import ConflictError, NotFoundError
from common.kubeapi.paths import namespace_path
from common.kubeapi.session import MERGE_PATCH, JsonObject, Session

INFERENCESERVICE_CONFIG = "inferenceservice-config"
STORAGE_CONFIG = "storage-config"


def _isvc_path(namespace: str, name: str) -> str:
    return (
        f"/apis/serving.kserve.io/v1beta1/namespaces/{quote(namespace, safe='')}"
        f"/inferenceservices/{quote(name, safe='')}"
    )


class KServe:
    """KServe's reads and writes over one session."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def patch_inferenceservice_status(
        self, namespace: str, name: str, uid: str, status: JsonObject
    ) -> None:
        """A merge patch of an InferenceService's `status` subresource, only while it is the
        object with this uid (409 otherwise)."""
        body = {"metadata": {"uid": uid}, "status": status}
        what = f"writing the status of InferenceService {namespace}/{name}"
        path = f"{_isvc_path(namespace, name)}/status"
        self._session.write(what, "PATCH", path, body, MERGE_PATCH)

    def read_inferenceservice(self, namespace: str, name: str) -> JsonObject:
        """The InferenceService `namespace/name` (NotFoundError: none, or no such kind)."""
        return self._session.read(_isvc_path(namespace, name))

    def read_inferenceservice_config(self, namespace: str) -> dict[str, str] | None:
        """The data of the namespace's inferenceservice-config ConfigMap (None: none)."""
        path = f"{namespace_path(namespace)}/configmaps/{INFERENCESERVICE_CONFIG}"
        try:
            found = self._session.read(path)
        except NotFoundError:
            return None
        return {str(k): str(v) for k, v in (found.get("data") or {}).items()}

    def read_storage_config(self, namespace: str) -> dict[str, str] | None:
        """The decoded keys of the namespace's storage-config Secret (None: none; a value that
        is not base64 text is left out)."""
        path = f"{namespace_path(namespace)}/secrets/{STORAGE_CONFIG}"
        try:
            found = self._session.read(path)
        except NotFoundError:
            return None
        data: dict[str, str] = {}
        for key, value in (found.get("data") or {}).items():
            with contextlib.suppress(binascii.Error, UnicodeDecodeError):
                data[str(key)] = base64.b64decode(str(value)).decode()
        for key, value in (found.get("stringData") or {}).items():
            data[str(key)] = str(value)
        return data

    def create_storage_secret(
        self, namespace: str, name: str, data: dict[str, str], labels: dict[str, str]
    ) -> None:
        """Create the Secret of KServe's keys (its name carries a digest of its content: one
        already there of that name is taken as it)."""
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "type": "Opaque",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        }
        with contextlib.suppress(ConflictError):
            self._session.write(
                f"creating Secret {namespace}/{name}",
                "POST",
                f"{namespace_path(namespace)}/secrets",
                body,
            )
