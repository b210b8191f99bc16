"""binder.framework.interpod: kube-scheduler's InterPodAffinity Filter and Score on a ClusterState.

The cases transcribe the corner cases of kube-scheduler's filtering_test.go
(TestRequiredAffinitySingleNode, TestRequiredAffinityMultipleNodes) and scoring_test.go
(TestPreferredAffinity, TestPreferredAffinityWithHardPodAffinitySymmetricWeight), with the
results upstream expects, named in plain words.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from binder.cluster.clusterstate import ClusterState
from binder.cluster.objects import NodeInfo, PodInfo, pod_from_api
from binder.framework.interpod import (
    REASON_AFFINITY,
    REASON_ANTI_AFFINITY,
    REASON_EXISTING_ANTI_AFFINITY,
    affinity_filter,
    affinity_scores,
)
from binder.framework.noderules import NODE_RULES
from tests.binder.objects import KEYS, pod_obj

AFF, ANTI, EXIST = REASON_AFFINITY, REASON_ANTI_AFFINITY, REASON_EXISTING_ANTI_AFFINITY
NAMESPACES = {
    "subteam1.team1": {"team": "team1"},
    "subteam2.team1": {"team": "team1"},
    "subteam1.team2": {"team": "team2"},
    "subteam2.team2": {"team": "team2"},
}

Json = dict[str, Any]


def expr(key: str, op: str, *values: str) -> Json:
    return {"key": key, "operator": op, **({"values": list(values)} if values else {})}


def term(topology: str, *exprs: Json, namespaces: list[str] | None = None, **extra: Any) -> Json:
    raw: Json = {"labelSelector": {"matchExpressions": list(exprs)}, "topologyKey": topology}
    if namespaces is not None:
        raw["namespaces"] = namespaces
    raw.update(extra)
    return raw


def affinity(
    required: list[Json] | None = None,
    anti: list[Json] | None = None,
    preferred: list[tuple[int, Json]] | None = None,
    preferred_anti: list[tuple[int, Json]] | None = None,
) -> Json:
    key_r, key_p = (
        "requiredDuringSchedulingIgnoredDuringExecution",
        "preferredDuringSchedulingIgnoredDuringExecution",
    )
    return {
        "podAffinity": {
            key_r: required or [],
            key_p: [{"weight": w, "podAffinityTerm": t} for w, t in preferred or []],
        },
        "podAntiAffinity": {
            key_r: anti or [],
            key_p: [{"weight": w, "podAffinityTerm": t} for w, t in preferred_anti or []],
        },
    }


_serial = iter(range(1_000_000))


def pod(
    labels: dict[str, str] | None = None,
    *,
    node: str = "",
    ns: str = "default",
    aff: Json | None = None,
    deleting: bool = False,
) -> PodInfo:
    obj = pod_obj(
        f"p{next(_serial)}",
        namespace=ns,
        node=node,
        labels=labels,
        spec_extra={"affinity": aff} if aff else None,
    )
    if deleting:
        obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:01Z"
    return pod_from_api(obj, KEYS)


def cluster(nodes: dict[str, dict[str, str]], pods: list[PodInfo] = ()) -> ClusterState:  # type: ignore[assignment]
    state = ClusterState(rules=NODE_RULES)
    for name, labels in nodes.items():
        state.set_node(NodeInfo(name, labels))
    for p in pods:
        state.track_pod(p)
    state.namespace_labels.update(NAMESPACES)
    state.arrays()
    return state


def rejected(state: ClusterState, incoming: PodInfo) -> dict[str, str]:
    return {state.names[i]: why for i, why in affinity_filter(state, incoming).items()}


def scored(state: ClusterState, incoming: PodInfo, names: list[str] | None = None) -> Any:
    rows = np.array([state.index[n] for n in names or state.names], np.int64)
    scores = affinity_scores(state, incoming, rows)
    if scores is None:
        return None
    return {state.names[i]: int(s) for i, s in zip(rows, scores, strict=True)}


# ---- filter, one node (TestRequiredAffinitySingleNode) ---------------------------------------

SCAN = {"service": "securityscan"}
S1 = {"security": "S1"}
NODE1 = {"node1": {"region": "r1", "zone": "z11"}}
on1 = pod(SCAN, node="node1")


def aff_in(topology: str, *values: str, key: str = "service") -> Json:
    return term(topology, expr(key, "In", *values))


SINGLE = [
    pytest.param(pod(), [], {}, id="no rules and no pods: every node passes"),
    pytest.param(
        pod(S1, aff=affinity([aff_in("region", "securityscan", "value2")])),
        [on1],
        {},
        id="affinity with In matches the existing pod",
    ),
    pytest.param(
        pod(S1, aff=affinity([term("region", expr("service", "NotIn", "securityscan3"))])),
        [on1],
        {},
        id="affinity with NotIn matches the existing pod",
    ),
    pytest.param(
        pod(S1, aff=affinity([{**aff_in("", "securityscan"), "namespaces": ["DiffNameSpace"]}])),
        [pod(SCAN, node="node1", ns="ns")],
        {"node1": AFF},
        id="affinity naming another namespace does not see the pod",
    ),
    pytest.param(
        pod(SCAN, aff=affinity([aff_in("", "antivirusscan")])),
        [on1],
        {"node1": AFF},
        id="affinity whose selector matches no pod fails",
    ),
    pytest.param(
        pod(
            S1,
            aff=affinity(
                [
                    term("region", expr("service", "Exists"), expr("wrongkey", "DoesNotExist")),
                    term(
                        "region",
                        expr("service", "In", "securityscan"),
                        expr("service", "NotIn", "x"),
                    ),
                ]
            ),
        ),
        [on1],
        {},
        id="affinity terms with different operators all match",
    ),
    pytest.param(
        pod(
            S1,
            aff=affinity(
                [
                    term("region", expr("service", "Exists"), expr("wrongkey", "DoesNotExist")),
                    term(
                        "region",
                        expr("service", "In", "securityscan2"),
                        expr("service", "NotIn", "x"),
                    ),
                ]
            ),
        ),
        [on1],
        {"node1": AFF},
        id="a selector's requirements are ANDed",
    ),
    pytest.param(
        pod(
            S1, aff=affinity([aff_in("region", "securityscan")], [aff_in("node", "antivirusscan")])
        ),
        [pod(SCAN, node="node1", aff=affinity(anti=[aff_in("node", "antivirusscan")]))],
        {},
        id="affinity, anti-affinity and the existing pod's anti-affinity all satisfied",
    ),
    pytest.param(
        pod(S1, aff=affinity([aff_in("region", "securityscan")], [aff_in("zone", "securityscan")])),
        [on1],
        {"node1": ANTI},
        id="affinity satisfied but anti-affinity not",
    ),
    pytest.param(
        pod(
            SCAN,
            aff=affinity([aff_in("region", "securityscan")], [aff_in("node", "antivirusscan")]),
        ),
        [pod(SCAN, node="node1", aff=affinity(anti=[aff_in("zone", "securityscan")]))],
        {"node1": EXIST},
        id="the existing pod's anti-affinity selects the incoming pod",
    ),
    pytest.param(
        pod(SCAN, aff=affinity([term("region", expr("service", "NotIn", "securityscan"))])),
        [pod(SCAN, node="node2")],
        {"node1": AFF},
        id="a pod that does not match its own affinity is not the first of a series",
    ),
    pytest.param(
        pod(SCAN),
        [pod(SCAN, node="node1", aff=affinity(anti=[aff_in("zone", "securityscan")]))],
        {"node1": EXIST},
        id="existing anti-affinity holds against a pod with no rules",
    ),
    pytest.param(
        pod(SCAN),
        [
            pod(
                SCAN,
                node="node1",
                aff=affinity(anti=[term("zone", expr("service", "NotIn", "securityscan"))]),
            )
        ],
        {},
        id="existing anti-affinity that does not select the pod keeps nothing off",
    ),
    pytest.param(
        pod(
            SCAN,
            aff=affinity(
                anti=[
                    term("region", expr("service", "Exists")),
                    term("region", expr("security", "Exists")),
                ]
            ),
        ),
        [pod(S1, node="node1", aff=affinity(anti=[term("zone", expr("security", "Exists"))]))],
        {"node1": ANTI},
        id="own anti-affinity is reported before the existing pod's",
    ),
    pytest.param(
        pod(S1, aff=affinity(anti=[term("zone", expr("security", "Exists"))])),
        [
            pod(
                SCAN,
                node="node1",
                aff=affinity(
                    anti=[
                        term("zone", expr("service", "Exists")),
                        term("zone", expr("security", "Exists")),
                    ]
                ),
            )
        ],
        {"node1": EXIST},
        id="symmetry: only the existing pod's terms select the other",
    ),
    pytest.param(
        pod(
            {"abc": "", "xyz": ""},
            aff=affinity(
                anti=[term("zone", expr("abc", "Exists")), term("zone", expr("def", "Exists"))]
            ),
        ),
        [
            pod(
                {"def": "", "xyz": ""},
                node="node1",
                aff=affinity(
                    anti=[term("zone", expr("abc", "Exists")), term("zone", expr("def", "Exists"))]
                ),
            )
        ],
        {"node1": ANTI},
        id="symmetry: both select each other by different terms",
    ),
]

NS_AFFINITY = term(
    "region",
    expr("service", "In", "securityscan"),
    namespaceSelector={"matchLabels": {"team": "team1"}},
)
NS_ANTI = {**NS_AFFINITY, "topologyKey": "zone"}

SINGLE_NAMESPACES = [
    pytest.param(
        pod(S1, aff=affinity([NS_AFFINITY])),
        [pod(SCAN, node="node1", ns="subteam1.team1")],
        {},
        id="affinity's namespaceSelector selects the pod's namespace",
    ),
    pytest.param(
        pod(S1, aff=affinity([NS_AFFINITY])),
        [pod(SCAN, node="node1", ns="subteam1.team2")],
        {"node1": AFF},
        id="affinity's namespaceSelector does not select the pod's namespace",
    ),
    pytest.param(
        pod(S1, ns="subteam1.team1", aff=affinity(anti=[NS_ANTI])),
        [pod(SCAN, node="node1", ns="subteam2.team1")],
        {"node1": ANTI},
        id="anti-affinity's namespaceSelector selects the pod's namespace",
    ),
    pytest.param(
        pod(S1, ns="subteam1.team1", aff=affinity(anti=[{**NS_ANTI, "namespaceSelector": {}}])),
        [pod(SCAN, node="node1", ns="subteam2.team1")],
        {"node1": ANTI},
        id="an empty namespaceSelector selects every namespace",
    ),
    pytest.param(
        pod(S1, ns="subteam1.team1", aff=affinity(anti=[NS_ANTI])),
        [pod(SCAN, node="node1", ns="subteam1.team2")],
        {},
        id="anti-affinity's namespaceSelector does not select the pod's namespace",
    ),
]


@pytest.mark.parametrize(("incoming", "existing", "want"), SINGLE + SINGLE_NAMESPACES)
def test_filter_on_one_node(
    incoming: PodInfo, existing: list[PodInfo], want: dict[str, str]
) -> None:
    assert rejected(cluster(NODE1, existing), incoming) == want


# ---- filter, several nodes (TestRequiredAffinityMultipleNodes) ---------------------------------

CHINA, CHINA_AZ1, INDIA = {"region": "China"}, {"region": "China", "az": "az1"}, {"region": "India"}
ABC = {"nodeA": {"region": "r1", "zone": "z1"}, "nodeB": {"region": "r1", "zone": "z2"}}
ABC3 = {**ABC, "nodeC": {"region": "r1", "zone": "z3"}}
SAME_ZONE = {"nodeA": {"region": "r1", "zone": "z1"}, "nodeB": {"region": "r1", "zone": "z1"}}


def exists(topology: str, key: str) -> Json:
    return term(topology, expr(key, "Exists"))


FOO_BAR_SCAN = {"foo": "bar", "service": "securityscan"}
SERIES = affinity([aff_in("zone", "bar", key="foo"), aff_in("zone", "securityscan")])

MULTI = [
    pytest.param(
        pod(aff=affinity([aff_in("region", "bar", key="foo")])),
        [pod({"foo": "bar"}, node="node1")],
        {"node1": CHINA, "node2": CHINA_AZ1, "node3": INDIA},
        {"node3": AFF},
        id="every node of the matching pod's region passes",
    ),
    pytest.param(
        pod(FOO_BAR_SCAN, aff=SERIES),
        [pod({"foo": "bar"}, node="nodeA")],
        {"nodeA": {"zone": "az1"}, "nodeB": {"zone": "az2"}},
        {},
        id="the first pod of a series passes anywhere: a pod matching one term only is no match",
    ),
    pytest.param(
        pod(FOO_BAR_SCAN, aff=SERIES),
        [pod({"foo": "bar"}, node="nodeA")],
        {"nodeA": {"zoneLabel": "az1"}, "nodeB": {"zoneLabel": "az2"}},
        {"nodeA": AFF, "nodeB": AFF},
        id="the first pod of a series needs the topology key on the node",
    ),
    pytest.param(
        pod(aff=affinity(anti=[aff_in("region", "abc", key="foo")])),
        [pod({"foo": "abc"}, node="nodeA")],
        {"nodeA": {"region": "r1"}, "nodeB": {"region": "r1"}},
        {"nodeA": ANTI, "nodeB": ANTI},
        id="anti-affinity keeps the pod off the whole region",
    ),
    pytest.param(
        pod(
            aff=affinity(anti=[aff_in("region", "abc", key="foo"), aff_in("zone", "securityscan")])
        ),
        [pod({"foo": "abc", "service": "securityscan"}, node="nodeA")],
        ABC,
        {"nodeA": ANTI, "nodeB": ANTI},
        id="anti-affinity rejects when any of its terms matches",
    ),
    pytest.param(
        pod({"foo": "123"}, ns="NS1", aff=affinity(anti=[aff_in("region", "bar", key="foo")])),
        [
            pod({"foo": "bar"}, node="nodeA", ns="NS1"),
            pod(node="nodeC", ns="NS2", aff=affinity(anti=[aff_in("region", "123", key="foo")])),
        ],
        {"nodeA": CHINA, "nodeB": CHINA_AZ1, "nodeC": INDIA},
        {"nodeA": ANTI, "nodeB": ANTI},
        id="an existing pod's anti-affinity sees its own namespace only",
    ),
    pytest.param(
        pod({"foo": ""}),
        [pod(node="nodeA", aff=affinity(anti=[exists("invalid-node-label", "foo")]))],
        SAME_ZONE,
        {},
        id="existing anti-affinity on a key no node has keeps nothing off",
    ),
    pytest.param(
        pod(aff=affinity(anti=[exists("invalid-node-label", "foo")])),
        [pod({"foo": ""}, node="nodeA")],
        SAME_ZONE,
        {},
        id="own anti-affinity on a key no node has keeps nothing off",
    ),
    pytest.param(
        pod({"foo": "", "bar": ""}),
        [
            pod(node="nodeA", aff=affinity(anti=[exists("zone", "foo")])),
            pod(node="nodeA", aff=affinity(anti=[exists("region", "bar")])),
        ],
        ABC,
        {"nodeA": EXIST, "nodeB": EXIST},
        id="existing pods' terms each hold their own domain",
    ),
    pytest.param(
        pod(aff=affinity(anti=[exists("zone", "foo"), exists("region", "bar")])),
        [pod({"foo": ""}, node="nodeA"), pod({"bar": ""}, node="nodeB")],
        ABC,
        {"nodeA": ANTI, "nodeB": ANTI},
        id="own anti-affinity terms each hold their own domain",
    ),
    pytest.param(
        pod({"foo": "", "bar": ""}),
        [
            pod(
                node="nodeA",
                aff=affinity(anti=[exists("invalid-node-label", "foo"), exists("zone", "bar")]),
            )
        ],
        ABC,
        {"nodeA": EXIST},
        id="existing anti-affinity: a term counts only where its key is",
    ),
    pytest.param(
        pod(aff=affinity(anti=[exists("invalid-node-label", "foo"), exists("zone", "bar")])),
        [pod({"foo": "", "bar": ""}, node="nodeA")],
        ABC,
        {"nodeA": ANTI},
        id="own anti-affinity: a term counts only where its key is",
    ),
    pytest.param(
        pod({"foo": "", "bar": ""}),
        [
            pod(node="nodeA", aff=affinity(anti=[exists("zone", "foo"), exists("zone", "labelA")])),
            pod(node="nodeB", aff=affinity(anti=[exists("zone", "bar"), exists("zone", "labelB")])),
        ],
        ABC3,
        {"nodeA": EXIST, "nodeB": EXIST},
        id="existing pods on two nodes leave the third",
    ),
    pytest.param(
        pod(aff=affinity([exists("region", "foo"), exists("zone", "bar")])),
        [pod({"foo": "", "bar": ""}, node="nodeA")],
        SAME_ZONE,
        {},
        id="affinity: one pod matching every term",
    ),
    pytest.param(
        pod(aff=affinity([exists("region", "foo"), exists("zone", "bar")])),
        [pod({"foo": ""}, node="nodeA"), pod({"bar": ""}, node="nodeB")],
        ABC,
        {"nodeA": AFF, "nodeB": AFF},
        id="affinity: terms matched by different pods are not met",
    ),
]


@pytest.mark.parametrize(("incoming", "existing", "nodes", "want"), MULTI)
def test_filter_on_several_nodes(
    incoming: PodInfo,
    existing: list[PodInfo],
    nodes: dict[str, dict[str, str]],
    want: dict[str, str],
) -> None:
    assert rejected(cluster(nodes, existing), incoming) == want


def test_a_node_failing_every_check_reports_the_affinity_first() -> None:
    incoming = pod({"app": "x"}, aff=affinity([exists("zone", "db")], [exists("zone", "app")]))
    existing = [
        pod({"app": "y"}, node="nodeA", aff=affinity(anti=[exists("zone", "app")])),
        pod({"db": ""}, node="nodeB"),
    ]
    state = cluster({"nodeA": {"zone": "z1"}, "nodeB": {"zone": "z2"}, "nodeC": {}}, existing)
    assert rejected(state, incoming) == {"nodeA": AFF, "nodeC": AFF}


def test_pods_being_deleted_still_count() -> None:
    incoming = pod(aff=affinity(anti=[exists("zone", "app")]))
    state = cluster(ABC, [pod({"app": "x"}, node="nodeA", deleting=True)])
    assert rejected(state, incoming) == {"nodeA": ANTI}


def test_pods_on_nodes_the_state_does_not_know_hold_no_domain() -> None:
    incoming = pod({"app": "x"}, aff=affinity([exists("zone", "app")], [exists("zone", "db")]))
    existing = [pod({"db": ""}, node="gone"), pod({"app": "x"}, node="gone")]
    # No known node holds a matching pod: the first-of-a-series rule lets every zoned node pass.
    assert rejected(cluster(ABC, existing), incoming) == {}


def test_existing_terms_see_an_unknown_namespace_through_no_labels() -> None:
    keep_out = term(
        "zone",
        expr("app", "Exists"),
        namespaceSelector={"matchExpressions": [expr("team", "NotIn", "team1")]},
    )
    existing = [pod(node="nodeA", aff=affinity(anti=[keep_out]))]
    state = cluster(ABC, existing)
    assert rejected(state, pod({"app": "x"}, ns="nowhere")) == {"nodeA": EXIST}
    assert rejected(state, pod({"app": "x"}, ns="subteam1.team1")) == {}


def test_incoming_terms_see_an_unknown_namespace_only_through_an_empty_selector() -> None:
    anywhere = term("zone", expr("app", "Exists"), namespaceSelector={})
    not_team1 = term(
        "zone",
        expr("app", "Exists"),
        namespaceSelector={"matchExpressions": [expr("team", "NotIn", "team1")]},
    )
    state = cluster(ABC, [pod({"app": "x"}, node="nodeA", ns="nowhere")])
    assert rejected(state, pod(aff=affinity(anti=[anywhere]))) == {"nodeA": ANTI}
    assert rejected(state, pod(aff=affinity(anti=[not_team1]))) == {}


def test_match_label_keys_tell_one_revision_from_another() -> None:
    spread = term("kubernetes.io/hostname", expr("app", "In", "web"), matchLabelKeys=["rev"])
    nodes = {n: {"kubernetes.io/hostname": n} for n in ("n1", "n2")}
    old = pod({"app": "web", "rev": "1"}, node="n1", aff=affinity(anti=[spread]))
    state = cluster(nodes, [old])
    assert rejected(state, pod({"app": "web", "rev": "2"}, aff=affinity(anti=[spread]))) == {}
    assert rejected(state, pod({"app": "web", "rev": "1"}, aff=affinity(anti=[spread]))) == {
        "n1": ANTI
    }


# ---- scores (TestPreferredAffinity) -----------------------------------------------------------

S2 = {"security": "S2"}
WITH_S1_REGION = (5, aff_in("region", "S1", key="security"))
WITH_S2_REGION = (6, aff_in("region", "S2", key="security"))
AWAY_S1_AZ = (5, aff_in("az", "S1", key="security"))
AWAY_S2_AZ = (5, aff_in("az", "S2", key="security"))
WITH_S1_AWAY_S2 = affinity(preferred=[(8, WITH_S1_REGION[1])], preferred_anti=[AWAY_S2_AZ])
THREE = {"node1": CHINA, "node2": INDIA, "node3": {"az": "az1"}}
HARD = affinity(
    [
        aff_in("region", "S1", "value2", key="security"),
        term("region", expr("security", "Exists"), expr("wrongkey", "DoesNotExist")),
    ]
)
NS_PREFERRED = term(
    "region",
    expr("security", "In", "S1"),
    namespaces=["subteam2.team2"],
    namespaceSelector={"matchLabels": {"team": "team1"}},
)

SCORES = [
    pytest.param(pod(S1), [], THREE, None, id="no affinity anywhere: nothing to score"),
    pytest.param(
        pod(S1, aff=affinity(preferred=[WITH_S1_REGION])),
        [pod(S1, node="node1"), pod(S2, node="node2"), pod(S1, node="node3")],
        THREE,
        {"node1": 100, "node2": 0, "node3": 0},
        id="affinity: the node with the key and a matching pod scores high",
    ),
    pytest.param(
        pod(aff=affinity(preferred=[WITH_S1_REGION])),
        [pod(S1, node="node1")],
        {"node1": CHINA, "node2": CHINA_AZ1, "node3": INDIA},
        {"node1": 100, "node2": 100, "node3": 0},
        id="affinity: every node of the matching pod's domain scores the same",
    ),
    pytest.param(
        pod(S1, aff=affinity(preferred=[WITH_S2_REGION])),
        [pod(S2, node=n) for n in ("node1", "node1", "node2", "node3", "node4", "node5")],
        {"node1": CHINA, "node2": INDIA, "node3": CHINA, "node4": CHINA, "node5": INDIA},
        {"node1": 100, "node2": 0, "node3": 100, "node4": 100, "node5": 0},
        id="affinity: the region with more matching pods scores high",
    ),
    pytest.param(
        pod(
            S1,
            aff=affinity(
                preferred=[
                    (
                        8,
                        term(
                            "region", expr("security", "NotIn", "S1"), expr("security", "In", "S2")
                        ),
                    ),
                    (
                        2,
                        term(
                            "region", expr("security", "Exists"), expr("wrongkey", "DoesNotExist")
                        ),
                    ),
                ]
            ),
        ),
        [pod(S1, node="node1"), pod(S2, node="node2"), pod(S1, node="node3")],
        THREE,
        {"node1": 20, "node2": 100, "node3": 0},
        id="affinity: weights add and normalize between the lowest and the highest",
    ),
    pytest.param(
        pod(S2),
        [
            pod(S1, node="node1", aff=affinity(preferred=[WITH_S1_REGION])),
            pod(S2, node="node2", aff=affinity(preferred=[WITH_S2_REGION])),
        ],
        THREE,
        {"node1": 0, "node2": 100, "node3": 0},
        id="symmetry: existing pods' preferred affinity for the incoming pod",
    ),
    pytest.param(
        pod(S1, ns="subteam1.team1"),
        [
            pod(S1, node="node1", aff=affinity(preferred=[(5, NS_PREFERRED)])),
            pod(S2, node="node2", aff=affinity(preferred=[WITH_S2_REGION])),
        ],
        THREE,
        {"node1": 100, "node2": 0, "node3": 0},
        id="symmetry: an existing pod's namespaceSelector selects the incoming pod's namespace",
    ),
    pytest.param(
        pod(S1, ns="subteam1.team1"),
        [
            pod(S1, node="node1", aff=affinity(preferred_anti=[(5, NS_PREFERRED)])),
            pod(S2, node="node2", aff=affinity(preferred=[WITH_S2_REGION])),
        ],
        THREE,
        {"node1": 0, "node2": 100, "node3": 100},
        id="symmetry: an existing pod's preferred anti-affinity by namespaceSelector",
    ),
    pytest.param(
        pod(S1),
        [pod(S1, node="node1", aff=HARD), pod(S2, node="node2", aff=HARD)],
        THREE,
        {"node1": 100, "node2": 100, "node3": 0},
        id="symmetry: existing pods' required affinity for the incoming pod",
    ),
    pytest.param(
        pod(S1, aff=affinity(preferred_anti=[AWAY_S1_AZ])),
        [pod(S1, node="node1"), pod(S2, node="node2")],
        {"node1": {"az": "az1"}, "node2": CHINA},
        {"node1": 0, "node2": 100},
        id="anti-affinity: the node without matching pods scores high",
    ),
    pytest.param(
        pod(S1, aff=affinity(preferred_anti=[AWAY_S1_AZ])),
        [pod(S1, node="node1"), pod(S1, node="node2")],
        {"node1": {"az": "az1"}, "node2": CHINA},
        {"node1": 0, "node2": 100},
        id="anti-affinity: a node without the key scores nothing against it",
    ),
    pytest.param(
        pod(S2),
        [
            pod(S1, node="node1", aff=affinity(preferred_anti=[AWAY_S2_AZ])),
            pod(S2, node="node2", aff=affinity(preferred_anti=[AWAY_S1_AZ])),
        ],
        {"node1": {"az": "az1"}, "node2": {"az": "az2"}},
        {"node1": 0, "node2": 100},
        id="symmetry: existing pods' preferred anti-affinity for the incoming pod",
    ),
    pytest.param(
        pod(S1, aff=WITH_S1_AWAY_S2),
        [pod(S1, node=n) for n in ("node1", "node1", "node2", "node3", "node3", "node4", "node5")],
        {"node1": CHINA_AZ1, "node2": INDIA, "node3": CHINA, "node4": CHINA, "node5": INDIA},
        {"node1": 100, "node2": 0, "node3": 100, "node4": 100, "node5": 0},
        id="affinity and anti-affinity with pods of the same labels",
    ),
    pytest.param(
        pod(S1, aff=WITH_S1_AWAY_S2),
        [
            pod(S1, node="node1"),
            pod(S2, node="node2"),
            pod(node="node3", aff=WITH_S1_AWAY_S2),
            pod(node="node4", aff=affinity(preferred_anti=[AWAY_S1_AZ])),
        ],
        {"node1": CHINA, "node2": {"az": "az1"}, "node3": INDIA, "node4": {"az": "az2"}},
        {"node1": 100, "node2": 0, "node3": 100, "node4": 0},
        id="affinity, anti-affinity and both symmetries together",
    ),
    pytest.param(
        pod(S1),
        [pod(S1, node="node1"), pod(node="node2", aff=WITH_S1_AWAY_S2)],
        {"node1": CHINA, "node2": CHINA},
        None,
        id="nodes of one domain all score the same",
    ),
    pytest.param(
        pod(S1, ns="subteam1.team1", aff=affinity(preferred=[(5, NS_PREFERRED)])),
        [
            pod(S1, node="node1", ns="subteam1.team1"),
            pod(S1, node="node1", ns="subteam1.team1"),
            pod(S1, node="node1", ns="subteam1.team2"),
            pod(S1, node="node2", ns="subteam2.team1"),
        ],
        {"node1": CHINA, "node2": INDIA},
        {"node1": 100, "node2": 0},
        id="own preferred affinity by namespaceSelector",
    ),
    pytest.param(
        pod(S1, ns="subteam1.team1", aff=affinity(preferred_anti=[(5, NS_PREFERRED)])),
        [
            pod(S1, node="node1", ns="subteam1.team1"),
            pod(S1, node="node1", ns="subteam2.team2"),
            pod(S1, node="node2", ns="subteam2.team1"),
        ],
        {"node1": CHINA, "node2": INDIA},
        {"node1": 0, "node2": 100},
        id="own preferred anti-affinity by namespaceSelector and namespaces",
    ),
    pytest.param(
        pod({"service": "S1"}, ns="subteam1.team1"),
        [
            pod(
                node="node1",
                aff=affinity(
                    [
                        term(
                            "region",
                            expr("service", "In", "S1"),
                            namespaces=["default", "subteam2.team2"],
                            namespaceSelector={"matchLabels": {"team": "team1"}},
                        )
                    ]
                ),
            )
        ],
        THREE,
        {"node1": 100, "node2": 0, "node3": 0},
        id="hard pod affinity weight through a namespaceSelector",
    ),
]


@pytest.mark.parametrize(("incoming", "existing", "nodes", "want"), SCORES)
def test_scores(
    incoming: PodInfo,
    existing: list[PodInfo],
    nodes: dict[str, dict[str, str]],
    want: dict[str, int] | None,
) -> None:
    assert scored(cluster(nodes, existing), incoming) == want


def test_scores_normalize_over_the_candidates_only() -> None:
    nodes = {"a": {"zone": "a"}, "b": {"zone": "b"}, "c": {"zone": "c"}, "d": {"zone": "d"}}
    existing = [pod(S1, node="a"), pod(S1, node="b"), pod(S1, node="b"), pod(S1, node="b")]
    incoming = pod(aff=affinity(preferred=[(1, aff_in("zone", "S1", key="security"))]))
    state = cluster(nodes, existing)
    assert scored(state, incoming) == {"a": 33, "b": 100, "c": 0, "d": 0}
    assert scored(state, incoming, ["a", "c"]) == {"a": 100, "c": 0}
    assert scored(state, incoming, ["c", "d"]) is None


def test_without_terms_anywhere_both_return_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    state = cluster(ABC, [pod(S1, node="nodeA"), pod(S2, node="nodeB")])

    def no_domains(key: str) -> Any:
        raise AssertionError("looked at topology domains with no term anywhere")

    monkeypatch.setattr(state.filters, "topology_domains", no_domains)
    assert affinity_filter(state, pod(S1)) == {}
    assert affinity_scores(state, pod(S1), np.arange(2)) is None
    # Only required anti-affinity on the existing side: still nothing to score.
    state.track_pod(pod(node="nodeA", aff=affinity(anti=[exists("zone", "x")])))
    assert affinity_scores(state, pod(S1), np.arange(2)) is None
