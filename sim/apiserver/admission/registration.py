"""What the API server refuses (422) in the ValidatingAdmissionPolicies and bindings it is asked to
store: upstream's required fields and enumerations, shapes the evaluation relies on, and what the
simulated server does not implement (policy parameters). CEL is not compiled or type-checked here
(see `cel`). Pure.
"""

from __future__ import annotations

from typing import Any

from sim.apiserver.resources import (
    VALIDATING_ADMISSION_POLICIES,
    VALIDATING_ADMISSION_POLICY_BINDINGS,
    Resource,
)

JsonObject = dict[str, Any]
Causes = list[tuple[str, str]]

ACTIONS = ("Deny", "Warn", "Audit")
REASONS = ("Unauthorized", "Forbidden", "Invalid", "RequestEntityTooLarge")
_NO_PARAMS = (
    "Forbidden: policy parameters (paramKind, paramRef) are not implemented by the simulated API"
    " server"
)


def _unsupported(value: object, supported: tuple[str, ...]) -> str:
    return f'Unsupported value: "{value}": supported values: ' + ", ".join(
        f'"{s}"' for s in sorted(supported)
    )


def _items(spec: JsonObject, key: str, path: str, causes: Causes) -> list[JsonObject]:
    """spec[key] as a list of objects (a cause for anything else)."""
    value = spec.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        causes.append((f"{path}.{key}", "Invalid value: must be a list of objects"))
        return []
    return value


def _strings(item: JsonObject, keys: tuple[str, ...], path: str, causes: Causes) -> None:
    for key in keys:
        if key in item and not isinstance(item[key], str):
            causes.append((f"{path}.{key}", "Invalid value: must be a string"))


def _match_resources(value: Any, path: str, causes: Causes, rules_required: bool) -> None:
    if value is None and not rules_required:
        return
    if not isinstance(value, dict):
        causes.append((path, "Required value" if value is None else "must be an object"))
        return
    for key in ("resourceRules", "excludeResourceRules"):
        for i, rule in enumerate(_items(value, key, path, causes)):
            for field in ("apiGroups", "apiVersions", "operations", "resources", "resourceNames"):
                names = rule.get(field)
                if names is not None and (
                    not isinstance(names, list) or not all(isinstance(n, str) for n in names)
                ):
                    causes.append((f"{path}.{key}[{i}].{field}", "must be a list of strings"))
    if rules_required and not value.get("resourceRules"):
        causes.append((f"{path}.resourceRules", "Required value"))
    for key in ("namespaceSelector", "objectSelector"):
        if value.get(key) is not None and not isinstance(value[key], dict):
            causes.append((f"{path}.{key}", "Invalid value: must be a label selector"))


def spec_causes(resource: Resource, obj: JsonObject) -> Causes:
    """What the API server refuses in a policy or binding it is asked to store."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [("spec", "Required value")]
    if resource is VALIDATING_ADMISSION_POLICIES:
        return _policy_causes(spec)
    if resource is VALIDATING_ADMISSION_POLICY_BINDINGS:
        return _binding_causes(spec)
    return []


def _policy_causes(spec: JsonObject) -> Causes:
    causes: Causes = []
    failure_policy = spec.get("failurePolicy", "Fail")
    if failure_policy not in ("Fail", "Ignore"):
        causes.append(("spec.failurePolicy", _unsupported(failure_policy, ("Fail", "Ignore"))))
    if spec.get("paramKind"):
        causes.append(("spec.paramKind", _NO_PARAMS))
    _match_resources(spec.get("matchConstraints"), "spec.matchConstraints", causes, True)
    for key in ("matchConditions", "variables"):
        for i, item in enumerate(_items(spec, key, "spec", causes)):
            for field in ("name", "expression"):
                if not item.get(field):
                    causes.append((f"spec.{key}[{i}].{field}", "Required value"))
            _strings(item, ("name", "expression"), f"spec.{key}[{i}]", causes)
    validations = _items(spec, "validations", "spec", causes)
    if not validations and not spec.get("auditAnnotations"):
        causes.append(
            (
                "spec.validations",
                "Required value: validations or auditAnnotations must contain at least one item",
            )
        )
    for i, validation in enumerate(validations):
        path = f"spec.validations[{i}]"
        if not validation.get("expression"):
            causes.append((f"{path}.expression", "Required value"))
        _strings(validation, ("expression", "message", "messageExpression"), path, causes)
        reason = validation.get("reason")
        if reason is not None and reason not in REASONS:
            causes.append((f"{path}.reason", _unsupported(reason, REASONS)))
    return causes


def _binding_causes(spec: JsonObject) -> Causes:
    causes: Causes = []
    if not spec.get("policyName"):
        causes.append(("spec.policyName", "Required value"))
    _strings(spec, ("policyName",), "spec", causes)
    if spec.get("paramRef"):
        causes.append(("spec.paramRef", _NO_PARAMS))
    _match_resources(spec.get("matchResources"), "spec.matchResources", causes, False)
    actions = spec.get("validationActions")
    if not actions:
        causes.append(("spec.validationActions", "Required value"))
    elif not isinstance(actions, list):
        causes.append(("spec.validationActions", "Invalid value: must be a list"))
    else:
        for i, action in enumerate(actions):
            if action not in ACTIONS:
                causes.append((f"spec.validationActions[{i}]", _unsupported(action, ACTIONS)))
        if "Deny" in actions and "Warn" in actions:
            causes.append(
                (
                    "spec.validationActions",
                    'Invalid value: ["Deny","Warn"]: must not contain both Deny and Warn'
                    " (repeating the same validation failure information in the API response"
                    " and headers serves no purpose)",
                )
            )
    return causes
