"""A model that needs a Triton release (a model pod's tritonshare.io/triton-version, a
TritonModel's spec.tritonVersion) is placed only on nodes whose agent publishes it, whatever the
scores prefer; refused, it names the releases the nodes run; preemption skips the other nodes."""

from __future__ import annotations

from binder.cluster.clusterstate import ClusterState
from binder.cluster.modelviews import model_from_api
from binder.cluster.objects import pod_from_api
from binder.framework.placement import explain, place, resolvable_nodes
from tests.binder.framework.test_placement import NOW, bind, cluster, placed, refused
from tests.binder.objects import GI, KEYS, node_obj, pod_obj
from tests.binder.tritonmodels.test_tritonmodels import model

NEEDS = KEYS.triton_version


def pools() -> ClusterState:
    """n1 runs 24.10 and already holds a model (binpacking's first choice), n2 runs 24.09, n3
    publishes no release (an agent that has not read its Triton yet)."""
    state = cluster(
        node_obj("n1", [16 * GI], annotations={NEEDS: "24.10"}),
        node_obj("n2", [16 * GI], annotations={NEEDS: "24.09"}),
        node_obj("n3", [16 * GI]),
    )
    bind(state, "other", "n1", 0, "4Gi", model="other")
    return state


def test_a_model_that_needs_a_release_goes_only_where_it_runs() -> None:
    state = pools()
    assert placed(state, pod_obj("any")).node == "n1", "binpacking prefers the used node"
    plan = pod_obj("plan", annotations={NEEDS: "24.09"})
    assert placed(state, plan).node == "n2"


def test_a_model_whose_release_no_node_runs_names_the_releases_they_run() -> None:
    result = refused(pools(), pod_obj("plan", annotations={NEEDS: "25.01"}))
    assert result.message == (
        "0/3 nodes are available: 1 node(s) published no Triton version, "
        "1 node(s) ran Triton 24.09, not 25.01 as the model requires, "
        "1 node(s) ran Triton 24.10, not 25.01 as the model requires."
    )
    verdicts = {
        v.node: v.reasons
        for v in explain(
            pools(), pod_from_api(pod_obj("plan", annotations={NEEDS: "24.09"}), KEYS), now=NOW
        )
    }
    assert verdicts == {
        "n1": ("node(s) ran Triton 24.10, not 24.09 as the model requires",),
        "n2": (),
        "n3": ("node(s) published no Triton version",),
    }


def test_a_release_that_is_not_one_is_the_pods_problem() -> None:
    pod = pod_from_api(pod_obj("plan", annotations={NEEDS: "24.10-py3"}), KEYS)
    assert pod.problem == (
        "annotation tritonshare.io/triton-version='24.10-py3' is not a Triton release; write "
        "the NGC container's tag without -py3, such as 24.10"
    )


def test_a_tritonmodels_replicas_need_its_release() -> None:
    obj = model("plan", 2)
    obj["metadata"].update(uid="uid-plan", namespace="default")
    obj["spec"]["tritonVersion"] = "24.09"
    replica = model_from_api(obj, KEYS, "tritonshare").replica(0)
    assert replica.triton_version == "24.09"
    result = place(pools(), replica, now=NOW)
    assert getattr(result, "node", None) == "n2", result


def test_preemption_does_not_evict_on_a_node_of_another_release() -> None:
    state = pools()
    # n1's GPU is full of a lower-priority model: evicting it would not let a 24.09 plan in.
    bind(state, "filler", "n1", 0, "12Gi", model="filler")
    bind(state, "filler2", "n2", 0, "16Gi", model="filler2")
    urgent = pod_from_api(
        pod_obj("plan", mem="8Gi", annotations={NEEDS: "24.09"}, spec_extra={"priority": 1000}),
        KEYS,
    )
    assert resolvable_nodes(state, urgent, NOW) == ["n2"]
