"""The binder's domain: immutable views of nodes, pods and leases, converted once from API dicts.

Everything the placement needs is read here, where API objects enter, so the rest of the binder
never touches camelCase dicts. Conversion never raises on bad user input: a malformed quantity or
a missing model id becomes a `problem` string on the pod (what is wrong and what to do), which the
controller turns into an event. This module does no I/O and reads no clock.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
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
    SPREAD_GPU,
    TENANT_CODE_NODE,
    ContractError,
    Keys,
    gpu_mem_problem,
    is_valid_model_id,
    model_id_problem,
    parse_overcommit,
    validate_replica_spread,
    validate_residency,
    validate_triton_version,
)
from common.podresources import (
    HostPort,
    host_ports,
    node_allocatable,
    pod_requests,
)
from common.quantity import QuantityError
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

    def avoiding(self, node: str) -> Constraints:
        """These constraints, and never on `node` (a required `metadata.name NotIn` field)."""
        away = Requirement("metadata.name", "NotIn", (node,))
        terms = (SelectorTerm(),) if self.required_terms is None else self.required_terms
        required = tuple(replace(t, match_fields=(*t.match_fields, away)) for t in terms)
        return replace(self, required_terms=required)


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
    triton_version: str = ""
    """The NGC release of the node's Triton its agent publishes (`24.10`); "" when none is."""

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
    """The pod's proof of placement annotation as written (checked by
    `binder.cluster.chargedpods`)."""
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
    replica_spread: str = SPREAD_GPU
    """How placement spreads the replicas of its model revision (`model_key`): `GPU` (other
    nodes first, then other GPUs of a node), `Node` (other nodes only) or `None` (packed)."""
    triton_version: str = ""
    """The NGC Triton release the model needs (a TensorRT plan's): placed only on nodes whose
    agent publishes it; "" for any node."""
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
            replica_spread=self.replica_spread,
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


def parse_time(value: object) -> float | None:
    """An RFC 3339 API timestamp as seconds since the epoch, or None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()  # 3.11 reads the "Z" itself
    except ValueError:
        return None


def as_mapping(value: object) -> Mapping[str, Any]:
    """An API field as a mapping: empty when absent or of another type."""
    # JSON decodes to dicts, and absent fields are None: both skip the slower abstract-class check.
    if type(value) is dict:
        return value
    if value is None:
        return _EMPTY
    return value if isinstance(value, Mapping) else _EMPTY


def as_sequence(value: object) -> Sequence[Any]:
    """An API field as a sequence: empty when absent or of another type."""
    # A tuple of types: `list | tuple` builds a union object on every call.
    return value if isinstance(value, (list, tuple)) else ()


def _requirements(raw: object) -> tuple[Requirement, ...]:
    out = []
    for item in as_sequence(raw):
        item = as_mapping(item)
        values = tuple(str(v) for v in as_sequence(item.get("values")))
        out.append(Requirement(str(item.get("key", "")), str(item.get("operator", "")), values))
    return tuple(out)


def _term(raw: object) -> SelectorTerm:
    raw = as_mapping(raw)
    return SelectorTerm(
        _requirements(raw.get("matchExpressions")), _requirements(raw.get("matchFields"))
    )


def constraints_from_spec(spec: Mapping[str, Any], tenant_code: bool = False) -> Constraints:
    """Read nodeSelector, node affinity and tolerations from a pod spec (API-shaped), for a pod
    whose namespace may (`tenant_code`) or may not run its own code in Triton."""
    raw_selector = as_mapping(spec.get("nodeSelector")).items()
    selector = tuple(sorted((str(k), str(v)) for k, v in raw_selector))
    node_affinity = as_mapping(as_mapping(spec.get("affinity")).get("nodeAffinity"))
    required_raw = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    required: tuple[SelectorTerm, ...] | None = None
    if isinstance(required_raw, Mapping):
        required = tuple(_term(t) for t in as_sequence(required_raw.get("nodeSelectorTerms")))
    preferred = []
    for item in as_sequence(node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution")):
        item = as_mapping(item)
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
        for t in map(as_mapping, as_sequence(spec.get("tolerations")))
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
    meta = as_mapping(obj.get("metadata"))
    spec = as_mapping(obj.get("spec"))
    status = as_mapping(obj.get("status"))
    annotations = as_mapping(meta.get("annotations"))
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
    labels = {str(k): str(v) for k, v in as_mapping(meta.get("labels")).items()}
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
    spread = str(annotations.get(keys.replica_spread) or SPREAD_GPU)
    if not problem:
        try:
            validate_replica_spread(spread, f"annotation {keys.replica_spread}")
        except ContractError as e:
            problem = str(e)
    triton_version = str(annotations.get(keys.triton_version) or "")
    if triton_version and not problem:
        try:
            validate_triton_version(triton_version, f"annotation {keys.triton_version}")
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
        revision=_revision(as_mapping(meta.get("labels"))),
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
        replica_spread=spread,
        triton_version=triton_version,
    )


def _nomination(value: object) -> tuple[str, str, str] | None:
    """The nomination annotation's (node, GPU uuid, proof); None if absent or not an object."""
    try:
        entry = json.loads(str(value)) if value else None
    except ValueError:
        return None
    return node_gpu_proof(entry) if isinstance(entry, Mapping) else None


def node_gpu_proof(entry: Mapping[str, Any]) -> tuple[str, str, str]:
    """A placement record's (node, GPU uuid, proof): a pod's nomination annotation, an entry
    of a TritonModel's status."""
    return (
        str(entry.get("node") or ""),
        str(entry.get("gpu") or ""),
        str(entry.get("proof") or ""),
    )


def _priority(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _controller(references: object) -> str:
    """The controlling owner reference as "Kind/uid", or ""."""
    for ref in as_sequence(references):
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
        for model, size in as_mapping(entry.get("models")).items():
            if isinstance(size, int) and not isinstance(size, bool) and size >= 0:
                measured[str(model)] = size
    return tuple(with_used), measured


def node_from_api(obj: Mapping[str, Any], keys: Keys) -> NodeInfo:
    """Convert an API node; a malformed GPU annotation leaves the node without GPUs, with why."""
    meta = as_mapping(obj.get("metadata"))
    spec = as_mapping(obj.get("spec"))
    labels = {str(k): str(v) for k, v in as_mapping(meta.get("labels")).items()}
    taints = tuple(
        Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in map(as_mapping, as_sequence(spec.get("taints")))
    )
    annotations = as_mapping(meta.get("annotations"))
    gpus, problem = _gpus(annotations, keys)
    gpus, measured = _usage(annotations, keys, gpus)
    status = as_mapping(obj.get("status"))
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
        triton_version=str(annotations.get(keys.triton_version) or ""),
    )


def lease_expiry(obj: Mapping[str, Any]) -> float:
    """When an agent's Lease runs out (seconds since the epoch); 0 when it never was valid."""
    spec = as_mapping(obj.get("spec"))
    renewed = parse_time(spec.get("renewTime")) or parse_time(spec.get("acquireTime"))
    duration = spec.get("leaseDurationSeconds")
    if renewed is None or not isinstance(duration, int):
        return 0.0
    return renewed + duration
