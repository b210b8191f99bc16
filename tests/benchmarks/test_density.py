"""The density benchmark's cluster: nodes of cloud instances' shapes, model pods with the
webhook's requests, and a refusal for want of node resources named as such."""

from __future__ import annotations

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
