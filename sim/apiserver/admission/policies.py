"""ValidatingAdmissionPolicies: the API server's CEL admission, after mutating admission and the
object's own validation, before the write is stored.

For a create, update (main resource or a subresource such as `pods/status`), delete, or
`pods/binding` create, every stored `ValidatingAdmissionPolicy` (admissionregistration.k8s.io/v1,
in name order) whose `matchConstraints` match is evaluated once per
`ValidatingAdmissionPolicyBinding` naming it whose `matchResources` match (bindings in name
order): `matchConditions` (all must hold), then `validations` with `variables`, over `object`,
`oldObject`, `request`, `namespaceObject` and `params` (always null). A failed validation is a
denial; a CEL error is one too under `failurePolicy: Fail` (the default) and is ignored under
`Ignore`. The binding's `validationActions` decide what a denial does: `Deny` refuses the request
with kube-apiserver's Status (`<resource> "<name>" is forbidden: ValidatingAdmissionPolicy '<p>'
with binding '<b>' denied request: <message>`, code from the validation's `reason`, 422 Invalid
by default), `Warn` adds a `Warning` header, `Audit` is logged.

Not simulated: policy parameters (`paramKind`, `paramRef`: refused when the policy or binding is
written, see `registration`), `auditAnnotations`, `matchPolicy: Equivalent` (only the exact
group/version matches), the `authorizer` variable and CEL's cost limits and type checking (see
`cel`). Policies do not apply to admissionregistration.k8s.io objects, as upstream. Pure: reads
the store, no I/O.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from sim.apiserver.admission.cel import (
    CelEnvironment,
    CelError,
    as_bool,
    as_str,
    to_cel,
    variables_map,
)
from sim.apiserver.admission.matching import (
    labels_of,
    namespace_selector_applies,
    rule_matches,
    selector_matches,
)
from sim.apiserver.auth import UserInfo
from sim.apiserver.errors import ApiError
from sim.apiserver.resources import (
    NAMESPACES,
    VALIDATING_ADMISSION_POLICIES,
    VALIDATING_ADMISSION_POLICY_BINDINGS,
    Resource,
)
from sim.apiserver.store import Store

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]

ADMISSION_GROUP = "admissionregistration.k8s.io"
_CODES = {"Unauthorized": 401, "Forbidden": 403, "Invalid": 422, "RequestEntityTooLarge": 413}


@dataclass(frozen=True)
class Request:
    """One request as admission sees it (admission.Attributes upstream)."""

    operation: str
    """CREATE, UPDATE or DELETE."""
    resource: Resource
    subresource: str
    namespace: str
    name: str
    obj: JsonObject | None
    """`object`: the object to be stored (null for a delete)."""
    old: JsonObject | None
    """`oldObject`: the stored object (null for a create)."""
    user: UserInfo
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))

    @property
    def kind(self) -> JsonObject:
        kind = "Binding" if self.subresource == "binding" else self.resource.kind
        return {"group": self.resource.group, "version": self.resource.version, "kind": kind}

    def to_json(self) -> JsonObject:
        """`request` in a policy's CEL: an admission/v1 AdmissionRequest without the objects."""
        resource = {
            "group": self.resource.group,
            "version": self.resource.version,
            "resource": self.resource.plural,
        }
        body: JsonObject = {
            "uid": self.uid,
            "kind": self.kind,
            "resource": resource,
            "requestKind": self.kind,
            "requestResource": resource,
            "name": self.name,
            "operation": self.operation,
            "userInfo": self.user.to_json(),
            "dryRun": False,
            "options": {
                "CREATE": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
                "UPDATE": {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"},
                "DELETE": {"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1"},
            }.get(self.operation),
        }
        if self.subresource:
            body["subResource"] = body["requestSubResource"] = self.subresource
        if self.resource.namespaced:
            body["namespace"] = self.namespace
        return body


@dataclass(frozen=True)
class Denial:
    policy: str
    binding: str
    message: str
    reason: str


class Policies:
    """Evaluates the stored policies for one API server (it owns the compiled CEL)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._cel = CelEnvironment()

    def validate(self, request: Request) -> list[str]:
        """The warnings for `request`; raises the ApiError of the first denial under `Deny`."""
        if request.resource.group == ADMISSION_GROUP:
            return []
        policies = sorted(
            (s.obj for s in self._store.objects(VALIDATING_ADMISSION_POLICIES, "")),
            key=lambda o: str(o["metadata"]["name"]),
        )
        if not policies:
            return []
        namespace = self._namespace_of(request)
        bindings = sorted(
            (s.obj for s in self._store.objects(VALIDATING_ADMISSION_POLICY_BINDINGS, "")),
            key=lambda o: str(o["metadata"]["name"]),
        )
        warnings: list[str] = []
        denials: list[Denial] = []
        for policy in policies:
            spec = policy.get("spec") or {}
            if not _resources_match(spec.get("matchConstraints"), request, namespace, True):
                continue
            name = str(policy["metadata"]["name"])
            for binding in bindings:
                binding_spec = binding.get("spec") or {}
                if binding_spec.get("policyName") != name:
                    continue
                if not _resources_match(binding_spec.get("matchResources"), request, namespace):
                    continue
                binding_name = str(binding["metadata"]["name"])
                for message, reason in self._evaluate(name, spec, request, namespace):
                    denial = Denial(name, binding_name, message, reason)
                    self._act(denial, binding_spec, request, denials, warnings)
        if denials:
            raise _denied(request, denials[0])
        return warnings

    def _namespace_of(self, request: Request) -> JsonObject | None:
        if not request.resource.namespaced:
            return None
        stored = self._store.get(NAMESPACES, "", request.namespace)
        return stored.obj if stored is not None else None

    def _act(
        self,
        denial: Denial,
        binding_spec: JsonObject,
        request: Request,
        denials: list[Denial],
        warnings: list[str],
    ) -> None:
        actions = binding_spec.get("validationActions") or []
        if "Deny" in actions:
            denials.append(denial)
        if "Warn" in actions:
            warnings.append(
                f"Validation failed for ValidatingAdmissionPolicy '{denial.policy}' with binding"
                f" '{denial.binding}': {denial.message}"
            )
        if "Audit" in actions:
            log.warning(
                "ValidatingAdmissionPolicy %r with binding %r would deny %s %s %s/%s (audit"
                " only): %s",
                denial.policy,
                denial.binding,
                request.operation,
                request.resource.group_resource,
                request.namespace,
                request.name,
                denial.message,
            )

    def _evaluate(
        self, name: str, spec: JsonObject, request: Request, namespace: JsonObject | None
    ) -> list[tuple[str, str]]:
        """(message, reason) of each denial this policy makes of the request."""
        ignore = spec.get("failurePolicy", "Fail") == "Ignore"

        def failed(problem: str) -> list[tuple[str, str]]:
            log.warning(
                "ValidatingAdmissionPolicy %r could not be evaluated for %s %s %s/%s (%s): %s",
                name,
                request.operation,
                request.resource.group_resource,
                request.namespace,
                request.name,
                "ignored, failurePolicy Ignore" if ignore else "denied, failurePolicy Fail",
                problem,
            )
            return [] if ignore else [(problem, "Invalid")]

        activation: dict[str, Any] = {
            "object": to_cel(request.obj),
            "oldObject": to_cel(request.old),
            "request": to_cel(request.to_json()),
            "params": to_cel(None),
            "namespaceObject": to_cel(namespace),
        }
        errors = []
        for condition in spec.get("matchConditions") or []:
            expression = str(condition.get("expression", ""))
            try:
                holds = self._bool(expression, activation)
            except CelError as e:
                errors.append(f"expression '{expression}' resulted in error: {e}")
                continue
            if not holds:
                return []
        if errors:
            return failed(_aggregate(errors))
        values: dict[str, Any] = {}
        for variable in spec.get("variables") or []:
            program = self._cel.compile(str(variable.get("expression", "")))
            values[str(variable.get("name"))] = program.value_or_error(
                {**activation, "variables": variables_map(values)}
            )
        activation["variables"] = variables_map(values)
        denials: list[tuple[str, str]] = []
        for validation in spec.get("validations") or []:
            expression = str(validation.get("expression", ""))
            try:
                if self._bool(expression, activation):
                    continue
            except CelError as e:
                denials += failed(f"expression '{expression}' resulted in error: {e}")
                continue
            message = self._message(validation, activation) or (
                str(validation.get("message") or "").strip()
                or f"failed expression: {expression.strip()}"
            )
            denials.append((message, str(validation.get("reason") or "Invalid")))
        return denials

    def _bool(self, expression: str, activation: dict[str, Any]) -> bool:
        value = self._cel.compile(expression).evaluate(activation)
        result = as_bool(value)
        if result is None:
            raise CelError(f"the expression's value is {type(value).__name__}, not a bool")
        return result

    def _message(self, validation: JsonObject, activation: dict[str, Any]) -> str:
        """The messageExpression's string, or "" (as upstream, a failing one is logged and the
        static message is used)."""
        expression = validation.get("messageExpression")
        if not expression:
            return ""
        try:
            message = as_str(self._cel.compile(str(expression)).evaluate(activation))
        except CelError as e:
            log.warning(
                "messageExpression %r failed (%s): using the message instead.", expression, e
            )
            return ""
        if message is None or not message.strip() or "\n" in message:
            log.warning(
                "messageExpression %r did not give a one-line string: using the message instead.",
                expression,
            )
            return ""
        return message.strip()


def _aggregate(errors: list[str]) -> str:
    """Upstream's aggregate error text: one error as is, several in brackets."""
    return errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"


def _resources_match(
    constraints: JsonObject | None,
    request: Request,
    namespace: JsonObject | None,
    rules_required: bool = False,
) -> bool:
    """A MatchResources: rules (a binding without rules takes the policy's), exclusions and the
    namespace and object selectors."""
    constraints = constraints or {}
    resource, operation = request.resource, request.operation
    sub, name = request.subresource, request.name

    def matches(rule: JsonObject) -> bool:
        return rule_matches(rule, resource, operation, sub, name)

    rules = constraints.get("resourceRules") or []
    if (rules or rules_required) and not any(matches(r) for r in rules):
        return False
    if any(matches(r) for r in constraints.get("excludeResourceRules") or []):
        return False
    if namespace_selector_applies(resource):
        if resource is NAMESPACES:
            namespace_labels = labels_of(request.obj or request.old)
        else:
            namespace_labels = labels_of(namespace)
        if not selector_matches(constraints.get("namespaceSelector"), namespace_labels):
            return False
    selector = constraints.get("objectSelector")
    return selector_matches(selector, labels_of(request.obj)) or (
        request.old is not None and selector_matches(selector, labels_of(request.old))
    )


def _denied(request: Request, denial: Denial) -> ApiError:
    """Upstream's refusal: admission.NewForbidden's wording, with the validation's reason."""
    message = (
        f"ValidatingAdmissionPolicy '{denial.policy}' with binding '{denial.binding}' denied"
        f" request: {denial.message}"
    )
    name = request.name or str(((request.obj or {}).get("metadata") or {}).get("name") or "")
    group_resource = request.resource.group_resource
    forbidden = f'{group_resource} "{name}"' if name else group_resource
    details: JsonObject = {"name": name}
    if request.resource.group:
        details["group"] = request.resource.group
    details["kind"] = request.resource.plural
    details["causes"] = [{"message": message}]
    reason = denial.reason if denial.reason in _CODES else "Invalid"
    return ApiError(_CODES[reason], reason, f"{forbidden} is forbidden: {message}", details)
