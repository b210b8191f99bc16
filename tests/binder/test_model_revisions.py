"""The proof of concept's rule kept where it means something: at most one pod per node per
(namespace, model id, revision), the revision being a pod's `pod-template-hash` (Deployment) or
`controller-revision-hash` (StatefulSet) label, and pods with neither one revision. A rollout's
surge pod (a new revision) joins the old one on a node; another namespace's model of the same id
never collides; each pod is charged its own request."""

from __future__ import annotations

from typing import Any

from binder.model import node_from_api, pod_from_api
from binder.placement import Placement, Unschedulable, explain, place
from binder.state import ClusterState
from common.contract import POC_PREFIX, Keys
from tests.binder.objects import GI, KEYS, node_obj, pod_obj
from tests.binder.test_placement import NOW, bind, cluster, placed, refused


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
    assert state.gpu_free("n1") == [7 * GI]


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
    assert state.gpu_free("n1") == [4 * GI]


def test_two_replicas_of_one_revision_never_share_a_node_and_explain_says_which() -> None:
    state = cluster(node_obj("n1", [16 * GI]), node_obj("n2", [16 * GI]))
    first = pod_from_api(revision_pod("r1", "5d4f8b", model="m"), KEYS)
    chosen = place(state, first, now=NOW)
    assert isinstance(chosen, Placement)
    # Assumed (bound but not yet seen back): the revision counts already.
    state.assume(first, chosen.node, chosen.gpu.uuid)
    second = placed(state, revision_pod("r2", "5d4f8b", model="m"))
    assert second.node != chosen.node
    bind(state, "r2", second.node, 0, model="m")
    state.set_pod(pod_from_api(revision_pod("r2", "5d4f8b", model="m", node=second.node), KEYS))
    third = pod_from_api(revision_pod("r3", "5d4f8b", model="m"), KEYS)
    result = place(state, third, now=NOW)
    assert isinstance(result, Unschedulable)
    reason = "node(s) already had model models/m at revision 5d4f8b"
    assert result.message == f"0/2 nodes are available: 2 {reason}."
    assert {v.node: v.reasons for v in explain(state, third, now=NOW)} == {
        "n1": (reason,),
        "n2": (reason,),
    }


def test_pods_without_a_revision_label_are_one_revision() -> None:
    state = cluster(node_obj("n1", [16 * GI]))
    bind(state, "plain-1", "n1", 0, model="m")
    result = refused(state, pod_obj("plain-2", model="m"))
    assert result.reasons == {"node(s) already had model models/m": 1}
    # A labelled pod is another revision than the unlabelled ones.
    assert placed(state, revision_pod("labelled", "5d4f8b", model="m")).node == "n1"


def test_a_statefulsets_controller_revision_hash_is_a_revision_too() -> None:
    state = cluster(node_obj("n1", [16 * GI]))
    label = "controller-revision-hash"
    state.set_pod(
        pod_from_api(revision_pod("s-0", "db-6d8f7", label=label, model="m", node="n1"), KEYS)
    )
    refused(state, revision_pod("s-1", "db-6d8f7", label=label, model="m"))
    assert placed(state, revision_pod("s-1", "db-7a9c4", label=label, model="m")).node == "n1"


def test_the_proof_of_concepts_annotation_names_keep_the_rule() -> None:
    poc = Keys(POC_PREFIX)
    state = ClusterState()
    state.set_node(
        node_from_api(
            {
                "metadata": {
                    "name": "n1",
                    "annotations": {
                        poc.gpus: '[{"uuid": "GPU-1", "index": 0, "product": "t4",'
                        ' "memory": 17179869184, "healthy": true}]'
                    },
                },
                "spec": {},
            },
            poc,
        )
    )
    state.set_lease("n1", NOW + 40)

    def poc_pod(name: str, revision: str, node: str = "") -> Any:
        obj = revision_pod(name, revision, mem=None, model=None, node=node)
        obj["metadata"]["annotations"] = {poc.model_id: "resnet"}
        obj["spec"]["containers"][0]["resources"] = {"limits": {poc.gpu_mem: "1Gi"}}
        return pod_from_api(obj, poc)

    state.set_pod(poc_pod("old", "aaaa", node="n1"))
    assert isinstance(place(state, poc_pod("same", "aaaa"), now=NOW), Unschedulable)
    assert isinstance(place(state, poc_pod("next", "bbbb"), now=NOW), Placement)
    assert poc.model_id == "seldon.io/trtis-model-id"
