"""binder.framework.spread against kube-scheduler's PodTopologySpread: the corner cases of its
filtering_test.go and scoring_test.go tables (same layouts, same expected nodes and scores),
on a real ClusterState fed with API objects."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from binder.cluster.clusterstate import ClusterState
from binder.cluster.objects import PodInfo, node_from_api, pod_from_api
from binder.cluster.podterms import HOSTNAME_KEY, ZONE_KEY
from binder.framework.noderules import NODE_RULES
from binder.framework.spread import (
    DEFAULT_CONSTRAINTS,
    REASON_MISSING_LABEL,
    REASON_SPREAD,
    constraints_of,
    spread_filter,
    spread_scores,
)
from tests.binder.objects import GI, KEYS, node_obj, pod_obj

FOO = {"matchExpressions": [{"key": "foo", "operator": "Exists"}]}
BAR = {"matchExpressions": [{"key": "bar", "operator": "Exists"}]}
TAINT = {"key": "k", "value": "v", "effect": "NoSchedule"}
MISSING, SPREAD = REASON_MISSING_LABEL, REASON_SPREAD


def node(
    name: str,
    labels: dict[str, str] | None = None,
    *,
    hostname: bool = True,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    obj = node_obj(name, [16 * GI], labels=labels, taints=taints)
    if not hostname:
        del obj["metadata"]["labels"][HOSTNAME_KEY]
    return obj


def cluster(*nodes: dict[str, Any]) -> ClusterState:
    state = ClusterState(rules=NODE_RULES)
    for obj in nodes:
        state.set_node(node_from_api(obj, KEYS))
    state.arrays()
    return state


def four_in_two_zones(**kw: Any) -> ClusterState:
    """node-a and node-b in zone1, node-x and node-y in zone2 (upstream's usual layout)."""
    return cluster(
        *(node(n, {ZONE_KEY: z}, **kw) for n, z in (("a", "1"), ("b", "1"), ("x", "2"), ("y", "2")))
    )


def put(
    state: ClusterState,
    node_name: str,
    count: int = 1,
    labels: dict[str, str] | None = None,
    *,
    namespace: str = "default",
    deleting: bool = False,
) -> None:
    """Bind `count` pods of the default scheduler on the node (labels: {"foo": ""})."""
    for _ in range(count):
        obj = pod_obj(
            f"p{len(state.pods)}",
            node=node_name,
            labels={"foo": ""} if labels is None else labels,
            namespace=namespace,
            mem=None,
            model=None,
            scheduler="default-scheduler",
            phase="Running",
        )
        if deleting:
            obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        state.track_pod(pod_from_api(obj, KEYS))


def constraint(
    key: str,
    skew: int = 1,
    when: str = "DoNotSchedule",
    selector: dict[str, Any] | None = FOO,
    **extra: Any,
) -> dict[str, Any]:
    raw: dict[str, Any] = {"maxSkew": skew, "topologyKey": key, "whenUnsatisfiable": when}
    if selector is not None:
        raw["labelSelector"] = selector
    return {**raw, **extra}


def incoming(
    *constraints: dict[str, Any],
    labels: dict[str, str] | None = None,
    owner: str = "",
    **spec: Any,
) -> PodInfo:
    extra = {"topologySpreadConstraints": list(constraints)} if constraints else {}
    obj = pod_obj(
        "p",
        namespace="default",
        labels={"foo": ""} if labels is None else labels,
        spec_extra={**extra, **spec},
    )
    if owner:
        kind = owner
        obj["metadata"]["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": kind, "name": "o", "uid": "o-1", "controller": True}
        ]
    return pod_from_api(obj, KEYS)


def rejected(state: ClusterState, pod: PodInfo) -> dict[str, str]:
    return {state.names[i]: why for i, why in spread_filter(state, pod).items()}


def scores(
    state: ClusterState, pod: PodInfo, candidates: tuple[str, ...] = ()
) -> dict[str, int] | None:
    names = candidates or tuple(state.names)
    at = np.array([state.index[n] for n in names], np.int64)
    found = spread_scores(state, pod, at)
    return None if found is None else {n: int(s) for n, s in zip(names, found, strict=True)}


# ---- the filter: one constraint ----------------------------------------------------------------


def test_no_existing_pods_rejects_nothing_whether_or_not_the_pod_matches_itself() -> None:
    state = four_in_two_zones()
    assert rejected(state, incoming(constraint(ZONE_KEY))) == {}
    assert rejected(state, incoming(constraint(ZONE_KEY), labels={"other": ""})) == {}


def test_only_pods_of_the_incoming_pods_namespace_count() -> None:
    state = four_in_two_zones()
    put(state, "a", 3, namespace="elsewhere")
    assert rejected(state, incoming(constraint(ZONE_KEY))) == {}
    put(state, "a")
    assert rejected(state, incoming(constraint(ZONE_KEY))) == {"a": SPREAD, "b": SPREAD}


def test_zones_holding_three_and_three_take_the_pod_anywhere() -> None:
    state = four_in_two_zones()
    for name, count in (("a", 1), ("b", 2), ("x", 2), ("y", 1)):
        put(state, name, count)
    assert rejected(state, incoming(constraint(ZONE_KEY))) == {}


def test_a_node_without_the_zone_neither_counts_nor_takes_the_pod() -> None:
    state = cluster(
        node("a", {ZONE_KEY: "1"}),
        node("b"),
        node("x", {ZONE_KEY: "2"}),
        node("y", {ZONE_KEY: "2"}),
    )
    for name in ("a", "b", "x", "y"):
        put(state, name)
    # zone1 holds 1 (node-b's pod is in no zone), zone2 holds 2.
    assert rejected(state, incoming(constraint(ZONE_KEY))) == {
        "b": MISSING,
        "x": SPREAD,
        "y": SPREAD,
    }


def test_no_node_with_the_key_rejects_every_node_for_the_missing_label() -> None:
    state = four_in_two_zones()
    assert rejected(state, incoming(constraint("rack"))) == dict.fromkeys("abxy", MISSING)


@pytest.mark.parametrize(
    ("skew", "labels", "expected"),
    [
        (1, None, {"a": SPREAD, "b": SPREAD, "y": SPREAD}),
        (2, None, {"a": SPREAD, "y": SPREAD}),
        (1, {"other": ""}, {"a": SPREAD, "y": SPREAD}),
    ],
    ids=["max-skew-1", "max-skew-2", "pod-not-matching-itself"],
)
def test_pods_spread_two_one_zero_three_over_hostnames(
    skew: int, labels: dict[str, str] | None, expected: dict[str, str]
) -> None:
    state = four_in_two_zones()
    for name, count in (("a", 2), ("b", 1), ("y", 3)):
        put(state, name, count)
    assert rejected(state, incoming(constraint(HOSTNAME_KEY, skew), labels=labels)) == expected


def test_the_pods_node_selector_leaves_unselectable_nodes_out_of_the_minimum() -> None:
    state = cluster(node("a", {"pool": "p"}), node("b"), node("x"), node("y", {"pool": "p"}))
    for name, count in (("a", 2), ("b", 1), ("y", 3)):
        put(state, name, count)
    # Domains are node-a (2) and node-y (3): the minimum is 2, so only node-y is over.
    pod = incoming(constraint(HOSTNAME_KEY), nodeSelector={"pool": "p"})
    assert rejected(state, pod) == {"y": SPREAD}


def test_pods_being_deleted_do_not_count() -> None:
    state = four_in_two_zones()
    put(state, "a", deleting=True)
    put(state, "b")
    assert rejected(state, incoming(constraint(HOSTNAME_KEY))) == {"b": SPREAD}


@pytest.mark.parametrize(
    ("min_domains", "expected"),
    [(4, {"a": SPREAD, "b": SPREAD}), (3, {}), (2, {})],
)
def test_fewer_domains_than_min_domains_make_the_minimum_zero(
    min_domains: int, expected: dict[str, str]
) -> None:
    state = cluster(node("a"), node("b"), node("x"))
    for name, count in (("a", 2), ("b", 2), ("x", 1)):
        put(state, name, count)
    pod = incoming(constraint(HOSTNAME_KEY, 2, minDomains=min_domains))
    assert rejected(state, pod) == expected


def test_min_domains_over_zones_counts_only_the_domains_there_are() -> None:
    state = four_in_two_zones()
    put(state, "a", 2)
    put(state, "x", 1)
    assert rejected(state, incoming(constraint(ZONE_KEY, 2, minDomains=3))) == {
        "a": SPREAD,
        "b": SPREAD,
    }
    assert rejected(state, incoming(constraint(ZONE_KEY, 2, minDomains=2))) == {}


def test_min_domains_counts_only_the_domains_the_node_affinity_policy_keeps() -> None:
    state = cluster(
        node("a", {ZONE_KEY: "1", "pool": "p"}),
        node("b", {ZONE_KEY: "1", "pool": "p"}),
        node("x", {ZONE_KEY: "2"}),
    )
    put(state, "a")
    pool = {"pool": "p"}
    assert rejected(state, incoming(constraint(ZONE_KEY), nodeSelector=pool)) == {}
    pod = incoming(constraint(ZONE_KEY, minDomains=2), nodeSelector=pool)
    assert rejected(state, pod) == {"a": SPREAD, "b": SPREAD}


AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "foo", "operator": "In", "values": [""]}]}
            ]
        }
    }
}


@pytest.mark.parametrize(
    "narrowing",
    [{"nodeSelector": {"foo": ""}}, {"affinity": AFFINITY}],
    ids=["selector", "affinity"],
)
@pytest.mark.parametrize(
    ("policy", "expected"), [("Honor", {}), ("Ignore", {"a": SPREAD, "b": SPREAD})]
)
def test_node_affinity_policy(
    narrowing: dict[str, Any], policy: str, expected: dict[str, str]
) -> None:
    state = cluster(
        node("a", {ZONE_KEY: "1", "foo": ""}),
        node("b", {ZONE_KEY: "1", "foo": ""}),
        node("x", {ZONE_KEY: "2"}),
    )
    put(state, "a")
    pod = incoming(constraint(ZONE_KEY, nodeAffinityPolicy=policy), **narrowing)
    assert rejected(state, pod) == expected


@pytest.mark.parametrize(
    ("policy", "tolerated", "expected"),
    [
        ("Ignore", False, {"a": SPREAD, "b": SPREAD}),
        ("Honor", False, {}),
        ("Honor", True, {"a": SPREAD, "b": SPREAD}),
    ],
    ids=["ignored", "honored", "honored-but-tolerated"],
)
def test_node_taints_policy(policy: str, tolerated: bool, expected: dict[str, str]) -> None:
    state = cluster(
        node("a", {ZONE_KEY: "1"}),
        node("b", {ZONE_KEY: "1"}),
        node("x", {ZONE_KEY: "2"}, taints=[TAINT]),
        node("y", {ZONE_KEY: "2"}, taints=[TAINT]),
    )
    put(state, "a")
    tolerations = [{"key": "k", "operator": "Exists"}] if tolerated else []
    pod = incoming(constraint(ZONE_KEY, nodeTaintsPolicy=policy), tolerations=tolerations)
    # The Filter itself never rejects for taints: zone2's nodes are only left out of the count.
    assert rejected(state, pod) == expected


def test_match_label_keys_count_only_pods_with_the_same_values() -> None:
    state = four_in_two_zones()
    put(state, "a", 2, {"foo": "", "rev": "old"})
    labels = {"foo": "", "rev": "new"}
    pod = incoming(constraint(ZONE_KEY, matchLabelKeys=["rev"]), labels=labels)
    assert rejected(state, pod) == {}
    assert rejected(state, incoming(constraint(ZONE_KEY), labels=labels)) == {
        "a": SPREAD,
        "b": SPREAD,
    }
    # A key the pod lacks adds nothing to the selector.
    pod = incoming(constraint(ZONE_KEY, matchLabelKeys=["absent"]), labels=labels)
    assert rejected(state, pod) == {"a": SPREAD, "b": SPREAD}


# ---- the filter: several constraints -----------------------------------------------------------


@pytest.mark.parametrize(
    ("on_y", "expected"),
    [
        (3, {"a": SPREAD, "b": SPREAD, "y": SPREAD}),
        (4, dict.fromkeys("abxy", SPREAD)),
    ],
    ids=["zones-3-3", "zones-3-4"],
)
def test_zone_and_hostname_must_both_hold(on_y: int, expected: dict[str, str]) -> None:
    state = four_in_two_zones()
    put(state, "a", 2)
    put(state, "b", 1)
    put(state, "y", on_y)
    assert rejected(state, incoming(constraint(ZONE_KEY), constraint(HOSTNAME_KEY))) == expected


def test_a_node_missing_one_constraints_key_counts_for_none() -> None:
    state = cluster(
        node("a", {ZONE_KEY: "1", "node": "a"}),
        node("b", {ZONE_KEY: "1", "node": "b"}),
        node("x", {ZONE_KEY: "2"}),
        node("y", {ZONE_KEY: "2", "node": "y"}),
    )
    put(state, "a")
    put(state, "x")
    # node-x's pod is not in zone2's count: zone1 holds 1, zone2 0.
    assert rejected(state, incoming(constraint(ZONE_KEY), constraint("node"))) == {
        "a": SPREAD,
        "b": SPREAD,
        "x": MISSING,
    }


def test_the_first_failing_constraint_gives_the_reason() -> None:
    state = cluster(
        node("a", {ZONE_KEY: "1", "node": "a"}),
        node("z", {ZONE_KEY: "1"}),
        node("x", {ZONE_KEY: "2", "node": "x"}),
    )
    put(state, "a", 2)
    zone_first = incoming(constraint(ZONE_KEY), constraint("node"))
    assert rejected(state, zone_first) == {"a": SPREAD, "z": SPREAD}
    node_first = incoming(constraint("node"), constraint(ZONE_KEY))
    assert rejected(state, node_first) == {"a": SPREAD, "z": MISSING}


def test_two_constraints_on_one_key_with_different_selectors() -> None:
    state = four_in_two_zones()
    put(state, "a", 1, {"foo": ""})
    put(state, "y", 1, {"bar": ""})
    pod = incoming(
        constraint(ZONE_KEY, selector=FOO),
        constraint(ZONE_KEY, selector=BAR),
        labels={"foo": "", "bar": ""},
    )
    assert rejected(state, pod) == dict.fromkeys("abxy", SPREAD)


def test_schedule_anyway_constraints_do_not_filter() -> None:
    state = four_in_two_zones()
    put(state, "a", 5)
    assert rejected(state, incoming(constraint(ZONE_KEY, when="ScheduleAnyway"))) == {}


def test_a_relabelled_node_is_counted_in_its_new_zone_at_the_next_decision() -> None:
    state = four_in_two_zones()
    put(state, "a")
    assert rejected(state, incoming(constraint(ZONE_KEY))) == {"a": SPREAD, "b": SPREAD}
    state.set_node(node_from_api(node("a", {ZONE_KEY: "2"}), KEYS))
    assert rejected(state, incoming(constraint(ZONE_KEY))) == {
        "a": SPREAD,
        "x": SPREAD,
        "y": SPREAD,
    }


# ---- the score ---------------------------------------------------------------------------------


def hosts(*names: str, **labels: dict[str, str]) -> ClusterState:
    return cluster(*(node(n, labels.get(n)) for n in names))


def soft(
    key: str = HOSTNAME_KEY, skew: int = 1, selector: Any = FOO, **extra: Any
) -> dict[str, Any]:
    return constraint(key, skew, "ScheduleAnyway", selector, **extra)


def test_equal_counts_and_a_null_selector_score_every_node_alike() -> None:
    state = hosts("a", "b")
    assert scores(state, incoming(soft())) is None
    put(state, "a")
    put(state, "b")
    assert scores(state, incoming(soft())) is None
    put(state, "a", 2)
    assert scores(state, incoming(soft(selector=None))) is None


@pytest.mark.parametrize(
    ("skew", "layout", "expected"),
    [
        (1, (2, 1, 0, 3), (20, 60, 100, 0)),
        (2, (2, 1, 0, 3), (33, 66, 100, 16)),
        (3, (4, 3, 2, 1), (44, 66, 77, 100)),
    ],
)
def test_hostname_scores_as_upstream(
    skew: int, layout: tuple[int, ...], expected: tuple[int, ...]
) -> None:
    state = hosts("a", "b", "c", "d")
    for name, count in zip("abcd", layout, strict=True):
        put(state, name, count)
    assert scores(state, incoming(soft(skew=skew))) == dict(zip("abcd", expected, strict=True))


def test_the_candidates_are_the_domains_and_a_node_lacking_the_key_scores_zero() -> None:
    state = cluster(node("a"), node("b"), node("x"), node("y"))
    for name, count in (("a", 4), ("b", 2), ("x", 1), ("y", 3)):
        put(state, name, count)
    assert scores(state, incoming(soft()), ("a", "b", "x")) == {"a": 33, "b": 83, "x": 100}
    state = cluster(node("a"), node("b", {"n": "b"}, hostname=False), node("x"), node("y"))
    for name, count in (("a", 4), ("b", 2), ("x", 1), ("y", 3)):
        put(state, name, count)
    assert scores(state, incoming(soft()), ("a", "b", "x")) == {"a": 16, "b": 0, "x": 100}


def test_zone_scores_count_every_node_of_the_zone() -> None:
    state = four_in_two_zones()
    for name, count in (("a", 4), ("b", 2), ("x", 1), ("y", 3)):
        put(state, name, count)
    got = scores(state, incoming(soft(ZONE_KEY)), ("a", "b", "x"))
    assert got == {"a": 75, "b": 75, "x": 100}


def test_zone_and_hostname_scores_add_up() -> None:
    state = four_in_two_zones()
    for name, count in (("a", 2), ("b", 1), ("x", 2), ("y", 4)):
        put(state, name, count)
    got = scores(state, incoming(soft(ZONE_KEY), soft()), ("a", "x"))
    assert got == {"a": 100, "x": 63}


def test_two_zone_constraints_with_different_selectors_score_as_upstream() -> None:
    state = four_in_two_zones()
    for name, labels in (
        ("a", {"foo": "", "bar": ""}),
        ("a", {"foo": ""}),
        ("b", {"foo": "", "bar": ""}),
        ("y", {"foo": ""}),
        ("y", {"foo": "", "bar": ""}),
        ("y", {"foo": ""}),
    ):
        put(state, name, 1, labels)
    pod = incoming(soft(ZONE_KEY), soft(ZONE_KEY, selector=BAR), labels={"foo": "", "bar": ""})
    assert scores(state, pod, ("a", "x")) == {"a": 85, "x": 100}


@pytest.mark.parametrize(
    ("pods", "candidates", "expected"),
    [
        (
            (
                ("a", {"foo": ""}),
                ("b", {"foo": "", "bar": ""}),
                ("y", {"foo": ""}),
                ("y", {"bar": ""}),
            ),
            ("a", "b", "x", "y"),
            (60, 20, 100, 60),
        ),
        (
            (("b", {"bar": ""}), ("x", {"foo": ""}), ("y", {"foo": "", "bar": ""})),
            ("a", "b", "x", "y"),
            (100, 60, 40, 0),
        ),
        (
            (
                ("a", {"foo": ""}),
                ("b", {"foo": "", "bar": ""}),
                ("y", {"foo": ""}),
                ("y", {"bar": ""}),
            ),
            ("a", "b", "x"),
            (50, 25, 100),
        ),
    ],
    ids=["all-candidates", "some-nodes-empty", "three-candidates"],
)
def test_zone_and_hostname_with_different_selectors(
    pods: tuple[tuple[str, dict[str, str]], ...],
    candidates: tuple[str, ...],
    expected: tuple[int, ...],
) -> None:
    state = four_in_two_zones()
    for name, labels in pods:
        put(state, name, 1, labels)
    pod = incoming(soft(ZONE_KEY), soft(selector=BAR), labels={"foo": "", "bar": ""})
    assert scores(state, pod, candidates) == dict(zip(candidates, expected, strict=True))


def test_scores_skip_other_namespaces_and_pods_being_deleted() -> None:
    state = hosts("a", "b")
    put(state, "a", namespace="ns1")
    put(state, "a")
    put(state, "b", 2)
    assert scores(state, incoming(soft())) == {"a": 100, "b": 33}
    state = hosts("a", "b")
    put(state, "a", deleting=True)
    put(state, "b")
    assert scores(state, incoming(soft())) == {"a": 100, "b": 0}


def test_min_domains_has_no_effect_on_the_score() -> None:
    state = cluster(*(node(n, {"node": n}) for n in "abc"))
    for name, count in (("a", 2), ("b", 2), ("c", 1)):
        put(state, name, count)
    got = scores(state, incoming(soft("node", 2, minDomains=10)))
    assert got == {"a": 75, "b": 75, "c": 100}


@pytest.mark.parametrize(
    "narrowing",
    [{"nodeSelector": {"foo": ""}}, {"affinity": AFFINITY}],
    ids=["selector", "affinity"],
)
@pytest.mark.parametrize(
    ("policy", "expected"),
    [("Honor", {"a": 0, "b": 33, "c": 100}), ("Ignore", {"a": 66, "b": 100, "c": 100})],
)
def test_node_affinity_policy_in_the_score(
    narrowing: dict[str, Any], policy: str, expected: dict[str, int]
) -> None:
    state = cluster(
        node("a", {"node": "a", "foo": ""}),
        node("b", {"node": "b", "foo": ""}),
        node("c", {"node": "c"}),
    )
    for name, count in (("a", 2), ("b", 1), ("c", 1)):
        put(state, name, count)
    pod = incoming(soft("node", nodeAffinityPolicy=policy), **narrowing)
    assert scores(state, pod) == expected


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("Honor", {"a": 0, "b": 33, "c": 100}), ("Ignore", {"a": 66, "b": 100, "c": 100})],
)
def test_node_taints_policy_in_the_score(policy: str, expected: dict[str, int]) -> None:
    state = cluster(
        node("a", {"node": "a"}), node("b", {"node": "b"}), node("c", {"node": "c"}, taints=[TAINT])
    )
    for name, count in (("a", 2), ("b", 1), ("c", 1)):
        put(state, name, count)
    assert scores(state, incoming(soft("node", nodeTaintsPolicy=policy))) == expected


def test_match_label_keys_in_the_score() -> None:
    state = cluster(
        *(node(n, {ZONE_KEY: z}) for n, z in (("a", "1"), ("b", "1"), ("c", "2"), ("d", "2")))
    )
    for name, labels in (
        ("a", {"foo": ""}),
        ("b", {"foo": "", "bar": "", "baz": ""}),
        ("c", {"foo": ""}),
        ("c", {"bar": ""}),
        ("c", {"bar": "", "baz": ""}),
    ):
        put(state, name, 1, labels)
    pod = incoming(
        soft(ZONE_KEY),
        soft(selector=BAR, matchLabelKeys=["baz"]),
        labels={"foo": "", "bar": "", "baz": ""},
    )
    assert scores(state, pod) == {"a": 60, "b": 20, "c": 60, "d": 100}


# ---- the default constraints -------------------------------------------------------------------


def test_a_pods_own_constraints_split_by_when_unsatisfiable() -> None:
    pod = incoming(constraint(ZONE_KEY), soft(), owner="ReplicaSet")
    hard, anyway = constraints_of(pod)
    assert [c.topology_key for c in hard] == [ZONE_KEY]
    assert [c.topology_key for c in anyway] == [HOSTNAME_KEY]


@pytest.mark.parametrize("kind", ["ReplicaSet", "StatefulSet", "ReplicationController"])
def test_controlled_pods_without_constraints_get_the_system_defaults(kind: str) -> None:
    labels = {"app": "m", "statefulset.kubernetes.io/pod-name": "m-0"}
    hard, anyway = constraints_of(incoming(labels=labels, owner=kind))
    assert hard == ()
    assert [(c.topology_key, c.max_skew, c.when_unsatisfiable) for c in anyway] == [
        (c.topology_key, c.max_skew, c.when_unsatisfiable) for c in DEFAULT_CONSTRAINTS
    ]
    selector = anyway[0].selector
    assert selector.matches({"app": "m", "statefulset.kubernetes.io/pod-name": "m-1"})
    assert not selector.matches({"app": "other"})


@pytest.mark.parametrize(
    ("owner", "labels"),
    [("", {"app": "m"}), ("Job", {"app": "m"}), ("ReplicaSet", {})],
    ids=["no-owner", "job", "no-labels"],
)
def test_no_default_constraints_without_a_controller_or_a_selector(
    owner: str, labels: dict[str, str]
) -> None:
    assert constraints_of(incoming(labels=labels, owner=owner)) == ((), ())


def test_system_defaults_without_zones_score_as_one_hostname_constraint() -> None:
    state = hosts("a", "b", "c", "d")
    for name, count in zip("abcd", (4, 3, 2, 1), strict=True):
        put(state, name, count)
    got = scores(state, incoming(owner="ReplicaSet"))
    assert got == {"a": 44, "b": 66, "c": 77, "d": 100}
    assert spread_filter(state, incoming(owner="ReplicaSet")) == {}


def test_system_defaults_count_the_sibling_replicas_of_a_stateful_set() -> None:
    state = four_in_two_zones()
    for i, name in enumerate(("a", "a", "b")):
        put(state, name, 1, {"app": "db", "statefulset.kubernetes.io/pod-name": f"db-{i}"})
    pod = incoming(
        labels={"app": "db", "statefulset.kubernetes.io/pod-name": "db-3"}, owner="StatefulSet"
    )
    got = scores(state, pod)
    assert got is not None
    assert got["x"] == got["y"] == 100
    assert got["b"] > got["a"]


def test_a_pod_asking_nothing_of_spread_is_neither_filtered_nor_scored() -> None:
    state = four_in_two_zones()
    put(state, "a", 3)
    assert spread_filter(state, incoming()) == {}
    assert scores(state, incoming()) is None
