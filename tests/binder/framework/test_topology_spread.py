"""PodTopologySpread, as kube-scheduler applies it (cases after its podtopologyspread
filtering_test.go and scoring_test.go): maxSkew per domain, the pod's own match, minDomains, the
node inclusion policies, nodes missing the key, pods being deleted, matchLabelKeys, several
constraints, the ScheduleAnyway score and the default constraints for owned pods."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from binder.cluster.clusterstate import ClusterState
from binder.cluster.objects import PodInfo, pod_from_api
from binder.framework.spread import (
    REASON_MISSING_LABEL,
    REASON_SPREAD,
    spread_filter,
    spread_scores,
)
from tests.binder.framework.test_placement import cluster, placed, refused
from tests.binder.objects import GI, KEYS, node_obj, pod_obj

ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"


def constraint(
    key: str, skew: int = 1, when: str = "DoNotSchedule", **extra: Any
) -> dict[str, Any]:
    return {
        "maxSkew": skew,
        "topologyKey": key,
        "whenUnsatisfiable": when,
        "labelSelector": {"matchLabels": {"app": "m"}},
        **extra,
    }


def spreading(
    *constraints: dict[str, Any], labels: dict[str, str] | None = None, **spec: Any
) -> PodInfo:
    obj = pod_obj(
        "new",
        labels={"app": "m"} if labels is None else labels,
        spec_extra={"topologySpreadConstraints": list(constraints), **spec},
    )
    return pod_from_api(obj, KEYS)


def zones(layout: dict[str, str], **node_kw: Any) -> ClusterState:
    """Nodes named by `layout`, each in the zone given ("" for a node without the label)."""
    return cluster(
        *(
            node_obj(name, [16 * GI], labels={ZONE: zone} if zone else {}, **node_kw)
            for name, zone in layout.items()
        )
    )


def put(
    state: ClusterState,
    node: str,
    count: int = 1,
    labels: dict[str, str] | None = None,
    namespace: str = "models",
    deleting: bool = False,
) -> None:
    for _ in range(count):
        name = f"p{len(state.pods)}"
        obj = pod_obj(
            name,
            node=node,
            labels={"app": "m"} if labels is None else labels,
            namespace=namespace,
            mem=None,
            model=None,
            scheduler="default-scheduler",
        )
        obj["status"] = {"phase": "Running"}
        if deleting:
            obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        state.track_pod(pod_from_api(obj, KEYS))


def rejected(state: ClusterState, pod: PodInfo) -> dict[str, str]:
    state.arrays()
    return {state.names[i]: why for i, why in spread_filter(state, pod).items()}


def test_a_domain_one_over_the_smallest_takes_the_pod_only_within_max_skew() -> None:
    state = zones({"a1": "a", "a2": "a", "b1": "b"})
    put(state, "a1", 2)
    put(state, "b1", 1)
    # zone a holds 2, b holds 1: a third in a makes the skew 3 - 1 = 2 > 1.
    assert rejected(state, spreading(constraint(ZONE))) == {
        "a1": REASON_SPREAD,
        "a2": REASON_SPREAD,
    }
    assert rejected(state, spreading(constraint(ZONE, skew=2))) == {}


def test_a_pod_not_matching_its_own_selector_adds_nothing() -> None:
    state = zones({"a1": "a", "b1": "b"})
    put(state, "a1", 1)
    pod = spreading(constraint(ZONE), labels={"app": "other"})
    assert rejected(state, pod) == {}


def test_a_node_without_the_key_is_missing_the_label() -> None:
    state = zones({"a1": "a", "none": ""})
    assert rejected(state, spreading(constraint(ZONE))) == {"none": REASON_MISSING_LABEL}


def test_min_domains_above_the_domains_there_are_makes_the_smallest_count_zero() -> None:
    state = zones({"a1": "a", "b1": "b"})
    put(state, "a1", 1)
    put(state, "b1", 1)
    assert rejected(state, spreading(constraint(ZONE))) == {}
    # Three domains wanted, two exist: the minimum is 0, so 1 + 1 - 0 = 2 > 1 everywhere.
    assert rejected(state, spreading(constraint(ZONE, minDomains=3))) == {
        "a1": REASON_SPREAD,
        "b1": REASON_SPREAD,
    }


def test_node_affinity_policy_honor_leaves_other_nodes_out_of_the_domains() -> None:
    state = cluster(
        node_obj("a1", [16 * GI], labels={ZONE: "a", "pool": "x"}),
        node_obj("b1", [16 * GI], labels={ZONE: "b", "pool": "y"}),
    )
    put(state, "a1", 1)
    pod = spreading(constraint(ZONE), nodeSelector={"pool": "x"})
    # Honor (default): zone b is not a domain, so zone a's minimum is its own count.
    assert rejected(state, pod) == {}
    pod = spreading(constraint(ZONE, nodeAffinityPolicy="Ignore"), nodeSelector={"pool": "x"})
    assert rejected(state, pod) == {"a1": REASON_SPREAD}


def test_node_taints_policy_honor_leaves_tainted_nodes_out_of_the_domains() -> None:
    taint = {"key": "k", "value": "v", "effect": "NoSchedule"}
    state = cluster(
        node_obj("a1", [16 * GI], labels={ZONE: "a"}),
        node_obj("b1", [16 * GI], labels={ZONE: "b"}, taints=[taint]),
    )
    put(state, "a1", 1)
    assert rejected(state, spreading(constraint(ZONE)))["a1"] == REASON_SPREAD  # Ignore
    assert rejected(state, spreading(constraint(ZONE, nodeTaintsPolicy="Honor"))) == {}


def test_pods_being_deleted_and_pods_of_other_namespaces_do_not_count() -> None:
    state = zones({"a1": "a", "b1": "b"})
    put(state, "a1", 1, deleting=True)
    put(state, "a1", 3, namespace="elsewhere")
    assert rejected(state, spreading(constraint(ZONE))) == {}


def test_match_label_keys_count_only_the_pods_of_the_same_revision() -> None:
    state = zones({"a1": "a", "b1": "b"})
    put(state, "a1", 2, labels={"app": "m", "pod-template-hash": "old"})
    pod = spreading(
        constraint(ZONE, matchLabelKeys=["pod-template-hash"]),
        labels={"app": "m", "pod-template-hash": "new"},
    )
    assert rejected(state, pod) == {}
    pod = spreading(constraint(ZONE), labels={"app": "m", "pod-template-hash": "new"})
    assert rejected(state, pod) == {"a1": REASON_SPREAD}


def test_every_constraint_must_hold() -> None:
    state = cluster(
        *(
            node_obj(n, [16 * GI], labels={ZONE: z})
            for n, z in (("a1", "a"), ("a2", "a"), ("b1", "b"))
        )
    )
    put(state, "a1", 1)
    put(state, "b1", 1)
    pod = spreading(constraint(ZONE), constraint(HOST))
    # Zones are even (1, 1); by hostname a2 holds 0, so a1 and b1 are at the skew limit.
    assert rejected(state, pod) == {"a1": REASON_SPREAD, "b1": REASON_SPREAD}


def test_the_filter_keeps_replicas_apart_through_placement_and_says_why() -> None:
    state = zones({"a1": "a", "b1": "b"})
    put(state, "a1", 1)
    obj = pod_obj(
        "new", labels={"app": "m"}, spec_extra={"topologySpreadConstraints": [constraint(ZONE)]}
    )
    assert placed(state, obj).node == "b1"
    # Zone b's only node is tainted (it still counts: nodeTaintsPolicy Ignore), and a node
    # without the label cannot take it either.
    taint = {"key": "k", "value": "v", "effect": "NoSchedule"}
    state = cluster(
        node_obj("a1", [16 * GI], labels={ZONE: "a"}),
        node_obj("b1", [16 * GI], labels={ZONE: "b"}, taints=[taint]),
        node_obj("none", [16 * GI]),
    )
    put(state, "a1", 1)
    assert refused(state, obj).reasons == {
        REASON_SPREAD: 1,
        REASON_MISSING_LABEL: 1,
        "node(s) had untolerated taint {k: v}": 1,
    }


def scores(state: ClusterState, pod: PodInfo) -> dict[str, float] | None:
    state.arrays()
    candidates = np.arange(len(state.names), dtype=np.int64)
    found = spread_scores(state, pod, candidates)
    return None if found is None else dict(zip(state.names, found.tolist(), strict=True))


def test_schedule_anyway_prefers_the_domain_with_fewer_pods() -> None:
    state = zones({"a1": "a", "b1": "b", "c1": "c"})
    put(state, "a1", 2)
    put(state, "b1", 1)
    got = scores(state, spreading(constraint(ZONE, when="ScheduleAnyway")))
    assert got is not None
    assert got["c1"] > got["b1"] > got["a1"]
    assert got["c1"] == 100


def test_schedule_anyway_gives_nodes_missing_the_key_zero_and_equal_counts_nothing() -> None:
    state = zones({"a1": "a", "b1": "b", "none": ""})
    got = scores(state, spreading(constraint(ZONE, when="ScheduleAnyway")))
    assert got == {"a1": 100, "b1": 100, "none": 0}
    state = zones({"a1": "a", "b1": "b"})
    assert scores(state, spreading(constraint(ZONE, when="ScheduleAnyway"))) is None


def owned(labels: dict[str, str]) -> PodInfo:
    obj = pod_obj("new", labels=labels)
    obj["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": "rs",
            "uid": "rs-1",
            "controller": True,
        }
    ]
    return pod_from_api(obj, KEYS)


def test_owned_pods_without_constraints_spread_by_the_defaults() -> None:
    state = cluster(
        *(
            node_obj(n, [16 * GI], labels={ZONE: z, HOST: n})
            for n, z in (("a1", "a"), ("a2", "a"), ("b1", "b"))
        )
    )
    labels = {"app": "m", "pod-template-hash": "h"}
    put(state, "a1", 2, labels=labels)
    got = scores(state, owned(labels))
    assert got is not None and got["b1"] > got["a2"] > got["a1"]
    # Not owned: no default constraints.
    assert scores(state, pod_from_api(pod_obj("new", labels=labels), KEYS)) is None


@pytest.mark.parametrize("policy", ["Honor", "Ignore"])
def test_a_pod_asking_nothing_of_spread_costs_nothing(policy: str) -> None:
    state = zones({"a1": "a"})
    pod = pod_from_api(pod_obj("plain"), KEYS)
    assert spread_filter(state, pod) == {}
    assert scores(state, pod) is None
