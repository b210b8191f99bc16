"""The namespace router of ModelMesh's clients: per namespace with a TritonModel made from a
ModelMesh InferenceService (labelled `serving.kserve.io/inferenceservice` by
`binder.inferenceservices`), the Service `modelmesh-serving` (gRPC 8033, REST 8008, as
ModelMesh's) selecting the namespace's model hosts, and the ConfigMap `tritonshare-mesh-routes`
their proxies read (`routes.json`: each TritonModel of the namespace, its model id and its own
Service's ClusterIP and ports, `proxy.mesh`), so a host serves the models it has and relays the
others to their Services.

The Service is created once per namespace (one already there is left as it is); the ConfigMap is
written when the namespace's routes change. A model's ClusterIP is read from its Service once.
Both stay when the namespace's models go (a route to a deleted Service answers nothing). Writes
only through `binder.api.kube`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from binder.api.kube import Kube
from binder.cluster.modelviews import ModelInfo
from binder.tritonmodels.hostpod import MESH_PORTS, ROUTES_CONFIG_MAP, ROUTES_KEY
from binder.tritonmodels.servicewriter import SERVICE_PORTS
from common.contract import Keys
from common.hosted import host_label
from common.kubeapi.errors import ConflictError, NotFoundError
from common.kubeapi.paths import namespace_path
from common.kubeapi.session import JsonObject

log = logging.getLogger(__name__)

MESH_SERVICE = "modelmesh-serving"
"""The Service ModelMesh's clients call (`modelmesh-serving.<namespace>`)."""
MESH_GRPC_PORT = 8033
MESH_REST_PORT = 8008
ISVC_LABEL = "serving.kserve.io/inferenceservice"
"""What `binder.inferenceservices` labels each TritonModel it makes with."""

_PORTS = {str(p["name"]): int(str(p["port"])) for p in SERVICE_PORTS}
"""Each model's own Service's ports by name (`binder.tritonmodels.servicewriter`)."""


def mesh_service(namespace: str, keys: Keys) -> JsonObject:
    """The `modelmesh-serving` Service of `namespace`: its model hosts, on the router's ports."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": MESH_SERVICE, "namespace": namespace},
        "spec": {
            "selector": {host_label(keys): "true"},
            "ports": [
                {
                    "name": "grpc",
                    "port": MESH_GRPC_PORT,
                    "targetPort": MESH_PORTS[0][0],
                    "appProtocol": "kubernetes.io/h2c",
                },
                {
                    "name": "http",
                    "port": MESH_REST_PORT,
                    "targetPort": MESH_PORTS[1][0],
                    "appProtocol": "http",
                },
            ],
        },
    }


def routes_document(routes: dict[str, tuple[str, str, int]]) -> str:
    """`routes.json` for `routes` (TritonModel name -> model id, ClusterIP, maxConcurrency),
    sorted by model id."""
    entries: list[dict[str, Any]] = [
        {"model": model_id, "address": address, "http": _PORTS["http"], "grpc": _PORTS["grpc"]}
        | ({"maxConcurrency": limit} if limit else {})
        for model_id, address, limit in sorted(routes.values())
        if address
    ]
    return json.dumps(entries, separators=(",", ":"))


class MeshWriter:
    """Writes each ModelMesh namespace's `modelmesh-serving` Service and routes ConfigMap."""

    def __init__(self, kube: Kube, executor: Executor, *, keys: Keys) -> None:
        self._kube = kube
        self._executor = executor
        self._keys = keys
        self._models: dict[str, dict[str, tuple[str, str, int]]] = {}
        """Per namespace, each TritonModel's (model id, ClusterIP, maxConcurrency) by name."""
        self._uids: dict[str, tuple[str, str]] = {}
        """Each model uid's (namespace, name)."""
        self._mesh: set[str] = set()
        """Namespaces with a ModelMesh InferenceService's TritonModel."""
        self._services: set[str] = set()
        """Namespaces whose `modelmesh-serving` this replica has created."""
        self._warned: set[str] = set()
        """Namespaces told to delete a `modelmesh-serving` that is not the binder's."""
        self._written: dict[str, str] = {}
        """Each namespace's routes document as last written."""

    async def model_written(self, model: ModelInfo) -> None:
        """`model` is reconciled (its Service written): its namespace's router follows it."""
        namespace = model.namespace
        known = self._models.setdefault(namespace, {})
        self._uids[model.uid] = (namespace, model.name)
        before = known.get(model.name)
        address = before[1] if before is not None else ""
        known[model.name] = (model.template.model_id, address, model.concurrency)
        if ISVC_LABEL in model.template.labels:
            self._mesh.add(namespace)
        if namespace in self._mesh:
            await self._write(namespace)

    async def forget(self, uid: str) -> None:
        """Model `uid` is gone: its route goes."""
        where = self._uids.pop(uid, None)
        if where is None:
            return
        namespace, name = where
        self._models.get(namespace, {}).pop(name, None)
        if namespace in self._mesh:
            await self._write(namespace)

    async def _write(self, namespace: str) -> None:
        known = self._models[namespace]
        for name, (model_id, address, limit) in list(known.items()):
            if not address:
                found = await self._call(self._cluster_ip, namespace, name)
                known[name] = (model_id, found, limit)
        document = routes_document(known)
        if self._written.get(namespace) != document:
            await self._call(self._put_routes, namespace, document)
            self._written[namespace] = document
        if namespace in self._services:
            return
        body = mesh_service(namespace, self._keys)
        try:
            await self._call(self._kube.create_service, namespace, body)
        except ConflictError:
            there = await self._call(self._selector, namespace)
            if there != body["spec"]["selector"]:
                # ModelMesh's own, left as it is (tried again at the namespace's next
                # change): its owner deletes it, and then the binder makes its own.
                if namespace not in self._warned:
                    self._warned.add(namespace)
                    log.warning(
                        "Namespace %s has a Service %s that selects %s, not its model hosts: "
                        "its clients do not reach the TritonModels; delete it.",
                        namespace,
                        MESH_SERVICE,
                        there,
                    )
                return
        self._services.add(namespace)
        log.info(
            "Namespace %s has ModelMesh InferenceServices: Service %s routes each request "
            "to its model's hosts.",
            namespace,
            MESH_SERVICE,
        )

    def _selector(self, namespace: str) -> dict[str, str]:
        """The selector of the namespace's `modelmesh-serving` ({} when gone meanwhile)."""
        try:
            service = self._kube.read(f"{namespace_path(namespace)}/services/{MESH_SERVICE}")
        except NotFoundError:
            return {}
        return dict((service.get("spec") or {}).get("selector") or {})

    def _cluster_ip(self, namespace: str, name: str) -> str:
        """The ClusterIP of model `name`'s Service ("" when it has none yet)."""
        path = f"{namespace_path(namespace)}/services/{name}"
        try:
            service = self._kube.read(path)
        except NotFoundError:
            return ""
        address = str((service.get("spec") or {}).get("clusterIP") or "")
        return "" if address == "None" else address

    def _put_routes(self, namespace: str, document: str) -> None:
        self._kube.put_config_map(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": ROUTES_CONFIG_MAP, "namespace": namespace},
                "data": {ROUTES_KEY: document},
            }
        )

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the executor; an ApiError fails the model's turn, tried again."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args))
