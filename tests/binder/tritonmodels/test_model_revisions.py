"""Replicas of one model revision spread over nodes: a node without a pod of the same (namespace,
model id, revision) is preferred, and only when none can take the pod does it join one (each pod
has its own name in Triton, so two replicas on a node never collide). The revision is a pod's
`pod-template-hash` (Deployment) or `controller-revision-hash` (StatefulSet) label, and pods with
neither are one revision. A rollout's surge pod (a new revision) joins the old one on a node;
another namespace's model of the same id never counts; each pod is charged its own request."""

from __future__ import annotations

from typing import Any

from binder.cluster.clusterstate import ClusterState
from binder.cluster.objects import node_from_api, pod_from_api
from binder.framework.noderules import NODE_RULES
from binder.framework.placement import Placement, explain, place
from common.contract import POC_PREFIX, Keys
from tests.binder.framework.test_placement import NOW, bind, cluster, placed
from tests.binder.objects import GI, KEYS, node_obj, pod_obj


def revision_pod(name: str, revision: str = "", label: str = "pod-template-hash", **kw: Any) -> Any:
    obj = pod_obj(name, **kw)
    if revision:
        obj["metadata"]["labels"] = {"app": "m", label: revision}
    return obj


def test_another_namespaces_model_of_the_same_id_never_keeps_a_team_off_a_node() -> None:
    # The attack: team-b deploys under team-a's well-known model name on every node.
    state = cluster(node_obj("n1", [16 * GI]), node_obj("n2", [16 * GI]))
    for node in ("n1", "n2"):
        bind(state, f"squat-{node}", node, 0, model="resnet50", namespace="team-b")
    chosen = placed(state, pod_obj("mine", model="resnet50", namespace="team-a"))
    assert chosen.node in ("n1", "n2")


def test_two_namespaces_share_one_node_each_charged_its_own_request() -> None:
    state = cluster(node_obj("n1", [16 * GI]))
    bind(state, "a", "n1", 0, mem="4Gi", model="resnet50", namespace="team-a")
    assert placed(state, pod_obj("b", mem="5Gi", model="resnet50", namespace="team-b")).node == "n1"
    bind(state, "b", "n1", 0, mem="5Gi", model="resnet50", namespace="team-b")
    assert state.memory.free("n1") == [7 * GI]


def test_a_rollouts_new_revision_joins_the_old_one_on_the_only_node() -> None:
    state = cluster(node_obj("n1", [16 * GI]))
    state.set_pod(
        pod_from_api(revision_pod("old", "5d4f8b", mem="6Gi", model="m", node="n1"), KEYS)
    )
    surge = placed(state, revision_pod("surge", "7c9f2d", mem="6Gi", model="m"))
    assert surge.node == "n1"
    state.assume(
        pod_from_api(revision_pod("surge", "7c9f2d", mem="6Gi", model="m"), KEYS),
        surge.node,
        surge.gpu.uuid,
    )
    # Each pod holds its own request: 16 - 6 - 6.
    assert state.memory.free("n1") == [4 * GI]


def test_replicas_of_one_revision_spread_over_nodes_then_share_them() -> None:
    state = cluster(node_obj("n1", [16 * GI]), node_obj("n2", [16 * GI]))
    first = pod_from_api(revision_pod("r1", "5d4f8b", model="m"), KEYS)
    chosen = place(state, first, now=NOW)
    assert isinstance(chosen, Placement)
    # Assumed (bound but not yet seen back): the revision counts already. Binpack would put
    # the second on the used GPU; the spread sends it to the other node.
    state.assume(first, chosen.node, chosen.gpu.uuid)
    second = placed(state, revision_pod("r2", "5d4f8b", model="m"))
    assert second.node != chosen.node
    bind(state, "r2", second.node, 0, model="m")
    state.set_pod(pod_from_api(revision_pod("r2", "5d4f8b", model="m", node=second.node), KEYS))
    third = pod_from_api(revision_pod("r3", "5d4f8b", model="m"), KEYS)
    assert isinstance(place(state, third, now=NOW), Placement)
    assert all(not v.reasons for v in explain(state, third, now=NOW))


def two_nodes_one_used(name: str, **kw: Any) -> ClusterState:
    """Two empty nodes, then `name` bound on n1: binpack alone would choose n1 next."""
    state = cluster(node_obj("n1", [16 * GI]), node_obj("n2", [16 * GI]))
    state.set_pod(pod_from_api(revision_pod(name, node="n1", **kw), KEYS))
    return state


def test_pods_without_a_revision_label_are_one_revision() -> None:
    state = two_nodes_one_used("plain-1", model="m")
    assert placed(state, pod_obj("plain-2", model="m")).node == "n2"
    # A labelled pod is another revision than the unlabelled ones: binpack's choice.
    assert placed(state, revision_pod("labelled", "5d4f8b", model="m")).node == "n1"


def test_a_statefulsets_controller_revision_hash_is_a_revision_too() -> None:
    label = "controller-revision-hash"
    state = two_nodes_one_used("s-0", revision="db-6d8f7", label=label, model="m")
    assert placed(state, revision_pod("s-1", "db-6d8f7", label=label, model="m")).node == "n2"
    assert placed(state, revision_pod("s-1", "db-7a9c4", label=label, model="m")).node == "n1"


def test_the_proof_of_concepts_annotation_names_spread_replicas_too() -> None:
    poc = Keys(POC_PREFIX)
    state = ClusterState(rules=NODE_RULES)
    for node in ("n1", "n2"):
        gpus = f'[{{"uuid": "GPU-{node}", "index": 0, "product": "t4", "memory": {16 * GI}}}]'
        meta = {"name": node, "annotations": {poc.gpus: gpus}}
        state.set_node(node_from_api({"metadata": meta, "spec": {}}, poc))
        state.set_lease(node, NOW + 40)

    def poc_pod(name: str, revision: str, node: str = "") -> Any:
        obj = revision_pod(name, revision, mem=None, model=None, node=node)
        obj["metadata"]["annotations"] = {poc.model_id: "resnet"}
        obj["spec"]["containers"][0]["resources"] = {"limits": {poc.gpu_mem: "1Gi"}}
        return pod_from_api(obj, poc)

    state.set_pod(poc_pod("old", "aaaa", node="n1"))
    same = place(state, poc_pod("same", "aaaa"), now=NOW)
    assert isinstance(same, Placement) and same.node == "n2"
    nxt = place(state, poc_pod("next", "bbbb"), now=NOW)
    assert isinstance(nxt, Placement) and nxt.node == "n1"
    assert poc.model_id == "seldon.io/trtis-model-id"


def test_a_node_a_revisions_pod_left_breaks_ties_for_that_revision_only() -> None:
    """The node a replica left may still hold its files (the agent keeps them): among nodes
    Kubernetes' scores rate equal it comes first, before GPU packing, for a new replica of the
    same namespace's revision only; a Kubernetes preference still wins over it."""
    for policy in ("binpack", "spread"):
        state = cluster(node_obj("n1", [16 * GI]), node_obj("n2", [16 * GI], labels={"t": "x"}))
        # Packing prefers n1 (a used GPU) to the empty n2.
        bind(state, "other", "n1", 0, mem="4Gi", model="other")
        new = placed(state, revision_pod("new", "5d4f8b", model="m"), policy=policy)
        assert new.node == ("n1" if policy == "binpack" else "n2")
        state.set_pod(pod_from_api(revision_pod("old", "5d4f8b", model="m", node="n2"), KEYS))
        state.set_pod(pod_from_api(revision_pod("gone", "5d4f8b", model="m", node="n1"), KEYS))
        state.remove_pod(pod_from_api(revision_pod("old", "5d4f8b", model="m"), KEYS).uid)
        state.remove_pod(pod_from_api(revision_pod("gone", "5d4f8b", model="m"), KEYS).uid)
        # n2 was left first, n1 last: both may hold the files; packing decides between them.
        both = placed(state, revision_pod("r1", "5d4f8b", model="m"), policy=policy)
        assert both.node == new.node
        state = cluster(node_obj("n1", [16 * GI]), node_obj("n2", [16 * GI], labels={"t": "x"}))
        bind(state, "other", "n1", 0, mem="4Gi", model="other")
        state.set_pod(pod_from_api(revision_pod("old", "5d4f8b", model="m", node="n2"), KEYS))
        state.remove_pod(pod_from_api(revision_pod("old", "5d4f8b", model="m"), KEYS).uid)
        # Only n2 was left by the revision: it wins the tie whatever packing says.
        assert placed(state, revision_pod("r2", "5d4f8b", model="m"), policy=policy).node == "n2"
        # Another revision, and another namespace's same revision, are placed as before.
        assert placed(state, revision_pod("r3", "7c9f2d", model="m"), policy=policy) == new
        other = revision_pod("r4", "5d4f8b", model="m", namespace="team-b")
        assert placed(state, other, policy=policy).node == new.node
        # A Kubernetes preference for n1 outweighs the files on n2.
        prefer = {
            "affinity": {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 1,
                            "preference": {
                                "matchExpressions": [
                                    {"key": "t", "operator": "DoesNotExist"},
                                ]
                            },
                        }
                    ]
                }
            }
        }
        wants_n1 = revision_pod("r5", "5d4f8b", model="m", spec_extra=prefer)
        assert placed(state, wants_n1, policy=policy).node == "n1"
