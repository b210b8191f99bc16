"""The density benchmark's cluster: nodes of cloud instances' shapes, model pods with the
webhook's requests, and a refusal for want of node resources named as such."""

from __future__ import annotations

from collections import Counter

from benchmarks import density
from binder.cluster.objects import PodInfo


def test_nodes_have_their_shape_s_allocatable_and_pods_the_webhook_s_requests() -> None:
    assert str(density.node_shape("t4", 1)) == "1xT4:4:29"
    assert str(density.node_shape("l4", 4)) == "4xL4:48:110"
    assert str(density.node_shape("a100", 8)) == "8xA100-80GB:96:110"
    cluster = density.make_cluster(0.02, 29)
    for node in cluster.nodes:
        # Allocatable less the node pod's requests: a g4dn.xlarge's 4 CPUs less 1.6.
        assert node.allocatable is not None and node.allocatable["cpu"] >= 2400
    [pod] = density.Deployment("m00001", "small", density.GI, 1).pods()
    assert pod.resources == {"cpu": 250, "memory": 256 << 20}
    assert pod.namespace.startswith("team-")


def test_a_pod_refused_for_cpu_while_its_gpu_has_room_is_refused_for_node_resources() -> None:
    node = density.node_shape("t4", 1).node("t4-0", labels={"gpu": "t4"})
    state = density.fresh_state(density.Cluster((node,)))
    deployments = [density.Deployment(f"m{i:05d}", "small", density.GI // 2, 1) for i in range(10)]
    pods: list[PodInfo] = [d.pods()[0] for d in deployments]
    for pod in pods[:9]:  # 4 CPUs less the node pod's 1.6: 9 pods of 250m
        chosen = density.binder_rule(state, pod)
        assert chosen is not None
        state.assume(pod, *chosen)
    assert density.binder_rule(state, pods[9]) is None
    assert density.cause(state, pods[9]) == "node resources"


def test_as_tritonmodels_a_node_s_replicas_of_one_namespace_share_one_pod_slot() -> None:
    node = density.node_shape("t4", 1).node("t4-0", labels={"gpu": "t4"})
    state = density.fresh_state(density.Cluster((node,)))
    every = (
        density.Deployment(f"m{i:05d}", "small", density.GI // 2, 1, True) for i in range(9999)
    )
    deployments = [d for d in every if d.pods()[0].namespace == "team-07"][:29]
    for deployment in deployments:
        [replica] = deployment.pods()
        chosen = density.binder_rule(state, replica)
        assert chosen is not None, "as pods the 10th finds no CPU; hosts share theirs"
        state.assume(replica, *chosen)
    assert state.pods.pod_count("t4-0") == state.pods.host_count() == 1


def test_ffd_places_on_the_binder_s_constraints_not_gpu_memory_alone() -> None:
    node = density.node_shape("t4", 1).node("t4-0", labels={"gpu": "t4"})
    cluster = density.Cluster((node,))
    state = density.fresh_state(cluster)
    ffd = density.ffd_rule(cluster)
    deployments = [density.Deployment(f"m{i:05d}", "small", density.GI // 2, 1) for i in range(10)]
    for deployment in deployments[:9]:
        [pod] = deployment.pods()
        chosen = ffd(state, pod)
        assert chosen is not None
        state.assume(pod, *chosen)
    # 5 GiB of 15.5 held, but the node's CPU holds 9 pods of 250m: the binder refuses the 10th.
    assert ffd(state, deployments[9].pods()[0]) is None
    assert density.binder_rule(state, deployments[9].pods()[0]) is None


def test_the_lower_bound_counts_pinned_bytes_on_a100s_and_pods_on_nodes_room() -> None:
    t4s = [density.node_shape("t4", 1).node(f"t4-{i}", labels={"gpu": "t4"}) for i in range(40)]
    a100 = density.node_shape("a100", 8).node("a100-0", labels={"gpu": "a100"})
    cluster = density.Cluster((a100, *t4s))
    llm = density.Deployment("m00000", "llm", 60 * density.GI, 2).pods()
    # 120 GiB fit two A100s; pinned, they could not go on T4s either way.
    assert density.lower_bound(cluster, llm) == 2
    small = [p for i in range(300) for p in density.Deployment(f"s{i:05d}", "small", 1, 1).pods()]
    # 300 tiny pods: memory would need one GPU; the A100 node's 110 slots and 9 a T4 node
    # (its CPU) need the A100 node and 22 T4 nodes.
    assert density.lower_bound(cluster, small) == 1 + 22


def test_density_wants_the_binder_s_gib_near_ffd_s_and_no_more_refused() -> None:
    def row(name: str, gib: float, refused: int) -> density.Row:
        return density.Row(name, Counter(t4=10), gib, 0, refused)

    ffd = row(density.FFD, 1000.0, 0)
    assert density.check_goals([ffd, row(density.BINDER, 1032.0, 0)]) == [True, True]
    assert density.check_goals([ffd, row(density.BINDER, 1100.0, 2)]) == [False, False]
