"""The binder's view of a TritonModel: `ModelInfo`, converted once from the API object
(`model_from_api`), and its replicas, each a PodInfo judged by every rule a pod is
(`as_replica`); the references its hosts, Service and Events carry to it.

As binder.cluster.objects, which reads the pod the replicas are made of: conversion never raises
on user input (problems land in the template's `problem`), does no I/O and reads no clock.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from binder.cluster.modelsizes import DECLARED, ESTIMATE, MEASURED, booked_of
from binder.cluster.objects import (
    PodInfo,
    as_mapping,
    as_sequence,
    node_gpu_proof,
    pod_from_api,
)
from common.contract import (
    MIN_GPU_MEM,
    SPREAD_GPU,
    Keys,
    is_valid_model_id,
    model_id_problem,
)
from common.hosted import host_group, host_storage_problem, replica_name, replica_uid
from common.modelpod import gpu_tolerations
from common.podresources import MODEL_HOST_BASE, MODEL_HOST_PER_MODEL
from common.storage import StorageAnnotationError, read_storage_options

TRITONMODEL_KIND = "TritonModel"
TRITONMODEL_API_VERSION = "tritonshare.io/v1alpha1"


def as_replica(pod: PodInfo) -> PodInfo:
    """The pod as a TritonModel replica: placed by every rule a pod is (its GPU memory,
    residency, node rules, labels for pod (anti-)affinity and topology spread, priority), but
    holding no pod of its own: it asks its node for its share of its namespace's model host
    (`MODEL_HOST_PER_MODEL`), and the host's own requests and pod slot (`MODEL_HOST_BASE`) are
    charged once per (host group, node). A replica has no host ports."""
    return replace(pod, resources=dict(MODEL_HOST_PER_MODEL), host=MODEL_HOST_BASE, host_ports=())


def is_replica(uid: str) -> bool:
    """Whether a uid in the ledger is a TritonModel replica's ("<model uid>/<ordinal>")."""
    return "/" in uid


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """A TritonModel as the binder places it: each replica is `replica(ordinal)`, a PodInfo
    judged by every rule a pod is (`as_replica`)."""

    uid: str
    namespace: str
    name: str
    """metadata.name; the model id its clients send is `template.model_id` (spec.modelName,
    else this name)."""
    generation: int
    replicas: int
    """spec.replicas: how many replicas are wanted (a roll's surge adds one)."""
    template: PodInfo
    """Replica 0 unplaced; the others differ only in uid and name."""
    placed: Mapping[int, tuple[str, str, str]] = field(default_factory=dict)
    """status.placements as written: ordinal -> (node, GPU uuid, proof)."""
    placed_uris: Mapping[int, str] = field(default_factory=dict)
    """status.placements' storageUri as written: ordinal -> the files that replica was given
    (absent for a placement written without one: it takes spec.storageUri)."""
    nominated: Mapping[int, tuple[str, str, str]] = field(default_factory=dict)
    """status.nominations as written: ordinal -> (node, GPU uuid, proof) of the room a
    replica's preemption holds (`binder.framework.replicapreemption`)."""
    status: Mapping[str, Any] = field(default_factory=dict)
    """status as written, to write only what changes."""
    resource_version: str = ""
    storage_uri: str = ""
    """spec.storageUri: where the host's loader fetches the files."""
    storage_secret: str = ""
    """spec.storageSecret: the Secret of the model's namespace the host's loader fetches with."""
    storage_options: tuple[tuple[str, str], ...] = ()
    """Its s3-* and schema-path annotations (`common.storage`), passed to the host's loader."""
    storage_problem: str = ""
    """Why a model host cannot fetch its files ("" when it can): its replicas are not placed."""
    concurrency: int = 0
    """spec.maxConcurrency (0: none given)."""
    min_available: int = 0
    """spec.minAvailable: the ready replicas an eviction of its hosts must leave (0: none)."""
    idle_seconds: int = 0
    """spec.idleSeconds (0: none given)."""
    idempotent: bool | None = None
    """spec.idempotent: true, its calls may run twice, so its host's proxy sends again one lost
    with the node gateway's process; false, never; None (unset): as its config says."""
    priority_class: str = ""
    """spec.priorityClassName ("" for the cluster's default); the template's priority and
    preemption policy are resolved from it (`binder.cluster.priorities`)."""
    priority_problem: str = ""
    """Why the model's priority class cannot be resolved ("" when it can): its replicas are
    not placed."""
    autoscaling: Mapping[str, Any] | None = None
    """spec.autoscaling as written (None: the built-in autoscaler leaves the model alone),
    read by `binder.autoscaler.loop`."""
    size_source: str = DECLARED
    """Where the template's GPU memory comes from (`binder.cluster.modelsizes`): DECLARED
    (spec.gpuMemory), ESTIMATED or MEASURED."""
    gpu_memory: str = ""
    """The quantity a new replica is booked at, before the per-process allowance: spec.gpuMemory
    as written when DECLARED."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def host_group(self) -> str:
        """The key of the hosts that serve its replicas, one per node: its namespace's hosts
        of its storage Secret (`common.hosted.host_group`)."""
        return host_group(self.namespace, self.storage_secret)

    def replica(self, ordinal: int, node: str = "", gpu: str = "", proof: str = "") -> PodInfo:
        """Replica `ordinal`: uid "<model uid>/<ordinal>" and name "<model>/<ordinal>", which no
        pod can have (a slash), so a replica's proof never verifies for a pod nor one replica's
        for another, or for a model recreated under the same name (another uid)."""
        t = self.template
        return replace(
            t,
            uid=replica_uid(self.uid, ordinal),
            name=replica_name(self.name, ordinal),
            node_name=node,
            gpu_uuid=gpu,
            placement=proof,
            phase="Running" if node else "Pending",
        )


def model_from_api(
    obj: Mapping[str, Any],
    keys: Keys,
    scheduler_name: str,
    tenant_code: Collection[str] = (),
    min_gpu_mem: int = MIN_GPU_MEM,
    allowance: int = 0,
    estimate: int = ESTIMATE,
) -> ModelInfo:
    """Convert an API TritonModel; never raises on user input (problems land in the template's
    `problem`). Its replicas are read as the pod a model pod of the same spec would be, so
    every rule reads them alike; one that declares no GPU memory is booked as
    `binder.cluster.modelsizes` says (`estimate`: the first estimate, in bytes)."""
    meta = as_mapping(obj.get("metadata"))
    spec = as_mapping(obj.get("spec"))
    status = as_mapping(obj.get("status"))
    name = str(meta.get("name", ""))
    labels = {str(k): str(v) for k, v in as_mapping(meta.get("labels")).items()}
    pod_spec: dict[str, Any] = {
        key: spec[key]
        for key in ("nodeSelector", "affinity", "tolerations", "topologySpreadConstraints")
        if key in spec
    }
    # The replica runs in its namespace's model host, which tolerates the GPU nodes' taints as a
    # model pod does (the webhook adds the same tolerations to model pods).
    pod_spec["tolerations"] = [
        *as_sequence(spec.get("tolerations")),
        *(t for t in gpu_tolerations(keys) if t not in as_sequence(spec.get("tolerations"))),
    ]
    pod_spec["schedulerName"] = scheduler_name
    # Declared, else measured, else the first estimate (`binder.cluster.modelsizes`); a measured
    # figure holds the model's own process already: no allowance is booked on top of it.
    booked = booked_of(spec, status, estimate)
    if booked.source == MEASURED:
        allowance = 0
    pod_spec["containers"] = [
        {"name": "model", "resources": {"limits": {keys.gpu_mem: booked.gpu_memory}}}
    ]
    model_id = str(spec.get("modelName") or name)
    annotations = {
        keys.model_id: model_id,
        keys.residency: str(spec.get("residency") or "always"),
        keys.replica_spread: str(spec.get("replicaSpread") or SPREAD_GPU),
    }
    backend = as_mapping(meta.get("annotations")).get(keys.backend)
    if backend is not None:
        annotations[keys.backend] = str(backend)
    if spec.get("tritonVersion"):
        annotations[keys.triton_version] = str(spec["tritonVersion"])
    pod = {
        "metadata": {
            "uid": str(meta.get("uid", "")),
            "namespace": meta.get("namespace", ""),
            "name": name,
            "labels": labels,
            "annotations": annotations,
            "creationTimestamp": meta.get("creationTimestamp"),
        },
        "spec": pod_spec,
    }
    template = as_replica(pod_from_api(pod, keys, tenant_code, min_gpu_mem, allowance))
    secret = str(spec.get("storageSecret") or "")
    template = replace(template, host_group=host_group(template.namespace, secret))
    if template.problem and not is_valid_model_id(model_id):
        template = replace(template, problem=f"spec.modelName: {model_id_problem(model_id)}")
    placed: dict[int, tuple[str, str, str]] = {}
    placed_uris: dict[int, str] = {}
    for ordinal, entry in _by_ordinal(status.get("placements")):
        placed[ordinal] = node_gpu_proof(entry)
        if entry.get("storageUri"):
            placed_uris[ordinal] = str(entry["storageUri"])
    nominated = {o: node_gpu_proof(entry) for o, entry in _by_ordinal(status.get("nominations"))}
    replicas = spec.get("replicas", 1)
    generation = meta.get("generation", 0)
    uri = str(spec.get("storageUri") or "")
    options: tuple[tuple[str, str], ...] = ()
    storage_problem = host_storage_problem(uri, secret)
    if not storage_problem:
        try:
            scheme = uri.partition("://")[0].lower()
            options = read_storage_options(as_mapping(meta.get("annotations")), keys.prefix, scheme)
        except StorageAnnotationError as e:
            storage_problem = str(e)
    return ModelInfo(
        uid=template.uid,
        namespace=template.namespace,
        name=name,
        generation=generation if isinstance(generation, int) else 0,
        replicas=replicas if isinstance(replicas, int) and replicas >= 0 else 0,
        template=template,
        placed=placed,
        placed_uris=placed_uris,
        nominated=nominated,
        status=status,
        resource_version=str(meta.get("resourceVersion", "")),
        storage_uri=uri,
        storage_secret=secret,
        storage_options=options,
        storage_problem=storage_problem,
        concurrency=_whole(spec.get("maxConcurrency")),
        min_available=_whole(spec.get("minAvailable")),
        idle_seconds=_whole(spec.get("idleSeconds")),
        idempotent=spec["idempotent"] if isinstance(spec.get("idempotent"), bool) else None,
        priority_class=str(spec.get("priorityClassName") or ""),
        autoscaling=spec["autoscaling"] if isinstance(spec.get("autoscaling"), Mapping) else None,
        size_source=booked.source,
        gpu_memory=booked.gpu_memory,
    )


def _by_ordinal(entries: object) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """The entries of a status list with a valid `replica` ordinal, with it."""
    for entry in map(as_mapping, as_sequence(entries)):
        ordinal = entry.get("replica")
        if isinstance(ordinal, int) and not isinstance(ordinal, bool) and ordinal >= 0:
            yield ordinal, entry


def _whole(value: object) -> int:
    """A positive whole number of the spec, else 0 (the schema already refuses the others)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def owner_reference(model: ModelInfo, *, controller: bool) -> dict[str, Any]:
    """The ownerReference to `model` of what it owns (its Service: the controller) or shares
    (its hosts)."""
    return {
        "apiVersion": TRITONMODEL_API_VERSION,
        "kind": TRITONMODEL_KIND,
        "name": model.name,
        "uid": model.uid,
        "controller": controller,
    }


def event_object(model: ModelInfo) -> dict[str, Any]:
    """The model as an Event's involvedObject."""
    return {
        "apiVersion": TRITONMODEL_API_VERSION,
        "kind": TRITONMODEL_KIND,
        "namespace": model.namespace,
        "name": model.name,
        "uid": model.uid,
    }
