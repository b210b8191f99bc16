"""Field validation the real API server applies to the served kinds, with its messages.

Names (DNS subdomain or label), label keys and values, annotation keys, the required fields of a
pod's containers, its node affinity (operators and their value counts, keys, values, weights),
and the fields of a pod that an update may not change. Each check returns
(field, message) causes; `sim.apiserver.rest` turns them into one 422 Invalid. Pure; no I/O.
"""

from __future__ import annotations

import json
import re
from typing import Any

from common.quantity import quantity_decimal
from sim.apiserver import disruption, quota, workloads
from sim.apiserver.admission import registration
from sim.apiserver.resources import (
    DEPLOYMENTS,
    NAMESPACES,
    POD_DISRUPTION_BUDGETS,
    PODS,
    REPLICA_SETS,
    RESOURCE_QUOTAS,
    VALIDATING_ADMISSION_POLICIES,
    VALIDATING_ADMISSION_POLICY_BINDINGS,
    Resource,
)

JsonObject = dict[str, Any]
Causes = list[tuple[str, str]]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

_SUBDOMAIN_HELP = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or"
    " '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used"
    " for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_HELP = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and"
    " must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex"
    " used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_POD_UPDATE_FORBIDDEN = (
    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only"
    " additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set"
    " to 1 if it was previously negative)"
)


def _quoted(value: Any) -> str:
    return json.dumps(value)


def name_causes(resource: Resource, name: str) -> Causes:
    if resource is NAMESPACES:
        if len(name) > 63 or not _DNS_LABEL.match(name):
            return [("metadata.name", f"Invalid value: {_quoted(name)}: {_LABEL_HELP}")]
    elif len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        return [("metadata.name", f"Invalid value: {_quoted(name)}: {_SUBDOMAIN_HELP}")]
    return []


def _key_causes(field: str, key: str) -> Causes:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return [(field, f"Invalid value: {_quoted(key)}: prefix part {_SUBDOMAIN_HELP}")]
    if not name or len(name) > 63 or not _NAME_PART.match(name):
        return [
            (
                field,
                f"Invalid value: {_quoted(key)}: name part must consist of alphanumeric"
                " characters, '-', '_' or '.', and must start and end with an alphanumeric"
                " character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for"
                " validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
            )
        ]
    return []


def metadata_causes(obj: JsonObject) -> Causes:
    meta = obj.get("metadata") or {}
    causes: Causes = []
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict):
        return [("metadata.labels", "Invalid value: labels must be a map of strings")]
    for key, value in labels.items():
        causes += _key_causes("metadata.labels", key)
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            causes.append(
                (
                    "metadata.labels",
                    f"Invalid value: {_quoted(value)}: a valid label must be an empty string or"
                    " consist of alphanumeric characters, '-', '_' or '.', and must start and end"
                    " with an alphanumeric character, at most 63 characters",
                )
            )
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, dict):
        return [("metadata.annotations", "Invalid value: annotations must be a map of strings")]
    for key, value in annotations.items():
        causes += _key_causes("metadata.annotations", key)
        if not isinstance(value, str):
            causes.append(
                ("metadata.annotations", f"Invalid value: {_quoted(value)}: not a string")
            )
    return causes


def pod_causes(pod: JsonObject) -> Causes:
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return [("spec.containers", "Required value")]
    causes: Causes = []
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        causes.append(("spec.containers", "Required value"))
        containers = []
    seen: set[str] = set()
    for list_name in ("initContainers", "containers"):
        items = spec.get(list_name) or []
        for index, container in enumerate(items):
            where = f"spec.{list_name}[{index}]"
            if not isinstance(container, dict):
                causes.append((where, "Invalid value: a container must be an object"))
                continue
            name = container.get("name")
            if not name:
                causes.append((f"{where}.name", "Required value"))
            elif not isinstance(name, str) or len(name) > 63 or not _DNS_LABEL.match(name):
                causes.append((f"{where}.name", f"Invalid value: {_quoted(name)}: {_LABEL_HELP}"))
            elif name in seen:
                causes.append((f"{where}.name", f"Duplicate value: {_quoted(name)}"))
            else:
                seen.add(name)
            if not container.get("image"):
                causes.append((f"{where}.image", "Required value"))
            causes += _resource_causes(container.get("resources"), f"{where}.resources")
    affinity = spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    if isinstance(node_affinity, dict):
        causes += node_affinity_causes(node_affinity, "spec.affinity.nodeAffinity")
    return causes


# What kube-apiserver's decoder accepts as a quantity; anything else fails the whole request. The
# value of one it accepts is common.quantity's `quantity_decimal`: the parts' own grammar.
QUANTITY_RE = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
QUANTITY_ERROR = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)


def _is_extended(name: str) -> bool:
    """Kubernetes' IsExtendedResourceName: a domain-qualified name outside kubernetes.io."""
    domain = name.partition("/")[0] if "/" in name else ""
    native = domain == "kubernetes.io" or domain.endswith(".kubernetes.io")
    return bool(domain) and not native and not name.startswith("requests.")


def _resource_causes(resources: Any, where: str) -> Causes:
    """Extended resources (such as tritonshare.io/gpu-mem) as kube-apiserver validates them:
    whole numbers, not negative, a request only with a limit, and equal to it."""
    if not isinstance(resources, dict):
        return []
    raw_limits, raw_requests = resources.get("limits"), resources.get("requests")
    limits: dict[str, Any] = raw_limits if isinstance(raw_limits, dict) else {}
    requests: dict[str, Any] = raw_requests if isinstance(raw_requests, dict) else {}
    causes: Causes = []
    for part, values in (("limits", limits), ("requests", requests)):
        for name, raw in values.items():
            value = quantity_decimal(str(raw))
            if value is None or not _is_extended(str(name)):
                continue
            if value < 0:
                causes.append(
                    (f"{where}.{part}[{name}]", f"Invalid value: {_quoted(raw)}: must be "
                     "greater than or equal to 0")
                )  # fmt: skip
            elif value != value.to_integral_value():
                causes.append(
                    (
                        f"{where}.{part}[{name}]",
                        f"Invalid value: {_quoted(raw)}: must be an integer",
                    )
                )
    for name, raw in requests.items():
        if not _is_extended(str(name)):
            continue
        if name not in limits:
            causes.append(
                (f"{where}.limits", "Required value: Limit must be set for non overcommitable "
                 "resources")
            )  # fmt: skip
            continue
        request, limit = quantity_decimal(str(raw)), quantity_decimal(str(limits[name]))
        if request is not None and limit is not None and request != limit:
            causes.append(
                (f"{where}.requests", f"Invalid value: {_quoted(raw)}: must be equal to {name} "
                 f"limit of {limits[name]}")
            )  # fmt: skip
    return causes


_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


def _requirement_causes(requirement: Any, where: str) -> Causes:
    """ValidateNodeSelectorRequirement: the operator's value count (not whether a Gt/Lt value
    parses as an integer: kube-scheduler finds that out), the key, and each value a label value."""
    if not isinstance(requirement, dict):
        return [(where, "Invalid value: a node selector requirement must be an object")]
    operator = requirement.get("operator")
    values = requirement.get("values") or []
    causes: Causes = []
    if operator in ("In", "NotIn") and not values:
        causes.append(
            (
                f"{where}.values",
                "Required value: must be specified when `operator` is 'In' or 'NotIn'",
            )
        )
    elif operator in ("Exists", "DoesNotExist") and values:
        causes.append(
            (
                f"{where}.values",
                "Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            )
        )
    elif operator in ("Gt", "Lt") and len(values) != 1:
        causes.append(
            (
                f"{where}.values",
                "Required value: must be specified single value when `operator` is 'Lt' or 'Gt'",
            )
        )
    elif operator not in _SELECTOR_OPERATORS:
        causes.append(
            (
                f"{where}.operator",
                f"Invalid value: {_quoted(operator)}: not a valid selector operator",
            )
        )
    causes += _key_causes(f"{where}.key", str(requirement.get("key") or ""))
    for index, value in enumerate(values):
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            causes.append(
                (
                    f"{where}.values[{index}]",
                    f"Invalid value: {_quoted(value)}: a valid label must be an empty string or"
                    " consist of alphanumeric characters, '-', '_' or '.', and must start and end"
                    " with an alphanumeric character, at most 63 characters",
                )
            )
    return causes


def _field_requirement_causes(requirement: Any, where: str) -> Causes:
    """ValidateNodeFieldSelectorRequirement: In/NotIn, exactly one value, key metadata.name."""
    if not isinstance(requirement, dict):
        return [(where, "Invalid value: a node selector requirement must be an object")]
    operator = requirement.get("operator")
    values = requirement.get("values") or []
    causes: Causes = []
    if operator in ("In", "NotIn"):
        if len(values) != 1:
            causes.append(
                (
                    f"{where}.values",
                    "Required value: must be only one value when `operator` is 'In' or 'NotIn' "
                    "for node field selector",
                )
            )
    else:
        causes.append(
            (
                f"{where}.operator",
                f"Invalid value: {_quoted(operator)}: not a valid selector operator",
            )
        )
    key = requirement.get("key")
    if key != "metadata.name":
        causes.append(
            (f"{where}.key", f"Invalid value: {_quoted(key)}: not a valid field selector key")
        )
    else:
        for index, value in enumerate(values):
            if not isinstance(value, str) or len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
                causes.append(
                    (
                        f"{where}.values[{index}]",
                        f"Invalid value: {_quoted(value)}: {_SUBDOMAIN_HELP}",
                    )
                )
    return causes


def _term_causes(term: Any, where: str) -> Causes:
    if not isinstance(term, dict):
        return [(where, "Invalid value: a node selector term must be an object")]
    causes: Causes = []
    for index, requirement in enumerate(term.get("matchExpressions") or []):
        causes += _requirement_causes(requirement, f"{where}.matchExpressions[{index}]")
    for index, requirement in enumerate(term.get("matchFields") or []):
        causes += _field_requirement_causes(requirement, f"{where}.matchFields[{index}]")
    return causes


def node_affinity_causes(node_affinity: JsonObject, where: str) -> Causes:
    """validateNodeAffinity: the required selector has at least one term; preferred terms weigh
    1 to 100; every term's requirements are well formed."""
    causes: Causes = []
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if isinstance(required, dict):
        path = f"{where}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
        terms = required.get("nodeSelectorTerms") or []
        if not terms:
            causes.append((path, "Required value: must have at least one node selector term"))
        for index, term in enumerate(terms):
            causes += _term_causes(term, f"{path}[{index}]")
    preferred = node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []
    for index, item in enumerate(preferred if isinstance(preferred, list) else []):
        path = f"{where}.preferredDuringSchedulingIgnoredDuringExecution[{index}]"
        if not isinstance(item, dict):
            causes.append((path, "Invalid value: a preferred scheduling term must be an object"))
            continue
        weight = item.get("weight")
        if not isinstance(weight, int) or isinstance(weight, bool) or not 1 <= weight <= 100:
            causes.append(
                (f"{path}.weight", f"Invalid value: {_quoted(weight)}: must be in the range 1-100")
            )
        causes += _term_causes(item.get("preference") or {}, f"{path}.preference")
    return causes


def _comparable_spec(spec: JsonObject) -> JsonObject:
    result = dict(spec)
    for key in (
        "activeDeadlineSeconds",
        "tolerations",
        "terminationGracePeriodSeconds",
        "schedulingGates",
    ):
        result.pop(key, None)
    for list_name in ("containers", "initContainers"):
        if isinstance(result.get(list_name), list):
            result[list_name] = [
                {k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c
                for c in result[list_name]
            ]
    return result


def pod_update_causes(old: JsonObject, new: JsonObject) -> Causes:
    """An update may change only container images, deadlines, added tolerations and removed
    scheduling gates."""
    old_spec = old.get("spec") or {}
    new_spec = new.get("spec") or {}
    if _comparable_spec(old_spec) != _comparable_spec(new_spec):
        return [("spec", _POD_UPDATE_FORBIDDEN)]
    old_tolerations = old_spec.get("tolerations") or []
    new_tolerations = new_spec.get("tolerations") or []
    if any(t not in new_tolerations for t in old_tolerations):
        return [("spec.tolerations", _POD_UPDATE_FORBIDDEN)]
    old_gates = old_spec.get("schedulingGates") or []
    new_gates = new_spec.get("schedulingGates") or []
    if any(g not in old_gates for g in new_gates):
        return [
            (
                "spec.schedulingGates",
                "Forbidden: only deletion is allowed, but found new scheduling gate",
            )
        ]
    return []


def ephemeral_update_causes(old: JsonObject, new: JsonObject) -> Causes:
    """The pods/ephemeralcontainers subresource adds ephemeral containers (each named, with an
    image, its name unused by the pod's other containers) and changes none it had."""
    before = (old.get("spec") or {}).get("ephemeralContainers") or []
    after = (new.get("spec") or {}).get("ephemeralContainers") or []
    if after[: len(before)] != before:
        return [
            (
                "spec.ephemeralContainers",
                "Forbidden: existing ephemeral containers may not be changed",
            )
        ]
    spec = old.get("spec") or {}
    names = {
        c.get("name")
        for list_name in ("initContainers", "containers")
        for c in spec.get(list_name) or []
        if isinstance(c, dict)
    } | {c.get("name") for c in before if isinstance(c, dict)}
    causes: Causes = []
    for index, container in enumerate(after[len(before) :], start=len(before)):
        where = f"spec.ephemeralContainers[{index}]"
        if not isinstance(container, dict) or not container.get("name"):
            causes.append((f"{where}.name", "Required value"))
            continue
        if container["name"] in names:
            causes.append((f"{where}.name", f"Duplicate value: {_quoted(container['name'])}"))
        names.add(container["name"])
        if not container.get("image"):
            causes.append((f"{where}.image", "Required value"))
    return causes


def kind_causes(resource: Resource, obj: JsonObject) -> Causes:
    causes = metadata_causes(obj)
    if resource is PODS:
        causes += pod_causes(obj)
    elif resource in (VALIDATING_ADMISSION_POLICIES, VALIDATING_ADMISSION_POLICY_BINDINGS):
        causes += registration.spec_causes(resource, obj)
    elif resource is POD_DISRUPTION_BUDGETS:
        causes += disruption.spec_causes(obj)
    elif resource is RESOURCE_QUOTAS:
        causes += quota.spec_causes(obj)
    elif resource is DEPLOYMENTS or resource is REPLICA_SETS:
        causes += workloads.spec_causes(resource, obj) + _template_causes(obj)
    return causes


def _template_causes(obj: JsonObject) -> Causes:
    """A workload's pod template is validated as the pods it makes will be, under its own path."""
    template = (obj.get("spec") or {}).get("template")
    if not isinstance(template, dict):
        return []
    pod = {"metadata": template.get("metadata") or {}, "spec": template.get("spec")}
    causes = [
        (f"spec.template.{where}", message)
        for where, message in metadata_causes(pod) + pod_causes(pod)
    ]
    return causes


# JSON types the real server's Go structs require for the fields this server reads; a body that
# breaks one is refused at decoding (400), as upstream's "cannot unmarshal" errors are.
_STRING, _INT, _BOOL, _OBJECT, _LIST = "string", "integer", "boolean", "object", "array"
_META_TYPES = {
    "name": _STRING,
    "generateName": _STRING,
    "namespace": _STRING,
    "uid": _STRING,
    "resourceVersion": _STRING,
    "labels": _OBJECT,
    "annotations": _OBJECT,
    "finalizers": _LIST,
    "ownerReferences": _LIST,
}
_SPEC_TYPES = {
    "nodeName": _STRING,
    "schedulerName": _STRING,
    "serviceAccountName": _STRING,
    "terminationGracePeriodSeconds": _INT,
    "activeDeadlineSeconds": _INT,
    "containers": _LIST,
    "initContainers": _LIST,
    "tolerations": _LIST,
    "taints": _LIST,
    "hostNetwork": _BOOL,
    "unschedulable": _BOOL,
    "holderIdentity": _STRING,
    "leaseDurationSeconds": _INT,
    "finalizers": _LIST,
    "replicas": _INT,
    "minReadySeconds": _INT,
    "revisionHistoryLimit": _INT,
    "progressDeadlineSeconds": _INT,
    "paused": _BOOL,
    "strategy": _OBJECT,
}
_STATUS_TYPES = {
    "phase": _STRING,
    "conditions": _LIST,
    "podIP": _STRING,
    "podIPs": _LIST,
    "nominatedNodeName": _STRING,
    "capacity": _OBJECT,
    "allocatable": _OBJECT,
}
_CONTAINER_TYPES = {"name": _STRING, "image": _STRING, "resources": _OBJECT}
_RESOURCES_TYPES = {"limits": _OBJECT, "requests": _OBJECT}
# Lists whose items must be objects, and lists whose items must be strings.
_OBJECT_ITEMS = frozenset(
    {"conditions", "podIPs", "containers", "initContainers", "ownerReferences", "tolerations"}
)
_STRING_ITEMS = frozenset({"finalizers"})


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return _BOOL
    if isinstance(value, int):
        return _INT
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return _STRING
    if isinstance(value, list):
        return _LIST
    if isinstance(value, dict):
        return _OBJECT
    return "null"


def _check_fields(owner: Any, types: dict[str, str], where: str) -> str | None:
    if not isinstance(owner, dict):
        return None
    for key, expected in types.items():
        value = owner.get(key)
        if value is None:
            continue
        found = _json_type(value)
        if found != expected:
            return f"cannot unmarshal {found} into Go struct field {where}.{key} of type {expected}"
        if expected == _LIST and (key in _OBJECT_ITEMS or key in _STRING_ITEMS):
            item_type = _OBJECT if key in _OBJECT_ITEMS else _STRING
            for item in value:
                if _json_type(item) != item_type:
                    return (
                        f"cannot unmarshal {_json_type(item)} into Go struct field"
                        f" {where}.{key} of type {item_type}"
                    )
        if expected == _OBJECT and key in ("labels", "annotations"):
            for label, text in value.items():
                if not isinstance(text, str):
                    return (
                        f"cannot unmarshal {_json_type(text)} into Go struct field"
                        f" {where}.{key}[{label}] of type string"
                    )
    return None


def _quantity_problem(resources: Any) -> str | None:
    if not isinstance(resources, dict):
        return None
    for part in ("limits", "requests"):
        values = resources.get(part)
        for raw in (values or {}).values() if isinstance(values, dict) else ():
            if not isinstance(raw, str | int) or isinstance(raw, bool):
                return QUANTITY_ERROR
            if quantity_decimal(str(raw)) is None:
                return QUANTITY_ERROR
    return None


def decoding_error(resource: Resource, obj: JsonObject) -> str | None:
    """Why `obj` could not be decoded into the kind's Go struct, or None if it could."""
    problem: str | None = None
    for part in ("metadata", "spec", "status"):
        value = obj.get(part)
        if value is not None and not isinstance(value, dict):
            problem = (
                f"cannot unmarshal {_json_type(value)} into Go struct field"
                f" {resource.kind}.{part} of type object"
            )
            break
    else:
        problem = (
            _check_fields(obj.get("metadata"), _META_TYPES, "ObjectMeta.metadata")
            or _check_fields(obj.get("spec"), _SPEC_TYPES, f"{resource.kind}.spec")
            or _check_fields(obj.get("status"), _STATUS_TYPES, f"{resource.kind}.status")
        )
        if problem is None and isinstance(obj.get("spec"), dict):
            for list_name in ("containers", "initContainers"):
                for container in obj["spec"].get(list_name) or []:
                    problem = problem or _check_fields(
                        container, _CONTAINER_TYPES, f"Container.spec.{list_name}"
                    )
                    problem = problem or _check_fields(
                        container.get("resources"),
                        _RESOURCES_TYPES,
                        f"Container.spec.{list_name}.resources",
                    )
                    problem = problem or _quantity_problem(container.get("resources"))
    if problem is None and resource is POD_DISRUPTION_BUDGETS:
        problem = disruption.decoding_problem(obj)
    if problem is None and resource is RESOURCE_QUOTAS and isinstance(obj.get("spec"), dict):
        problem = _quantity_problem({"requests": obj["spec"].get("hard")})
    if problem is None and (resource is DEPLOYMENTS or resource is REPLICA_SETS):
        problem = workloads.decoding_problem(resource, obj)
    if problem is None:
        return None
    # The decoder reports a bad quantity in its own words, a type mismatch as json's.
    detail = problem if problem == QUANTITY_ERROR else f"json: {problem}"
    return (
        f'{resource.kind} in version "{resource.version}" cannot be handled as a'
        f" {resource.kind}: {detail}"
    )
