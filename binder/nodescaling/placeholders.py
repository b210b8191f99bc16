"""Placeholder pods: a model the binder cannot place, as a pod a node autoscaler acts on.

Cluster Autoscaler and Karpenter add nodes for pending pods they can simulate with
kube-scheduler's rules. A TritonModel replica is no pod, and a pending model pod (schedulerName
tritonshare, no `nvidia.com/gpu` request: the node pod holds every GPU) fits any node with CPU to
spare in their simulation, so neither makes them act. A placeholder does: a pod of the default
scheduler in the system namespace, of the PriorityClass `tritonshare-placeholder` (below every
workload, preempting none), carrying the waiting model's node selection (nodeSelector, required
node affinity, tolerations; the GPU-node tolerations and `--placeholder-node-selector` added) and
a required pod anti-affinity, per node (`kubernetes.io/hostname`), to model pods (label
`tritonshare.io/role: model`), model hosts and other placeholders, in every namespace: it fits
only a node that serves no model and asks for no other node, which is what the autoscaler's
template of a node group is (its DaemonSet pods, the node pod among them, are none of those). Not
a `kubernetes.io/hostname NotIn` of the existing nodes: Karpenter ignores a pod whose node
affinity names that label. The binder reads no placeholder's anti-affinity
(binder.cluster.objects), so none keeps a model off the node added for it. A placeholder is
`cluster-autoscaler.kubernetes.io/safe-to-evict: "true"`: it is never why Cluster Autoscaler
keeps a node it could move it from.

Placeholders are grouped by namespace and node selection (`Group`): a namespace's models waiting
for the same kind of node ask for one node at a time, and every placeholder belongs to one
namespace, which `binder.nodescaling.planning` bounds.

A model waits when the binder reported kube-scheduler's FitError for it ("0/N nodes are
available: ...", after "replica N: " for a TritonModel): a pod's `PodScheduled=False`
`Unschedulable`, a TritonModel's `Placed=False` `Unschedulable`. A spec problem, a quota or a
missing PriorityClass is no reason to add a node.

Pure: decisions from API-shaped objects; no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from binder.cluster.objects import effective_request
from common.conditions import find
from common.contract import Keys
from common.hosted import host_label
from common.modelpod import gpu_tolerations
from common.quantity import QuantityError, parse_quantity

JsonObject = dict[str, Any]

PRIORITY_CLASS = "tritonshare-placeholder"
"""The PriorityClass of placeholders (the chart and deploy/overlays/node-autoscaling make it:
value -10, Cluster Autoscaler's default --expendable-pods-priority-cutoff, below which it would
ignore them; preemptionPolicy Never)."""
NAME_PREFIX = "tritonshare-placeholder-"
HOSTNAME = "kubernetes.io/hostname"
ROLE_LABEL = "tritonshare.io/role"
"""The label of model pods (`model`), which the webhook and the node pod's NetworkPolicy read."""
MAX_PER_GROUP = 8
"""Placeholders of one group at most: nodes asked for the same waiting models at once."""
MAX_PLACEHOLDERS = 32
"""Placeholders at most, all namespaces together."""
MAX_PER_NAMESPACE = 8
"""Placeholders of one namespace at most."""
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
MAX_NAMED_WAITERS = 5
"""Waiting models named in a placeholder's annotation (the rest are counted)."""
_ENDED = frozenset({"Succeeded", "Failed"})
_DEFAULT_KEYS = Keys()
# kube-scheduler's FitError, as a pod's message or after a TritonModel's "replica N: ".
_FIT_ERROR = re.compile(r"(?:^|: )0/\d+ nodes are available")


def placeholder_label(keys: Keys) -> str:
    """The label on every placeholder; its value is the placeholder's group."""
    return f"{keys.prefix}placeholder"


def namespace_label(keys: Keys) -> str:
    """The label on every placeholder naming the namespace whose models it stands for."""
    return f"{keys.prefix}placeholder-namespace"


def waiting_for_annotation(keys: Keys) -> str:
    """The annotation that names the models a placeholder asks a node for."""
    return f"{keys.prefix}placeholder-for"


@dataclass(frozen=True)
class Selection:
    """Where a model may go, as kube-scheduler's node rules read it: the group of a placeholder."""

    node_selector: Mapping[str, str] = field(default_factory=dict)
    terms: tuple[JsonObject, ...] = ()
    """Required node affinity terms (OR'ed); empty: any node."""
    tolerations: tuple[JsonObject, ...] = ()


@dataclass(frozen=True)
class Group:
    """The models of one namespace that wait for one kind of node: a placeholder stands for
    them."""

    namespace: str
    selection: Selection

    @property
    def key(self) -> str:
        """A short stable digest (a label value and part of a pod name)."""
        selection = self.selection
        text = json.dumps(
            [
                self.namespace,
                dict(selection.node_selector),
                list(selection.terms),
                list(selection.tolerations),
            ],
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Waiting:
    """A model the binder reported as fitting no node: `what` names it for people."""

    what: str
    selection: Selection
    involved: Mapping[str, str] = field(default_factory=dict, compare=False)
    """The object as an Event's involvedObject (apiVersion, kind, namespace, name, uid)."""
    namespace: str = ""
    request: int = 0
    """The GPU memory one replica (or the pod) asks, in bytes."""

    @property
    def group(self) -> Group:
        return Group(self.namespace, self.selection)


def _involved(obj: Mapping[str, Any], api_version: str, kind: str) -> dict[str, str]:
    metadata = obj.get("metadata") or {}
    return {
        "apiVersion": str(obj.get("apiVersion") or api_version),
        "kind": kind,
        "namespace": str(metadata.get("namespace", "")),
        "name": str(metadata.get("name", "")),
        "uid": str(metadata.get("uid", "")),
    }


@dataclass(frozen=True)
class Placeholder:
    """A placeholder pod as the watch last showed it."""

    name: str
    uid: str
    group: str
    """Its group's key."""
    node: str
    """Where the default scheduler bound it; empty while pending."""
    ended: bool
    namespace: str = ""
    """The namespace whose models it stands for."""


def selection_of(spec: Mapping[str, Any]) -> Selection:
    """The node selection of a pod spec or a TritonModel spec (the same fields)."""
    selector = spec.get("nodeSelector") or {}
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = affinity.get("nodeSelectorTerms") or []
    return Selection(
        node_selector={str(k): str(v) for k, v in selector.items()}
        if isinstance(selector, Mapping)
        else {},
        terms=tuple(t for t in terms if isinstance(t, dict)),
        tolerations=tuple(t for t in spec.get("tolerations") or [] if isinstance(t, dict)),
    )


def _fit_error(condition: Mapping[str, Any] | None) -> bool:
    """A condition that says kube-scheduler's FitError: no node fits, adding one may help."""
    return (
        condition is not None
        and condition.get("status") == "False"
        and condition.get("reason") == "Unschedulable"
        and _FIT_ERROR.search(str(condition.get("message") or "")) is not None
    )


def waiting_pod(
    pod: Mapping[str, Any], scheduler_name: str, keys: Keys = _DEFAULT_KEYS
) -> Waiting | None:
    """A pending model pod the binder reported unschedulable, else None."""
    metadata, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    status = pod.get("status") or {}
    if (
        spec.get("schedulerName") != scheduler_name
        or spec.get("nodeName")
        or metadata.get("deletionTimestamp")
        or status.get("phase", "Pending") != "Pending"
        or status.get("nominatedNodeName")  # a preemption makes its room
        or not _fit_error(find(status.get("conditions"), "PodScheduled"))
    ):
        return None
    try:
        request = effective_request(spec, keys.gpu_mem)
    except QuantityError:
        request = 0
    return Waiting(
        f"pod {metadata.get('namespace')}/{metadata.get('name')}",
        selection_of(spec),
        _involved(pod, "v1", "Pod"),
        str(metadata.get("namespace", "")),
        request,
    )


def waiting_model(model: Mapping[str, Any]) -> Waiting | None:
    """A TritonModel with a replica the binder reported unschedulable, else None."""
    metadata = model.get("metadata") or {}
    if metadata.get("deletionTimestamp"):
        return None
    status = model.get("status") or {}
    if not _fit_error(find(status.get("conditions"), "Placed")):
        return None
    spec = model.get("spec") or {}
    # A model that declares no GPU memory: what the binder books its next replica at.
    sized = status.get("gpuMemory")
    sized = sized if isinstance(sized, dict) else {}
    try:
        request = parse_quantity(str(spec.get("gpuMemory") or sized.get("booked") or "0"))
    except QuantityError:
        request = 0
    return Waiting(
        f"tritonmodel {metadata.get('namespace')}/{metadata.get('name')}",
        selection_of(spec),
        _involved(model, "tritonshare.io/v1alpha1", "TritonModel"),
        str(metadata.get("namespace", "")),
        request,
    )


def placeholder_of(pod: Mapping[str, Any], keys: Keys) -> Placeholder | None:
    """The placeholder a pod is (by its label), else None."""
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    group = labels.get(placeholder_label(keys))
    if not group or not str(metadata.get("name", "")).startswith(NAME_PREFIX):
        return None
    return Placeholder(
        name=metadata["name"],
        uid=str(metadata.get("uid", "")),
        group=str(group),
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
        ended=bool(metadata.get("deletionTimestamp"))
        or (pod.get("status") or {}).get("phase") in _ENDED,
        namespace=str(labels.get(namespace_label(keys), "")),
    )


def next_name(group: str, taken: Iterable[str]) -> str:
    """The first free name of the group's placeholders."""
    names = set(taken)
    index = 0
    while f"{NAME_PREFIX}{group}-{index}" in names:
        index += 1
    return f"{NAME_PREFIX}{group}-{index}"


def manifest(
    group: Group,
    *,
    name: str,
    namespace: str,
    keys: Keys,
    image: str,
    node_selector: Sequence[tuple[str, str | None]],
    waiting_for: Sequence[str],
    gpu_memory: tuple[str, int] | None = None,
) -> JsonObject:
    """The placeholder pod for `group`: it fits only a node that runs no model pod, model host
    or other placeholder, and that the waiting models' node rules and `node_selector`
    accept. `gpu_memory`: (label, MiB): the node's label gives its GPUs' memory in MiB, at least
    that much (Gt), or the node lacks the label (a second term, which node autoscalers try
    after the first)."""
    selection = group.selection
    extra = [
        {"key": key, "operator": "In", "values": [value]}
        if value is not None
        else {"key": key, "operator": "Exists"}
        for key, value in node_selector
    ]
    sizes: list[list[JsonObject]] = [[]]
    if gpu_memory is not None:
        label, mebibytes = gpu_memory
        sizes = [
            [{"key": label, "operator": "Gt", "values": [str(mebibytes - 1)]}],
            [{"key": label, "operator": "DoesNotExist"}],
        ]
    # Required terms are OR'ed and a term's expressions AND'ed: each term of the model's gets the
    # placeholder's own expressions (once per GPU size term).
    terms = [
        {**term, "matchExpressions": [*(term.get("matchExpressions") or []), *extra, *size]}
        for size in sizes
        for term in selection.terms or ({},)
    ]
    node_affinity = (
        {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        if any(t.get("matchExpressions") or t.get("matchFields") for t in terms)
        else {}
    )
    apart = [
        {"matchLabels": {ROLE_LABEL: "model"}},
        {"matchLabels": {host_label(keys): "true"}},
        {"matchExpressions": [{"key": placeholder_label(keys), "operator": "Exists"}]},
    ]
    anti_affinity = {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": selector, "namespaceSelector": {}, "topologyKey": HOSTNAME}
            for selector in apart
        ]
    }
    tolerations = list(selection.tolerations)
    tolerations += [t for t in gpu_tolerations(keys) if t not in tolerations]
    named = list(waiting_for[:MAX_NAMED_WAITERS])
    if len(waiting_for) > MAX_NAMED_WAITERS:
        named.append(f"{len(waiting_for) - MAX_NAMED_WAITERS} more")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                placeholder_label(keys): group.key,
                namespace_label(keys): group.namespace,
            },
            "annotations": {
                waiting_for_annotation(keys): ", ".join(named),
                # Never why Cluster Autoscaler keeps a node (a pod without a controller is).
                SAFE_TO_EVICT: "true",
            },
        },
        "spec": {
            "priorityClassName": PRIORITY_CLASS,
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "nodeSelector": dict(selection.node_selector),
            "affinity": {"nodeAffinity": node_affinity, "podAntiAffinity": anti_affinity},
            "tolerations": tolerations,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65535,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "placeholder",
                    "image": image,
                    "resources": {
                        "requests": {"cpu": "1m", "memory": "8Mi"},
                        "limits": {"memory": "8Mi"},
                    },
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }
