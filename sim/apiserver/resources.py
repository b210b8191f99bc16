"""The kinds the simulated API server serves, and what the real server knows about each.

For every resource: its group/version, plural and kind, whether it is namespaced, its
subresources, the field labels a `fieldSelector` may use (exactly upstream's list for that kind),
and the strategy flags that change verb behaviour (status reset on update, create on update).
A `Catalog` is one server's served set: the built-in kinds below plus the custom resources its
CustomResourceDefinitions define (`CustomShape`: schema, scale paths, printer columns).
Nothing here touches stored objects or the network.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

JsonObject = dict[str, Any]
FieldGetter = Callable[[JsonObject], str]


def _path(*keys: str) -> FieldGetter:
    def get(obj: JsonObject) -> str:
        value: Any = obj
        for key in keys:
            if not isinstance(value, dict):
                return ""
            value = value.get(key)
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    return get


def _pod_ips(obj: JsonObject) -> str:
    ips = obj.get("status", {}).get("podIPs") or []
    return ",".join(str(ip.get("ip", "")) for ip in ips if isinstance(ip, dict))


_META = {"metadata.name": _path("metadata", "name")}
_NAMESPACED_META = _META | {"metadata.namespace": _path("metadata", "namespace")}
META_FIELDS: Mapping[str, FieldGetter] = _META
"""The field labels every cluster-scoped kind has (custom resources have only these)."""
NAMESPACED_META_FIELDS: Mapping[str, FieldGetter] = _NAMESPACED_META


@dataclass(frozen=True)
class PrinterColumn:
    """One `additionalPrinterColumns` entry of a CRD version."""

    name: str
    type: str
    json_path: str
    description: str = ""
    priority: int = 0
    format: str = ""


@dataclass(frozen=True)
class ScalePaths:
    """The `scale` subresource of a CRD version: where Scale's fields live in the object."""

    spec_replicas: str
    status_replicas: str
    label_selector: str = ""


@dataclass(frozen=True, eq=False)
class CustomShape:
    """What a CustomResourceDefinition says about one served version beyond the REST basics."""

    crd_name: str
    schema: Mapping[str, Any]
    """The version's `openAPIV3Schema` (structural)."""
    scale: ScalePaths | None
    columns: tuple[PrinterColumn, ...]
    singular: str = ""


@dataclass(frozen=True)
class Resource:
    """One served resource (a REST collection) and its upstream behaviour."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    field_labels: Mapping[str, FieldGetter]
    subresources: frozenset[str] = frozenset()
    status_subresource: bool = False
    """Updates of the main resource keep the stored status; /status updates keep the rest."""
    allow_create_on_update: bool = False
    """PUT of a missing object creates it (leases and events do, pods and nodes do not)."""
    allow_unconditional_update: bool = True
    """PUT without metadata.resourceVersion is accepted (leases require one)."""
    short_names: tuple[str, ...] = ()
    """Discovery short names (`kubectl get ns`)."""
    categories: tuple[str, ...] = ()
    """Discovery categories (`kubectl get all` lists the kinds in `all`)."""
    verbs: frozenset[str] = field(
        default=frozenset(
            {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}
        )
    )
    custom: CustomShape | None = field(default=None, compare=False)
    """Set for a custom resource: its schema, scale paths and printer columns."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        """How error messages name the resource: `pods`, `leases.coordination.k8s.io`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"


NAMESPACES = Resource(
    group="",
    version="v1",
    plural="namespaces",
    kind="Namespace",
    short_names=("ns",),
    namespaced=False,
    field_labels=_META | {"status.phase": _path("status", "phase")},
    subresources=frozenset({"status"}),
    status_subresource=True,
    verbs=frozenset({"create", "delete", "get", "list", "patch", "update", "watch"}),
)

NODES = Resource(
    group="",
    version="v1",
    plural="nodes",
    kind="Node",
    short_names=("no",),
    namespaced=False,
    field_labels=_META | {"spec.unschedulable": _path("spec", "unschedulable")},
    subresources=frozenset({"status"}),
    status_subresource=True,
)

PODS = Resource(
    group="",
    version="v1",
    plural="pods",
    kind="Pod",
    short_names=("po",),
    namespaced=True,
    categories=("all",),
    field_labels=_NAMESPACED_META
    | {
        "spec.nodeName": _path("spec", "nodeName"),
        "spec.restartPolicy": _path("spec", "restartPolicy"),
        "spec.schedulerName": _path("spec", "schedulerName"),
        "spec.serviceAccountName": _path("spec", "serviceAccountName"),
        "spec.hostNetwork": lambda obj: (
            "true" if obj.get("spec", {}).get("hostNetwork") else "false"
        ),
        "status.phase": _path("status", "phase"),
        "status.podIP": _path("status", "podIP"),
        "status.podIPs": _pod_ips,
        "status.nominatedNodeName": _path("status", "nominatedNodeName"),
    },
    subresources=frozenset({"status", "binding", "eviction", "ephemeralcontainers", "log"}),
    status_subresource=True,
)

EVENTS = Resource(
    group="",
    version="v1",
    plural="events",
    kind="Event",
    short_names=("ev",),
    namespaced=True,
    field_labels=_NAMESPACED_META
    | {
        "involvedObject.kind": _path("involvedObject", "kind"),
        "involvedObject.namespace": _path("involvedObject", "namespace"),
        "involvedObject.name": _path("involvedObject", "name"),
        "involvedObject.uid": _path("involvedObject", "uid"),
        "involvedObject.apiVersion": _path("involvedObject", "apiVersion"),
        "involvedObject.resourceVersion": _path("involvedObject", "resourceVersion"),
        "involvedObject.fieldPath": _path("involvedObject", "fieldPath"),
        "reason": _path("reason"),
        "reportingComponent": _path("reportingComponent"),
        "source": _path("source", "component"),
        "type": _path("type"),
    },
    allow_create_on_update=True,
)

LEASES = Resource(
    group="coordination.k8s.io",
    version="v1",
    plural="leases",
    kind="Lease",
    namespaced=True,
    field_labels=_NAMESPACED_META,
    allow_create_on_update=True,
    allow_unconditional_update=False,
)

MUTATING_WEBHOOK_CONFIGURATIONS = Resource(
    group="admissionregistration.k8s.io",
    version="v1",
    plural="mutatingwebhookconfigurations",
    kind="MutatingWebhookConfiguration",
    namespaced=False,
    field_labels=_META,
)

VALIDATING_ADMISSION_POLICIES = Resource(
    group="admissionregistration.k8s.io",
    version="v1",
    plural="validatingadmissionpolicies",
    kind="ValidatingAdmissionPolicy",
    namespaced=False,
    field_labels=_META,
    subresources=frozenset({"status"}),
    status_subresource=True,
)

VALIDATING_ADMISSION_POLICY_BINDINGS = Resource(
    group="admissionregistration.k8s.io",
    version="v1",
    plural="validatingadmissionpolicybindings",
    kind="ValidatingAdmissionPolicyBinding",
    namespaced=False,
    field_labels=_META,
)

POD_DISRUPTION_BUDGETS = Resource(
    group="policy",
    version="v1",
    plural="poddisruptionbudgets",
    kind="PodDisruptionBudget",
    short_names=("pdb",),
    namespaced=True,
    field_labels=_NAMESPACED_META,
    subresources=frozenset({"status"}),
    status_subresource=True,
)

PRIORITY_CLASSES = Resource(
    group="scheduling.k8s.io",
    version="v1",
    plural="priorityclasses",
    kind="PriorityClass",
    short_names=("pc",),
    namespaced=False,
    field_labels=_META,
)

# apps/v1 workloads: the server stores them; the controllers that act on them are API clients
# (sim.controllers), as kube-controller-manager is.
DEPLOYMENTS = Resource(
    group="apps",
    version="v1",
    plural="deployments",
    kind="Deployment",
    short_names=("deploy",),
    namespaced=True,
    categories=("all",),
    field_labels=_NAMESPACED_META,
    subresources=frozenset({"status", "scale"}),
    status_subresource=True,
)

REPLICA_SETS = Resource(
    group="apps",
    version="v1",
    plural="replicasets",
    kind="ReplicaSet",
    short_names=("rs",),
    namespaced=True,
    categories=("all",),
    field_labels=_NAMESPACED_META | {"status.replicas": _path("status", "replicas")},
    subresources=frozenset({"status", "scale"}),
    status_subresource=True,
)

# Stored only: no controller creates their pods (a test or the simulated cluster creates node
# pods itself); read by `tritonshare preflight` and the Pod Security warnings of their templates.
DAEMON_SETS = Resource(
    group="apps",
    version="v1",
    plural="daemonsets",
    kind="DaemonSet",
    short_names=("ds",),
    namespaced=True,
    categories=("all",),
    field_labels=_NAMESPACED_META,
    subresources=frozenset({"status"}),
    status_subresource=True,
)

# Autoscaling: the HPA controller and KEDA's operator are API clients too (sim.controllers.hpa).
HORIZONTAL_POD_AUTOSCALERS = Resource(
    group="autoscaling",
    version="v2",
    plural="horizontalpodautoscalers",
    kind="HorizontalPodAutoscaler",
    short_names=("hpa",),
    namespaced=True,
    categories=("all",),
    field_labels=_NAMESPACED_META,
    subresources=frozenset({"status"}),
    status_subresource=True,
)

# KEDA's ScaledObject (keda.sh/v1alpha1), a custom resource the simulated KEDA operator reads.
SCALED_OBJECTS = Resource(
    group="keda.sh",
    version="v1alpha1",
    plural="scaledobjects",
    kind="ScaledObject",
    short_names=("so",),
    namespaced=True,
    field_labels=_NAMESPACED_META,
    subresources=frozenset({"status"}),
    status_subresource=True,
)

CUSTOM_RESOURCE_DEFINITIONS = Resource(
    group="apiextensions.k8s.io",
    version="v1",
    plural="customresourcedefinitions",
    kind="CustomResourceDefinition",
    short_names=("crd", "crds"),
    namespaced=False,
    field_labels=_META,
    subresources=frozenset({"status"}),
    status_subresource=True,
)

# What `kubectl apply -k deploy/example` creates beside the workload: stored as written (and a
# Service's clusterIP allocated, sim.apiserver.services); sim.service and the kubelet read them.
CONFIG_MAPS = Resource(
    group="",
    version="v1",
    plural="configmaps",
    kind="ConfigMap",
    short_names=("cm",),
    namespaced=True,
    field_labels=_NAMESPACED_META,
)

# Stored as written (`stringData` too); the kubelet mounts their keys (sim.node.podworker).
SECRETS = Resource(
    group="",
    version="v1",
    plural="secrets",
    kind="Secret",
    short_names=(),
    namespaced=True,
    field_labels=_NAMESPACED_META,
)

SERVICES = Resource(
    group="",
    version="v1",
    plural="services",
    kind="Service",
    short_names=("svc",),
    namespaced=True,
    field_labels=_NAMESPACED_META,
    subresources=frozenset({"status"}),
    status_subresource=True,
)

# Kept by the simulated controller manager from the pods each Service selects
# (sim.controllers.endpoints), as kube-controller-manager's Endpoints and EndpointSlice
# controllers keep them. Endpoints may be created by an update, as upstream's strategy allows.
ENDPOINTS = Resource(
    group="",
    version="v1",
    plural="endpoints",
    kind="Endpoints",
    short_names=("ep",),
    namespaced=True,
    field_labels=_NAMESPACED_META,
    allow_create_on_update=True,
)

ENDPOINT_SLICES = Resource(
    group="discovery.k8s.io",
    version="v1",
    plural="endpointslices",
    kind="EndpointSlice",
    namespaced=True,
    field_labels=_NAMESPACED_META | {"addressType": _path("addressType")},
)

NETWORK_POLICIES = Resource(
    group="networking.k8s.io",
    version="v1",
    plural="networkpolicies",
    kind="NetworkPolicy",
    short_names=("netpol",),
    namespaced=True,
    field_labels=_NAMESPACED_META,
)

# Pod creates are admitted against them and their status kept by sim.apiserver.quota.
RESOURCE_QUOTAS = Resource(
    group="",
    version="v1",
    plural="resourcequotas",
    kind="ResourceQuota",
    short_names=("quota",),
    namespaced=True,
    field_labels=_NAMESPACED_META,
    subresources=frozenset({"status"}),
    status_subresource=True,
)

# Stored as written; TokenRequest (the `token` subresource) still accepts any account name, as
# the sim's parts ask for tokens of accounts nobody created.
SERVICE_ACCOUNTS = Resource(
    group="",
    version="v1",
    plural="serviceaccounts",
    kind="ServiceAccount",
    short_names=("sa",),
    namespaced=True,
    field_labels=_NAMESPACED_META,
    subresources=frozenset({"token"}),
)

# Stored as written, never enforced (the server authorizes every caller): what `kubectl apply -k`
# of a manifest with roles, such as deploy/kserve-crds, creates beside its other kinds.
CLUSTER_ROLES = Resource(
    group="rbac.authorization.k8s.io",
    version="v1",
    plural="clusterroles",
    kind="ClusterRole",
    namespaced=False,
    field_labels=_META,
)

CLUSTER_ROLE_BINDINGS = Resource(
    group="rbac.authorization.k8s.io",
    version="v1",
    plural="clusterrolebindings",
    kind="ClusterRoleBinding",
    namespaced=False,
    field_labels=_META,
)

ROLES = Resource(
    group="rbac.authorization.k8s.io",
    version="v1",
    plural="roles",
    kind="Role",
    namespaced=True,
    field_labels=_NAMESPACED_META,
)

ROLE_BINDINGS = Resource(
    group="rbac.authorization.k8s.io",
    version="v1",
    plural="rolebindings",
    kind="RoleBinding",
    namespaced=True,
    field_labels=_NAMESPACED_META,
)

STORED: tuple[Resource, ...] = (
    NAMESPACES,
    NODES,
    PODS,
    EVENTS,
    LEASES,
    MUTATING_WEBHOOK_CONFIGURATIONS,
    VALIDATING_ADMISSION_POLICIES,
    VALIDATING_ADMISSION_POLICY_BINDINGS,
    POD_DISRUPTION_BUDGETS,
    PRIORITY_CLASSES,
    DEPLOYMENTS,
    REPLICA_SETS,
    DAEMON_SETS,
    HORIZONTAL_POD_AUTOSCALERS,
    SCALED_OBJECTS,
    CUSTOM_RESOURCE_DEFINITIONS,
    CONFIG_MAPS,
    SECRETS,
    SERVICES,
    ENDPOINTS,
    ENDPOINT_SLICES,
    NETWORK_POLICIES,
    SERVICE_ACCOUNTS,
    RESOURCE_QUOTAS,
    CLUSTER_ROLES,
    CLUSTER_ROLE_BINDINGS,
    ROLES,
    ROLE_BINDINGS,
)

# Served but never stored: TokenReview and Binding.
TOKEN_REVIEWS = Resource(
    group="authentication.k8s.io",
    version="v1",
    plural="tokenreviews",
    kind="TokenReview",
    namespaced=False,
    field_labels=_META,
    verbs=frozenset({"create"}),
)
BINDINGS = Resource(
    group="",
    version="v1",
    plural="bindings",
    kind="Binding",
    namespaced=True,
    field_labels=_NAMESPACED_META,
    verbs=frozenset({"create"}),
)

ALL: tuple[Resource, ...] = (*STORED, TOKEN_REVIEWS, BINDINGS)

BY_GROUP_VERSION: dict[tuple[str, str], dict[str, Resource]] = {}
for _resource in ALL:
    BY_GROUP_VERSION.setdefault((_resource.group, _resource.version), {})[_resource.plural] = (
        _resource
    )


_BUILT_IN_GROUP_RESOURCES = frozenset(r.group_resource for r in ALL)


class Catalog:
    """The resources one API server serves: the built-in kinds and its custom resources.

    `by_group_version` is what request parsing and discovery read; custom resources come and go
    with their CRDs (`add`, `remove`), never shadowing a built-in kind.
    """

    def __init__(self) -> None:
        self.by_group_version: dict[tuple[str, str], dict[str, Resource]] = {
            key: dict(served) for key, served in BY_GROUP_VERSION.items()
        }
        self._custom: dict[str, tuple[Resource, ...]] = {}

    def served(self) -> Iterator[Resource]:
        for served in self.by_group_version.values():
            yield from served.values()

    def stored(self) -> Iterator[Resource]:
        """Every stored resource, built-in and custom (one entry per custom resource)."""
        yield from STORED
        for versions in self._custom.values():
            yield versions[0]

    def custom(self, crd_name: str) -> tuple[Resource, ...]:
        """The served versions of a CRD (empty if it serves none)."""
        return self._custom.get(crd_name, ())

    def add(self, crd_name: str, versions: tuple[Resource, ...]) -> tuple[Resource, ...]:
        """Serve `versions` for the CRD (replacing what it served); returns those served: a
        resource a built-in kind (or another CRD) already serves is left out."""
        self.remove(crd_name)
        served = tuple(
            r
            for r in versions
            if r.group_resource not in _BUILT_IN_GROUP_RESOURCES
            and r.plural not in self.by_group_version.get((r.group, r.version), {})
        )
        for resource in served:
            self.by_group_version.setdefault((resource.group, resource.version), {})[
                resource.plural
            ] = resource
        if served:
            self._custom[crd_name] = served
        return served

    def remove(self, crd_name: str) -> tuple[Resource, ...]:
        """Stop serving a CRD's versions; returns them."""
        removed = self._custom.pop(crd_name, ())
        for resource in removed:
            key = (resource.group, resource.version)
            served = self.by_group_version.get(key, {})
            if served.get(resource.plural) is resource:
                del served[resource.plural]
            if not served:
                self.by_group_version.pop(key, None)
        return removed
