"""Server-side field validation: the `fieldValidation` parameter of create, update and patch.

A decoder drops two kinds of field: one the kind does not declare (for a custom resource, what
structural pruning removes, `x-kubernetes-preserve-unknown-fields` keeping its subtree; for every
kind, a `metadata` field ObjectMeta does not have) and one given twice in a JSON object (the
last one wins). As kube-apiserver: `Strict` refuses the request (400) naming every such field,
`Warn` (the default for a request without the parameter) accepts it with one `Warning` header
per field, `Ignore` accepts it silently. The simulator knows no full schema of a built-in kind,
so beyond `metadata` a built-in object's unknown fields pass. Pure; no I/O.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from sim.apiserver import patch as patches
from sim.apiserver import schema
from sim.apiserver.errors import ApiError, bad_request, invalid
from sim.apiserver.resources import Resource

JsonObject = dict[str, Any]

STRICT, WARN, IGNORE = "Strict", "Warn", "Ignore"
OBJECT_META_FIELDS = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)


def parse_directive(value: str | None) -> str:
    """The directive a request asks for (Warn when it names none); 400 for an unknown one."""
    if not value:
        return WARN
    if value not in (STRICT, WARN, IGNORE):
        raise bad_request(
            f'fieldValidation: Unsupported value: "{value}": supported values: "Ignore",'
            ' "Strict", "Warn"'
        )
    return value


class _Pairs(dict[str, Any]):
    """A decoded JSON object that remembers the keys it was given more than once."""

    repeated: list[str]


def _pairs(items: list[tuple[str, Any]]) -> _Pairs:
    obj = _Pairs(items)
    seen: set[str] = set()
    obj.repeated = []
    for key, _ in items:
        if key in seen and key not in obj.repeated:
            obj.repeated.append(key)
        seen.add(key)
    return obj


def loads(raw: bytes) -> tuple[Any, list[str]]:
    """The JSON document, as plain dicts and lists, and the paths of the fields it gives more
    than once (`spec.replicas`, `spec.items[0].name`). Raises ValueError as `json.loads`."""
    document = json.loads(raw, object_pairs_hook=_pairs)
    found: list[str] = []
    return _plain(document, "", found), found


def _plain(value: Any, path: str, found: list[str]) -> Any:
    if isinstance(value, _Pairs):
        found.extend(f"{path}.{key}" if path else key for key in value.repeated)
        return {
            key: _plain(child, f"{path}.{key}" if path else key, found)
            for key, child in value.items()
        }
    if isinstance(value, list):
        return [_plain(item, f"{path}[{index}]", found) for index, item in enumerate(value)]
    return value


def unknown_fields(resource: Resource, obj: Any) -> list[str]:
    """The fields of `obj` its kind does not declare, as upstream's field validation names
    them (`spec.replica`, `metadata.labelz`)."""
    if not isinstance(obj, dict):
        return []
    found: list[str] = []
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        found += [f"metadata.{key}" for key in meta if key not in OBJECT_META_FIELDS]
    if resource.custom is not None:
        found += schema.prune(resource.custom.schema, copy.deepcopy(obj))
    return found


def prune_metadata(obj: JsonObject) -> None:
    """Drop, in place, the metadata fields ObjectMeta does not have (the decoder does)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        for key in [key for key in meta if key not in OBJECT_META_FIELDS]:
            del meta[key]


def _problems(duplicates: list[str], unknown: list[str]) -> list[str]:
    return [f'duplicate field "{path}"' for path in duplicates] + [
        f'unknown field "{path}"' for path in unknown
    ]


def _go_value(value: Any) -> str:
    """A decoded JSON value as Go's `%+v` prints it (maps with sorted keys)."""
    if isinstance(value, dict):
        inner = " ".join(f"{key}:{_go_value(value[key])}" for key in sorted(value))
        return f"map[{inner}]"
    if isinstance(value, list):
        return "[" + " ".join(_go_value(item) for item in value) + "]"
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass
class FieldValidation:
    """One write request's directive, and the warnings it adds to the response."""

    directive: str = WARN
    warnings: list[str] = field(default_factory=list)

    def _report(self, problems: list[str], refuse: ApiError) -> None:
        if not problems or self.directive == IGNORE:
            return
        if self.directive == STRICT:
            raise refuse
        self.warnings.extend(problems)

    def check_object(self, resource: Resource, obj: Any, duplicates: list[str]) -> None:
        """A create or update body: refused (Strict), warned about (Warn) or let through."""
        problems = _problems(duplicates, unknown_fields(resource, obj))
        message = (
            f'{resource.kind} in version "{resource.version}" cannot be handled as a'
            f" {resource.kind}: strict decoding error: {', '.join(problems)}"
        )
        self._report(problems, bad_request(message))

    def check_patched(
        self, resource: Resource, content_type: str, raw: bytes, patched: Any
    ) -> None:
        """A patch: the fields its document repeats and those the patched object does not
        declare. A strategic merge patch is refused as upstream refuses it (422, naming the
        patch), a JSON or merge patch with a 400."""
        try:
            document, duplicates = loads(raw)
        except ValueError:
            document, duplicates = None, []
        problems = _problems(duplicates, unknown_fields(resource, patched))
        strict = f"strict decoding error: {', '.join(problems)}"
        media = content_type.split(";")[0].strip().lower()
        if media == patches.STRATEGIC_MERGE_PATCH:
            shown = json.dumps(_go_value(document))
            cause = f"Invalid value: {shown}: {strict}"
            refuse = invalid("", "", "", [("patch", cause)])  # upstream names no kind here
        else:
            refuse = bad_request(strict)
        self._report(problems, refuse)
