"""The InferenceService controller: each ModelMesh-mode InferenceService of a namespace labelled
`modelmesh-enabled: "true"` becomes a TritonModel of the same name it owns, and its status reads
as ModelMesh writes it, from that TritonModel's.

The label's key is a setting (`Config.namespace_label`). An InferenceService is ModelMesh's
when annotated `serving.kserve.io/deploymentMode: ModelMesh`, or when it has no such
annotation and the cluster's `inferenceservice-config` ConfigMap (in the
system namespace, else KServe's) says `{"defaultDeploymentMode": "ModelMesh"}` under `deploy`.
Others, and every InferenceService of a namespace not labelled, are left alone. A spec refused
(binder.inferenceservices.predictor, .runtimes, .storage) reads so in its status with
ModelMesh's reason and a Warning Event; a TritonModel it already has keeps serving the files it
has. A storage key's credential becomes a Secret of KServe's keys in the same namespace that the
TritonModel names (binder.inferenceservices.storage).

It keeps its own picture of InferenceServices, ServingRuntimes and ClusterServingRuntimes (its
informers, optional kinds: while the API server serves none, nothing is done and the list is
asked again every 30 s), of the namespaces' labels and of the TritonModels InferenceServices own
(the binder's watches hand them on). An InferenceService's status has one writer
(binder.inferenceservices.status); only the leader writes. Reconciles run one at a time on the
binder's loop, the API calls on its worker threads; a failed one is tried again with backoff,
and every InferenceService is looked at again every `resync_seconds` (the ConfigMap and the
storage-config Secret are read, not watched).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import partial
from typing import Any

from binder.api.kube import Kube
from binder.api.listwatch import CLUSTERSERVINGRUNTIMES, INFERENCESERVICES, SERVINGRUNTIMES, Kind
from binder.inferenceservices.modelstatus import Refusal
from binder.inferenceservices.predictor import (
    INVALID_PREDICTOR_SPEC,
    MODELMESH,
    InvalidSpecError,
    Predictor,
    deployment_mode,
    parse,
)
from binder.inferenceservices.runtimes import Runtime, choose, runtime_of
from binder.inferenceservices.status import StatusWriter
from binder.inferenceservices.storage import Files, entry_of, files_of
from binder.inferenceservices.tritonmodel import (
    Wanted,
    controlled_by,
    gpu_memory_of,
    new_model,
    owner_of,
    patch_for,
    scaling_of,
)
from common.contract import Keys
from common.kubeapi.errors import ApiError, ConflictError, NotFoundError
from common.kubeapi.session import JsonObject

log = logging.getLogger(__name__)

SERVERLESS = "Serverless"
"""KServe's own default deployment mode."""
RETRY_SECONDS = 1.0
RETRY_MAX_SECONDS = 30.0
Key = tuple[str, str]
Watched = tuple[Kind, Callable[[list[JsonObject]], None], Callable[[str, JsonObject], None]]
"""A kind to watch, with its list and event callbacks."""


@dataclass(frozen=True)
class Config:
    """The controller's settings (binder.settings gives them)."""

    tenant_code: frozenset[str]
    """Namespaces allowed tenant code (PyTorch and Python models)."""
    config_namespaces: tuple[str, ...]
    """Where the inferenceservice-config ConfigMap is looked for, in order."""
    namespace_label: str = "modelmesh-enabled"
    """The namespace label (value "true") that hands its InferenceServices to this controller."""
    resync_seconds: float = 30.0
    """Every InferenceService is looked at again this often, the ConfigMap read again."""


def _key(obj: JsonObject) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


class InferenceServiceController:
    """Serves ModelMesh-mode InferenceServices as TritonModels; `run` is its one task."""

    def __init__(
        self,
        kube: Kube,
        *,
        leading: asyncio.Event,
        executor: Executor,
        identity: str,
        keys: Keys,
        config: Config,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self._leading = leading
        self._executor = executor
        self._keys = keys
        self._config = config
        self._monotonic = monotonic
        self._services: dict[Key, JsonObject] = {}
        self._runtimes: dict[Key, Runtime] = {}
        self._cluster_runtimes: dict[str, Runtime] = {}
        self._namespaces: dict[str, dict[str, str]] = {}
        self._models: dict[Key, JsonObject] = {}
        """The TritonModels an InferenceService controls, by (namespace, name)."""
        self.status = StatusWriter(kube, executor, identity)
        """The one writer of the InferenceServices' status and refusal Events."""
        self._foreign: set[Key] = set()
        """The TritonModels no InferenceService of their name controls."""
        self._dirty: dict[Key, None] = {}
        self._wake = asyncio.Event()
        self._failures: dict[Key, int] = {}
        self._mode: tuple[float, str] | None = None
        """(when read, the cluster's default deployment mode)."""

    # what the informers hand over (on the loop)

    def kinds(self) -> list[Watched]:
        """The kinds this controller watches itself, with their list and event callbacks."""
        return [
            (INFERENCESERVICES, self.replace_services, self.apply_service),
            (SERVINGRUNTIMES, self.replace_runtimes, self.apply_runtime),
            (CLUSTERSERVINGRUNTIMES, self.replace_cluster_runtimes, self.apply_cluster_runtime),
        ]

    def replace_services(self, items: list[JsonObject]) -> None:
        self._services = {_key(o): o for o in items}
        self.resync()

    def apply_service(self, event: str, obj: JsonObject) -> None:
        key = _key(obj)
        if event == "DELETED":
            self._services.pop(key, None)
            self.status.forget(key)
            self._failures.pop(key, None)
            return  # its TritonModel goes with it (garbage collection)
        self._services[key] = obj
        self._enqueue(key)

    def replace_runtimes(self, items: list[JsonObject]) -> None:
        self._runtimes = {_key(o): runtime_of(o, cluster=False) for o in items}
        self.resync()

    def apply_runtime(self, event: str, obj: JsonObject) -> None:
        key = _key(obj)
        if event == "DELETED":
            self._runtimes.pop(key, None)
        else:
            self._runtimes[key] = runtime_of(obj, cluster=False)
        self._enqueue_namespace(key[0])

    def replace_cluster_runtimes(self, items: list[JsonObject]) -> None:
        self._cluster_runtimes = {_key(o)[1]: runtime_of(o, cluster=True) for o in items}
        self.resync()

    def apply_cluster_runtime(self, event: str, obj: JsonObject) -> None:
        name = _key(obj)[1]
        if event == "DELETED":
            self._cluster_runtimes.pop(name, None)
        else:
            self._cluster_runtimes[name] = runtime_of(obj, cluster=True)
        self.resync()

    def replace_namespaces(self, items: list[JsonObject]) -> None:
        self._namespaces = {
            _key(o)[1]: dict((o.get("metadata") or {}).get("labels") or {}) for o in items
        }
        self.resync()

    def apply_namespace(self, event: str, obj: JsonObject) -> None:
        name = _key(obj)[1]
        labels = dict((obj.get("metadata") or {}).get("labels") or {})
        before = self._namespaces.get(name)
        if event == "DELETED":
            self._namespaces.pop(name, None)
            return
        self._namespaces[name] = labels
        label = self._config.namespace_label
        if before is None or before.get(label) != labels.get(label):
            self._enqueue_namespace(name)

    def replace_models(self, items: list[JsonObject]) -> None:
        self._models = {_key(o): o for o in items if owner_of(o) == _key(o)[1]}
        self._foreign = {_key(o) for o in items} - set(self._models)
        self.resync()

    def apply_model(self, event: str, obj: JsonObject) -> None:
        key = _key(obj)
        self._models.pop(key, None)
        self._foreign.discard(key)
        if event != "DELETED":
            if owner_of(obj) == key[1]:
                self._models[key] = obj
            else:
                self._foreign.add(key)
        self._enqueue(key)

    # the queue

    def resync(self, *, reread: bool = False) -> None:
        """Look at every InferenceService again; `reread`: and read the inferenceservice-config
        ConfigMap again."""
        if reread:
            self._mode = None
        for key in self._services:
            self._dirty[key] = None
        self._wake.set()

    def _enqueue(self, key: Key) -> None:
        if key in self._services:
            self._dirty[key] = None
            self._wake.set()

    def _enqueue_namespace(self, namespace: str) -> None:
        for key in self._services:
            if key[0] == namespace:
                self._dirty[key] = None
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        next_resync = self._monotonic() + self._config.resync_seconds
        while not stop.is_set():
            if not self._dirty:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), 1.0)
            if self._monotonic() >= next_resync:
                next_resync = self._monotonic() + self._config.resync_seconds
                self.resync(reread=True)
            if not self._leading.is_set():
                self._dirty.clear()  # a new leader starts from a resync
                continue
            while self._dirty and not stop.is_set() and self._leading.is_set():
                key = next(iter(self._dirty))
                del self._dirty[key]
                try:
                    await self._reconcile(key)
                    self._failures.pop(key, None)
                except Exception as e:  # one InferenceService's failure must not stop the others
                    failures = self._failures[key] = self._failures.get(key, 0) + 1
                    delay = min(RETRY_SECONDS * 2 ** (failures - 1), RETRY_MAX_SECONDS)
                    if isinstance(e, ApiError):
                        log.warning(
                            "Reconciling InferenceService %s/%s has failed (%s): "
                            "retrying in %.0f s.",
                            *key,
                            e,
                            delay,
                        )
                    else:
                        log.exception(
                            "Reconciling InferenceService %s/%s has failed: retrying in %.0f s.",
                            *key,
                            delay,
                        )
                    loop.call_later(delay, self._enqueue, key)

    async def _call(self, call: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    # one InferenceService

    async def _reconcile(self, key: Key) -> None:
        obj = self._services.get(key)
        if obj is None:
            return
        namespace, name = key
        if self._namespaces.get(namespace, {}).get(self._config.namespace_label) != "true":
            return
        if deployment_mode(obj, await self._default_mode()) != MODELMESH:
            return
        model = self._models.get(key)
        refusal: Refusal | None = None
        try:
            wanted = await self._wanted(obj, parse(obj))
        except InvalidSpecError as e:
            refusal = Refusal(e.reason, e.message)
        else:
            if key in self._foreign or (model is not None and not controlled_by(model, obj)):
                refusal = Refusal(
                    INVALID_PREDICTOR_SPEC,
                    f"TritonModel {name} exists and is not this InferenceService's: delete it "
                    "or rename the InferenceService",
                )
                model = None
            else:
                await self._apply(obj, model, wanted)
        await self.status.write(obj, model, refusal)

    async def _wanted(self, obj: JsonObject, predictor: Predictor) -> Wanted:
        """What the TritonModel should be, or InvalidSpecError."""
        namespace = _key(obj)[0]
        choose(
            predictor,
            (r for (ns, _), r in self._runtimes.items() if ns == namespace),
            self._cluster_runtimes.values(),
            tenant_code=namespace in self._config.tenant_code,
        )
        prefix = self._keys.prefix
        gpu_memory = gpu_memory_of(obj, f"{prefix}gpu-memory")
        scaling = scaling_of(obj, f"{prefix}autoscaling")
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        chosen = str(annotations.get(f"{self._keys.prefix}storage-secret") or "") or None
        files = await self._files(namespace, predictor, credential=chosen is None)
        secret = chosen or (files.secret_name() if files.credential else None)
        return Wanted(files, secret, gpu_memory, scaling)

    async def _files(self, namespace: str, predictor: Predictor, *, credential: bool) -> Files:
        storage = predictor.storage
        if storage.uri is not None and storage.key is None and storage.scheme == "https":
            return Files(storage.uri)
        data = await self._call(lambda: self._kube.read_storage_config(namespace))
        entry = entry_of(data, storage.key)
        return files_of(storage, entry, storage.key, credential=credential)

    async def _apply(self, obj: JsonObject, model: JsonObject | None, wanted: Wanted) -> None:
        """Create or patch the TritonModel (and the credential's Secret first)."""
        namespace, name = _key(obj)
        prefix = self._keys.prefix
        files = wanted.files
        if files.credential and wanted.storage_secret == files.secret_name():
            labels = {"app.kubernetes.io/managed-by": "tritonshare"}
            await self._call(
                lambda: self._kube.create_storage_secret(
                    namespace, files.secret_name(), dict(files.credential), labels
                )
            )
        if model is None:
            body = new_model(obj, wanted, prefix)
            try:
                await self._call(lambda: self._kube.create_model(namespace, body))
            except ConflictError:
                return  # its watch event brings it here again
            log.info(
                "InferenceService %s/%s is served as TritonModel %s (%s, %s).",
                namespace,
                name,
                name,
                files.uri,
                f"{wanted.gpu_memory} of GPU memory"
                if wanted.gpu_memory
                else "its GPU memory learned at its first load",
            )
            return
        patch = patch_for(model, wanted, prefix)
        if patch is None:
            return
        uid = str(model["metadata"]["uid"])
        try:
            await self._call(lambda: self._kube.patch_model(namespace, name, uid, patch))
        except (NotFoundError, ConflictError):
            return  # deleted or recreated meanwhile: its watch event brings it here again
        log.info("TritonModel %s/%s follows its InferenceService's new spec.", namespace, name)

    async def _default_mode(self) -> str:
        """The cluster's default deployment mode (inferenceservice-config's `deploy`), read
        again at each resync."""
        if self._mode is not None:
            return self._mode[1]
        mode = SERVERLESS
        for namespace in self._config.config_namespaces:
            try:
                data = await self._call(partial(self._kube.read_inferenceservice_config, namespace))
            except ApiError as e:
                log.warning(
                    "Reading the inferenceservice-config ConfigMap of %s has failed (%s): "
                    "InferenceServices without a deploymentMode annotation are taken as %s.",
                    namespace,
                    e,
                    mode,
                )
                continue
            if data is None:
                continue
            try:
                deploy = json.loads(data.get("deploy") or "{}")
            except ValueError:
                log.warning("inferenceservice-config of %s: `deploy` is not JSON.", namespace)
                continue
            if isinstance(deploy, dict) and deploy.get("defaultDeploymentMode"):
                mode = str(deploy["defaultDeploymentMode"])
                break
        self._mode = (self._monotonic(), mode)
        return mode
