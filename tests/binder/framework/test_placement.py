"""Placement over a cluster state: our filters (GPU memory on one GPU, live agent, model id),
scoring, tie-breaks, the unschedulable message, and the effective GPU memory request."""

from __future__ import annotations

from typing import Any

import pytest

from binder.cluster.clusterstate import ClusterState
from binder.cluster.objects import effective_request, lease_expiry, node_from_api, pod_from_api
from binder.framework.noderules import NODE_RULES
from binder.framework.placement import (
    BY_REQUEST_KEPT,
    Placement,
    Unschedulable,
    explain,
    gpu_kinds,
    place,
)
from common.contract import Keys
from common.quantity import QuantityError
from tests.binder.objects import GI, KEYS, lease_obj, node_obj, pod_obj

NOW = 1_000_000.0


def cluster(*nodes: dict[str, Any], reserve: int = 0, alive: bool = True) -> ClusterState:
    state = ClusterState(rules=NODE_RULES, reserve=reserve)
    for obj in nodes:
        info = node_from_api(obj, KEYS)
        state.set_node(info)
        if alive:
            state.set_lease(info.name, lease_expiry(lease_obj(info.name, NOW - 1)))
    return state


def bind(state: ClusterState, name: str, node: str, gpu: int, mem: str = "1Gi", **kw: Any) -> None:
    state.set_pod(
        pod_from_api(pod_obj(name, mem=mem, node=node, gpu=f"GPU-{node}-{gpu}", **kw), KEYS)
    )


def placed(state: ClusterState, obj: dict[str, Any], **kw: Any) -> Placement:
    result = place(state, pod_from_api(obj, KEYS), now=NOW, **kw)
    assert isinstance(result, Placement), result
    return result


def refused(state: ClusterState, obj: dict[str, Any]) -> Unschedulable:
    result = place(state, pod_from_api(obj, KEYS), now=NOW)
    assert isinstance(result, Unschedulable), result
    return result


# ---- the request -------------------------------------------------------------------------------


def spec_with(
    containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {"containers": containers, "initContainers": init or []}


def ctr(
    name: str, limit: str | None = None, request: str | None = None, **extra: Any
) -> dict[str, Any]:
    resources: dict[str, dict[str, str]] = {}
    if limit is not None:
        resources["limits"] = {KEYS.gpu_mem: limit}
    if request is not None:
        resources["requests"] = {KEYS.gpu_mem: request}
    return {"name": name, "resources": resources, **extra}


def test_effective_request_sums_containers_and_takes_the_largest_init_container() -> None:
    spec = spec_with(
        [ctr("a", "1Gi"), ctr("b", "512Mi")], [ctr("loader", "1Gi"), ctr("big", "3Gi")]
    )
    assert effective_request(spec, KEYS.gpu_mem) == 3 * GI
    spec = spec_with([ctr("a", "1Gi"), ctr("b", "1Gi")], [ctr("loader", "1Gi")])
    assert effective_request(spec, KEYS.gpu_mem) == 2 * GI


def test_a_limit_implies_the_request_and_an_explicit_request_wins() -> None:
    assert effective_request(spec_with([ctr("a", limit="2Gi")]), KEYS.gpu_mem) == 2 * GI
    assert effective_request(spec_with([ctr("a", request="1Gi")]), KEYS.gpu_mem) == GI
    assert effective_request(spec_with([ctr("a")]), KEYS.gpu_mem) == 0


def test_sidecar_init_containers_add_to_the_app_and_later_init_containers() -> None:
    sidecar = ctr("side", "1Gi", restartPolicy="Always")
    spec = spec_with([ctr("a", "2Gi")], [sidecar, ctr("later", "2Gi")])
    assert effective_request(spec, KEYS.gpu_mem) == 3 * GI


def test_overhead_is_added() -> None:
    spec = {**spec_with([ctr("a", "1Gi")]), "overhead": {KEYS.gpu_mem: "1Gi"}}
    assert effective_request(spec, KEYS.gpu_mem) == 2 * GI


def test_a_malformed_quantity_raises_with_the_container_name() -> None:
    with pytest.raises(QuantityError, match="container 'a'"):
        effective_request(spec_with([ctr("a", "lots")]), KEYS.gpu_mem)


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        (pod_obj("p", mem="lots"), "is not a Kubernetes quantity"),
        (pod_obj("p", mem=None), "requests no GPU memory"),
        (pod_obj("p", model=None), "has no tritonshare.io/model-id annotation"),
        (pod_obj("p", model=".hidden"), "starts with a dot"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message_and_never_raises(
    obj: dict[str, Any], fragment: str
) -> None:
    state = cluster(node_obj("n1", [16 * GI]))
    result = refused(state, obj)
    assert fragment in result.message
    assert result.message.startswith("0/1 nodes are available: ")


def test_a_request_larger_than_any_gpu_says_so() -> None:
    state = cluster(node_obj("n1", [16 * GI]), node_obj("n2", [16 * GI]), reserve=GI)
    result = refused(state, pod_obj("huge", mem="20Gi"))
    assert "more than any healthy GPU in the cluster offers (largest 15Gi" in result.message


# ---- our filters -------------------------------------------------------------------------------


def test_memory_must_fit_on_one_gpu_not_across_gpus() -> None:
    state = cluster(node_obj("n1", [8 * GI, 8 * GI]))
    bind(state, "a", "n1", 0, "6Gi")
    bind(state, "b", "n1", 1, "6Gi")
    result = refused(state, pod_obj("c", mem="3Gi"))
    assert result.message == (
        "0/1 nodes are available: 1 Insufficient GPU memory (largest free block 2Gi)."
    )
    assert placed(state, pod_obj("d", mem="2Gi")).node == "n1"


def test_the_reserve_is_kept_free_on_every_gpu() -> None:
    state = cluster(node_obj("n1", [8 * GI]), reserve=GI)
    assert isinstance(place(state, pod_from_api(pod_obj("a", mem="7Gi"), KEYS), now=NOW), Placement)
    refused(state, pod_obj("b", mem="7.5Gi"))


def test_unhealthy_gpus_offer_nothing() -> None:
    state = cluster(node_obj("n1", [16 * GI, 8 * GI], healthy=[False, True]))
    assert placed(state, pod_obj("a", mem="4Gi")).gpu.uuid == "GPU-n1-1"
    refused(state, pod_obj("b", mem="10Gi"))


def test_terminated_pods_free_memory_and_terminating_pods_keep_it() -> None:
    state = cluster(node_obj("n1", [8 * GI]))
    bind(state, "done", "n1", 0, "8Gi", phase="Succeeded")
    assert placed(state, pod_obj("a", mem="8Gi")).node == "n1"
    terminating = pod_obj("going", mem="8Gi", node="n1", gpu="GPU-n1-0", phase="Running")
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    state.set_pod(pod_from_api(terminating, KEYS))
    refused(state, pod_obj("b", mem="1Gi"))
    state.remove_pod(terminating["metadata"]["uid"])
    assert placed(state, pod_obj("b", mem="1Gi")).node == "n1"


def test_a_pod_without_a_gpu_annotation_is_charged_to_the_freest_gpu() -> None:
    state = cluster(node_obj("n1", [8 * GI, 8 * GI]))
    bind(state, "a", "n1", 0, "2Gi")
    state.set_pod(pod_from_api(pod_obj("legacy", mem="5Gi", node="n1"), KEYS))
    assert state.memory.free("n1") == [6 * GI, 3 * GI]


def test_assumed_pods_count_until_forgotten() -> None:
    state = cluster(node_obj("n1", [8 * GI]))
    first = pod_from_api(pod_obj("a", mem="6Gi"), KEYS)
    chosen = place(state, first, now=NOW)
    assert isinstance(chosen, Placement)
    state.assume(first, chosen.node, chosen.gpu.uuid)
    refused(state, pod_obj("b", mem="6Gi"))
    state.remove_pod(first.uid)
    placed(state, pod_obj("b", mem="6Gi"))


def test_replicas_of_a_model_spread_over_nodes_then_share_them() -> None:
    state = cluster(node_obj("n1", [16 * GI]), node_obj("n2", [16 * GI]))
    bind(state, "resnet-1", "n1", 0, model="resnet")
    # n1 is the tighter fit for binpack, but it already has a replica.
    assert placed(state, pod_obj("resnet-2", model="resnet")).node == "n2"
    bind(state, "resnet-2", "n2", 0, model="resnet")
    # Past the nodes, a third replica shares one rather than waiting.
    assert placed(state, pod_obj("resnet-3", model="resnet")).node in ("n1", "n2")


def test_a_node_without_a_live_agent_is_skipped() -> None:
    state = cluster(node_obj("n1", [16 * GI]), alive=False)
    assert refused(state, pod_obj("a")).reasons == {"node(s) had no live tritonshare agent": 1}
    state.set_lease("n1", NOW + 10)
    placed(state, pod_obj("a"))
    state.set_lease("n1", NOW - 0.001)
    refused(state, pod_obj("a"))


def test_nodes_without_gpus_or_with_a_broken_annotation_are_skipped() -> None:
    broken = node_obj("n2", [16 * GI])
    broken["metadata"]["annotations"][KEYS.gpus] = "{not json"
    state = cluster(node_obj("n1"), broken)
    assert refused(state, pod_obj("a")).reasons == {
        "node(s) had no GPUs published by the tritonshare agent": 1,
        "node(s) had an unreadable tritonshare GPU annotation": 1,
    }


def test_the_message_counts_every_reason_sorted_as_kube_scheduler_does() -> None:
    taint = {"key": "nvidia.com/gpu", "value": "", "effect": "NoSchedule"}
    zone_a = {"zone": "a"}
    nodes = [node_obj(f"full{i}", [8 * GI], labels=zone_a) for i in range(3)]
    nodes += [node_obj(f"tainted{i}", [16 * GI], labels=zone_a, taints=[taint]) for i in range(2)]
    nodes += [node_obj(f"other{i}", [16 * GI], labels={"zone": "b"}) for i in range(2)]
    state = cluster(*nodes)
    for i in range(3):
        bind(state, f"big{i}", f"full{i}", 0, "6.5Gi")
    result = refused(state, pod_obj("p", mem="2Gi", spec_extra={"nodeSelector": zone_a}))
    assert result.message == (
        "0/7 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, "
        "2 node(s) had untolerated taint {nvidia.com/gpu: }, "
        "3 Insufficient GPU memory (largest free block 1.5Gi)."
    )
    # A node is counted once, under the first rule it breaks in kube-scheduler's order.
    result = refused(state, pod_obj("q", mem="2Gi", spec_extra={"nodeSelector": {"zone": "c"}}))
    assert result.message == (
        "0/7 nodes are available: 2 node(s) had untolerated taint {nvidia.com/gpu: }, "
        "5 node(s) didn't match Pod's node affinity/selector."
    )


def test_insufficient_memory_reports_the_largest_free_block_across_nodes() -> None:
    state = cluster(node_obj("n1", [8 * GI]), node_obj("n2", [8 * GI]))
    bind(state, "a", "n1", 0, "7Gi")
    bind(state, "b", "n2", 0, "6.5Gi")
    result = refused(state, pod_obj("c", mem="2Gi"))
    assert result.message == (
        "0/2 nodes are available: 2 Insufficient GPU memory (largest free block 1.5Gi)."
    )


# ---- scoring -----------------------------------------------------------------------------------


def test_binpack_fills_the_fullest_gpu_and_node_and_keeps_whole_gpus_free() -> None:
    state = cluster(node_obj("n1", [16 * GI, 16 * GI]), node_obj("n2", [16 * GI, 16 * GI]))
    bind(state, "a", "n2", 1, "10Gi")
    choice = placed(state, pod_obj("b", mem="4Gi"))
    assert (choice.node, choice.gpu.uuid) == ("n2", "GPU-n2-1")
    spread = placed(state, pod_obj("b", mem="4Gi"), policy="spread")
    assert spread.node == "n1"


def test_a_small_model_leaves_the_last_a100_block_to_the_big_model_waiting_for_it() -> None:
    """Before, a node scored by how full it would be relative to its own size: the 8-GPU A100
    node with one LLM looked fuller than a T4 node, so small models broke its last 80 GiB
    block and the next LLM fitted nowhere."""
    a100 = {"gpu": "a100"}
    state = cluster(
        node_obj("a100-0", [80 * GI] * 2, labels=a100),
        node_obj("t4-0", [16 * GI], labels={"gpu": "t4"}),
        node_obj("t4-1", [16 * GI], labels={"gpu": "t4"}),
    )
    bind(state, "llm-1", "a100-0", 0, "60Gi")
    bind(state, "bert", "t4-1", 0, "6Gi")
    # Small models go to the T4s, the used one first, and open the other T4 when it is full.
    for name, gpu in (("s0", "GPU-t4-1-0"), ("s1", "GPU-t4-1-0"), ("s2", "GPU-t4-0-0")):
        pod = pod_from_api(pod_obj(name, mem="4Gi"), KEYS)
        choice = place(state, pod, now=NOW)
        assert isinstance(choice, Placement)
        assert choice.gpu.uuid == gpu, name
        state.assume(pod, choice.node, choice.gpu.uuid)
    # 17Gi fits no T4: the A100 remainder beside the LLM, not the empty A100.
    medium = placed(state, pod_obj("medium", mem="17Gi"))
    assert medium.gpu.uuid == "GPU-a100-0-0"
    state.assume(pod_from_api(pod_obj("medium", mem="17Gi"), KEYS), medium.node, medium.gpu.uuid)
    llm = placed(state, pod_obj("llm-2", mem="70Gi", spec_extra={"nodeSelector": a100}))
    assert llm.gpu.uuid == "GPU-a100-0-1"


def test_binpack_takes_the_smallest_gpu_kind_that_fits_when_no_kind_has_gpus_to_spare() -> None:
    state = cluster(
        node_obj("a", [80 * GI] * 8), node_obj("b", [24 * GI] * 4), node_obj("c", [16 * GI] * 4)
    )
    # One A100 in eight whole, one L4 in four with room for a model only an L4 holds: not more
    # than two fifths, none to spare.
    for gpu in range(1, 8):  # the A100 node is the fullest node, but its free GPU the largest
        bind(state, f"llm-{gpu}", "a", gpu, "76Gi")
    for gpu in range(1, 4):
        bind(state, f"whisper-{gpu}", "b", gpu, "24Gi")
        bind(state, f"t5-{gpu}", "c", gpu, "16Gi")
    for mem, node in (("4Gi", "c"), ("20Gi", "b"), ("30Gi", "a")):
        for budget in (None, 0):
            assert placed(state, pod_obj(f"p-{mem}", mem=mem), scan_budget=budget).node == node
    # Once the T4 holds 13Gi, a 4Gi pod no longer fits it: the L4 is next, not the A100's 4Gi
    # remainders beside the LLMs.
    bind(state, "x", "c", 0, "13Gi")
    assert placed(state, pod_obj("q", mem="4Gi")).node == "b"


def test_binpack_opens_the_larger_gpus_while_their_kind_has_gpus_to_spare() -> None:
    """An earlier rule opened the smallest GPU first whatever was free: the static fleet of
    benchmarks/density.py then used 742 T4s and 1,000 GPUs in all, where first-fit decreasing
    used 576. While more than two fifths of a kind's GPUs have room for a model that needs the
    kind, binpack opens the larger ones (fewer GPUs in use); the A100s stay kept for the pods
    only they hold."""
    state = cluster(
        node_obj("a100-0", [80 * GI] * 8),
        node_obj("l4-0", [24 * GI] * 4),
        node_obj("t4-0", [16 * GI] * 4),
    )
    for budget in (None, 0):
        assert placed(state, pod_obj("bert", mem="4Gi"), scan_budget=budget).node == "l4-0"
    # Three L4s of four hold 22Gi: one with room for an L4 model is not more than two fifths,
    # the T4s open now.
    for gpu in range(3):
        bind(state, f"whisper-{gpu}", "l4-0", gpu, "22Gi")
    for budget in (None, 0):
        assert placed(state, pod_obj("t5", mem="6Gi"), scan_budget=budget).node == "t4-0"


def test_a_small_model_leaves_the_block_an_l4_model_needs_when_l4s_are_short() -> None:
    """A used L4's 22Gi block is the only room a 20Gi model has once the L4s are taken: a 3Gi
    model opens a T4 rather than break it."""
    state = cluster(
        node_obj("a100-0", [80 * GI]), node_obj("l4-0", [24 * GI] * 4), node_obj("t4-0", [16 * GI])
    )
    for gpu in range(3):
        bind(state, f"whisper-{gpu}", "l4-0", gpu, "24Gi")
    bind(state, "resnet", "l4-0", 3, "2Gi")
    for budget in (None, 0):
        assert placed(state, pod_obj("bert", mem="3Gi"), scan_budget=budget).node == "t4-0"
    # A block too small for anything an L4 alone holds is filled as any used GPU's.
    bind(state, "t5", "l4-0", 3, "10Gi")
    for budget in (None, 0):
        choice = placed(state, pod_obj("bert", mem="3Gi"), scan_budget=budget)
        assert choice.gpu.uuid == "GPU-l4-0-3"


def test_small_models_fill_the_room_beside_an_llm_only_while_a100s_are_to_spare() -> None:
    """Beside a 70Gi LLM, 10Gi is left: less than a T4, so nothing only an A100 holds fits
    there, and leaving it empty wasted 1,081 GiB of A100 memory on benchmarks/density.py's
    static fleet. A small model takes it while more than two fifths of the A100s are whole, so
    the next LLM still finds one; once they are short (two fifths whole or fewer) it does not,
    as what it leaves behind when the LLM goes would split the block the next LLM needs."""
    a100 = {"gpu": "a100"}
    state = cluster(
        node_obj("a100-0", [80 * GI] * 8, labels=a100), node_obj("t4-0", [16 * GI]), reserve=0
    )
    bind(state, "llm-0", "a100-0", 0, "70Gi")
    for budget in (None, 0):
        choice = placed(state, pod_obj("bert", mem="4Gi"), scan_budget=budget)
        assert choice.gpu.uuid == "GPU-a100-0-0"
    for gpu in range(1, 6):  # two A100s of eight whole: not more than two fifths
        bind(state, f"llm-{gpu}", "a100-0", gpu, "70Gi")
    for budget in (None, 0):
        assert placed(state, pod_obj("bert", mem="4Gi"), scan_budget=budget).node == "t4-0"


def test_binpack_fills_a_used_gpu_before_opening_an_empty_one_of_the_same_kind() -> None:
    state = cluster(node_obj("n1", [16 * GI, 16 * GI]), node_obj("n2", [16 * GI]))
    bind(state, "a", "n1", 1, "4Gi")
    choice = placed(state, pod_obj("b", mem="2Gi"))
    assert (choice.node, choice.gpu.uuid) == ("n1", "GPU-n1-1")
    bind(state, "c", "n2", 0, "10Gi")  # now n2's GPU is the tightest block that fits
    choice = placed(state, pod_obj("b", mem="2Gi"))
    assert (choice.node, choice.gpu.uuid) == ("n2", "GPU-n2-0")


def test_binpack_fills_a_used_gpu_of_a_bigger_kind_before_opening_an_empty_smaller_one() -> None:
    """An earlier rule took the smallest kind first and opened an empty T4 while a used L4
    had room: 3 % more GPU memory in use on benchmarks/density.py's static fleet."""
    state = cluster(
        node_obj("a100-0", [80 * GI]), node_obj("l4-0", [24 * GI]), node_obj("t4-0", [16 * GI])
    )
    bind(state, "whisper", "l4-0", 0, "18Gi")
    for budget in (None, 0):
        assert placed(state, pod_obj("bert", mem="4Gi"), scan_budget=budget).node == "l4-0"
    # A used GPU is preferred only where the pod fits: 7Gi no longer does, the empty T4 opens.
    assert placed(state, pod_obj("t5", mem="7Gi")).node == "t4-0"


def test_the_largest_kind_is_taken_by_a_smaller_model_only_when_nothing_smaller_has_room() -> None:
    """The room beside an LLM looks like any used GPU's, but a small model left there stays when
    the LLM goes, and the next LLM finds no whole A100: under churn every rule that filled it
    refused most big models (benchmarks/density.py)."""
    a100 = {"gpu": "a100"}
    state = cluster(
        node_obj("a100-0", [80 * GI] * 2, labels=a100), node_obj("t4-0", [16 * GI]), reserve=0
    )
    bind(state, "llm", "a100-0", 0, "60Gi")
    for budget in (None, 0):
        assert placed(state, pod_obj("bert", mem="4Gi"), scan_budget=budget).node == "t4-0"
    bind(state, "resnet", "t4-0", 0, "14Gi")
    # No T4 has room: the A100 beside the LLM, not the whole one.
    for budget in (None, 0):
        choice = placed(state, pod_obj("bert", mem="4Gi"), scan_budget=budget)
        assert choice.gpu.uuid == "GPU-a100-0-0"


def test_gpus_within_a_tenth_of_the_largest_count_as_the_largest_kind() -> None:
    """An A100 80GB and an H100 80GB publish sizes 0.4 % apart; both are kept for big models."""
    state = cluster(
        node_obj("a100-0", [80 * GI]),
        node_obj("h100-0", [int(79.6 * GI)]),
        node_obj("a40-0", [48 * GI]),
    )
    bind(state, "llm", "h100-0", 0, "40Gi")
    # The used H100 scores as a GPU of the largest kind, below the empty smaller A40.
    assert placed(state, pod_obj("small", mem="4Gi")).node == "a40-0"


def test_on_a_node_of_mixed_gpus_binpack_takes_the_smaller_gpu() -> None:
    state = cluster(node_obj("n1", [80 * GI, 16 * GI]))
    bind(state, "a", "n1", 0, "72Gi")  # the A100's block (8Gi) is tighter than the T4 (16Gi)
    assert placed(state, pod_obj("b", mem="4Gi")).gpu.uuid == "GPU-n1-1"
    assert placed(state, pod_obj("b", mem="4Gi"), scan_budget=0).gpu.uuid == "GPU-n1-1"


def test_spread_picks_the_emptiest_gpu_on_the_emptiest_node() -> None:
    state = cluster(node_obj("n1", [16 * GI, 16 * GI]), node_obj("n2", [16 * GI, 16 * GI]))
    bind(state, "a", "n1", 0, "2Gi")
    bind(state, "b", "n2", 0, "4Gi")
    bind(state, "c", "n2", 1, "4Gi")
    choice = placed(state, pod_obj("d", mem="1Gi"), policy="spread")
    assert (choice.node, choice.gpu.uuid) == ("n1", "GPU-n1-1")


def test_preferred_affinity_outweighs_memory_packing() -> None:
    state = cluster(node_obj("n1", [16 * GI], labels={"tier": "fast"}), node_obj("n2", [16 * GI]))
    bind(state, "a", "n2", 0, "12Gi")
    prefer = {
        "affinity": {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 10,
                        "preference": {
                            "matchExpressions": [
                                {"key": "tier", "operator": "In", "values": ["fast"]}
                            ]
                        },
                    }
                ]
            }
        }
    }
    assert placed(state, pod_obj("b", mem="1Gi")).node == "n2"
    assert placed(state, pod_obj("b", mem="1Gi", spec_extra=prefer)).node == "n1"


def test_prefer_no_schedule_taints_lower_the_score() -> None:
    soft = [{"key": "spot", "value": "", "effect": "PreferNoSchedule"}]
    state = cluster(node_obj("n1", [16 * GI], taints=soft), node_obj("n2", [16 * GI]))
    bind(state, "a", "n1", 0, "12Gi")
    assert placed(state, pod_obj("b", mem="1Gi")).node == "n2"
    tolerate = {"tolerations": [{"key": "spot", "operator": "Exists"}]}
    assert placed(state, pod_obj("b", mem="1Gi", spec_extra=tolerate)).node == "n1"


def test_spread_breaks_ties_by_the_pod_uid_reproducibly() -> None:
    nodes = [node_obj(f"n{i}", [16 * GI]) for i in range(8)]
    pods = [pod_obj(f"p{i}") for i in range(40)]
    first = {p["metadata"]["name"]: placed(cluster(*nodes), p, policy="spread").node for p in pods}
    again = {
        p["metadata"]["name"]: placed(cluster(*reversed(nodes)), p, policy="spread").node
        for p in pods
    }
    assert first == again
    assert len(set(first.values())) > 1, "the hash should spread ties over the nodes"


def test_binpack_breaks_ties_by_node_name_so_equal_choices_pile_up() -> None:
    nodes = [node_obj(f"n{i}", [16 * GI]) for i in range(8)]
    for order in (nodes, list(reversed(nodes))):
        assert {placed(cluster(*order), pod_obj(f"p{i}")).node for i in range(40)} == {"n0"}


def test_explain_gives_every_node_its_reasons() -> None:
    taint = {"key": "t", "value": "v", "effect": "NoSchedule"}
    state = cluster(
        node_obj("a", [8 * GI]), node_obj("b", [8 * GI], taints=[taint]), node_obj("c", [2 * GI])
    )
    verdicts = {
        v.node: v.reasons
        for v in explain(state, pod_from_api(pod_obj("p", mem="4Gi"), KEYS), now=NOW)
    }
    assert verdicts["a"] == ()
    assert verdicts["b"] == ("node(s) had untolerated taint {t: v}",)
    assert verdicts["c"] == ("Insufficient GPU memory: needs 4Gi, the largest free block is 2Gi",)


def test_a_node_relabelled_or_cordoned_is_judged_anew() -> None:
    state = cluster(node_obj("n1", [16 * GI]))
    selector = pod_obj("p", spec_extra={"nodeSelector": {"zone": "a"}})
    refused(state, selector)
    state.set_node(node_from_api(node_obj("n1", [16 * GI], labels={"zone": "a"}), KEYS))
    assert placed(state, selector).node == "n1"
    cordoned = node_obj("n1", [16 * GI], labels={"zone": "a"}, unschedulable=True)
    state.set_node(node_from_api(cordoned, KEYS))
    assert refused(state, selector).reasons == {"node(s) were unschedulable": 1}
    state.remove_node("n1")
    assert refused(state, selector).message == "0/0 nodes are available:"


def test_the_proof_of_concepts_key_prefix_reads_its_own_names() -> None:
    poc = Keys("seldon.io/trtis-")
    obj = pod_obj("legacy", mem=None, model=None)
    obj["metadata"]["annotations"]["seldon.io/trtis-model-id"] = "resnet"
    obj["spec"]["containers"][0]["resources"] = {"limits": {"seldon.io/trtis-gpu-mem": "3Gi"}}
    pod = pod_from_api(obj, poc)
    assert (pod.request, pod.model_id, pod.problem) == (3 * GI, "resnet", "")
    assert pod_from_api(obj, KEYS).problem.startswith("pod requests no GPU memory")
    node = node_obj("n1", [16 * GI])
    annotations = node["metadata"]["annotations"]
    annotations["seldon.io/trtis-gpus"] = annotations.pop(KEYS.gpus)
    assert len(node_from_api(node, poc).gpus) == 1
    assert node_from_api(node, KEYS).gpus == ()


def test_pods_of_many_distinct_requests_keep_binpacks_per_request_scores_bounded() -> None:
    """binpack keeps each request's per-size scores with the cluster's GPU kinds (the pods of one
    Deployment ask alike); a tenant creating pods of thousands of distinct requests must not
    grow that memory without bound."""
    state = cluster(node_obj("a100-0", [80 * GI] * 8), node_obj("t4-0", [16 * GI] * 4))
    for mib in range(64, 64 + 4 * BY_REQUEST_KEPT):  # from --min-gpu-mem's default up
        placed(state, pod_obj(f"p{mib}", mem=f"{mib}Mi"))
        assert len(gpu_kinds(state).by_request) <= BY_REQUEST_KEPT
