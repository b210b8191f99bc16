"""What the API server refuses (422) in the ValidatingAdmissionPolicies and bindings it is asked to
store: upstream's required fields and enumerations, and what the simulated server does not
implement (policy parameters). CEL is not compiled or type-checked here (see `cel`). Pure.
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

_ACTIONS = ("Deny", "Warn", "Audit")


def spec_causes(resource: Resource, obj: JsonObject) -> Causes:
    """What the API server refuses (422) in a policy or binding it is asked to store, and what
    this one does not implement (parameters)."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [("spec", "Required value")]
    causes: Causes = []
    if resource is VALIDATING_ADMISSION_POLICIES:
        if spec.get("failurePolicy", "Fail") not in ("Fail", "Ignore"):
            causes.append(
                (
                    "spec.failurePolicy",
                    f'Unsupported value: "{spec["failurePolicy"]}": supported values: "Fail",'
                    ' "Ignore"',
                )
            )
        if spec.get("paramKind"):
            causes.append(("spec.paramKind", _NO_PARAMS))
        if not (spec.get("matchConstraints") or {}).get("resourceRules"):
            causes.append(("spec.matchConstraints.resourceRules", "Required value"))
        if not spec.get("validations") and not spec.get("auditAnnotations"):
            causes.append(
                (
                    "spec.validations",
                    "Required value: validations or auditAnnotations must contain"
                    " at least one item",
                )
            )
        for i, validation in enumerate(spec.get("validations") or []):
            if not isinstance(validation, dict) or not validation.get("expression"):
                causes.append((f"spec.validations[{i}].expression", "Required value"))
    elif resource is VALIDATING_ADMISSION_POLICY_BINDINGS:
        if not spec.get("policyName"):
            causes.append(("spec.policyName", "Required value"))
        if spec.get("paramRef"):
            causes.append(("spec.paramRef", _NO_PARAMS))
        actions = spec.get("validationActions") or []
        if not actions:
            causes.append(("spec.validationActions", "Required value"))
        for i, action in enumerate(actions):
            if action not in _ACTIONS:
                causes.append(
                    (
                        f"spec.validationActions[{i}]",
                        f'Unsupported value: "{action}": supported values: "Audit", "Deny", "Warn"',
                    )
                )
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


_NO_PARAMS = (
    "Forbidden: policy parameters (paramKind, paramRef) are not implemented by the simulated API"
    " server"
)
