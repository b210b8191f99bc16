"""OpenAPI v3 of custom resources: `/openapi/v3` and `/openapi/v3/apis/<group>/<version>`.

As kube-apiserver publishes a CRD's schema: one document per group/version that serves custom
resources, its `paths` naming each resource's operations (with `x-kubernetes-group-version-kind`,
and the `fieldValidation` parameter on writes, which tells kubectl the server validates fields
itself), its `components.schemas` each kind's `openAPIV3Schema` with `apiVersion`, `kind` and
`metadata` added. `kubectl explain` reads these. Built-in kinds have no document (the simulator
knows no full schema of them). Pure data; no I/O.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from sim.apiserver.resources import Catalog, Resource

JsonObject = dict[str, Any]

_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_LIST_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"
_API_VERSION = (
    "APIVersion defines the versioned schema of this representation of an object. Servers"
    " should convert recognized schemas to the latest internal value, and may reject"
    " unrecognized values."
)
_KIND = (
    "Kind is a string value representing the REST resource this object represents. Servers may"
    " infer this from the endpoint the client submits requests to. In CamelCase."
)
_METADATA = "Standard object's metadata."
_META_SCHEMAS: JsonObject = {
    _OBJECT_META: {
        "type": "object",
        "description": "ObjectMeta is metadata that all persisted resources must have.",
        "properties": {
            "name": {"type": "string", "description": "Name must be unique within a namespace."},
            "generateName": {
                "type": "string",
                "description": "A prefix the server adds a random suffix to, if name is empty.",
            },
            "namespace": {
                "type": "string",
                "description": "The namespace the object lives in (empty: cluster-scoped).",
            },
            "uid": {"type": "string", "description": "The unique ID the server gives it."},
            "resourceVersion": {
                "type": "string",
                "description": "The version of the object, for optimistic concurrency.",
            },
            "generation": {
                "type": "integer",
                "format": "int64",
                "description": "A sequence number of the desired state's generation.",
            },
            "creationTimestamp": {
                "type": "string",
                "format": "date-time",
                "description": "When the object was created.",
            },
            "deletionTimestamp": {
                "type": "string",
                "format": "date-time",
                "description": "When the object will be deleted (set by the server).",
            },
            "deletionGracePeriodSeconds": {
                "type": "integer",
                "format": "int64",
                "description": "Seconds allowed for graceful termination before removal.",
            },
            "labels": {
                "type": "object",
                "additionalProperties": {"type": "string", "default": ""},
                "description": "Map of string keys and values to organize and select objects.",
            },
            "annotations": {
                "type": "object",
                "additionalProperties": {"type": "string", "default": ""},
                "description": "Unstructured key value map set by external tools.",
            },
            "finalizers": {
                "type": "array",
                "items": {"type": "string", "default": ""},
                "description": "Must be empty before the object is deleted from the registry.",
            },
            "ownerReferences": {
                "type": "array",
                "items": {"type": "object"},
                "description": "Objects this one depends on (garbage collection).",
            },
            "managedFields": {
                "type": "array",
                "items": {"type": "object"},
                "description": "Which field manager owns which fields (server-side apply).",
            },
        },
    },
    _LIST_META: {
        "type": "object",
        "description": "ListMeta describes metadata that synthetic resources must have.",
        "properties": {
            "continue": {"type": "string", "description": "A token to read the next chunk."},
            "resourceVersion": {"type": "string", "description": "The list's version."},
        },
    },
}


def _schema_name(resource: Resource, kind: str) -> str:
    """`io.tritonshare.v1alpha1.TritonModel`, as upstream names a CRD's definitions."""
    reversed_group = ".".join(reversed(resource.group.split(".")))
    return f"{reversed_group}.{resource.version}.{kind}"


def _gvk(resource: Resource, kind: str) -> JsonObject:
    return {"group": resource.group, "version": resource.version, "kind": kind}


def _ref(name: str) -> JsonObject:
    return {"$ref": f"#/components/schemas/{name}"}


def _kind_schema(resource: Resource) -> JsonObject:
    assert resource.custom is not None
    document = copy.deepcopy(dict(resource.custom.schema))
    properties = document.setdefault("properties", {})
    properties["apiVersion"] = {"type": "string", "description": _API_VERSION}
    properties["kind"] = {"type": "string", "description": _KIND}
    properties["metadata"] = {"allOf": [_ref(_OBJECT_META)], "description": _METADATA}
    document["x-kubernetes-group-version-kind"] = [_gvk(resource, resource.kind)]
    return document


def _list_schema(resource: Resource) -> JsonObject:
    return {
        "type": "object",
        "description": f"{resource.kind}List is a list of {resource.kind}",
        "required": ["items"],
        "properties": {
            "apiVersion": {"type": "string", "description": _API_VERSION},
            "kind": {"type": "string", "description": _KIND},
            "metadata": {"allOf": [_ref(_LIST_META)], "description": "Standard list metadata."},
            "items": {
                "type": "array",
                "description": f"List of {resource.plural}.",
                "items": _ref(_schema_name(resource, resource.kind)),
            },
        },
        "x-kubernetes-group-version-kind": [_gvk(resource, f"{resource.kind}List")],
    }


def _operation(
    resource: Resource, action: str, kind: str, returns: str, *, writes: bool
) -> JsonObject:
    parameters: list[JsonObject] = []
    if writes:
        parameters = [
            {
                "name": name,
                "in": "query",
                "description": description,
                "schema": {"type": "string"},
            }
            for name, description in (
                ("dryRun", "When present, modifications are not persisted."),
                ("fieldManager", "The name of the actor making the change."),
                (
                    "fieldValidation",
                    "Ignore, Warn or Strict: what to do with unknown or duplicate fields.",
                ),
            )
        ]
    content = {"application/json": {"schema": _ref(returns)}}
    return {
        "tags": [f"{resource.group}_{resource.version}"],
        "description": f"{action} {kind}",
        "parameters": parameters,
        "responses": {"200": {"description": "OK", "content": content}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": _gvk(resource, resource.kind),
    }


def _paths(resource: Resource) -> JsonObject:
    kind = resource.kind
    one = _schema_name(resource, kind)
    many = _schema_name(resource, f"{kind}List")
    base = f"/apis/{resource.group}/{resource.version}"
    collection = (
        f"{base}/namespaces/{{namespace}}/{resource.plural}"
        if resource.namespaced
        else f"{base}/{resource.plural}"
    )
    item = f"{collection}/{{name}}"
    paths: JsonObject = {
        collection: {
            "get": _operation(resource, "list", kind, many, writes=False),
            "post": _operation(resource, "post", kind, one, writes=True),
        },
        item: {
            "get": _operation(resource, "get", kind, one, writes=False),
            "put": _operation(resource, "put", kind, one, writes=True),
            "patch": _operation(resource, "patch", kind, one, writes=True),
            "delete": _operation(resource, "delete", kind, one, writes=False),
        },
    }
    if resource.namespaced:
        paths[f"{base}/{resource.plural}"] = {
            "get": _operation(resource, "list", kind, many, writes=False)
        }
    if resource.status_subresource:
        paths[f"{item}/status"] = {
            "get": _operation(resource, "get", kind, one, writes=False),
            "put": _operation(resource, "put", kind, one, writes=True),
            "patch": _operation(resource, "patch", kind, one, writes=True),
        }
    return paths


def _custom_resources(catalog: Catalog, group: str, version: str) -> list[Resource]:
    served = catalog.by_group_version.get((group, version)) or {}
    return [r for r in served.values() if r.custom is not None]


def group_version_document(catalog: Catalog, group: str, version: str) -> JsonObject | None:
    """The OpenAPI v3 document of one group/version's custom resources, or None if it serves
    none."""
    resources = _custom_resources(catalog, group, version)
    if not resources:
        return None
    paths: JsonObject = {}
    schemas: JsonObject = dict(_META_SCHEMAS)
    for resource in sorted(resources, key=lambda r: r.plural):
        paths.update(_paths(resource))
        schemas[_schema_name(resource, resource.kind)] = _kind_schema(resource)
        schemas[_schema_name(resource, f"{resource.kind}List")] = _list_schema(resource)
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes CRD Swagger", "version": "v0.1.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def _hash(document: JsonObject) -> str:
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha512(text.encode()).hexdigest().upper()


def discovery_document(catalog: Catalog) -> JsonObject:
    """`/openapi/v3`: each group/version with a document, at a URL that changes with it (the
    hash lets clients cache it)."""
    paths: JsonObject = {}
    for group, version in sorted(catalog.by_group_version):
        document = group_version_document(catalog, group, version)
        if document is not None:
            url = f"/openapi/v3/apis/{group}/{version}?hash={_hash(document)}"
            paths[f"apis/{group}/{version}"] = {"serverRelativeURL": url}
    return {"paths": paths}
