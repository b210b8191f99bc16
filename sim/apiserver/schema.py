"""Structural schemas of custom resources: pruning, defaulting and validation.

What kube-apiserver does with a CRD version's `openAPIV3Schema` when it decodes and validates a
custom object: unknown fields are pruned (except under `x-kubernetes-preserve-unknown-fields`,
and `apiVersion`, `kind`, `metadata` at the root), `default`s fill absent fields, then the object
is checked for `type` (with `nullable` and `x-kubernetes-int-or-string`), `properties`,
`additionalProperties`, `items`, `required`, `enum`, `minimum`/`maximum` (and exclusive),
`minLength`/`maxLength`, `pattern`, `minItems`/`maxItems`, and the CEL rules of
`x-kubernetes-validations` (`rule` over `self`, with `message` or `messageExpression`; on the
admission policies' evaluator, sim.apiserver.admission.cel), each failure a (field path, message)
cause worded as the API server words it; pruning names the fields it drops, for field
validation (sim.apiserver.fieldvalidation). Not implemented: `format`, transition rules (`oldSelf`:
skipped), `fieldPath`, `oneOf`/`anyOf`/`allOf`/`not`, list-type and map-type uniqueness. Pure
functions over JSON; no I/O.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from functools import cache
from typing import Any

from sim.apiserver.admission.cel import CelEnvironment, CelError, as_bool, as_str, to_cel

Schema = Mapping[str, Any]
Causes = list[tuple[str, str]]

_ROOT_KEPT = ("apiVersion", "kind", "metadata")
_CEL = CelEnvironment()  # compiled rules, cached by their text


def _preserves(schema: Schema) -> bool:
    return bool(schema.get("x-kubernetes-preserve-unknown-fields"))


def prune(schema: Schema, obj: dict[str, Any]) -> list[str]:
    """Drop, in place, every field of the object its schema does not declare; returns the
    paths of the fields dropped (`spec.replica`, `spec.items[0].extra`), as upstream's pruning
    reports them to field validation."""
    kept = {key: obj[key] for key in _ROOT_KEPT if key in obj}
    for key in _ROOT_KEPT:
        obj.pop(key, None)
    dropped: list[str] = []
    _prune(schema, obj, "", dropped)
    obj.update(kept)
    return dropped


def _prune(schema: Schema, value: Any, path: str, dropped: list[str]) -> None:
    if isinstance(value, dict):
        properties: Mapping[str, Schema] = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        for key in list(value):
            child = properties.get(key)
            if child is None and isinstance(additional, Mapping):
                child = additional
            if child is None:
                if not _preserves(schema) and additional is not True:
                    del value[key]
                    dropped.append(_child(path, key))
                continue
            if value[key] is None and "default" in child and not child.get("nullable"):
                del value[key]  # as upstream: a null where a default exists is defaulted
                continue
            _prune(child, value[key], _child(path, key), dropped)
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            for index, item in enumerate(value):
                _prune(items, item, f"{path}[{index}]", dropped)


def apply_defaults(schema: Schema, value: Any) -> None:
    """Fill, in place, every absent field that has a `default`, at every depth."""
    if isinstance(value, dict):
        properties: Mapping[str, Schema] = schema.get("properties") or {}
        for key, child in properties.items():
            if key not in value and "default" in child:
                value[key] = copy.deepcopy(child["default"])
            if key in value:
                apply_defaults(child, value[key])
        additional = schema.get("additionalProperties")
        if isinstance(additional, Mapping):
            for key, child_value in value.items():
                if key not in properties:
                    apply_defaults(additional, child_value)
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            for item in value:
                apply_defaults(items, item)


def causes(schema: Schema, obj: Mapping[str, Any]) -> Causes:
    """What is wrong with the object against its schema (metadata is the API server's own)."""
    found: Causes = []
    root = {key: value for key, value in obj.items() if key not in _ROOT_KEPT}
    _check(schema, root, "", found)
    return found


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _fits(declared: str, actual: str, value: Any) -> bool:
    if declared == actual:
        return True
    if declared == "number" and actual == "integer":
        return True
    return declared == "integer" and actual == "number" and float(value).is_integer()


def _shown(value: Any) -> str:
    """A value as field errors print it: strings quoted, numbers bare."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(_json_type(value))


@cache
def _pattern(text: str) -> re.Pattern[str]:
    return re.compile(text)


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _check(schema: Schema, value: Any, path: str, found: Causes) -> None:
    actual = _json_type(value)
    if value is None and schema.get("nullable"):
        return
    if schema.get("x-kubernetes-int-or-string"):
        if actual not in ("integer", "string"):
            found.append(
                (
                    path,
                    f'Invalid value: "{actual}": {path} in body must be of type integer,string:'
                    f' "{actual}"',
                )
            )
            return
    else:
        declared = schema.get("type")
        if declared and not _fits(str(declared), actual, value):
            found.append(
                (
                    path,
                    f'Invalid value: "{actual}": {path} in body must be of type {declared}:'
                    f' "{actual}"',
                )
            )
            return
    enum = schema.get("enum")
    if enum is not None and value not in enum:
        supported = ", ".join(_shown(choice) for choice in enum)
        found.append((path, f"Unsupported value: {_shown(value)}: supported values: {supported}"))
    if actual in ("integer", "number"):
        _check_number(schema, value, path, found)
    elif actual == "string":
        _check_string(schema, value, path, found)
    elif actual == "array":
        _check_array(schema, value, path, found)
    elif actual == "object":
        _check_object(schema, value, path, found)
    _check_rules(schema, value, actual, path, found)


def _check_rules(schema: Schema, value: Any, actual: str, path: str, found: Causes) -> None:
    """`x-kubernetes-validations`: each rule evaluated with `self` the value here; a rule that
    is false fails with its message (`Invalid value: "<type>": <message>`, as upstream)."""
    rules = schema.get("x-kubernetes-validations") or ()
    if not rules:
        return
    activation = {"self": to_cel(value)}
    for rule in rules:
        text = str(rule.get("rule", ""))
        if "oldSelf" in text:
            continue  # a transition rule: only an update has an old object
        try:
            passed = as_bool(_CEL.compile(text).evaluate(activation))
        except CelError as e:
            found.append((path, f"Internal error: {e} evaluating rule: {text}"))
            continue
        if passed:
            continue
        message = f"failed rule: {text}"
        if rule.get("messageExpression"):
            try:
                said = as_str(_CEL.compile(str(rule["messageExpression"])).evaluate(activation))
            except CelError:
                said = None
            message = said or str(rule.get("message") or message)
        elif rule.get("message"):
            message = str(rule["message"])
        found.append((path, f'Invalid value: "{actual}": {message}'))


def _check_number(schema: Schema, value: float, path: str, found: Causes) -> None:
    minimum, maximum = schema.get("minimum"), schema.get("maximum")
    if minimum is not None:
        if schema.get("exclusiveMinimum") and value <= minimum:
            found.append(
                (
                    path,
                    f"Invalid value: {_shown(value)}: {path} in body should be greater than"
                    f" {minimum}",
                )
            )
        elif value < minimum:
            found.append(
                (
                    path,
                    f"Invalid value: {_shown(value)}: {path} in body should be greater than or"
                    f" equal to {minimum}",
                )
            )
    if maximum is not None:
        if schema.get("exclusiveMaximum") and value >= maximum:
            found.append(
                (
                    path,
                    f"Invalid value: {_shown(value)}: {path} in body should be less than {maximum}",
                )
            )
        elif value > maximum:
            found.append(
                (
                    path,
                    f"Invalid value: {_shown(value)}: {path} in body should be less than or equal"
                    f" to {maximum}",
                )
            )


def _check_string(schema: Schema, value: str, path: str, found: Causes) -> None:
    max_length, min_length = schema.get("maxLength"), schema.get("minLength")
    if max_length is not None and len(value) > max_length:
        found.append((path, f"Too long: may not be longer than {max_length}"))
    if min_length is not None and len(value) < min_length:
        found.append(
            (
                path,
                f"Invalid value: {_shown(value)}: {path} in body should be at least {min_length}"
                " chars long",
            )
        )
    pattern = schema.get("pattern")
    if pattern is not None and not _pattern(str(pattern)).search(value):
        found.append(
            (path, f"Invalid value: {_shown(value)}: {path} in body should match '{pattern}'")
        )


def _check_array(schema: Schema, value: list[Any], path: str, found: Causes) -> None:
    max_items, min_items = schema.get("maxItems"), schema.get("minItems")
    if max_items is not None and len(value) > max_items:
        found.append((path, f"Too many: {len(value)}: must have at most {max_items} items"))
    if min_items is not None and len(value) < min_items:
        found.append(
            (
                path,
                f"Invalid value: {len(value)}: {path} in body should have at least {min_items}"
                " items",
            )
        )
    items = schema.get("items")
    if isinstance(items, Mapping):
        for index, item in enumerate(value):
            _check(items, item, f"{path}[{index}]", found)


def _check_object(schema: Schema, value: dict[str, Any], path: str, found: Causes) -> None:
    for key in schema.get("required") or ():
        if key not in value:
            found.append((_child(path, key), "Required value"))
    properties: Mapping[str, Schema] = schema.get("properties") or {}
    additional = schema.get("additionalProperties")
    for key, child_value in value.items():
        child = properties.get(key)
        if child is None and isinstance(additional, Mapping):
            child = additional
        if child is not None:
            _check(child, child_value, _child(path, key), found)


def structural_problems(schema: Any, path: str = "openAPIV3Schema") -> Causes:
    """Why a schema is not structural enough to serve (the checks cheap to make): every node
    with properties, items or a type names a known type, `properties` and `items` are schemas."""
    found: Causes = []
    if not isinstance(schema, Mapping):
        return [(path, "Required value: a schema object")]
    declared = schema.get("type")
    known = ("object", "array", "string", "integer", "number", "boolean")
    if declared is None and not (_preserves(schema) or schema.get("x-kubernetes-int-or-string")):
        found.append(
            (f"{path}.type", "Required value: must not be empty for specified object fields")
        )
    elif declared is not None and declared not in known:
        found.append((f"{path}.type", f'Unsupported value: "{declared}"'))
    properties = schema.get("properties") or {}
    if not isinstance(properties, Mapping):
        return [*found, (f"{path}.properties", "Invalid value: must be an object")]
    for key, child in properties.items():
        found += structural_problems(child, f"{path}.properties[{key}]")
    for part in ("items", "additionalProperties"):
        child = schema.get(part)
        if isinstance(child, Mapping):
            found += structural_problems(child, f"{path}.{part}")
    return found
