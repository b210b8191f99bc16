"""Field validation the real API server applies to the served kinds, with its messages.

Names (DNS subdomain or label), label keys and values, annotation keys, the required fields of a
pod's containers, and the fields of a pod that an update may not change. Each check returns
(field, message) causes; `sim.apiserver.rest` turns them into one 422 Invalid. Pure; no I/O.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sim.apiserver.resources import NAMESPACES, PODS, Resource

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
    return causes


def _comparable_spec(spec: JsonObject) -> JsonObject:
    result = dict(spec)
    for key in ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds"):
        result.pop(key, None)
    for list_name in ("containers", "initContainers"):
        if isinstance(result.get(list_name), list):
            result[list_name] = [
                {k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c
                for c in result[list_name]
            ]
    return result


def pod_update_causes(old: JsonObject, new: JsonObject) -> Causes:
    """An update may change only container images, deadlines and added tolerations."""
    old_spec = old.get("spec") or {}
    new_spec = new.get("spec") or {}
    if _comparable_spec(old_spec) != _comparable_spec(new_spec):
        return [("spec", _POD_UPDATE_FORBIDDEN)]
    old_tolerations = old_spec.get("tolerations") or []
    new_tolerations = new_spec.get("tolerations") or []
    if any(t not in new_tolerations for t in old_tolerations):
        return [("spec.tolerations", _POD_UPDATE_FORBIDDEN)]
    return []


def kind_causes(resource: Resource, obj: JsonObject) -> Causes:
    causes = metadata_causes(obj)
    if resource is PODS:
        causes += pod_causes(obj)
    return causes
