"""The simulated API server validates a pod's node affinity at create as kube-apiserver does
(ValidateNodeSelectorRequirement and friends): operators and their value counts, keys, values,
matchFields, preferred weights, at least one required term. It does not check that a Gt/Lt value
parses as an integer, and neither does the real one: kube-scheduler finds that out."""

from __future__ import annotations

import json
from typing import Any

import kubernetes.client
import pytest

from tests.fixtures_sim import core_v1

TOO_BIG = str(2**63)


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    item: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        item["values"] = list(values)
    return item


def with_affinity(node_affinity: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "p"},
        "spec": {
            "containers": [{"name": "c", "image": "i"}],
            "affinity": {"nodeAffinity": node_affinity},
        },
    }


def preferred(term: dict[str, Any], weight: Any = 10) -> dict[str, Any]:
    return {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": weight, "preference": term}]
    }


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}


PREF = "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0]"
REQ = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"


@pytest.mark.parametrize(
    ("affinity", "field", "message"),
    [
        (
            preferred({"matchExpressions": [expr("a", "Foo", "x")]}),
            f"{PREF}.preference.matchExpressions[0].operator",
            'Invalid value: "Foo": not a valid selector operator',
        ),
        (
            preferred({"matchExpressions": [expr("a", "In")]}),
            f"{PREF}.preference.matchExpressions[0].values",
            "Required value: must be specified when `operator` is 'In' or 'NotIn'",
        ),
        (
            preferred({"matchExpressions": [expr("a", "Exists", "x")]}),
            f"{PREF}.preference.matchExpressions[0].values",
            "Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
        ),
        (
            preferred({"matchExpressions": [expr("a", "Gt", "1", "2")]}),
            f"{PREF}.preference.matchExpressions[0].values",
            "Required value: must be specified single value when `operator` is 'Lt' or 'Gt'",
        ),
        (
            preferred({"matchExpressions": [expr("a/b/c", "Exists")]}),
            f"{PREF}.preference.matchExpressions[0].key",
            'Invalid value: "a/b/c"',
        ),
        (
            preferred({"matchExpressions": [expr("a", "In", "not a label")]}),
            f"{PREF}.preference.matchExpressions[0].values[0]",
            'Invalid value: "not a label"',
        ),
        (
            preferred({"matchFields": [expr("spec.unschedulable", "In", "x")]}),
            f"{PREF}.preference.matchFields[0].key",
            'Invalid value: "spec.unschedulable": not a valid field selector key',
        ),
        (
            preferred({"matchFields": [expr("metadata.name", "Exists")]}),
            f"{PREF}.preference.matchFields[0].operator",
            'Invalid value: "Exists": not a valid selector operator',
        ),
        (
            preferred({"matchFields": [expr("metadata.name", "In", "a", "b")]}),
            f"{PREF}.preference.matchFields[0].values",
            "Required value: must be only one value when `operator` is 'In' or 'NotIn' for node "
            "field selector",
        ),
        (
            preferred({"matchExpressions": [expr("a", "Exists")]}, weight=0),
            f"{PREF}.weight",
            "Invalid value: 0: must be in the range 1-100",
        ),
        (
            preferred({"matchExpressions": [expr("a", "Exists")]}, weight=101),
            f"{PREF}.weight",
            "Invalid value: 101: must be in the range 1-100",
        ),
        (required(), REQ, "Required value: must have at least one node selector term"),
        (
            required({"matchExpressions": [expr("a", "Lt")]}),
            f"{REQ}[0].matchExpressions[0].values",
            "Required value: must be specified single value when `operator` is 'Lt' or 'Gt'",
        ),
    ],
)
def test_malformed_node_affinity_is_refused_at_create(
    kube_api: kubernetes.client.ApiClient, affinity: dict[str, Any], field: str, message: str
) -> None:
    core: Any = core_v1(kube_api)
    with pytest.raises(kubernetes.client.ApiException) as refused:
        core.create_namespaced_pod("default", with_affinity(affinity))
    assert refused.value.status == 422
    status = json.loads(refused.value.body or "{}")
    causes = [(c["field"], c["message"]) for c in status["details"]["causes"]]
    assert any(f == field and m.startswith(message) for f, m in causes), causes
    assert core.list_namespaced_pod("default").items == []


@pytest.mark.parametrize(
    "affinity",
    [
        preferred({"matchExpressions": [expr("mem", "Gt", TOO_BIG)]}),  # parses at scheduling
        preferred({"matchExpressions": [expr("mem", "Lt", "abc")]}),
        preferred({}),  # an empty preference is a no-op
        required({"matchExpressions": [expr("zone", "In", "a")]}, {"matchFields": []}),
        required({"matchFields": [expr("metadata.name", "NotIn", "node-1")]}),
    ],
)
def test_well_formed_node_affinity_is_accepted(
    kube_api: kubernetes.client.ApiClient, affinity: dict[str, Any]
) -> None:
    core: Any = core_v1(kube_api)
    core.create_namespaced_pod("default", with_affinity(affinity))
    assert [p.metadata.name for p in core.list_namespaced_pod("default").items] == ["p"]
