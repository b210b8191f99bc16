"""Custom resources: what a CustomResourceDefinition makes the API server serve.

A CRD (apiextensions.k8s.io/v1) is checked when written (its name, names, scope, versions,
structural schema) and given the status the real server writes (NamesAccepted, Established,
acceptedNames, storedVersions). Once stored, `Definitions` (a store observer) serves each of its
served versions through the catalog (`Resource` with a `CustomShape`), so every verb, watch,
selector and discovery works for it as for a built-in kind; a deleted CRD takes its objects with
it. The verb rules that differ for custom objects (schema, generation, the status and scale
subresources) are called from `rest`; `field_at` reads a CRD's simple JSONPaths (scale paths,
printer columns). No I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sim.apiserver import schema
from sim.apiserver.resources import (
    CUSTOM_RESOURCE_DEFINITIONS,
    META_FIELDS,
    NAMESPACED_META_FIELDS,
    Catalog,
    CustomShape,
    PrinterColumn,
    Resource,
    ScalePaths,
)
from sim.apiserver.store import DELETED, Event, Store

JsonObject = dict[str, Any]
Causes = list[tuple[str, str]]

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_PATH_PART = re.compile(
    r"\.([A-Za-z0-9_-]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_-]+)==[\"']([^\"']*)[\"']\)\]"
)
_SCALE_PATH = re.compile(r"\.(spec|status)(\.[A-Za-z0-9_-]+)+")
DEFAULT_AGE_COLUMN = PrinterColumn("Age", "date", ".metadata.creationTimestamp")


def field_at(obj: Any, path: str) -> Any:
    """The value at a simple JSONPath (`.status.replicas`, `.spec.items[0].name`, or a filter
    on a list's first match, as printer columns write it:
    `.status.conditions[?(@.type=="Ready")].reason`), or None."""
    value = obj
    for match in _PATH_PART.finditer(path):
        key, index, field, wanted = match.groups()
        if key is not None:
            value = value.get(key) if isinstance(value, dict) else None
        elif index is not None:
            position = int(index)
            value = value[position] if isinstance(value, list) and position < len(value) else None
        else:
            items = value if isinstance(value, list) else []
            value = next((i for i in items if isinstance(i, dict) and i.get(field) == wanted), None)
        if value is None:
            return None
    return value


def _simple_path(path: Any) -> bool:
    """A scale path the real server accepts: `.spec.x` or `.status.x`, dots and names only."""
    return isinstance(path, str) and bool(_SCALE_PATH.fullmatch(path))


def _set_at(obj: JsonObject, path: str, value: Any) -> None:
    keys = [m.group(1) for m in _PATH_PART.finditer(path)]
    target = obj
    for key in keys[:-1]:
        child = target.get(key)
        if not isinstance(child, dict):
            child = target[key] = {}
        target = child
    target[keys[-1]] = value


# the definition itself


def crd_causes(crd: JsonObject) -> Causes:
    """What the API server refuses in a CRD, as (field, message) pairs."""
    found: Causes = []
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group, plural = str(spec.get("group") or ""), str(names.get("plural") or "")
    name = str(crd["metadata"].get("name", ""))
    if not group:
        found.append(("spec.group", "Required value"))
    elif not _DNS_SUBDOMAIN.fullmatch(group) or "." not in group:
        found.append(
            ("spec.group", f'Invalid value: "{group}": should be a domain with at least one dot')
        )
    for key in ("plural", "kind"):
        if not names.get(key):
            found.append((f"spec.names.{key}", "Required value"))
    if plural and not _DNS_LABEL.fullmatch(plural):
        found.append(("spec.names.plural", f'Invalid value: "{plural}": a lowercase DNS label'))
    if group and plural and name != f"{plural}.{group}":
        found.append(
            ("metadata.name", f'Invalid value: "{name}": must be spec.names.plural+"."+spec.group')
        )
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        found.append(
            (
                "spec.scope",
                f"Unsupported value: {_quoted(spec.get('scope'))}: supported values:"
                ' "Cluster", "Namespaced"',
            )
        )
    versions = spec.get("versions") or []
    if not isinstance(versions, list) or not versions:
        found.append(
            (
                "spec.versions",
                "Invalid value: must have exactly one version marked as storage version",
            )
        )
        return found
    if sum(1 for v in versions if isinstance(v, dict) and v.get("storage")) != 1:
        found.append(
            (
                "spec.versions",
                "Invalid value: must have exactly one version marked as storage version",
            )
        )
    for index, version in enumerate(versions):
        where = f"spec.versions[{index}]"
        if not isinstance(version, dict) or not version.get("name"):
            found.append((f"{where}.name", "Required value"))
            continue
        validation = version.get("schema") or {}
        if "openAPIV3Schema" not in validation:
            found.append(
                (f"{where}.schema.openAPIV3Schema", "Required value: schemas are required")
            )
        else:
            found += [
                (f"{where}.schema.{field}", message)
                for field, message in schema.structural_problems(validation["openAPIV3Schema"])
            ]
        scale = (version.get("subresources") or {}).get("scale")
        if scale is not None:
            for key in ("specReplicasPath", "statusReplicasPath"):
                if not _simple_path(scale.get(key)):
                    found.append(
                        (
                            f"{where}.subresources.scale.{key}",
                            f"Invalid value: {_quoted(scale.get(key))}: should be a simple json"
                            " path under .spec or .status",
                        )
                    )
        for column_index, column in enumerate(version.get("additionalPrinterColumns") or []):
            if not isinstance(column, dict) or not column.get("name"):
                found.append(
                    (f"{where}.additionalPrinterColumns[{column_index}].name", "Required value")
                )
    return found


def _quoted(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value)


def crd_status(crd: JsonObject, now: str) -> JsonObject:
    """The status the real server gives an accepted CRD."""
    spec = crd.get("spec") or {}
    names = dict(spec.get("names") or {})
    names.setdefault("singular", str(names.get("kind", "")).lower())
    names.setdefault("listKind", f"{names.get('kind', '')}List")
    conditions = [
        {
            "type": kind,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastTransitionTime": now,
        }
        for kind, reason, message in (
            ("NamesAccepted", "NoConflicts", "no conflicts found"),
            ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        )
    ]
    stored = [str(v.get("name")) for v in spec.get("versions") or [] if v.get("storage")]
    return {"acceptedNames": names, "conditions": conditions, "storedVersions": stored}


def crd_defaults(crd: JsonObject) -> None:
    """What the real server defaults in a CRD's names."""
    names = (crd.get("spec") or {}).get("names")
    if isinstance(names, dict) and names.get("kind"):
        names.setdefault("singular", str(names["kind"]).lower())
        names.setdefault("listKind", f"{names['kind']}List")


def resources_of(crd: Mapping[str, Any]) -> tuple[Resource, ...]:
    """One `Resource` per served version of a stored (valid) CRD."""
    spec = crd["spec"]
    names = spec["names"]
    namespaced = spec["scope"] == "Namespaced"
    served = []
    for version in spec["versions"]:
        if not version.get("served", True):
            continue
        subresources = version.get("subresources") or {}
        scale = subresources.get("scale")
        columns = tuple(
            PrinterColumn(
                name=str(c["name"]),
                type=str(c.get("type", "string")),
                json_path=str(c.get("jsonPath", "")),
                description=str(c.get("description", "")),
                priority=int(c.get("priority", 0)),
                format=str(c.get("format", "")),
            )
            for c in version.get("additionalPrinterColumns") or []
        )
        shape = CustomShape(
            crd_name=str(crd["metadata"]["name"]),
            schema=version["schema"]["openAPIV3Schema"],
            scale=ScalePaths(
                spec_replicas=scale["specReplicasPath"],
                status_replicas=scale["statusReplicasPath"],
                label_selector=str(scale.get("labelSelectorPath") or ""),
            )
            if scale is not None
            else None,
            columns=columns or (DEFAULT_AGE_COLUMN,),
            singular=str(names.get("singular") or str(names["kind"]).lower()),
        )
        served.append(
            Resource(
                group=spec["group"],
                version=version["name"],
                plural=names["plural"],
                kind=names["kind"],
                namespaced=namespaced,
                field_labels=NAMESPACED_META_FIELDS if namespaced else META_FIELDS,
                subresources=frozenset(k for k in ("status", "scale") if k in subresources),
                status_subresource="status" in subresources,
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                custom=shape,
            )
        )
    return tuple(served)


class Definitions:
    """Keeps a catalog serving exactly the stored CRDs (a store observer)."""

    def __init__(self, catalog: Catalog, store: Store) -> None:
        self.catalog = catalog
        self.store = store

    def __call__(self, event: Event) -> None:
        if event.resource is not CUSTOM_RESOURCE_DEFINITIONS:
            return
        name = event.stored.name
        if event.type == DELETED:
            removed = self.catalog.remove(name)
            if removed:
                # As the CRD's cleanup finalizer does: its objects go with it.
                for stored in list(self.store.objects(removed[0], None)):
                    self.store.remove(removed[0], stored.namespace, stored.name)
            return
        self.catalog.add(name, resources_of(event.stored.obj))


# custom objects


def prepare(resource: Resource, obj: JsonObject) -> None:
    """Prune unknown fields and apply the schema's defaults (decoding, as upstream)."""
    assert resource.custom is not None
    schema.prune(resource.custom.schema, obj)
    schema.apply_defaults(resource.custom.schema, obj)


def object_causes(resource: Resource, obj: JsonObject) -> Causes:
    assert resource.custom is not None
    return schema.causes(resource.custom.schema, obj)


def next_generation(resource: Resource, old: JsonObject, new: JsonObject) -> int:
    """metadata.generation: bumped when anything but metadata (and status, with a status
    subresource) changes."""
    generation = int(old["metadata"].get("generation") or 1)
    ignored = {"metadata", "kind", "apiVersion"}
    if resource.status_subresource:
        ignored.add("status")

    def content(obj: JsonObject) -> JsonObject:
        return {k: v for k, v in obj.items() if k not in ignored}

    return generation + 1 if content(old) != content(new) else generation


def scale_of(resource: Resource, obj: JsonObject) -> JsonObject:
    """The autoscaling/v1 Scale of a custom object, through its CRD's scale paths."""
    assert resource.custom is not None and resource.custom.scale is not None
    paths = resource.custom.scale
    meta = obj["metadata"]
    replicas = field_at(obj, paths.spec_replicas)
    status_replicas = field_at(obj, paths.status_replicas)
    scale: JsonObject = {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            key: meta[key]
            for key in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if key in meta
        },
        "spec": {"replicas": int(replicas) if isinstance(replicas, int) else 0},
        "status": {"replicas": int(status_replicas) if isinstance(status_replicas, int) else 0},
    }
    if paths.label_selector:
        selector = field_at(obj, paths.label_selector)
        if isinstance(selector, str) and selector:
            scale["status"]["selector"] = selector
    return scale


def set_replicas(resource: Resource, obj: JsonObject, replicas: int) -> None:
    assert resource.custom is not None and resource.custom.scale is not None
    _set_at(obj, resource.custom.scale.spec_replicas, replicas)
