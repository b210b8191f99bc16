"""Which admission rules and selectors match a request: the matching that mutating webhooks and
ValidatingAdmissionPolicies (and their bindings) share, as kube-apiserver's admission predicates
do it.

A rule names operations, API groups, versions and resources (`pods`, `pods/status`, `*`, `*/*`,
`pods/*`, `*/status`), optionally resource names and a scope; a label selector is a
metav1.LabelSelector. Pure: reads only the objects it is given.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sim.apiserver.resources import NAMESPACES, Resource

JsonObject = dict[str, Any]


def _wildcard(values: Iterable[str], value: str) -> bool:
    values = list(values)
    return "*" in values or value in values


def _resource_matches(patterns: Iterable[str], plural: str, subresource: str) -> bool:
    # As upstream: "*" is every resource but no subresource, "*/*" everything, "pods/*" pods and
    # all of its subresources, "*/status" the status of every resource.
    for pattern in patterns:
        name, _, sub = pattern.partition("/")
        if (name in ("*", plural)) and (sub == "*" or sub == subresource):
            return True
    return False


def rule_matches(
    rule: JsonObject, resource: Resource, operation: str, subresource: str = "", name: str = ""
) -> bool:
    """A RuleWithOperations (or NamedRuleWithOperations, with `resourceNames`) against a
    request for `resource`/`subresource` named `name`."""
    if not _wildcard(rule.get("operations") or [], operation):
        return False
    if not _wildcard(rule.get("apiGroups") or [], resource.group):
        return False
    if not _wildcard(rule.get("apiVersions") or [], resource.version):
        return False
    if not _resource_matches(rule.get("resources") or [], resource.plural, subresource):
        return False
    names = rule.get("resourceNames") or []
    if names and name not in names:
        return False
    scope = rule.get("scope", "*")
    return (
        scope == "*"
        or (scope == "Namespaced" and resource.namespaced)
        or (scope == "Cluster" and not resource.namespaced)
    )


def selector_matches(selector: JsonObject | None, labels: JsonObject) -> bool:
    """A metav1.LabelSelector; an absent or empty one matches everything."""
    if not selector:
        return True
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not isinstance(match_labels, dict) or not isinstance(expressions, list):
        return False  # a malformed selector selects nothing
    for key, value in match_labels.items():
        if labels.get(key) != value:
            return False
    for expression in expressions:
        if not isinstance(expression, dict):
            return False
        key, operator = str(expression.get("key")), expression.get("operator")
        values = expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def labels_of(obj: JsonObject | None) -> JsonObject:
    labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
    return labels if isinstance(labels, dict) else {}


def namespace_selector_applies(resource: Resource) -> bool:
    """A namespaceSelector does not apply to cluster-scoped objects other than namespaces (which
    it matches by their own labels), as upstream."""
    return resource.namespaced or resource is NAMESPACES
