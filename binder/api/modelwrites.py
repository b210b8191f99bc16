"""What the TritonModel controller and the autoscaler write besides pods, over a
common.kubeapi.session.Session: a TritonModel's status, an object's `scale` subresource, a model's
Service, a model host's PodDisruptionBudget and a namespace router's routes ConfigMap; and the
TritonModels the InferenceService controller creates and patches. Every write is retried as the
session says.
"""

from __future__ import annotations

import contextlib
from urllib.parse import quote

from common.kubeapi.errors import ConflictError, NotFoundError
from common.kubeapi.paths import namespace_path
from common.kubeapi.session import MERGE_PATCH, JsonObject, Session

AUTOSCALER = "tritonshare-autoscaler"
"""The field manager of the built-in autoscaler's writes to `scale`."""


def _models_path(namespace: str) -> str:
    return f"/apis/tritonshare.io/v1alpha1/namespaces/{quote(namespace, safe='')}/tritonmodels"


def _budgets_path(namespace: str) -> str:
    return f"/apis/policy/v1/namespaces/{quote(namespace, safe='')}/poddisruptionbudgets"


class ModelWrites:
    """The model writes over one session."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def patch_model_status(self, namespace: str, name: str, uid: str, status: JsonObject) -> None:
        """A merge patch of a TritonModel's `status` subresource, only while it is the object
        with this uid (a model recreated under the name meanwhile is left alone: 409)."""
        body = {"metadata": {"uid": uid}, "status": status}
        path = f"{_models_path(namespace)}/{quote(name, safe='')}/status"
        what = f"writing the status of TritonModel {namespace}/{name}"
        self._session.write(what, "PATCH", path, body, MERGE_PATCH)

    def create_model(self, namespace: str, body: JsonObject) -> None:
        """Create the TritonModel (ConflictError when one of that name is there)."""
        what = f"creating TritonModel {namespace}/{body['metadata']['name']}"
        self._session.write(what, "POST", _models_path(namespace), body)

    def patch_model(self, namespace: str, name: str, uid: str, patch: JsonObject) -> None:
        """A merge patch of a TritonModel, only while it is the object with this uid (409
        otherwise)."""
        meta = {**patch.get("metadata", {}), "uid": uid}
        body = {**patch, "metadata": meta}
        path = f"{_models_path(namespace)}/{quote(name, safe='')}"
        self._session.write(
            f"updating TritonModel {namespace}/{name}", "PATCH", path, body, MERGE_PATCH
        )

    def scale(self, api: str, plural: str, namespace: str, name: str, replicas: int) -> None:
        """Set the replicas of an object (`api`: "/apis/GROUP/VERSION") through its `scale`
        subresource, as an HPA does, under the autoscaler's own field manager."""
        path = (
            f"{api}/namespaces/{quote(namespace, safe='')}/{plural}/{quote(name, safe='')}"
            f"/scale?fieldManager={AUTOSCALER}"
        )
        body = {"spec": {"replicas": replicas}}
        what = f"scaling {plural} {namespace}/{name} to {replicas}"
        self._session.write(what, "PATCH", path, body, MERGE_PATCH)

    def create_service(self, namespace: str, body: JsonObject) -> None:
        """Create the Service (ConflictError when one of that name is there)."""
        path = f"{namespace_path(namespace)}/services"
        what = f"creating Service {namespace}/{body['metadata']['name']}"
        self._session.write(what, "POST", path, body)

    def put_config_map(self, body: JsonObject) -> None:
        """Create the ConfigMap, or set the data of the one of its name."""
        meta = body["metadata"]
        path = f"{namespace_path(meta['namespace'])}/configmaps"
        what = f"ConfigMap {meta['namespace']}/{meta['name']}"
        try:
            self._session.write(f"creating {what}", "POST", path, body)
        except ConflictError:
            patch = {"data": body["data"]}
            name = quote(meta["name"], safe="")
            self._session.write(f"updating {what}", "PATCH", f"{path}/{name}", patch, MERGE_PATCH)

    def put_budget(self, body: JsonObject) -> None:
        """Create the PodDisruptionBudget, or set the spec of the one of its name."""
        meta = body["metadata"]
        path = _budgets_path(meta["namespace"])
        what = f"PodDisruptionBudget {meta['namespace']}/{meta['name']}"
        try:
            self._session.write(f"creating {what}", "POST", path, body)
        except ConflictError:
            patch = {"spec": body["spec"]}
            name = quote(meta["name"], safe="")
            self._session.write(f"updating {what}", "PATCH", f"{path}/{name}", patch, MERGE_PATCH)

    def delete_budget(self, namespace: str, name: str) -> None:
        """Delete the PodDisruptionBudget (gone already: nothing to do)."""
        path = f"{_budgets_path(namespace)}/{quote(name, safe='')}"
        with contextlib.suppress(NotFoundError):
            self._session.write(f"deleting PodDisruptionBudget {namespace}/{name}", "DELETE", path)
