"""The binder's Lease calls over the one API session (common.kubeapi.session): read, create,
replace and delete a coordination.k8s.io/v1 Lease, for the leader elector (binder.api.leader) and
`tritonshare uninstall-cleanup`. One attempt each: the elector retries every retry period.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from urllib.parse import quote

from binder.api.listwatch import leases_in
from common.kubeapi.errors import NotFoundError
from common.kubeapi.session import READ_TIMEOUT_SECONDS, JsonObject, Session


def micro_time(seconds: float) -> str:
    """A Lease's MicroTime (acquireTime, renewTime) for a wall-clock time in seconds."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _lease_path(namespace: str, name: str = "") -> str:
    path = leases_in(namespace).path
    return f"{path}/{quote(name, safe='')}" if name else path


class Leases:
    """Lease calls over one session."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def get_lease(
        self, namespace: str, name: str, timeout: float = READ_TIMEOUT_SECONDS
    ) -> JsonObject | None:
        try:
            data = self._session.request("GET", _lease_path(namespace, name), timeout)
        except NotFoundError:
            return None
        result: JsonObject = json.loads(data)
        return result

    def create_lease(
        self, namespace: str, body: JsonObject, timeout: float = READ_TIMEOUT_SECONDS
    ) -> JsonObject:
        result: JsonObject = json.loads(
            self._session.request("POST", _lease_path(namespace), timeout, body)
        )
        return result

    def replace_lease(
        self, namespace: str, name: str, body: JsonObject, timeout: float = READ_TIMEOUT_SECONDS
    ) -> JsonObject:
        """PUT with the body's resourceVersion: a 409 means someone else wrote it first."""
        result: JsonObject = json.loads(
            self._session.request("PUT", _lease_path(namespace, name), timeout, body)
        )
        return result

    def delete_lease(self, namespace: str, name: str) -> bool:
        """Delete a Lease; False when it was already gone."""
        try:
            self._session.request("DELETE", _lease_path(namespace, name))
        except NotFoundError:
            return False
        return True
