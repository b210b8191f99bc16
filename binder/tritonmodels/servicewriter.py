"""Each TritonModel's Service: its name, owned by the model, ports http 9000 and grpc 9001 (as a
model pod's, deploy/example/model-service.yaml), selecting the model hosts labelled
`<prefix>serves-<model>` (`binder.tritonmodels.serving` says which), so it reaches exactly the
hosts where the model is loaded and served.

Created once per model by this binder; one already there is left as it is (the binder's own, or a
name the namespace chose to reuse). A creation refused for the namespace's cause is told in a
`FailedCreateService` Warning Event on the model; one refused for the API server's own (no answer,
5xx, 429) is raised, and the model's turn is tried again. Writes only through `binder.api.kube`.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor

from binder.api.kube import Kube
from binder.cluster.modelviews import ModelInfo, event_object, owner_reference
from common.contract import Keys
from common.hosted import serves_label
from common.kubeapi.errors import ApiError, ConflictError
from common.kubeapi.session import JsonObject

SERVICE_PORTS = [
    {"name": "http", "port": 9000, "targetPort": "http", "appProtocol": "http"},
    {"name": "grpc", "port": 9001, "targetPort": "grpc", "appProtocol": "kubernetes.io/h2c"},
]
"""As a model pod's Service (deploy/example/model-service.yaml)."""


class ServiceWriter:
    """Creates the models' Services, once each."""

    def __init__(self, kube: Kube, executor: Executor, *, keys: Keys, identity: str) -> None:
        self._kube = kube
        self._executor = executor
        self._keys = keys
        self._identity = identity
        self._written: set[str] = set()
        """Models whose Service this replica has written."""

    def forget(self, uid: str) -> None:
        """The model is gone (its Service with it: the model owns it)."""
        self._written.discard(uid)

    async def create(self, model: ModelInfo) -> None:
        """The model's Service, unless this replica has written it already."""
        if model.uid in self._written:
            return
        loop, body = asyncio.get_running_loop(), self._service(model)
        try:
            await loop.run_in_executor(
                self._executor, lambda: self._kube.create_service(model.namespace, body)
            )
        except ConflictError:
            pass  # there already: the binder's own, or a name the namespace chose to reuse
        except ApiError as e:
            if e.status == 0 or e.status >= 500 or e.status == 429:
                raise
            message = f"the binder cannot create Service {model.name}: {e}"
            await loop.run_in_executor(
                self._executor,
                lambda: self._kube.record_object_event(
                    event_object(model),
                    reason="FailedCreateService",
                    message=message,
                    reporting_instance=self._identity,
                ),
            )
        self._written.add(model.uid)

    def _service(self, model: ModelInfo) -> JsonObject:
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": model.name,
                "namespace": model.namespace,
                "ownerReferences": [owner_reference(model, controller=True)],
            },
            "spec": {
                "selector": {serves_label(self._keys, model.name): "true"},
                "ports": SERVICE_PORTS,
            },
        }
