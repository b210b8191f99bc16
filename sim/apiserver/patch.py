"""The three patch kinds the API server accepts, chosen by the request's Content-Type.

- `application/json-patch+json`: RFC 6902 operations (add, remove, replace, move, copy, test).
- `application/merge-patch+json`: RFC 7386, maps merge, `null` deletes, lists are replaced.
- `application/strategic-merge-patch+json`: a merge patch where the lists upstream tags with a
  patch strategy merge by key (`status.conditions` by `type`, `spec.containers` by `name`, ...),
  `metadata.finalizers` merges as a set, and the `$patch`, `$deleteFromPrimitiveList/`,
  `$retainKeys` and `$setElementOrder/` directives work as upstream's. Lists without a strategy
  are replaced, as upstream does.

Functions take a fresh copy of the stored object and return the patched one; they raise
`ApiError` (400 for a malformed patch, 422 for one that cannot apply). No I/O.
"""

from __future__ import annotations

import copy
from typing import Any

from sim.apiserver.errors import bad_request, unprocessable

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
ACCEPTED = [JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH, APPLY_PATCH]

# Upstream's patchMergeKey tags for the fields of the served kinds, by path (list items are
# entered as "[]"). A string is the merge key of a list of objects; "" merges a list of scalars.
_MERGE_KEYS: dict[tuple[str, ...], str] = {
    ("metadata", "finalizers"): "",
    ("metadata", "ownerReferences"): "uid",
    ("status", "conditions"): "type",
    ("status", "addresses"): "type",
    ("status", "podIPs"): "ip",
    ("status", "hostIPs"): "ip",
    ("spec", "containers"): "name",
    ("spec", "initContainers"): "name",
    ("spec", "ephemeralContainers"): "name",
    ("spec", "volumes"): "name",
    ("spec", "imagePullSecrets"): "name",
    ("spec", "hostAliases"): "ip",
    ("spec", "podCIDRs"): "",
    ("spec", "topologySpreadConstraints"): "topologyKey",
    ("spec", "resourceClaims"): "name",
    ("spec", "schedulingGates"): "name",
}
_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
_CONTAINER_MERGE_KEYS = {
    "env": "name",
    "ports": "containerPort",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "resizePolicy": "resourceName",
}


def merge_key(path: tuple[str, ...]) -> str | None:
    """The merge key for the list at `path`, "" for a set of scalars, None to replace it."""
    if path in _MERGE_KEYS:
        return _MERGE_KEYS[path]
    if len(path) == 4 and path[0] == "spec" and path[1] in _CONTAINER_LISTS and path[2] == "[]":
        return _CONTAINER_MERGE_KEYS.get(path[3])
    return None


def json_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = json_merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: dict[str, Any], patch: Any) -> dict[str, Any]:
    if not isinstance(patch, dict):
        raise bad_request("strategic merge patch: the patch must be a JSON object")
    return _merge_map(target, patch, ())


def _merge_map(target: Any, patch: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return {}
    if directive not in (None, "merge"):
        raise bad_request(f"Unknown patch type: {directive} in map at {'.'.join(path) or '/'}")
    result = dict(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    if retain is not None:
        if not isinstance(retain, list):
            raise bad_request("$retainKeys must be a list of keys")
        result = {k: v for k, v in result.items() if k in retain}
    deletions: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            if not isinstance(value, list):
                raise bad_request(f"{key} must be a list of values to delete")
            deletions[key.split("/", 1)[1]] = value
            continue
        if value is None:
            result.pop(key, None)
            continue
        child = (*path, key)
        if isinstance(value, dict):
            result[key] = _merge_map(result.get(key), value, child)
        elif isinstance(value, list):
            result[key] = _merge_list(result.get(key), value, child)
        else:
            result[key] = value
    for key, removed in deletions.items():
        current = result.get(key)
        if isinstance(current, list):
            result[key] = [item for item in current if item not in removed]
    return result


def _merge_list(target: Any, patch: list[Any], path: tuple[str, ...]) -> list[Any]:
    key = merge_key(path)
    current = list(target) if isinstance(target, list) else []
    if key is None:
        if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
            return [item for item in patch if not _is_directive(item)]
        return copy.deepcopy(patch)
    if key == "":
        merged = list(current)
        for item in patch:
            if item not in merged:
                merged.append(item)
        return merged
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [copy.deepcopy(item) for item in patch if not _is_directive(item)]
    item_path = (*path, "[]")
    for item in patch:
        if not isinstance(item, dict):
            raise bad_request(
                f"strategic merge patch: the list {'.'.join(path)} merges by {key!r} and needs"
                f" objects, got {item!r}"
            )
        if key not in item:
            raise bad_request(f"map: {item} does not contain declared merge key: {key}")
        index = next(
            (
                i
                for i, old in enumerate(current)
                if isinstance(old, dict) and old.get(key) == item[key]
            ),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del current[index]
            continue
        if index is None:
            current.append(_merge_map({}, item, item_path))
        else:
            current[index] = _merge_map(current[index], item, item_path)
    return current


def _is_directive(item: Any) -> bool:
    return isinstance(item, dict) and set(item) == {"$patch"}


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902; a malformed patch is 400, one that does not apply is 422."""
    if not isinstance(operations, list):
        raise bad_request("json patch: the patch must be a JSON array of operations")
    doc = target
    for number, op in enumerate(operations):
        if not isinstance(op, dict) or not isinstance(op.get("op"), str):
            raise bad_request(f"json patch: operation {number} has no 'op'")
        kind = op["op"]
        path = op.get("path")
        if not isinstance(path, str):
            raise bad_request(f"json patch: operation {number} ({kind}) has no 'path'")
        if kind in ("add", "replace", "test") and "value" not in op:
            raise bad_request(f"json patch: operation {number} ({kind}) has no 'value'")
        if kind == "add":
            doc = _add(doc, _pointer(path), copy.deepcopy(op["value"]))
        elif kind == "remove":
            doc, _ = _remove(doc, _pointer(path))
        elif kind == "replace":
            doc, _ = _remove(doc, _pointer(path))
            doc = _add(doc, _pointer(path), copy.deepcopy(op["value"]))
        elif kind in ("move", "copy"):
            source = op.get("from")
            if not isinstance(source, str):
                raise bad_request(f"json patch: operation {number} ({kind}) has no 'from'")
            if kind == "move":
                doc, value = _remove(doc, _pointer(source))
            else:
                value = copy.deepcopy(_get(doc, _pointer(source)))
            doc = _add(doc, _pointer(path), value)
        elif kind == "test":
            if _get(doc, _pointer(path)) != op["value"]:
                raise unprocessable(f"testing value {path} failed")
        else:
            raise bad_request(f"json patch: unexpected operation {kind!r}")
    return doc


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"json patch: path {path!r} must start with '/'")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _container(doc: Any, parts: list[str]) -> Any:
    node = doc
    for part in parts:
        node = _child(node, part, "/".join(parts))
    return node


def _child(node: Any, part: str, where: str) -> Any:
    if isinstance(node, dict):
        if part not in node:
            raise unprocessable(f"doc is missing path: /{where}")
        return node[part]
    if isinstance(node, list):
        return node[_index(node, part, where, allow_end=False)]
    raise unprocessable(f"doc is missing path: /{where}")


def _index(node: list[Any], part: str, where: str, *, allow_end: bool) -> int:
    if part == "-" and allow_end:
        return len(node)
    if not part.isdigit():
        raise unprocessable(f"invalid array index {part!r} in /{where}")
    index = int(part)
    if index > len(node) or (index == len(node) and not allow_end):
        raise unprocessable(f"array index {index} out of bounds in /{where}")
    return index


def _get(doc: Any, parts: list[str]) -> Any:
    return _container(doc, parts)


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _container(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, "/".join(parts), allow_end=True), value)
    else:
        raise unprocessable(f"doc is missing path: /{'/'.join(parts)}")
    return doc


def _remove(doc: Any, parts: list[str]) -> tuple[Any, Any]:
    if not parts:
        return None, doc
    parent = _container(doc, parts[:-1])
    last = parts[-1]
    where = "/".join(parts)
    if isinstance(parent, dict):
        if last not in parent:
            raise unprocessable(f"Unable to remove nonexistent key: {last}: missing value")
        return doc, parent.pop(last)
    if isinstance(parent, list):
        return doc, parent.pop(_index(parent, last, where, allow_end=False))
    raise unprocessable(f"doc is missing path: /{where}")
