"""TritonModel replicas in the binder's pure core: placed like pods by every filter, but without a
pod slot of their own. Their namespace's model host on a node takes one slot and the host's
requests, charged with the first replica there and freed with the last; each replica adds only
its share. Pod (anti-)affinity and topology spread count each replica."""

from __future__ import annotations

import random
from typing import Any

import pytest

from binder.cluster.clusterstate import ClusterState
from binder.cluster.modelviews import as_replica, model_from_api
from binder.cluster.objects import PodInfo, pod_from_api
from binder.framework.placement import Placement, Unschedulable, place
from common.hosted import host_group
from common.podresources import CPU, MEMORY, MODEL_HOST_BASE, MODEL_HOST_PER_MODEL
from tests.binder.framework.test_placement import NOW, cluster
from tests.binder.objects import GI, KEYS, node_obj, pod_obj
from tests.binder.tritonmodels.test_tritonmodels import model
from webhook.mutation import complete
from webhook.settings import Settings

HOST_CPU, SHARE_CPU = MODEL_HOST_BASE[CPU], MODEL_HOST_PER_MODEL[CPU]
HOST_MEM, SHARE_MEM = MODEL_HOST_BASE[MEMORY], MODEL_HOST_PER_MODEL[MEMORY]


def replica(name: str, namespace: str = "a", **kw: Any) -> PodInfo:
    return as_replica(pod_from_api(pod_obj(name, namespace=namespace, **kw), KEYS))


def node(name: str, *, cpu: str = "8", pods: str = "110", gpus: int = 1) -> dict[str, Any]:
    allocatable = {"cpu": cpu, "memory": "64Gi", "pods": pods}
    return node_obj(name, [80 * GI] * gpus, allocatable=allocatable)


def put(state: ClusterState, pod: PodInfo) -> Placement | Unschedulable:
    """Place the replica and, when it fits, charge it as the binder does (an assumption)."""
    decision = place(state, pod, now=NOW)
    if isinstance(decision, Placement):
        state.assume(pod, decision.node, decision.gpu.uuid)
    return decision


def on(state: ClusterState, pod: PodInfo) -> str:
    decision = put(state, pod)
    assert isinstance(decision, Placement), decision
    return decision.node


def gone(state: ClusterState, uid: str) -> None:
    """The replica deleted, as the cache forgets a deleted pod."""
    state.remove_pod(uid)
    state.untrack_pod(uid)


def test_a_namespace_s_replicas_share_one_host_charged_once_per_node() -> None:
    state = cluster(node("n1"))
    for i in range(3):
        assert on(state, replica(f"r{i}")) == "n1"
    assert state.pods.pod_count("n1") == 1, "one host, whatever its replicas"
    assert state.pods.requested("n1") == {
        CPU: HOST_CPU + 3 * SHARE_CPU,
        MEMORY: HOST_MEM + 3 * SHARE_MEM,
    }
    assert on(state, replica("r0", namespace="b")) == "n1"
    assert state.pods.pod_count("n1") == 2, "another namespace gets a host of its own"
    assert state.pods.requested("n1")[CPU] == 2 * HOST_CPU + 4 * SHARE_CPU
    assert state.pods.host_count() == 2
    assert state.pods.has_host("b", "n1") and not state.pods.has_host("c", "n1")


def test_the_replicas_of_a_storage_secret_are_charged_a_host_of_their_own() -> None:
    """A namespace's models of one storage Secret have a host of their own on a node (it alone
    mounts the Secret): its slot and requests are charged too, so more Secrets gain a namespace
    nothing it is not charged for."""
    state = cluster(node("n1"))
    assert on(state, replica("r0")) == "n1"
    obj = model("bert", 2)
    obj["metadata"].update(namespace="a", uid="uid-bert")
    obj["spec"]["storageSecret"] = "creds"
    bert = model_from_api(obj, KEYS, "tritonshare")
    assert bert.host_group == host_group("a", "creds")
    assert on(state, bert.replica(0)) == "n1"
    assert on(state, bert.replica(1)) == "n1"
    assert state.pods.pod_count("n1") == 2, "a host per Secret"
    assert state.pods.requested("n1")[CPU] == 2 * HOST_CPU + 3 * SHARE_CPU
    assert state.pods.has_host(host_group("a", "creds"), "n1") and state.pods.has_host("a", "n1")
    for ordinal in (0, 1):
        gone(state, bert.replica(ordinal).uid)
    assert state.pods.pod_count("n1") == 1 and not state.pods.has_host("a/creds", "n1")


def test_the_host_takes_the_last_pod_slot_and_the_namespace_s_next_replicas_need_none() -> None:
    state = cluster(node("n1", pods="3"))
    for i in range(2):  # two pods of another scheduler
        other = pod_obj(f"o{i}", mem=None, model=None, node="n1", scheduler="default-scheduler")
        state.track_pod(pod_from_api(other, KEYS))
    assert on(state, replica("r0")) == "n1"
    for i in range(1, 5):
        assert on(state, replica(f"r{i}")) == "n1", "no slot of its own"
    refused = put(state, replica("r0", namespace="b"))
    assert isinstance(refused, Unschedulable)
    assert refused.reasons == {"Too many pods": 1}
    # A pod takes a slot of its own: refused as well.
    pod = pod_from_api(pod_obj("p", namespace="a"), KEYS)
    assert isinstance(place(state, pod, now=NOW), Unschedulable)


def test_cpu_runs_out_for_a_new_host_before_it_does_for_the_replicas_of_a_placed_one() -> None:
    # Room for one host and its first replica, then for two more replicas' shares.
    cpu = HOST_CPU + 3 * SHARE_CPU
    state = cluster(node("n1", cpu=f"{cpu}m"))
    for i in range(3):
        assert on(state, replica(f"r{i}")) == "n1"
    refused = put(state, replica("r3"))
    assert isinstance(refused, Unschedulable)
    assert refused.reasons == {"Insufficient cpu": 1}
    assert "0/1 nodes are available: 1 Insufficient cpu." in refused.message
    gone(state, "uid-a-r2")
    assert on(state, replica("r3")) == "n1", "a share freed is a share to place"
    refused = put(state, replica("r0", namespace="b"))
    assert isinstance(refused, Unschedulable) and refused.reasons == {"Insufficient cpu": 1}


def test_removing_a_namespace_s_last_replica_on_a_node_frees_its_host() -> None:
    state = cluster(node("n1", pods="1"))
    assert on(state, replica("r0")) == "n1"
    assert on(state, replica("r1")) == "n1"
    assert isinstance(put(state, replica("r0", namespace="b")), Unschedulable)
    gone(state, "uid-a-r0")
    assert state.pods.pod_count("n1") == 1, "the host still serves r1"
    assert isinstance(put(state, replica("r0", namespace="b")), Unschedulable)
    gone(state, "uid-a-r1")
    assert state.pods.pod_count("n1") == 0 and state.pods.requested("n1") == {}
    assert not state.pods.has_host("a", "n1") and state.pods.host_count() == 0
    assert on(state, replica("r0", namespace="b")) == "n1"


def test_preemption_s_what_if_without_a_replica_frees_its_host_and_puts_it_back() -> None:
    state = cluster(node("n1", pods="1"))
    assert on(state, replica("r0")) == "n1"
    with state.without(["uid-a-r0"]):
        assert state.pods.pod_count("n1") == 0
        assert isinstance(place(state, replica("r0", namespace="b"), now=NOW), Placement)
    assert state.pods.pod_count("n1") == 1
    assert state.pods.requested("n1")[CPU] == HOST_CPU + SHARE_CPU


SPREAD = {
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"team": "x"}},
        }
    ]
}
ANTI = {
    "affinity": {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"team": "x"}},
                }
            ]
        }
    }
}


def _two_nodes_with_replicas(counts: dict[str, int]) -> ClusterState:
    """Two nodes; on each, `counts` replicas labelled team=x (one host per node)."""
    state = cluster(node("n1"), node("n2"))
    for name, count in counts.items():
        for i in range(count):
            bound = pod_obj(
                f"{name}-{i}",
                namespace="a",
                node=name,
                gpu=f"GPU-{name}-0",
                labels={"team": "x"},
                phase="Running",
            )
            state.set_pod(as_replica(pod_from_api(bound, KEYS)))
    return state


def test_topology_spread_counts_each_replica_not_each_host() -> None:
    # n1 holds two replicas, n2 one: one host each. Counted by host, both nodes hold one and
    # binpack takes the tighter n1; counted by replica, n1 would reach 3 against 1.
    state = _two_nodes_with_replicas({"n1": 2, "n2": 1})
    assert state.pods.pod_count("n1") == state.pods.pod_count("n2") == 1
    plain = replica("new", labels={"team": "x"})
    decision = place(state, plain, now=NOW)
    assert isinstance(decision, Placement) and decision.node == "n1"
    spread = replica("new", labels={"team": "x"}, spec_extra=SPREAD)
    assert on(state, spread) == "n2"


def test_required_anti_affinity_counts_each_replica() -> None:
    state = _two_nodes_with_replicas({"n1": 1})
    assert on(state, replica("new", labels={"team": "x"}, spec_extra=ANTI)) == "n2"
    refused = put(state, replica("third", labels={"team": "x"}, spec_extra=ANTI))
    assert isinstance(refused, Unschedulable)
    assert refused.reasons == {"node(s) didn't match pod anti-affinity rules": 2}


def test_the_host_s_base_is_the_proxy_s_requests_the_webhook_writes() -> None:
    annotations = {"tritonshare.io/model-uri": "gs://b/add_one", KEYS.gpu_mem: "1Gi"}
    pod = {
        "metadata": {"name": "m", "namespace": "a", "annotations": annotations},
        "spec": {"containers": []},
    }
    containers = complete(pod, Settings())["spec"]["containers"]
    [proxy] = [c for c in containers if c["name"] == "proxy"]
    requests = pod_from_api({"spec": {"containers": [proxy]}}, KEYS).resources
    assert requests == dict(MODEL_HOST_BASE)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_index_and_the_whole_class_scan_judge_replicas_alike(seed: int) -> None:
    # Tight slots and CPU: hosts run out on some nodes first, shares on others.
    rng = random.Random(seed)
    nodes = []
    for i in range(8):
        cpu = HOST_CPU + rng.randint(0, 4) * SHARE_CPU + rng.choice([0, HOST_CPU])
        allocatable = {"cpu": f"{cpu}m", "memory": "64Gi", "pods": str(rng.randint(1, 3))}
        nodes.append(node_obj(f"n{i}", [24 * GI, 24 * GI], allocatable=allocatable))
    state = cluster(*nodes)
    outcomes = set()
    for i in range(60):
        pod = replica(f"r{i}", namespace=f"ns{rng.randint(0, 3)}", mem=f"{rng.randint(1, 8)}Gi")
        decisions = [place(state, pod, now=NOW, scan_budget=b) for b in (0, None, 256)]
        assert decisions[0] == decisions[1] == decisions[2], pod.name
        if isinstance(decisions[0], Placement):
            state.assume(pod, decisions[0].node, decisions[0].gpu.uuid)
            outcomes.add("placed")
        else:
            outcomes.update(decisions[0].reasons)
    assert {"placed", "Too many pods", "Insufficient cpu"} <= outcomes


def test_replicas_of_a_model_share_a_node_once_every_node_has_one() -> None:
    state = cluster(node("n1"), node("n2"))
    # kube-scheduler's default spreading: a node without one first.
    assert {on(state, replica(f"r{i}", model="m")) for i in range(2)} == {"n1", "n2"}
    assert on(state, replica("r2", model="m")) in ("n1", "n2")


def test_three_replicas_of_one_model_on_a_one_node_four_gpu_cluster() -> None:
    state = cluster(node("n1", gpus=4))
    placed = []
    for i in range(3):
        decision = put(state, replica(f"r{i}", model="m", mem="60Gi"))
        assert isinstance(decision, Placement), decision
        placed.append((decision.node, decision.gpu.uuid))
    assert {n for n, _ in placed} == {"n1"}
    assert len({g for _, g in placed}) == 3, "60Gi each: a GPU of its own"
    assert state.pods.pod_count("n1") == 1, "one host serves all three"


def test_a_model_that_asks_one_replica_per_node_keeps_it() -> None:
    state = cluster(node("n1", gpus=4))
    labels = {"team": "x"}
    assert on(state, replica("r0", model="m", labels=labels, spec_extra=ANTI)) == "n1"
    refused = put(state, replica("r1", model="m", labels=labels, spec_extra=ANTI))
    assert isinstance(refused, Unschedulable)
    assert refused.reasons == {"node(s) didn't match pod anti-affinity rules": 1}
