"""Kubernetes' node rules through the public `binder.framework.placement.node_fits`, one rule at a
time, with the upstream corner cases (kube-scheduler NodeAffinity, TaintToleration,
NodeUnschedulable), and the TenantCode filter that follows them."""

from __future__ import annotations

from typing import Any

import pytest

from binder.framework.placement import node_fits

AFFINITY = "node(s) didn't match Pod's node affinity/selector"
UNSCHEDULABLE = "node(s) were unschedulable"


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": spec}


def node(
    name: str = "n1",
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if taints is not None:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
        }
    }


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    item: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        item["values"] = list(values)
    return item


def test_a_plain_pod_fits_a_plain_node() -> None:
    assert node_fits(pod(), node()) == []


# ---- nodeSelector ------------------------------------------------------------------------------


def test_node_selector_needs_every_label_with_its_value() -> None:
    selector = {"accelerator": "t4", "zone": "a"}
    assert (
        node_fits(pod(nodeSelector=selector), node(labels={"accelerator": "t4", "zone": "a"})) == []
    )
    assert node_fits(pod(nodeSelector=selector), node(labels={"accelerator": "t4"})) == [AFFINITY]
    assert node_fits(
        pod(nodeSelector=selector), node(labels={"accelerator": "a100", "zone": "a"})
    ) == [AFFINITY]


def test_empty_node_selector_matches_every_node() -> None:
    assert node_fits(pod(nodeSelector={}), node()) == []


def test_node_selector_and_affinity_must_both_match() -> None:
    spec = {
        "nodeSelector": {"zone": "a"},
        "affinity": required({"matchExpressions": [expr("gpu", "Exists")]}),
    }
    assert node_fits(pod(**spec), node(labels={"zone": "a", "gpu": "1"})) == []
    assert node_fits(pod(**spec), node(labels={"zone": "a"})) == [AFFINITY]
    assert node_fits(pod(**spec), node(labels={"gpu": "1"})) == [AFFINITY]


# ---- required node affinity --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requirement", "labels", "fits"),
    [
        (expr("gpu", "In", "t4", "a10"), {"gpu": "a10"}, True),
        (expr("gpu", "In", "t4"), {"gpu": "a10"}, False),
        (expr("gpu", "In", "t4"), {}, False),
        (expr("gpu", "NotIn", "t4"), {"gpu": "a10"}, True),
        (expr("gpu", "NotIn", "t4"), {}, True),  # an absent label is "not in"
        (expr("gpu", "NotIn", "t4"), {"gpu": "t4"}, False),
        (expr("gpu", "Exists"), {"gpu": ""}, True),
        (expr("gpu", "Exists"), {}, False),
        (expr("gpu", "DoesNotExist"), {}, True),
        (expr("gpu", "DoesNotExist"), {"gpu": "x"}, False),
        (expr("mem", "Gt", "16"), {"mem": "32"}, True),
        (expr("mem", "Gt", "16"), {"mem": "16"}, False),
        (expr("mem", "Gt", "16"), {}, False),
        (expr("mem", "Gt", "16"), {"mem": "big"}, False),  # a non-integer label never compares
        (expr("mem", "Lt", "16"), {"mem": "8"}, True),
        (expr("mem", "Lt", "16"), {"mem": "16"}, False),
        (expr("mem", "Lt", "16"), {"mem": "08"}, True),
    ],
)
def test_match_expression_operators(
    requirement: dict[str, Any], labels: dict[str, str], fits: bool
) -> None:
    spec = {"affinity": required({"matchExpressions": [requirement]})}
    assert node_fits(pod(**spec), node(labels=labels)) == ([] if fits else [AFFINITY])


def test_expressions_in_a_term_are_anded_and_terms_are_ored() -> None:
    both = {"matchExpressions": [expr("a", "Exists"), expr("b", "Exists")]}
    only_c = {"matchExpressions": [expr("c", "Exists")]}
    spec = {"affinity": required(both, only_c)}
    assert node_fits(pod(**spec), node(labels={"a": "1", "b": "1"})) == []
    assert node_fits(pod(**spec), node(labels={"a": "1"})) == [AFFINITY]
    assert node_fits(pod(**spec), node(labels={"c": "1"})) == []


@pytest.mark.parametrize(
    "malformed",
    [
        expr("gpu", "In"),  # In needs values
        expr("gpu", "NotIn"),
        expr("gpu", "Exists", "x"),  # Exists takes no values
        expr("gpu", "DoesNotExist", "x"),
        expr("mem", "Gt", "1", "2"),  # Gt takes exactly one value
        expr("mem", "Gt", "ten"),  # ... that is an integer
        expr("mem", "Lt", "-5"),  # ... and a valid label value
        expr("gpu", "Equals", "t4"),  # not a node selector operator
        expr("bad key!", "Exists"),
        expr("gpu", "In", "not a label value"),
    ],
)
def test_a_malformed_term_matches_nothing_and_other_terms_still_count(
    malformed: dict[str, Any],
) -> None:
    labels = {"gpu": "t4", "mem": "32", "ok": "1"}
    alone = {"affinity": required({"matchExpressions": [malformed]})}
    assert node_fits(pod(**alone), node(labels=labels)) == [AFFINITY]
    with_good = {
        "affinity": required(
            {"matchExpressions": [malformed, expr("ok", "Exists")]},
            {"matchExpressions": [expr("ok", "Exists")]},
        )
    }
    assert node_fits(pod(**with_good), node(labels=labels)) == []


def test_empty_terms_match_nothing() -> None:
    assert node_fits(pod(affinity=required({})), node()) == [AFFINITY]
    assert node_fits(pod(affinity=required({"matchExpressions": []})), node()) == [AFFINITY]
    assert node_fits(pod(affinity=required()), node()) == [AFFINITY]
    # A required affinity that is absent (not empty) allows every node.
    assert node_fits(pod(affinity={"nodeAffinity": {}}), node()) == []


def test_match_fields_selects_by_node_name() -> None:
    pin = {"affinity": required({"matchFields": [expr("metadata.name", "In", "n1")]})}
    assert node_fits(pod(**pin), node("n1")) == []
    assert node_fits(pod(**pin), node("n2")) == [AFFINITY]
    avoid = {"affinity": required({"matchFields": [expr("metadata.name", "NotIn", "n1")]})}
    assert node_fits(pod(**avoid), node("n1")) == [AFFINITY]
    assert node_fits(pod(**avoid), node("n2")) == []


def test_match_fields_and_expressions_in_one_term_are_anded() -> None:
    term = {
        "matchFields": [expr("metadata.name", "In", "n1")],
        "matchExpressions": [expr("gpu", "Exists")],
    }
    spec = {"affinity": required(term)}
    assert node_fits(pod(**spec), node("n1", labels={"gpu": "1"})) == []
    assert node_fits(pod(**spec), node("n1")) == [AFFINITY]


@pytest.mark.parametrize(
    "field",
    [
        expr("metadata.name", "In", "n1", "n2"),  # exactly one value
        expr("metadata.name", "In"),
        expr("metadata.name", "Exists"),  # only In and NotIn exist for fields
    ],
)
def test_malformed_match_fields_match_nothing(field: dict[str, Any]) -> None:
    spec = {"affinity": required({"matchFields": [field]})}
    assert node_fits(pod(**spec), node("n1")) == [AFFINITY]


def test_an_unknown_field_reads_as_empty() -> None:
    unknown_in = {"affinity": required({"matchFields": [expr("metadata.uid", "In", "x")]})}
    assert node_fits(pod(**unknown_in), node("n1")) == [AFFINITY]
    unknown_not_in = {"affinity": required({"matchFields": [expr("metadata.uid", "NotIn", "x")]})}
    assert node_fits(pod(**unknown_not_in), node("n1")) == []


def test_preferred_affinity_never_filters() -> None:
    spec = {
        "affinity": {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 50, "preference": {"matchExpressions": [expr("gpu", "Exists")]}}
                ]
            }
        }
    }
    assert node_fits(pod(**spec), node()) == []


# ---- taints and tolerations --------------------------------------------------------------------


def taint(key: str, effect: str, value: str = "") -> dict[str, str]:
    return {"key": key, "value": value, "effect": effect}


def test_an_untolerated_no_schedule_taint_filters_and_is_named() -> None:
    tainted = node(taints=[taint("nvidia.com/gpu", "NoSchedule")])
    assert node_fits(pod(), tainted) == ["node(s) had untolerated taint {nvidia.com/gpu: }"]
    valued = node(taints=[taint("dedicated", "NoExecute", "ml")])
    assert node_fits(pod(), valued) == ["node(s) had untolerated taint {dedicated: ml}"]


def test_prefer_no_schedule_never_filters() -> None:
    assert node_fits(pod(), node(taints=[taint("soft", "PreferNoSchedule")])) == []


def test_only_the_first_untolerated_taint_is_reported() -> None:
    tainted = node(
        taints=[taint("a", "PreferNoSchedule"), taint("b", "NoSchedule"), taint("c", "NoExecute")]
    )
    assert node_fits(pod(), tainted) == ["node(s) had untolerated taint {b: }"]


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}, True),
        ({"key": "k", "value": "v", "effect": "NoSchedule"}, True),  # empty operator is Equal
        ({"key": "k", "operator": "Equal", "value": "other", "effect": "NoSchedule"}, False),
        ({"key": "k", "operator": "Exists", "effect": "NoSchedule"}, True),
        ({"key": "k", "operator": "Exists"}, True),  # empty effect matches every effect
        ({"key": "k", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
        ({"operator": "Exists"}, True),  # empty key with Exists tolerates everything
        ({"operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "k", "operator": "Gt", "value": "v"}, False),  # unknown operator tolerates nothing
    ],
)
def test_toleration_matching(toleration: dict[str, str], tolerated: bool) -> None:
    tainted = node(taints=[taint("k", "NoSchedule", "v")])
    expected = [] if tolerated else ["node(s) had untolerated taint {k: v}"]
    assert node_fits(pod(tolerations=[toleration]), tainted) == expected


def test_no_execute_taint_needs_a_toleration_too() -> None:
    tainted = node(taints=[taint("evict", "NoExecute")])
    assert node_fits(pod(), tainted) != []
    tolerate = [
        {"key": "evict", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}
    ]
    assert node_fits(pod(tolerations=tolerate), tainted) == []


# ---- unschedulable -----------------------------------------------------------------------------


def test_an_unschedulable_node_filters() -> None:
    assert node_fits(pod(), node(unschedulable=True)) == [UNSCHEDULABLE]


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"},
        {"operator": "Exists"},
    ],
)
def test_tolerating_the_unschedulable_taint_tolerates_unschedulable(
    toleration: dict[str, str],
) -> None:
    assert node_fits(pod(tolerations=[toleration]), node(unschedulable=True)) == []


def test_tolerating_another_effect_does_not_tolerate_unschedulable() -> None:
    toleration = {
        "key": "node.kubernetes.io/unschedulable",
        "operator": "Exists",
        "effect": "NoExecute",
    }
    assert node_fits(pod(tolerations=[toleration]), node(unschedulable=True)) == [UNSCHEDULABLE]


def test_all_reasons_in_kube_scheduler_filter_order() -> None:
    spec = {"nodeSelector": {"zone": "b"}}
    bad = node(labels={"zone": "a"}, taints=[taint("x", "NoSchedule")], unschedulable=True)
    assert node_fits(pod(**spec), bad) == [
        UNSCHEDULABLE,
        "node(s) had untolerated taint {x: }",
        AFFINITY,
    ]


def test_garbage_shapes_do_not_raise() -> None:
    weird_pod = {
        "spec": {"nodeSelector": None, "affinity": {"nodeAffinity": None}, "tolerations": None}
    }
    weird_node = {"metadata": {"name": "n"}, "spec": {"taints": None}}
    assert node_fits(weird_pod, weird_node) == []
    assert node_fits({}, {}) == []


@pytest.mark.parametrize(
    ("tenant_code", "labels", "reasons"),
    [
        (False, {}, []),
        (True, {"tritonshare.io/tenant-code": "true"}, []),
        (True, {}, ["node(s) are not dedicated to tenant code"]),
        (True, {"tritonshare.io/tenant-code": "yes"}, ["node(s) are not dedicated to tenant code"]),
        (False, {"tritonshare.io/tenant-code": "true"}, ["node(s) are dedicated to tenant code"]),
    ],
)
def test_tenant_code_and_dedicated_nodes_go_together_both_ways(
    tenant_code: bool, labels: dict[str, str], reasons: list[str]
) -> None:
    assert node_fits(pod(), node(labels=labels), tenant_code=tenant_code) == reasons


def test_the_tenant_code_filter_comes_after_kubernetes_rules() -> None:
    dedicated = node(labels={"tritonshare.io/tenant-code": "true"}, unschedulable=True)
    assert node_fits(pod(), dedicated) == [UNSCHEDULABLE, "node(s) are dedicated to tenant code"]
