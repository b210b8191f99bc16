"""Two corners found against upstream's own test cases.

`Gt`/`Lt` compare 64-bit integers: kube's `strconv.ParseInt(v, 10, 64)` fails on a value that
does not fit, so such a label never matches and such a requirement makes its term match nothing.

A preferred node affinity term kube-scheduler cannot parse is not "worth 0": NodeAffinity's
PreScore returns the parse error (k8s.io/component-helpers NewPreferredSchedulingTerms; terms of
weight 0 and empty terms are skipped first), so with two or more feasible nodes the attempt fails
with a scheduler error (FailedScheduling, PodScheduled=False reason SchedulerError) and is retried;
with a single feasible node kube-scheduler skips scoring and binds there.
"""

from __future__ import annotations

from typing import Any

import kubernetes.client
import pytest

from binder.cluster.objects import pod_from_api
from binder.framework.placement import Placement, Unschedulable, node_fits, place
from tests.binder.framework.test_node_fits import AFFINITY, expr, node, pod, required
from tests.binder.framework.test_placement import NOW, cluster
from tests.binder.objects import GI, KEYS, node_obj, pod_obj
from tests.binder.simcluster import (
    MakeBinder,
    add_node,
    add_pod,
    eventually,
    failed_events,
    node_of,
    scheduled_condition,
)

INT64_MAX = str(2**63 - 1)
TOO_BIG = str(2**63)  # one past int64: ParseInt fails


@pytest.mark.parametrize(
    ("requirement", "labels", "fits"),
    [
        (expr("mem", "Gt", "5"), {"mem": INT64_MAX}, True),
        (expr("mem", "Gt", "5"), {"mem": TOO_BIG}, False),  # the label does not parse
        (expr("mem", "Lt", "5"), {"mem": "-" + TOO_BIG}, True),  # int64's minimum parses
        (expr("mem", "Lt", "5"), {"mem": str(-(2**63) - 1)}, False),
        (expr("mem", "Lt", INT64_MAX), {"mem": "5"}, True),
        (expr("mem", "Lt", TOO_BIG), {"mem": "5"}, False),  # the requirement does not parse
        (expr("mem", "Gt", "99999999999999999999999"), {"mem": "5"}, False),
        (expr("mem", "Gt", "5"), {"mem": "\u0661\u0662"}, False),  # not ASCII digits
        (expr("mem", "Gt", "5"), {"mem": "12\n"}, False),
    ],
)
def test_gt_and_lt_compare_int64_only(
    requirement: dict[str, Any], labels: dict[str, str], fits: bool
) -> None:
    spec = {"affinity": required({"matchExpressions": [requirement]})}
    assert node_fits(pod(**spec), node(labels=labels)) == ([] if fits else [AFFINITY])


def test_a_requirement_that_does_not_parse_leaves_other_required_terms_counting() -> None:
    spec = {
        "affinity": required(
            {"matchExpressions": [expr("mem", "Lt", TOO_BIG)]},
            {"matchExpressions": [expr("zone", "In", "a")]},
        )
    }
    assert node_fits(pod(**spec), node(labels={"mem": "1", "zone": "a"})) == []
    assert node_fits(pod(**spec), node(labels={"mem": "1", "zone": "b"})) == [AFFINITY]


def preferring(*terms: tuple[int, dict[str, Any]]) -> dict[str, Any]:
    return {
        "affinity": {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": weight, "preference": term} for weight, term in terms
                ]
            }
        }
    }


BROKEN = {"matchExpressions": [expr("mem", "Gt", TOO_BIG)]}
FAST = {"matchExpressions": [expr("tier", "In", "fast")]}
PRESCORE_ERROR = (
    'running PreScore plugin "NodeAffinity": [1].matchExpressions[0].values[0]: Invalid value: '
    f"\"{TOO_BIG}\": for 'Gt', 'Lt' operators, the value must be an integer"
)


def two_nodes() -> Any:
    return cluster(node_obj("n1", [16 * GI], labels={"tier": "fast"}), node_obj("n2", [16 * GI]))


def test_a_preferred_term_prescore_rejects_fails_the_attempt_with_its_error() -> None:
    spec = preferring((10, FAST), (5, BROKEN))
    result = place(two_nodes(), pod_from_api(pod_obj("p", spec_extra=spec), KEYS), now=NOW)
    assert isinstance(result, Unschedulable), result
    assert result.message == PRESCORE_ERROR
    assert result.condition_reason == "SchedulerError"
    assert result.attempt_result == "error"


def test_every_error_of_the_preferred_terms_is_reported_as_upstream_aggregates_them() -> None:
    bad_ops = {"matchExpressions": [expr("a", "Foo"), expr("b", "In")]}
    bad_fields = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": []}]}
    spec = preferring((1, bad_ops), (1, bad_fields))
    result = place(two_nodes(), pod_from_api(pod_obj("p", spec_extra=spec), KEYS), now=NOW)
    assert isinstance(result, Unschedulable)
    assert result.message == (
        'running PreScore plugin "NodeAffinity": ['
        '[0].matchExpressions[0].operator: Unsupported value: "Foo": supported values: "In", '
        '"NotIn", "Exists", "DoesNotExist", "Gt", "Lt", '
        "[0].matchExpressions[1].values: Invalid value: []string{}: for 'in', 'notin' "
        "operators, values set can't be empty, "
        "[1].matchFields[0].values: Invalid value: []string{}: must have one element]"
    )


def test_zero_weight_and_empty_preferred_terms_are_skipped_before_parsing() -> None:
    spec = preferring((0, BROKEN), (7, {}), (10, FAST))
    result = place(two_nodes(), pod_from_api(pod_obj("p", spec_extra=spec), KEYS), now=NOW)
    assert isinstance(result, Placement) and result.node == "n1"


def test_with_one_feasible_node_scoring_is_skipped_and_the_pod_binds() -> None:
    state = cluster(node_obj("n1", [16 * GI]), node_obj("n2", [2 * GI]))
    spec = preferring((5, BROKEN))
    result = place(state, pod_from_api(pod_obj("p", mem="4Gi", spec_extra=spec), KEYS), now=NOW)
    assert isinstance(result, Placement) and result.node == "n1"


def test_with_no_feasible_node_the_fit_error_wins() -> None:
    state = cluster(node_obj("n1", [2 * GI]), node_obj("n2", [2 * GI]))
    spec = preferring((5, BROKEN))
    result = place(state, pod_from_api(pod_obj("p", mem="4Gi", spec_extra=spec), KEYS), now=NOW)
    assert isinstance(result, Unschedulable)
    assert result.message.startswith("0/2 nodes are available: ")
    assert result.condition_reason == "Unschedulable"


async def test_the_binder_reports_a_scheduler_error_and_does_not_bind(
    kube_api: kubernetes.client.ApiClient, core: Any, make_binder: MakeBinder
) -> None:
    add_node(kube_api, "gpu-1", [16 * GI], labels={"tier": "fast"})
    add_node(kube_api, "gpu-2", [16 * GI])
    await make_binder()
    # The API server accepts it (it checks the operator's value count, not that it parses).
    add_pod(core, "broken", spec_extra=preferring((10, FAST), (5, BROKEN)))
    condition = await eventually(lambda: scheduled_condition(core, "broken"), what="a condition")
    assert (condition.status, condition.reason) == ("False", "SchedulerError")
    assert condition.message == PRESCORE_ERROR
    events = await eventually(lambda: failed_events(core, "broken"), what="FailedScheduling")
    assert events[0].message == PRESCORE_ERROR
    add_pod(core, "fine", spec_extra=preferring((10, FAST)))
    assert await eventually(lambda: node_of(core, "fine")) == "gpu-1"
    assert node_of(core, "broken") == ""
