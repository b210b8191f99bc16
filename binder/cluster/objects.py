"""The binder's domain: immutable views of nodes, pods and leases, converted once from API dicts.

Everything the placement needs is read here, where API objects enter, so the rest of the binder
never touches camelCase dicts. Conversion never raises on bad user input: a malformed quantity or
a missing model id becomes a `problem` string on the pod (what is wrong and what to do), which the
controller turns into an event. This module does no I/O and reads no clock.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import MappingProxyType
from typing import Any, NamedTuple

from binder.cluster.podterms import (
    NO_AFFINITY,
    PodAffinity,
    SpreadConstraint,
    pod_affinity_from_spec,
    spread_from_spec,
)
from common.backends import BackendError, declared_backend, process_allowance
from common.contract import (
    MIN_GPU_MEM,
    RESIDENCY_ON_DEMAND,
    TENANT_CODE_NODE,
    ContractError,
    Keys,
    gpu_mem_problem,
    is_valid_model_id,
    model_id_problem,
    parse_overcommit,
    validate_residency,
)
from common.hosted import (
    host_group,
    host_storage_problem,
    replica_name,
    replica_uid,
)
from common.modelpod import gpu_tolerations
from common.podresources import (
    MODEL_HOST_BASE,
    MODEL_HOST_PER_MODEL,
    HostPort,
    host_ports,
    node_allocatable,
    pod_requests,
)
from common.quantity import QuantityError
from common.storage import StorageAnnotationError, read_s3_options
from common.tritonname import private_triton_name

TERMINATED_PHASES = frozenset({"Succeeded", "Failed"})
_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Requirement:
    """One node selector requirement (`matchExpressions` or `matchFields` entry)."""

    key: str
    operator: str
    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SelectorTerm:
    """One node selector term: its requirements are ANDed."""

    match_expressions: tuple[Requirement, ...] = ()
    match_fields: tuple[Requirement, ...] = ()


@dataclass(frozen=True, slots=True)
class PreferredTerm:
    """A preferred node affinity term and its weight."""

    weight: int
    preference: SelectorTerm


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = ""
    value: str = ""
    effect: str = ""


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class Constraints:
    """Everything a pod says about which nodes it may use; hashable, so pods that share a template
    share one cached evaluation over all nodes."""

    node_selector: tuple[tuple[str, str], ...] = ()
    required_terms: tuple[SelectorTerm, ...] | None = None
    preferred_terms: tuple[PreferredTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    tenant_code: bool = False
    """Whether the pod's namespace may run its own code in Triton (the binder's
    --tenant-code-namespaces): such a pod goes only to nodes dedicated to tenant code, any
    other only to nodes that are not."""


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU as the agent publishes it; `memory` in bytes."""

    uuid: str
    index: int
    product: str
    memory: int
    healthy: bool
    used: int | None = None
    """Bytes in use as the agent last published (NVML, rounded); None when not published."""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """The parts of a Node the binder decides on. Equal values mean no placement-relevant change."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict, hash=False, compare=True)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    tenant_code: bool = False
    """Labelled as dedicated to tenant code (`Keys.tenant_code`)."""
    gpus: tuple[Gpu, ...] = ()
    gpu_problem: str = ""
    """Why the agent's GPU annotation could not be read; empty when it was fine or absent."""
    measured: Mapping[str, int] = field(default_factory=dict, hash=False, compare=True)
    """Name in Triton -> GPU memory that loaded model is measured to use on this node (bytes):
    a pod's private name, or a legacy model's public id (the agent's gpu-usage annotation)."""
    allocatable: Mapping[str, int] | None = field(default=None, hash=False, compare=True)
    """`status.allocatable` (cpu in millicores, the rest in whole units); None when the node
    publishes none, and then NodeResourcesFit does not judge it (as for a node object made by
    hand; a kubelet always publishes it)."""
    overcommit: float = 1.0
    """The over-commit factor of the node's GPUs for `on-demand` models (its label; 1: off)."""
    overcommit_problem: str = ""
    """Why the node's over-commit label could not be read (then the factor is 1); empty if fine."""

    def measured_of(self, pod: PodInfo) -> int | None:
        """What the pod's model is measured to use here: by its private name; else, for a model
        installed before private names, by its model id (another pod's legacy model of the same
        id can only make this pod look larger, never another pod smaller)."""
        if not pod.model_id or not self.measured:
            return None  # the common case costs no digest (about 3 us each)
        name = pod.triton_name
        if name and name in self.measured:
            return self.measured[name]
        return self.measured.get(pod.model_id)


REVISION_LABELS = ("pod-template-hash", "controller-revision-hash")
"""The labels that name a pod's revision: a Deployment's ReplicaSet, a StatefulSet's revision."""


class ModelKey(NamedTuple):
    """What the binder spreads over nodes: one revision of one model id of a namespace.

    Pods and replicas of one revision prefer a node without one (each has its own private name
    in Triton, so they may share one), and another namespace's model of the same id never
    counts. Pods with no revision label are one revision ("")."""

    namespace: str
    model_id: str
    revision: str

    def __str__(self) -> str:
        named = f"{self.namespace}/{self.model_id}"
        return f"{named} at revision {self.revision}" if self.revision else named


@dataclass(frozen=True, slots=True)
class PodInfo:
    """The parts of a Pod the binder decides on or accounts for."""

    uid: str
    namespace: str
    name: str
    scheduler_name: str = ""
    node_name: str = ""
    phase: str = "Pending"
    deleting: bool = False
    request: int = 0
    """GPU memory booked in bytes: the effective request, plus the per-process allowance for a
    model that may run in a process of its own (0 when the pod asks for none)."""
    allowance: int = 0
    """The part of `request` that is the per-process allowance, charged to quotas with the
    rest as Kubernetes charges a pod's overhead; the API server counts `asked` alone."""
    model_id: str = ""
    revision: str = ""
    """The pod's `pod-template-hash` (Deployment) or `controller-revision-hash` (StatefulSet)
    label; empty when it has neither."""
    gpu_uuid: str = ""
    """The GPU the binder chose, from the pod's annotation; empty before binding."""
    placement: str = ""
    """The pod's proof of placement annotation as written (checked by `binder.cluster.proofs`)."""
    constraints: Constraints = Constraints()
    problem: str = ""
    """Why the pod cannot be scheduled whatever the cluster looks like; empty when it can."""
    created: float = 0.0
    """Creation time, seconds since the epoch (0 when unknown)."""
    resource_version: str = ""
    priority: int = 0
    """spec.priority, as the priority admission plugin resolved it (0 when absent)."""
    priority_class: str = ""
    """spec.priorityClassName, which a quota's PriorityClass scope selects on."""
    controlled: bool = False
    """Whether an owner reference marks a controller (a ReplicaSet, a StatefulSet...) that
    recreates the pod when it is evicted."""
    labels: Mapping[str, str] = field(default_factory=dict, hash=False, compare=True)
    resources: Mapping[str, int] = field(default_factory=dict, hash=False, compare=True)
    """Effective requests per resource, as `common.podresources.pod_requests` reads them."""
    host_ports: tuple[HostPort, ...] = ()
    affinity: PodAffinity = NO_AFFINITY
    spread: tuple[SpreadConstraint, ...] = ()
    owner: str = ""
    """The controlling owner as "Kind/uid" ("" without one): pods of one ReplicaSet or
    StatefulSet, which kube-scheduler's default topology spread keeps apart."""
    preemption_policy: str = "PreemptLowerPriority"
    nominated_node: str = ""
    """status.nominatedNodeName: where a preemption made room for the pod."""
    nomination: tuple[str, str, str] | None = None
    """The binder's nomination annotation: (node, GPU uuid, proof) of the room held."""
    on_demand: bool = False
    """Residency `on-demand`: the model may be unloaded when idle (placed against the GPU's
    over-committed memory); False for `always`, the default."""
    host: Mapping[str, int] | None = field(default=None, hash=False, compare=True)
    """For a TritonModel replica (`as_replica`): the requests of the model host that serves it,
    charged with one pod slot on a node only while its host group has no replica there yet
    (`binder.cluster.podindex`); `resources` is then the replica's own share. None for a pod, which
    takes its own slot and its requests."""
    host_group: str = ""
    """For a TritonModel replica: the hosts that serve it, one per node (its namespace's of its
    storage Secret, `common.hosted.host_group`); "" stands for the namespace's."""
    model_key: ModelKey = field(init=False, repr=False, compare=False, hash=False)
    """The (namespace, model id, revision) placement spreads over nodes; made once here, as
    placement reads it for every decision."""

    @property
    def asked(self) -> int:
        """The GPU memory the pod or TritonModel asks, as the API server's quota admission
        counts a pod (the binder's quota check adds the allowance: `binder.framework.quota`)."""
        return self.request - self.allowance

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "model_key", ModelKey(self.namespace, self.model_id, self.revision)
        )

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def bound(self, node: str, gpu_uuid: str, placement: str) -> PodInfo:
        """The pod as the binder binds it: on `node`, its GPU and proof written (made field by
        field: `dataclasses.replace` costs several times more, on every decision)."""
        return PodInfo(
            uid=self.uid,
            namespace=self.namespace,
            name=self.name,
            scheduler_name=self.scheduler_name,
            node_name=node,
            phase=self.phase,
            request=self.request,
            allowance=self.allowance,
            model_id=self.model_id,
            revision=self.revision,
            gpu_uuid=gpu_uuid,
            placement=placement,
            constraints=self.constraints,
            created=self.created,
            priority=self.priority,
            priority_class=self.priority_class,
            controlled=self.controlled,
            labels=self.labels,
            resources=self.resources,
            host_ports=self.host_ports,
            affinity=self.affinity,
            spread=self.spread,
            owner=self.owner,
            preemption_policy=self.preemption_policy,
            on_demand=self.on_demand,
            host=self.host,
            host_group=self.host_group,
        )

    @property
    def triton_name(self) -> str:
        """The private name the node's agent gives the pod's model in Triton ("" without a valid
        model id); a model installed before private names keeps its model id there instead."""
        if not is_valid_model_id(self.model_id) or not self.namespace or not self.uid:
            return ""
        return private_triton_name(self.namespace, self.model_id, self.uid)

    @property
    def claims_share(self) -> bool:
        """Whether the pod carries tritonshare resources or annotations (GPU memory, a model id,
        a GPU, a proof): what a pod placed by the binder carries."""
        return self.request > 0 or bool(self.model_id or self.gpu_uuid or self.placement)

    @property
    def terminated(self) -> bool:
        """Succeeded and Failed pods hold no GPU memory; a deleting pod still does until gone."""
        return self.phase in TERMINATED_PHASES


def as_replica(pod: PodInfo) -> PodInfo:
    """The pod as a TritonModel replica: placed by every rule a pod is (its GPU memory,
    residency, node rules, labels for pod (anti-)affinity and topology spread, priority), but
    holding no pod of its own: it asks its node for its share of its namespace's model host
    (`MODEL_HOST_PER_MODEL`), and the host's own requests and pod slot (`MODEL_HOST_BASE`) are
    charged once per (host group, node). A replica has no host ports."""
    return replace(pod, resources=dict(MODEL_HOST_PER_MODEL), host=MODEL_HOST_BASE, host_ports=())


def parse_time(value: object) -> float | None:
    """An RFC 3339 API timestamp as seconds since the epoch, or None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()  # 3.11 reads the "Z" itself
    except ValueError:
        return None


def _mapping(value: object) -> Mapping[str, Any]:
    # JSON decodes to dicts, and absent fields are None: both skip the slower abstract-class check.
    if type(value) is dict:
        return value
    if value is None:
        return _EMPTY
    return value if isinstance(value, Mapping) else _EMPTY


def _sequence(value: object) -> Sequence[Any]:
    # A tuple of types: `list | tuple` builds a union object on every call.
    return value if isinstance(value, (list, tuple)) else ()


def _requirements(raw: object) -> tuple[Requirement, ...]:
    out = []
    for item in _sequence(raw):
        item = _mapping(item)
        values = tuple(str(v) for v in _sequence(item.get("values")))
        out.append(Requirement(str(item.get("key", "")), str(item.get("operator", "")), values))
    return tuple(out)


def _term(raw: object) -> SelectorTerm:
    raw = _mapping(raw)
    return SelectorTerm(
        _requirements(raw.get("matchExpressions")), _requirements(raw.get("matchFields"))
    )


def constraints_from_spec(spec: Mapping[str, Any], tenant_code: bool = False) -> Constraints:
    """Read nodeSelector, node affinity and tolerations from a pod spec (API-shaped), for a pod
    whose namespace may (`tenant_code`) or may not run its own code in Triton."""
    raw_selector = _mapping(spec.get("nodeSelector")).items()
    selector = tuple(sorted((str(k), str(v)) for k, v in raw_selector))
    node_affinity = _mapping(_mapping(spec.get("affinity")).get("nodeAffinity"))
    required_raw = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    required: tuple[SelectorTerm, ...] | None = None
    if isinstance(required_raw, Mapping):
        required = tuple(_term(t) for t in _sequence(required_raw.get("nodeSelectorTerms")))
    preferred = []
    for item in _sequence(node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution")):
        item = _mapping(item)
        weight = item.get("weight", 0)
        preferred.append(
            PreferredTerm(weight if isinstance(weight, int) else 0, _term(item.get("preference")))
        )
    tolerations = tuple(
        Toleration(
            str(t.get("key") or ""),
            str(t.get("operator") or ""),
            str(t.get("value") or ""),
            str(t.get("effect") or ""),
        )
        for t in map(_mapping, _sequence(spec.get("tolerations")))
    )
    return Constraints(selector, required, tuple(preferred), tolerations, tenant_code)


def effective_request(spec: Mapping[str, Any], resource: str) -> int:
    """The pod's effective request of `resource`, as Kubernetes computes it
    (`common.podresources.pod_requests`: containers and sidecars summed, the largest init
    container, the overhead). Raises QuantityError for an unreadable quantity."""
    return pod_requests(spec).get(resource, 0)


def _revision(labels: Mapping[str, Any]) -> str:
    for label in REVISION_LABELS:
        value = labels.get(label)
        if value:
            return str(value)
    return ""


def pod_from_api(
    obj: Mapping[str, Any],
    keys: Keys,
    tenant_code: Collection[str] = (),
    min_gpu_mem: int = MIN_GPU_MEM,
    allowance: int = 0,
) -> PodInfo:
    """Convert an API pod; never raises on user input (problems land in `problem`).
    `tenant_code`: the namespaces allowed to run their own code in Triton; `min_gpu_mem`: the
    least GPU memory a model may ask (`--min-gpu-mem`); `allowance`: the per-process allowance,
    booked in `request` unless the pod declares an in-process backend."""
    meta = _mapping(obj.get("metadata"))
    spec = _mapping(obj.get("spec"))
    status = _mapping(obj.get("status"))
    annotations = _mapping(meta.get("annotations"))
    problem = ""
    try:
        resources = pod_requests(spec)
    except QuantityError as e:
        resources = {}
        fix = f"{keys.gpu_mem} limit" if keys.gpu_mem in str(e) else "resources"
        problem = f"{e}; fix the pod's {fix}"
    # GPU memory is the binder's own, accounted per GPU (binder.cluster.clusterstate): not
    # NodeResourcesFit's.
    request = resources.pop(keys.gpu_mem, 0)
    labels = {str(k): str(v) for k, v in _mapping(meta.get("labels")).items()}
    namespace = str(meta.get("namespace", ""))
    model_id = str(annotations.get(keys.model_id) or "")
    owner = _controller(meta.get("ownerReferences"))
    if not problem:
        problem = gpu_mem_problem(request, min_gpu_mem, keys.gpu_mem)
    if not problem:
        if not model_id:
            problem = (
                f"pod has no {keys.model_id} annotation; set it to the model's name, the one its "
                f"clients send, so the agent knows which model the pod serves"
            )
        elif not is_valid_model_id(model_id):
            problem = f"annotation {keys.model_id}: {model_id_problem(model_id)}"
    try:
        declared = declared_backend(annotations.get(keys.backend), keys.backend)
    except BackendError as e:
        declared, problem = "", problem or str(e)
    booked = process_allowance(declared, allowance) if request > 0 else 0
    request += booked
    residency = annotations.get(keys.residency)
    if residency is not None and not problem:
        try:
            validate_residency(str(residency), keys.residency)
        except ContractError as e:
            problem = str(e)
    return PodInfo(
        uid=str(meta.get("uid", "")),
        namespace=namespace,
        name=str(meta.get("name", "")),
        scheduler_name=str(spec.get("schedulerName") or "default-scheduler"),
        node_name=str(spec.get("nodeName") or ""),
        phase=str(status.get("phase") or "Pending"),
        deleting=bool(meta.get("deletionTimestamp")),
        request=request,
        allowance=booked,
        model_id=model_id,
        revision=_revision(_mapping(meta.get("labels"))),
        gpu_uuid=str(annotations.get(keys.gpu) or ""),
        placement=str(annotations.get(keys.placement) or ""),
        constraints=constraints_from_spec(spec, namespace in tenant_code),
        problem=problem,
        created=parse_time(meta.get("creationTimestamp")) or 0.0,
        resource_version=str(meta.get("resourceVersion", "")),
        priority=_priority(spec.get("priority")),
        priority_class=str(spec.get("priorityClassName") or ""),
        controlled=bool(owner),
        labels=labels,
        resources=resources,
        host_ports=host_ports(spec),
        # A node autoscaling placeholder's anti-affinity says which nodes a node autoscaler need
        # not add; it keeps no model off the node added for it (binder.nodescaling).
        affinity=NO_AFFINITY
        if f"{keys.prefix}placeholder" in labels
        else pod_affinity_from_spec(spec, namespace, labels),
        spread=spread_from_spec(spec, labels),
        owner=owner,
        preemption_policy=str(spec.get("preemptionPolicy") or "PreemptLowerPriority"),
        nominated_node=str(status.get("nominatedNodeName") or ""),
        nomination=_nomination(annotations.get(keys.nomination)),
        on_demand=residency == RESIDENCY_ON_DEMAND,
    )


def _nomination(value: object) -> tuple[str, str, str] | None:
    """The nomination annotation's (node, GPU uuid, proof); None if absent or not an object."""
    try:
        entry = json.loads(str(value)) if value else None
    except ValueError:
        return None
    return _where(entry) if isinstance(entry, Mapping) else None


def _priority(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _controller(references: object) -> str:
    """The controlling owner reference as "Kind/uid", or ""."""
    for ref in _sequence(references):
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return f"{ref.get('kind', '')}/{ref.get('uid', '')}"
    return ""


def _gpus(annotations: Mapping[str, Any], keys: Keys) -> tuple[tuple[Gpu, ...], str]:
    raw = annotations.get(keys.gpus)
    if raw is None:
        return (), ""
    where = f"annotation {keys.gpus}"
    try:
        items = json.loads(raw) if isinstance(raw, str) else None
    except ValueError as e:
        return (), f"{where} is not JSON ({e}); the node's agent must rewrite it"
    if not isinstance(items, list):
        return (), f"{where} is not a JSON list; the node's agent must rewrite it"
    gpus = []
    for position, item in enumerate(items):
        if not isinstance(item, Mapping) or not isinstance(item.get("uuid"), str):
            return (), f"{where}: entry {position} has no uuid; the node's agent must rewrite it"
        memory = item.get("memory")
        index = item.get("index", position)
        if not isinstance(memory, int) or isinstance(memory, bool) or memory < 0:
            return (), f"{where}: GPU {item['uuid']} has no memory size in bytes"
        gpus.append(
            Gpu(
                uuid=item["uuid"],
                index=index if isinstance(index, int) else position,
                product=str(item.get("product", "")),
                memory=memory,
                healthy=item.get("healthy", True) is True,
            )
        )
    return tuple(gpus), ""


def _usage(
    annotations: Mapping[str, Any], keys: Keys, gpus: tuple[Gpu, ...]
) -> tuple[tuple[Gpu, ...], dict[str, int]]:
    """The GPUs with their published used memory, and each loaded model's measured memory, from
    the agent's gpu-usage annotation; a malformed or absent one adds nothing (the requests
    alone count, as before the agent measured)."""
    try:
        usage = json.loads(str(annotations.get(keys.gpu_usage) or "{}"))
    except ValueError:
        return gpus, {}
    if not isinstance(usage, Mapping):
        return gpus, {}
    measured: dict[str, int] = {}
    with_used = []
    for gpu in gpus:
        entry = usage.get(gpu.uuid)
        if not isinstance(entry, Mapping):
            with_used.append(gpu)
            continue
        used = entry.get("used")
        valid = isinstance(used, int) and not isinstance(used, bool) and used >= 0
        with_used.append(replace(gpu, used=used) if valid else gpu)
        for model, size in _mapping(entry.get("models")).items():
            if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
                measured[str(model)] = size
    return tuple(with_used), measured


def node_from_api(obj: Mapping[str, Any], keys: Keys) -> NodeInfo:
    """Convert an API node; a malformed GPU annotation leaves the node without GPUs, with why."""
    meta = _mapping(obj.get("metadata"))
    spec = _mapping(obj.get("spec"))
    labels = {str(k): str(v) for k, v in _mapping(meta.get("labels")).items()}
    taints = tuple(
        Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in map(_mapping, _sequence(spec.get("taints")))
    )
    annotations = _mapping(meta.get("annotations"))
    gpus, problem = _gpus(annotations, keys)
    gpus, measured = _usage(annotations, keys, gpus)
    status = _mapping(obj.get("status"))
    allocatable = node_allocatable(status) if "allocatable" in status else None
    overcommit, overcommit_problem = 1.0, ""
    label = labels.get(keys.gpu_mem_overcommit)
    if label is not None:
        try:
            overcommit = parse_overcommit(label, keys.gpu_mem_overcommit)
        except ContractError as e:
            overcommit_problem = f"{e}; the binder places this node's GPUs without over-commit"
    return NodeInfo(
        name=str(meta.get("name", "")),
        labels=labels,
        taints=taints,
        unschedulable=bool(spec.get("unschedulable")),
        tenant_code=labels.get(keys.tenant_code) == TENANT_CODE_NODE,
        gpus=gpus,
        gpu_problem=problem,
        measured=measured,
        allocatable=allocatable,
        overcommit=overcommit,
        overcommit_problem=overcommit_problem,
    )


def lease_expiry(obj: Mapping[str, Any]) -> float:
    """When an agent's Lease runs out (seconds since the epoch); 0 when it never was valid."""
    spec = _mapping(obj.get("spec"))
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    duration = spec.get("leaseDurationSeconds")
    if renewed is None or not isinstance(duration, int):
        return 0.0
    return renewed + duration


# ---- TritonModels ------------------------------------------------------------------------------

TRITONMODEL_KIND = "TritonModel"
TRITONMODEL_API_VERSION = "tritonshare.io/v1alpha1"


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
    """Its s3-* annotations, as a model pod's (`common.storage`), passed to the host's loader."""
    storage_problem: str = ""
    """Why a model host cannot fetch its files ("" when it can): its replicas are not placed."""
    concurrency: int = 0
    """spec.maxConcurrency (0: none given)."""
    min_available: int = 0
    """spec.minAvailable: the ready replicas an eviction of its hosts must leave (0: none)."""
    idle_seconds: int = 0
    """spec.idleSeconds (0: none given)."""
    priority_class: str = ""
    """spec.priorityClassName ("" for the cluster's default); the template's priority and
    preemption policy are resolved from it (`binder.cluster.priorities`)."""
    priority_problem: str = ""
    """Why the model's priority class cannot be resolved ("" when it can): its replicas are
    not placed."""
    autoscaling: Mapping[str, Any] | None = None
    """spec.autoscaling as written (None: the built-in autoscaler leaves the model alone),
    read by `binder.autoscaler.loop`."""

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
) -> ModelInfo:
    """Convert an API TritonModel; never raises on user input (problems land in the template's
    `problem`). Its replicas are read as the pod a model pod of the same spec would be, so
    every rule reads them alike."""
    meta = _mapping(obj.get("metadata"))
    spec = _mapping(obj.get("spec"))
    status = _mapping(obj.get("status"))
    name = str(meta.get("name", ""))
    labels = {str(k): str(v) for k, v in _mapping(meta.get("labels")).items()}
    pod_spec: dict[str, Any] = {
        key: spec[key]
        for key in ("nodeSelector", "affinity", "tolerations", "topologySpreadConstraints")
        if key in spec
    }
    # The replica runs in its namespace's model host, which tolerates the GPU nodes' taints as a
    # model pod does (the webhook adds the same tolerations to model pods).
    pod_spec["tolerations"] = [
        *_sequence(spec.get("tolerations")),
        *(t for t in gpu_tolerations(keys) if t not in _sequence(spec.get("tolerations"))),
    ]
    pod_spec["schedulerName"] = scheduler_name
    pod_spec["containers"] = [
        {"name": "model", "resources": {"limits": {keys.gpu_mem: spec.get("gpuMemory", "0")}}}
    ]
    model_id = str(spec.get("modelName") or name)
    annotations = {keys.model_id: model_id, keys.residency: str(spec.get("residency") or "always")}
    backend = _mapping(meta.get("annotations")).get(keys.backend)
    if backend is not None:
        annotations[keys.backend] = str(backend)
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
        placed[ordinal] = _where(entry)
        if entry.get("storageUri"):
            placed_uris[ordinal] = str(entry["storageUri"])
    nominated = {o: _where(entry) for o, entry in _by_ordinal(status.get("nominations"))}
    replicas = spec.get("replicas", 1)
    generation = meta.get("generation", 0)
    uri = str(spec.get("storageUri") or "")
    options: tuple[tuple[str, str], ...] = ()
    storage_problem = host_storage_problem(uri, secret)
    if not storage_problem:
        try:
            scheme = uri.partition("://")[0].lower()
            options = read_s3_options(_mapping(meta.get("annotations")), keys.prefix, scheme)
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
        priority_class=str(spec.get("priorityClassName") or ""),
        autoscaling=spec["autoscaling"] if isinstance(spec.get("autoscaling"), Mapping) else None,
    )


def _by_ordinal(entries: object) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """The entries of a status list with a valid `replica` ordinal, with it."""
    for entry in map(_mapping, _sequence(entries)):
        ordinal = entry.get("replica")
        if isinstance(ordinal, int) and not isinstance(ordinal, bool) and ordinal >= 0:
            yield ordinal, entry


def _where(entry: Mapping[str, Any]) -> tuple[str, str, str]:
    """A status entry's (node, GPU uuid, proof)."""
    return (
        str(entry.get("node") or ""),
        str(entry.get("gpu") or ""),
        str(entry.get("proof") or ""),
    )


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
