"""The TritonModel controller: places each model's replicas, writes its status, and keeps its
namespace's model hosts and its Service.

While this replica leads, a model the cache reports changed (`changed`) is reconciled on the
loop: replicas past `spec.replicas` (the highest ordinals) are freed; each wanted replica not yet
charged is placed, while the namespace's ResourceQuotas allow it (`binder.quota`), by the
binder's own `place` (every rule a pod is placed by, `as_replica`),
charged at once (assume) and signed (`binder.proofs.sign`: namespace, model, ordinal and the
model's uid, node, GPU, GPU memory and residency, so a proof copied to another replica, model or
node does not verify). Then, off the loop:

- `status` through the status subresource: `placements[]` ({replica, node, gpu, proof, host}),
  `replicas`, `selector`, `observedGeneration` and the `Placed` condition (False with
  kube-scheduler's refusal when a replica fits nowhere, and a Warning Event `FailedScheduling`
  on the model, written only when the refusal changes);
- the namespace's model hosts: one pod per node with a replica placed there, named
  `tritonshare-host-<hash of the node>`, created on its node (`spec.nodeName`), owned by every
  TritonModel with a replica there (garbage collection removes it with the last), labelled
  `<prefix>serves-<model>` for each, and naming its replicas in `<prefix>hosted-models` (with
  what their proofs' claims need: model, model uid, ordinal, GPU, residency); deleted when its
  last replica leaves;
- the model's Service (same name, owned by the model): ports http 9000 and grpc 9001, selecting
  the hosts labelled `<prefix>serves-<model>`.

A refused model, and a namespace whose new host waits for its old one on the node to be gone, is
tried again every RETRY_SECONDS. The ledger is the cache's: a restarted binder
charges the replicas whose proofs in status verify, and places the others again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from binder.cache import Ledger
from binder.errors import ApiError, ConflictError, NotFoundError
from binder.kube import JsonObject, Kube, now_rfc3339
from binder.model import (
    TRITONMODEL_API_VERSION,
    TRITONMODEL_KIND,
    ModelInfo,
    PodInfo,
)
from binder.placement import Placement, Policy, place
from binder.proofs import sign
from binder.quota import EXCEEDED_QUOTA, QuotaCheck, charged_in, limits_from_api
from common.contract import RESIDENCY_ALWAYS, RESIDENCY_ON_DEMAND, Keys
from common.hosted import (
    HostedReplica,
    encode_hosted,
    host_label,
    host_name,
    hosted_models_annotation,
    replica_uid,
    serves_label,
)
from common.placement import KeyRing
from common.podresources import CPU, MEMORY, MODEL_HOST_BASE, MODEL_HOST_PER_MODEL

log = logging.getLogger(__name__)

RETRY_SECONDS = 1.0
"""How often a model with a replica that fits nowhere is tried again."""
QUOTA_READ_SECONDS = 1.0
"""How long a namespace's ResourceQuotas, once read, serve the placements that follow (the
models of a namespace created together read them once); their pods' use is that much late."""
PLACED = "Placed"
"""The condition type: every wanted replica is placed."""
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
SERVICE_PORTS = [
    {"name": "http", "port": 9000, "targetPort": "http", "appProtocol": "http"},
    {"name": "grpc", "port": 9001, "targetPort": "grpc", "appProtocol": "kubernetes.io/h2c"},
]
"""As a model pod's Service (deploy/example/model-service.yaml)."""


def _owner(model: ModelInfo, controller: bool) -> JsonObject:
    return {
        "apiVersion": TRITONMODEL_API_VERSION,
        "kind": TRITONMODEL_KIND,
        "name": model.name,
        "uid": model.uid,
        "controller": controller,
    }


def _involved(model: ModelInfo) -> JsonObject:
    """The model as an Event's involvedObject."""
    return {
        "apiVersion": TRITONMODEL_API_VERSION,
        "kind": TRITONMODEL_KIND,
        "namespace": model.namespace,
        "name": model.name,
        "uid": model.uid,
    }


class ModelController:
    """Reconciles TritonModels one at a time, on the loop, while this replica leads."""

    def __init__(
        self,
        kube: Kube,
        ledger: Ledger,
        *,
        leading: asyncio.Event,
        keys: Keys,
        policy: Policy,
        placement_keys: Callable[[], KeyRing],
        executor: Executor,
        identity: str,
        scheduler_name: str,
        host_image: str,
    ) -> None:
        self._kube = kube
        self._ledger = ledger
        self._leading = leading
        self._keys = keys
        self._policy = policy
        self._ring = placement_keys
        self._executor = executor
        self._identity = identity
        self._scheduler_name = scheduler_name
        self._host_image = host_image
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._refused: dict[str, str] = {}
        """Model uid -> the refusal last reported (an Event only when it changes)."""
        self._namespaces: dict[str, str] = {}
        """Model uid -> namespace, to tidy its namespace's hosts once it is gone."""
        self._services: set[str] = set()
        """Models whose Service this replica has written."""
        self._hosts_for: dict[str, frozenset[tuple[int, str]]] = {}
        """Model uid -> its (ordinal, node) the hosts were last made to serve."""
        self._stale: set[str] = set()
        """Namespaces whose hosts are all to be checked again."""
        self._waiting: set[str] = set()
        """Namespaces with a replica on a node whose old host is still terminating."""
        self._quotas: dict[str, tuple[float, list[JsonObject]]] = {}
        """Namespace -> when its ResourceQuotas were last read, and what they were."""
        self._host_refusals: dict[str, str] = {}
        """Model uid -> the refusal of one of its hosts last reported (an Event on change)."""

    def hosts_changed(self, namespace: str) -> None:
        """A host of the namespace went away, or waits to: its hosts are all checked again."""
        models = self._ledger.by_namespace.get(namespace)
        if models:
            self._stale.add(namespace)
            self._dirty.add(next(iter(models)))
            self._wake.set()

    def changed(self, uid: str) -> None:
        """A model, or its placed replicas, changed (from the cache, on the loop)."""
        self._dirty.add(uid)
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(self._wake.wait(), RETRY_SECONDS)
            except TimeoutError:
                self._dirty.update(self._refused)
                waiting, self._waiting = self._waiting, set()
                for namespace in waiting:
                    self.hosts_changed(namespace)
            self._wake.clear()
            if not self._leading.is_set():
                continue
            if not self._dirty:
                continue
            dirty, self._dirty = self._dirty, set()
            for uid in sorted(dirty):
                if stop.is_set() or not self._leading.is_set():
                    break
                try:
                    await self._reconcile(uid)
                except ApiError as e:
                    log.warning("Reconciling TritonModel %s has failed (%s): retrying.", uid, e)
                    self._refused.setdefault(uid, "")
                except Exception:  # one model's failure must not stop the others'
                    log.exception("Reconciling TritonModel %s has failed: retrying.", uid)
                    self._refused.setdefault(uid, "")

    # ---- one model -----------------------------------------------------------------------------

    async def _reconcile(self, uid: str) -> None:
        model = self._ledger.models.get(uid)
        if model is None:
            self._refused.pop(uid, None)
            self._host_refusals.pop(uid, None)
            self._services.discard(uid)
            namespace = self._namespaces.pop(uid, None)
            if namespace is not None:
                before = self._hosts_for.get(uid, frozenset())
                await self._reconcile_hosts(namespace, {node for _, node in before})
            self._hosts_for.pop(uid, None)
            return
        self._namespaces[uid] = model.namespace
        quota = await self._quota(model)
        placed, refusal = self._place(model, quota)
        reason = EXCEEDED_QUOTA if quota is not None and quota.refused else "Unschedulable"
        status = self._status(model, placed, refusal, reason)
        if any(model.status.get(k) != v for k, v in status.items()):
            try:
                await self._call(
                    self._kube.patch_model_status, model.namespace, model.name, uid, status
                )
            except (NotFoundError, ConflictError):
                return  # deleted or recreated: its DELETED event frees what was assumed
        if refusal and self._refused.get(uid) != refusal:
            await self._call(
                self._kube.record_object_event,
                _involved(model),
                reason="FailedScheduling",
                message=refusal,
                reporting_instance=self._identity,
            )
        if refusal:
            self._refused[uid] = refusal
        else:
            self._refused.pop(uid, None)
        hosted = frozenset((o, r.node_name) for o, r in placed.items())
        last = self._hosts_for.get(uid)
        if model.namespace in self._stale:
            self._stale.discard(model.namespace)
            await self._reconcile_hosts(model.namespace, None)
        elif hosted != last:
            nodes = {node for _, node in hosted | (last or frozenset())}
            await self._reconcile_hosts(model.namespace, nodes)
        self._hosts_for[uid] = hosted
        if uid not in self._services:
            try:
                await self._call(self._kube.create_service, model.namespace, self._service(model))
            except ConflictError:
                pass  # there already: the binder's own, or a name the namespace chose to reuse
            except ApiError as e:
                if e.status == 0 or e.status >= 500 or e.status == 429:
                    raise
                await self._call(
                    self._kube.record_object_event,
                    _involved(model),
                    reason="FailedCreateService",
                    message=f"the binder cannot create Service {model.name}: {e}",
                    reporting_instance=self._identity,
                )
            self._services.add(uid)

    async def _quota(self, model: ModelInfo) -> QuotaCheck | None:
        """The namespace's quotas on GPU memory, read only when a replica is to be placed."""
        state = self._ledger.state
        if all(state.is_accounted(replica_uid(model.uid, o)) for o in range(model.replicas)):
            return None
        read_at, quotas = self._quotas.get(model.namespace, (-math.inf, []))
        if time.monotonic() - read_at > QUOTA_READ_SECONDS:
            loop = asyncio.get_running_loop()
            quotas = await loop.run_in_executor(
                self._executor, self._kube.list_quotas, model.namespace
            )
            self._quotas[model.namespace] = (time.monotonic(), quotas)
        limits = limits_from_api(quotas, self._keys)
        return QuotaCheck(limits, charged_in(self._ledger, model.namespace)) if limits else None

    def _place(
        self, model: ModelInfo, quota: QuotaCheck | None = None
    ) -> tuple[dict[int, PodInfo], str]:
        """The model's charged replicas after freeing those past spec.replicas and placing the
        missing ones that `quota` allows, and the refusal of the first refused or that fits
        nowhere ("" when all fit)."""
        state = self._ledger.state
        prefix = f"{model.uid}/"
        for rid in self._ledger.replica_uids(model.uid):
            if int(rid.rpartition("/")[2]) >= model.replicas:
                state.remove_pod(rid)
                state.untrack_pod(rid)
        placed: dict[int, PodInfo] = {}
        refusal = ""
        now = time.time()
        for ordinal in range(model.replicas):
            charged = state.charged_pod(f"{prefix}{ordinal}")
            if charged is not None:
                placed[ordinal] = charged
                continue
            if refusal:
                continue
            replica = model.replica(ordinal)
            exceeded = quota.refusal(replica.request) if quota is not None else ""
            if exceeded:
                refusal = f'tritonmodel "{model.name}" replica {ordinal}: {exceeded}'
                continue
            decision = place(state, replica, now=now, policy=self._policy)
            if isinstance(decision, Placement):
                proof = sign(self._ring(), replica, decision.node, decision.gpu.uuid)
                state.assume(replica, decision.node, decision.gpu.uuid, proof)
                if quota is not None:
                    quota.charge(replica.request)
                placed[ordinal] = replica.bound(decision.node, decision.gpu.uuid, proof)
            else:
                refusal = f"replica {ordinal}: {decision.message}"
        return placed, refusal

    def _status(
        self,
        model: ModelInfo,
        placed: dict[int, PodInfo],
        refusal: str,
        reason: str = "Unschedulable",
    ) -> JsonObject:
        if refusal:
            condition: dict[str, Any] = {
                "type": PLACED,
                "status": "False",
                "reason": reason,
            }
            condition["message"] = refusal
        else:
            condition = {"type": PLACED, "status": "True", "reason": "AllReplicasPlaced"}
            condition["message"] = f"{len(placed)} of {model.replicas} replicas placed"
        old = next(
            (
                c
                for c in model.status.get("conditions") or []
                if isinstance(c, dict) and c.get("type") == PLACED
            ),
            {},
        )
        same = old.get("status") == condition["status"]
        condition["lastTransitionTime"] = (
            old.get("lastTransitionTime") if same else None
        ) or now_rfc3339()
        if same and all(old.get(k) == condition[k] for k in ("reason", "message")):
            condition = dict(old)
        condition["observedGeneration"] = model.generation
        return {
            "observedGeneration": model.generation,
            "replicas": len(placed),
            "selector": f"{serves_label(self._keys, model.name)}=true",
            "placements": [
                {
                    "replica": ordinal,
                    "node": replica.node_name,
                    "gpu": replica.gpu_uuid,
                    "proof": replica.placement,
                    "host": host_name(replica.node_name),
                }
                for ordinal, replica in sorted(placed.items())
            ],
            "conditions": [condition],
        }

    # ---- hosts and Services --------------------------------------------------------------------

    def _hosted(self, namespace: str) -> dict[str, list[tuple[ModelInfo, int, PodInfo]]]:
        """Node -> the replicas of the namespace charged there (model, ordinal, replica)."""
        state = self._ledger.state
        nodes: dict[str, list[tuple[ModelInfo, int, PodInfo]]] = {}
        for uid in self._ledger.by_namespace.get(namespace, ()):
            model = self._ledger.models[uid]
            for ordinal in range(model.replicas):
                replica = state.charged_pod(f"{model.uid}/{ordinal}")
                if replica is not None:
                    nodes.setdefault(replica.node_name, []).append((model, ordinal, replica))
        return nodes

    async def _reconcile_hosts(self, namespace: str, nodes: set[str] | None) -> None:
        """Create, update or delete the namespace's hosts on `nodes` (None: every node) to
        serve the replicas charged there."""
        wanted = self._hosted(namespace)
        label = host_label(self._keys)
        there_now = self._ledger.hosts.get(namespace, {})
        for node, replicas in sorted(wanted.items()):
            if nodes is not None and node not in nodes:
                continue
            body = self._host(namespace, node, replicas)
            there = there_now.get(node)
            if there is not None and (there.get("metadata") or {}).get("deletionTimestamp"):
                # The last one is going away: a new host once it is gone.
                self._waiting.add(namespace)
                continue
            if there is None:
                try:
                    # A 409: made already, and its watch event is on the way.
                    with contextlib.suppress(ConflictError):
                        await self._call(self._kube.create_pod, namespace, body)
                except ApiError as e:
                    if e.status != 403:
                        raise
                    await self._host_refused(namespace, node, replicas, e)
                continue
            meta = there.get("metadata") or {}
            labels = meta.get("labels") or {}
            patch_labels: dict[str, Any] = dict(body["metadata"]["labels"])
            for key in labels:
                if key.startswith(f"{self._keys.prefix}serves-") and key not in patch_labels:
                    patch_labels[key] = None
            annotation = hosted_models_annotation(self._keys)
            if (
                any(labels.get(k) != v for k, v in patch_labels.items())
                or (meta.get("annotations") or {}).get(annotation)
                != body["metadata"]["annotations"][annotation]
                or meta.get("ownerReferences") != body["metadata"]["ownerReferences"]
            ):
                patch = {
                    "metadata": {
                        "labels": patch_labels,
                        "annotations": body["metadata"]["annotations"],
                        "ownerReferences": body["metadata"]["ownerReferences"],
                    }
                }
                await self._call(self._kube.merge_patch_pod, namespace, str(meta["name"]), patch)
        for node, there in list(there_now.items()):
            meta = there.get("metadata") or {}
            if node in wanted or meta.get("deletionTimestamp") or (nodes and node not in nodes):
                continue
            if (meta.get("labels") or {}).get(label) != "true":
                continue
            with contextlib.suppress(NotFoundError, ConflictError):
                await self._call(
                    self._kube.delete_pod, namespace, str(meta["name"]), str(meta["uid"])
                )

    async def _host_refused(
        self,
        namespace: str,
        node: str,
        replicas: list[tuple[ModelInfo, int, PodInfo]],
        error: ApiError,
    ) -> None:
        """The API server forbids the host (a ResourceQuota on pods, CPU or memory; a policy):
        each model placed there gets a Warning Event with its words, once per message, and the
        namespace's hosts are tried again every RETRY_SECONDS."""
        self._waiting.add(namespace)
        message = f"the binder cannot create model host {host_name(node)} on node {node}: "
        message += error.message
        for model in {model.uid: model for model, _, _ in replicas}.values():
            if self._host_refusals.get(model.uid) == message:
                continue
            self._host_refusals[model.uid] = message
            await self._call(
                self._kube.record_object_event,
                _involved(model),
                reason="FailedCreate",
                message=message,
                reporting_instance=self._identity,
            )

    def _host(
        self, namespace: str, node: str, replicas: list[tuple[ModelInfo, int, PodInfo]]
    ) -> JsonObject:
        """The host pod of `namespace` on `node` serving `replicas`."""
        labels = {host_label(self._keys): "true"}
        owners: dict[str, JsonObject] = {}
        hosted = []
        for model, ordinal, replica in sorted(replicas, key=lambda r: (r[0].name, r[1])):
            labels[serves_label(self._keys, model.name)] = "true"
            owners.setdefault(model.uid, _owner(model, False))
            hosted.append(
                HostedReplica(
                    model=model.name,
                    uid=model.uid,
                    replica=ordinal,
                    gpu=replica.gpu_uuid,
                    residency=RESIDENCY_ON_DEMAND if replica.on_demand else RESIDENCY_ALWAYS,
                    proof=replica.placement,
                    storage_uri=model.storage_uri,
                    concurrency=model.concurrency,
                    idle_seconds=model.idle_seconds,
                )
            )
        cpu = MODEL_HOST_BASE[CPU] + MODEL_HOST_PER_MODEL[CPU] * len(replicas)
        memory = MODEL_HOST_BASE[MEMORY] + MODEL_HOST_PER_MODEL[MEMORY] * len(replicas)
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": host_name(node),
                "namespace": namespace,
                "labels": labels,
                "annotations": {hosted_models_annotation(self._keys): encode_hosted(hosted)},
                "ownerReferences": list(owners.values()),
            },
            "spec": {
                "nodeName": node,
                "schedulerName": self._scheduler_name,
                "automountServiceAccountToken": False,
                "tolerations": [dict(GPU_TOLERATION)],
                "containers": [
                    {
                        "name": "proxy",
                        "image": self._host_image,
                        "ports": [
                            {"name": "http", "containerPort": 9000},
                            {"name": "grpc", "containerPort": 9001},
                            {"name": "metrics", "containerPort": 9002},
                        ],
                        "resources": {"requests": {"cpu": f"{cpu}m", "memory": str(memory)}},
                    }
                ],
            },
        }

    def _service(self, model: ModelInfo) -> JsonObject:
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": model.name,
                "namespace": model.namespace,
                "ownerReferences": [_owner(model, True)],
            },
            "spec": {
                "selector": {serves_label(self._keys, model.name): "true"},
                "ports": SERVICE_PORTS,
            },
        }

    async def _call(self, fn: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))
