"""Replicas of one model spread over GPUs: a node without a replica first (as before), then on
a node a GPU without one, then binpacking's order; `Node` keeps only the first, `None` packs
them (a TritonModel's spec.replicaSpread, a model pod's tritonshare.io/replica-spread). A score
only: memory fit, node affinity and pod anti-affinity still decide where a replica may go."""

from __future__ import annotations

from typing import Any

from binder.cluster.clusterstate import ClusterState
from binder.cluster.modelviews import ModelInfo, model_from_api
from binder.cluster.objects import PodInfo, pod_from_api
from binder.framework.noderules import NODE_RULES
from binder.framework.placement import Placement, Unschedulable, place
from tests.binder.framework.test_placement import NOW, bind, cluster
from tests.binder.objects import GI, KEYS, node_obj, pod_obj
from tests.binder.tritonmodels.test_tritonmodels import model


def tritonmodel(replicas: int, spread: str | None = None, memory: str = "2Gi") -> ModelInfo:
    obj = model("anchor", replicas, memory)
    obj["metadata"].update(uid="uid-anchor", namespace="default")
    if spread is not None:
        obj["spec"]["replicaSpread"] = spread
    return model_from_api(obj, KEYS, "tritonshare")


def place_all(state: ClusterState, replicas: list[PodInfo]) -> list[tuple[str, int]]:
    """Place each in turn, charging it as the binder does; (node, GPU index) of each."""
    where = []
    for replica in replicas:
        result = place(state, replica, now=NOW)
        assert isinstance(result, Placement), result
        state.assume(replica, result.node, result.gpu.uuid)
        where.append((result.node, result.gpu.index))
    return where


def replicas_of(m: ModelInfo) -> list[PodInfo]:
    return [m.replica(i) for i in range(m.replicas)]


def one_node_one_gpu_used() -> ClusterState:
    """A node of two 16Gi GPUs; GPU 0 holds another model, GPU 1 is empty."""
    state = cluster(node_obj("n1", [16 * GI, 16 * GI]))
    bind(state, "other", "n1", 0, "4Gi", model="other")
    return state


def model_pods(count: int, annotations: dict[str, str] | None = None) -> list[PodInfo]:
    labels = {"app": "anchor", "pod-template-hash": "abc"}
    return [
        pod_from_api(
            pod_obj(f"anchor-{i}", model="anchor", labels=labels, annotations=annotations), KEYS
        )
        for i in range(count)
    ]


def test_three_replicas_of_a_tritonmodel_use_both_gpus_of_a_node() -> None:
    state = one_node_one_gpu_used()
    where = place_all(state, replicas_of(tritonmodel(3)))
    # The first goes where binpacking puts it (the used GPU), the second on the other GPU, the
    # third, every GPU holding one, by binpacking's order again.
    assert where == [("n1", 0), ("n1", 1), ("n1", 0)]


def test_with_spread_none_or_node_the_replicas_stack_on_one_gpu() -> None:
    for spread in ("None", "Node"):
        state = one_node_one_gpu_used()
        assert place_all(state, replicas_of(tritonmodel(3, spread))) == [("n1", 0)] * 3


def test_a_deployments_model_pods_spread_over_gpus_and_the_annotation_packs_them() -> None:
    state = one_node_one_gpu_used()
    assert {gpu for _, gpu in place_all(state, model_pods(3))} == {0, 1}
    state = one_node_one_gpu_used()
    packed = model_pods(3, {KEYS.replica_spread: "None"})
    assert place_all(state, packed) == [("n1", 0)] * 3


def test_other_nodes_come_first_then_other_gpus() -> None:
    state = cluster(node_obj("n1", [16 * GI, 16 * GI]), node_obj("n2", [16 * GI, 16 * GI]))
    where = place_all(state, replicas_of(tritonmodel(4)))
    assert {node for node, _ in where[:2]} == {"n1", "n2"}
    assert sorted(where) == [("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1)]


def test_spread_none_packs_replicas_onto_one_node() -> None:
    state = cluster(node_obj("n1", [16 * GI, 16 * GI]), node_obj("n2", [16 * GI, 16 * GI]))
    bind(state, "other", "n1", 0, "4Gi", model="other")
    assert place_all(state, replicas_of(tritonmodel(2, "None"))) == [("n1", 0)] * 2


def test_spread_never_breaks_memory_fit() -> None:
    # GPU 1 has no room for the model: the second replica stacks on GPU 0 rather than wait.
    state = cluster(node_obj("n1", [16 * GI, 16 * GI]))
    bind(state, "big", "n1", 1, "15Gi", model="big")
    assert place_all(state, replicas_of(tritonmodel(2))) == [("n1", 0), ("n1", 0)]
    # And a replica that fits nowhere is refused for memory, whatever the spread.
    full = tritonmodel(1, memory="15Gi").replica(0)
    assert isinstance(place(state, full, now=NOW), Unschedulable)


def test_spread_never_breaks_node_affinity_or_pod_anti_affinity() -> None:
    state = cluster(
        node_obj("n1", [16 * GI, 16 * GI], labels={"pool": "a"}),
        node_obj("n2", [16 * GI, 16 * GI], labels={"pool": "b"}),
    )
    selector: dict[str, Any] = {"nodeSelector": {"pool": "a"}}
    pods = [
        pod_from_api(pod_obj(f"s-{i}", model="sel", spec_extra=selector), KEYS) for i in range(3)
    ]
    assert [node for node, _ in place_all(state, pods)] == ["n1"] * 3
    # Another model's required anti-affinity keeps the replicas off n2 altogether.
    state = cluster(node_obj("n1", [16 * GI, 16 * GI]), node_obj("n2", [16 * GI, 16 * GI]))
    bind(state, "guard", "n2", 0, "1Gi", model="guard", labels={"role": "guard"})
    term: dict[str, Any] = {
        "labelSelector": {"matchLabels": {"role": "guard"}},
        "topologyKey": "kubernetes.io/hostname",
    }
    anti = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    pods = [
        pod_from_api(pod_obj(f"a-{i}", model="anti", spec_extra={"affinity": anti}), KEYS)
        for i in range(3)
    ]
    where = place_all(state, pods)
    assert [node for node, _ in where] == ["n1"] * 3
    assert {gpu for _, gpu in where} == {0, 1}


def test_an_unknown_spread_is_the_pods_problem() -> None:
    pod = pod_from_api(pod_obj("p", annotations={KEYS.replica_spread: "Zone"}), KEYS)
    assert "is not a replica spread" in pod.problem
    assert isinstance(place(ClusterState(rules=NODE_RULES), pod, now=NOW), Unschedulable)
