"""The pure decisions of node autoscaling: which models wait, when a placeholder is made or
deleted, what it fits (judged by the simulated kube-scheduler's filters), and the guards."""

from __future__ import annotations

from typing import Any

from binder.nodescaling.guard import GUARDS, guard_annotation, patches
from binder.nodescaling.placeholders import (
    MAX_PER_GROUP,
    Placeholder,
    Selection,
    Waiting,
    manifest,
    next_name,
    placeholder_of,
    plan,
    waiting_model,
    waiting_pod,
)
from common.contract import Keys
from sim.controllers.nodefit import unfit

KEYS = Keys()
FIT_ERROR = "0/3 nodes are available: 3 Insufficient GPU memory (largest free block 4Gi)."
GPU_NODE = {"nvidia.com/gpu.present": "true"}
TAINT = {"key": "tritonshare.io/gpu-node", "value": "true", "effect": "NoExecute"}


def pending(
    *, reason: str = "Unschedulable", message: str = FIT_ERROR, **spec: Any
) -> dict[str, Any]:
    condition = {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}
    return {
        "metadata": {"namespace": "models", "name": "m"},
        "spec": {"schedulerName": "tritonshare", **spec},
        "status": {"phase": "Pending", "conditions": [condition]},
    }


def node(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"taints": [TAINT]},
    }


def test_only_a_fit_error_makes_a_model_wait() -> None:
    assert waiting_pod(pending(), "tritonshare") is not None
    assert waiting_pod(pending(), "other") is None
    assert (
        waiting_pod(pending(message="pod has no tritonshare.io/model-id annotation"), "tritonshare")
        is None
    )
    assert waiting_pod(pending(reason="SchedulerError"), "tritonshare") is None
    assert waiting_pod(pending(nodeName="n1"), "tritonshare") is None
    nominated = pending()
    nominated["status"]["nominatedNodeName"] = "n1"
    assert waiting_pod(nominated, "tritonshare") is None, "a preemption makes its room"

    def model(reason: str, message: str) -> dict[str, Any]:
        condition = {"type": "Placed", "status": "False", "reason": reason, "message": message}
        return {
            "metadata": {"namespace": "a", "name": "r"},
            "spec": {},
            "status": {"conditions": [condition]},
        }

    assert waiting_model(model("Unschedulable", f"replica 1: {FIT_ERROR}")) == Waiting(
        "tritonmodel a/r", Selection()
    )
    assert waiting_model(model("ExceededQuota", f"replica 1: {FIT_ERROR}")) is None
    assert waiting_model(model("Unschedulable", "replica 1: a spec problem")) is None


def test_models_of_one_node_selection_share_a_group() -> None:
    spec: dict[str, Any] = {"nodeSelector": {"zone": "a"}, "tolerations": [TAINT]}
    one = waiting_pod(pending(**spec), "tritonshare")
    two = waiting_pod(pending(**spec), "tritonshare")
    other = waiting_pod(pending(nodeSelector={"zone": "b"}), "tritonshare")
    assert one is not None and two is not None and other is not None
    assert one.selection.group == two.selection.group != other.selection.group


def _placeholder(group: str, node: str = "", index: int = 0, ended: bool = False) -> Placeholder:
    return Placeholder(
        f"tritonshare-placeholder-{group}-{index}", f"uid-{index}", group, node, ended
    )


def test_one_node_at_a_time_per_group_then_another_after_the_grace() -> None:
    selection = Selection(node_selector={"zone": "a"})
    group = selection.group
    waiting = [Waiting("pod a/x", selection), Waiting("pod a/y", selection)]
    never: Any = lambda node: None  # noqa: E731
    assert plan(waiting, [], never, 60).create == (selection,), "one placeholder for both"
    assert plan(waiting, [_placeholder(group)], never, 60).create == (), "the autoscaler works"
    bound = [_placeholder(group, "n9")]
    assert plan(waiting, bound, never, 60).create == (), "its node does not serve yet"
    assert plan(waiting, bound, lambda n: 59.0, 60).create == (), "within the grace"
    assert plan(waiting, bound, lambda n: 60.0, 60).create == (selection,), (
        "the node was not enough"
    )
    full = [_placeholder(group, "n", i) for i in range(MAX_PER_GROUP)]
    assert plan(waiting, full, lambda n: 600.0, 60).create == ()


def test_a_group_that_waits_no_more_loses_its_placeholders() -> None:
    gone = _placeholder("feed", "n1")
    ended = _placeholder("beef", ended=True)
    decided = plan([], [gone, ended], lambda n: None, 60)
    assert decided.delete == (gone,) and decided.create == ()


def on_node(name: str, namespace: str = "team", **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels}, "spec": {}}


def test_a_placeholder_fits_only_a_node_without_models_its_models_accept() -> None:
    selection = Selection(
        node_selector={"zone": "a"},
        terms=({"matchExpressions": [{"key": "size", "operator": "In", "values": ["big"]}]},),
    )
    pod = manifest(
        selection,
        name=next_name(selection.group, []),
        namespace="tritonshare-system",
        keys=KEYS,
        image="pause",
        node_selector=(("nvidia.com/gpu.present", "true"),),
        waiting_for=[f"pod a/m{i}" for i in range(7)],
    )
    assert placeholder_of(pod, KEYS) == Placeholder(
        pod["metadata"]["name"], "", selection.group, "", False
    )
    assert pod["metadata"]["annotations"]["tritonshare.io/placeholder-for"].endswith("m4, 2 more")
    fitting = node("gpu", {**GPU_NODE, "zone": "a", "size": "big"})
    node_pod = on_node("tritonshare-node", "tritonshare-system", **{"app.kubernetes.io/name": "x"})
    assert unfit(pod, fitting, [node_pod, on_node("daemon")]) is None, "a new node"
    refused = "node(s) didn't match pod anti-affinity rules"
    assert unfit(pod, fitting, [on_node("m", **{"tritonshare.io/role": "model"})]) == refused
    assert unfit(pod, fitting, [on_node("h", **{"tritonshare.io/model-host": "true"})]) == refused
    assert unfit(pod, fitting, [{**pod, "spec": {"nodeName": "gpu"}}]) == refused, "one a node"
    assert unfit(pod, node("gpu", {**GPU_NODE, "zone": "a", "size": "small"}), []) is not None
    assert unfit(pod, node("cpu", {"zone": "a", "size": "big"}), []) is not None, "a GPU node"
    assert "kubernetes.io/hostname" not in str(pod["spec"]["affinity"]["nodeAffinity"]), (
        "Karpenter ignores a pod whose node affinity names the hostname"
    )
    assert next_name(selection.group, [pod["metadata"]["name"]]).endswith("-1")


def test_guards_follow_the_serving_nodes_and_leave_an_operators_own() -> None:
    marker = guard_annotation(KEYS)
    nodes: dict[str, dict[str, str]] = {
        "serving": {},
        "own": {GUARDS[0]: "true"},
        "idle": {GUARDS[0]: "true", GUARDS[1]: "true", marker: ",".join(GUARDS)},
        "quiet": {},
    }
    assert patches(nodes, {"serving", "own"}, KEYS) == {
        "serving": {GUARDS[0]: "true", GUARDS[1]: "true", marker: ",".join(GUARDS)},
        "own": {GUARDS[1]: "true", marker: GUARDS[1]},
        "idle": {GUARDS[0]: None, GUARDS[1]: None, marker: None},
    }
    owned = {"own": {GUARDS[0]: "true", GUARDS[1]: "true", marker: GUARDS[1]}}
    assert patches(owned, set(), KEYS) == {"own": {GUARDS[1]: None, marker: None}}
