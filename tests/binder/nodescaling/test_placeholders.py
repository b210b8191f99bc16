"""The pure decisions of node autoscaling: which models wait, when a placeholder is made or
deleted, whose turn it is, which models get none and why, what a placeholder fits (judged by the
simulated kube-scheduler's filters), and the guards."""

from __future__ import annotations

from typing import Any

from binder.nodescaling.guard import GUARDS, guard_annotation, patches
from binder.nodescaling.placeholders import (
    MAX_PER_GROUP,
    MAX_PER_NAMESPACE,
    MAX_PLACEHOLDERS,
    SAFE_TO_EVICT,
    Group,
    Placeholder,
    Selection,
    Waiting,
    manifest,
    next_name,
    placeholder_of,
    waiting_model,
    waiting_pod,
)
from binder.nodescaling.planning import Bounds, Refusal, plan, shares
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
        "tritonmodel a/r", Selection(), namespace="a"
    )
    assert waiting_model(model("ExceededQuota", f"replica 1: {FIT_ERROR}")) is None
    assert waiting_model(model("Unschedulable", "replica 1: a spec problem")) is None
    # One that declares no GPU memory waits for what the binder books its next replica at.
    learned = model("Unschedulable", f"replica 1: {FIT_ERROR}")
    learned["status"]["gpuMemory"] = {"source": "Measured", "booked": "3380Mi"}
    waiting = waiting_model(learned)
    assert waiting is not None and waiting.request == 3380 << 20


def test_models_of_one_node_selection_share_a_group() -> None:
    spec: dict[str, Any] = {"nodeSelector": {"zone": "a"}, "tolerations": [TAINT]}
    one = waiting_pod(pending(**spec), "tritonshare")
    two = waiting_pod(pending(**spec), "tritonshare")
    other = waiting_pod(pending(nodeSelector={"zone": "b"}), "tritonshare")
    assert one is not None and two is not None and other is not None
    assert one.group.key == two.group.key != other.group.key
    elsewhere = waiting_pod(pending(**spec) | {"metadata": {"namespace": "b", "name": "m"}}, "x")
    assert elsewhere is None or elsewhere.group.key != one.group.key
    assert Group("b", one.selection).key != one.group.key, "a namespace's own group"


def _placeholder(
    group: str, node: str = "", index: int = 0, ended: bool = False, namespace: str = "a"
) -> Placeholder:
    return Placeholder(
        f"tritonshare-placeholder-{group}-{index}", f"uid-{index}", group, node, ended, namespace
    )


def test_one_node_at_a_time_per_group_then_another_after_the_grace() -> None:
    selection = Selection(node_selector={"zone": "a"})
    group = Group("a", selection)
    key = group.key
    waiting = [
        Waiting("pod a/x", selection, namespace="a"),
        Waiting("pod a/y", selection, namespace="a"),
    ]
    never: Any = lambda node: None  # noqa: E731
    assert plan(waiting, [], never, 60).create == (group,), "one placeholder for both"
    assert plan(waiting, [_placeholder(key)], never, 60).create == (), "the autoscaler works"
    bound = [_placeholder(key, "n9")]
    running = {"n9"}
    assert plan(waiting, bound, never, 60, running=running).create == (), "not serving yet"
    assert plan(waiting, bound, lambda n: 59.0, 60, running=running).create == (), "grace"
    assert plan(waiting, bound, lambda n: 60.0, 60, running=running).create == (group,), (
        "the node was not enough"
    )
    full = [_placeholder(key, f"n{i}", i) for i in range(MAX_PER_GROUP)]
    nodes = {f"n{i}" for i in range(MAX_PER_GROUP)}
    assert plan(waiting, full, lambda n: 600.0, 60, running=nodes).create == ()


def test_a_node_added_that_took_none_of_its_models_refuses_the_group() -> None:
    """The node serves, runs no model after the grace: another would not take them either."""
    selection = Selection(node_selector={"zone": "a"})
    group = Group("a", selection)
    waiting = [Waiting("tritonmodel a/x", selection, namespace="a")]
    bound = _placeholder(group.key, "n9")
    decided = plan(waiting, [bound], lambda n: 60.0, 60)
    assert decided.create == () and decided.delete == (bound,)
    [(key, why)] = decided.unhelped
    assert key == group.key and why.startswith("node n9 was added for it")
    assert decided.refused == (Refusal(waiting[0], why),)
    # Remembered by the caller: the group asks for nothing more.
    again = plan(waiting, [], lambda n: None, 60, refused={group.key: why})
    assert again.create == () and again.refused == (Refusal(waiting[0], why),)


def test_a_placeholder_pending_too_long_refuses_its_group() -> None:
    """No node group matches it, or none can grow: its models ask for no node."""
    selection = Selection(node_selector={"pool": "none"})
    waiting = [Waiting("tritonmodel a/x", selection, namespace="a")]
    pending = _placeholder(Group("a", selection).key)
    never: Any = lambda node: None  # noqa: E731
    assert plan(waiting, [pending], never, 60, pending_for=lambda p: 899.0, pending_limit=900)
    decided = plan(waiting, [pending], never, 60, pending_for=lambda p: 900.0, pending_limit=900)
    assert decided.delete == (pending,) and decided.create == ()
    [(_, why)] = decided.unhelped
    assert why == (
        "its placeholder has been pending for 900 s: no node group matches its node selection, "
        "or none can grow"
    )
    assert decided.refused == (Refusal(waiting[0], why),)
    assert plan(waiting, [pending], never, 60, pending_for=lambda p: 1e9).delete == (), "0: never"


def test_namespaces_take_turns_and_one_holds_its_share_at_most() -> None:
    never: Any = lambda node: None  # noqa: E731
    attacker = [
        Waiting(f"tritonmodel evil/m{i}", Selection({"pool": f"none-{i}"}), namespace="evil")
        for i in range(32)
    ]
    victim = Waiting("tritonmodel team/big", Selection(), namespace="team")
    alone = plan(attacker, [], never, 60)
    assert len(alone.create) == MAX_PER_NAMESPACE, "a namespace's cap"
    held = [_placeholder(g.key, index=i, namespace="evil") for i, g in enumerate(alone.create)]
    decided = plan([*attacker, victim], held, never, 60)
    assert decided.create == (victim.group,) and decided.delete == (), "the other's turn"

    # Namespaces enough to fill the global cap: one holding its cap loses pending placeholders
    # past its share once another waits; a bound one stays (its node is coming).
    crowd = [
        Waiting(f"pod ns{n}/m{i}", Selection({"pool": f"p{i}"}), namespace=f"ns{n}")
        for n in range(MAX_PLACEHOLDERS // MAX_PER_NAMESPACE)
        for i in range(MAX_PER_NAMESPACE)
    ]
    full = [
        _placeholder(w.group.key, "n0" if w.namespace == "ns0" else "", i, namespace=w.namespace)
        for i, w in enumerate(crowd)
    ]
    decided = plan([*crowd, victim], full, never, 60)
    assert decided.create == (victim.group,)
    assert decided.delete and not [p for p in decided.delete if p.node], "bound ones stay"
    assert len(full) - len(decided.delete) + len(decided.create) <= MAX_PLACEHOLDERS
    assert plan(crowd, full, never, 60).delete == (), "while no other namespace waits"


def test_shares_are_max_min_fair() -> None:
    assert shares({"a": 32}) == {"a": MAX_PER_NAMESPACE}
    assert shares({"a": 32, "b": 1}) == {"a": MAX_PER_NAMESPACE, "b": 1}
    five = shares({f"n{i}": 32 for i in range(5)})
    assert sum(five.values()) <= MAX_PLACEHOLDERS and min(five.values()) == 6
    many = shares({f"n{i}": 1 for i in range(40)})
    assert sum(many.values()) == MAX_PLACEHOLDERS
    # A namespace whose placeholders are bound keeps them; the others share the rest.
    floored = shares({"a": 8, "b": 8, "c": 8, "d": 8, "e": 1}, {"a": 8})
    assert floored["a"] == 8 and floored["e"] == 1 and sum(floored.values()) == MAX_PLACEHOLDERS


def test_a_model_no_new_node_could_hold_gets_no_placeholder_and_says_why() -> None:
    never: Any = lambda node: None  # noqa: E731
    gi = 1 << 30
    huge = Waiting("tritonmodel a/huge", Selection(), namespace="a", request=40 * gi)
    fits = Waiting("tritonmodel a/fits", Selection({"zone": "b"}), namespace="a", request=gi)
    decided = plan([huge, fits], [], never, 60, bounds=Bounds(largest_gpu=15 * gi))
    assert decided.create == (fits.group,)
    [refusal] = decided.refused
    assert refusal.waiting == huge
    assert refusal.reason == (
        "it requests 40Gi of GPU memory, more than the largest GPU of the cluster's nodes and "
        "node groups offers (15Gi after the reserve)"
    )
    # Its placeholder from before goes.
    old = _placeholder(huge.group.key, "n1")
    assert plan([huge], [old], never, 60, bounds=Bounds(15 * gi)).delete == (old,)
    assert plan([huge], [], never, 60, bounds=Bounds(80 * gi)).create == (huge.group,), (
        "a node group of larger GPUs"
    )
    assert plan([huge], [], never, 60).create == (huge.group,), "no size known"


def test_a_namespace_past_its_quota_gets_no_placeholder() -> None:
    never: Any = lambda node: None  # noqa: E731
    gi = 1 << 30
    one = Waiting("tritonmodel q/one", Selection({"z": "1"}), namespace="q", request=4 * gi)
    two = Waiting("tritonmodel q/two", Selection({"z": "2"}), namespace="q", request=4 * gi)
    other = Waiting("tritonmodel free/m", Selection(), namespace="free", request=4 * gi)
    exhausted = Bounds(headroom={"q": 0})
    decided = plan([one, other], [], never, 60, bounds=exhausted)
    assert decided.create == (other.group,), "no quota binds the other namespace"
    assert [r.waiting for r in decided.refused] == [one]
    assert "GPU memory quota of namespace q leaves 0" in decided.refused[0].reason
    # Room for one model's request: one placeholder, not one per group.
    decided = plan([one, two], [], never, 60, bounds=Bounds(headroom={"q": 6 * gi}))
    assert len(decided.create) == 1 and decided.refused == ()
    held = [_placeholder(decided.create[0].key, namespace="q")]
    assert plan([one, two], held, never, 60, bounds=Bounds(headroom={"q": 6 * gi})).create == ()


def test_a_group_that_waits_no_more_loses_its_placeholders() -> None:
    """What it stood for is placed or gone: it is deleted, so it keeps no node."""
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
    group = Group("a", selection)
    pod = manifest(
        group,
        name=next_name(group.key, []),
        namespace="tritonshare-system",
        keys=KEYS,
        image="pause",
        node_selector=(("nvidia.com/gpu.present", "true"),),
        waiting_for=[f"pod a/m{i}" for i in range(7)],
    )
    assert placeholder_of(pod, KEYS) == Placeholder(
        pod["metadata"]["name"], "", group.key, "", False, "a"
    )
    assert pod["metadata"]["annotations"]["tritonshare.io/placeholder-for"].endswith("m4, 2 more")
    assert pod["metadata"]["annotations"][SAFE_TO_EVICT] == "true", "never keeps a node"
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
    assert next_name(group.key, [pod["metadata"]["name"]]).endswith("-1")


def test_a_placeholder_asks_for_a_gpu_of_its_models_size_or_a_node_group_not_labelled() -> None:
    """Karpenter's instance-gpu-memory (MiB per GPU): 40960 MiB needed, a T4's 16384 refused, an
    A100 40GB's 40960 taken; a node without the label still taken (its group unlabelled)."""
    label = "karpenter.k8s.aws/instance-gpu-memory"
    selection = Selection(
        terms=(
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
        )
    )
    pod = manifest(
        Group("a", selection),
        name="p",
        namespace="tritonshare-system",
        keys=KEYS,
        image="pause",
        node_selector=(("nvidia.com/gpu.present", "true"),),
        waiting_for=["tritonmodel a/big"],
        gpu_memory=(label, 40960),
    )

    def on(zone: str, mebibytes: int | None) -> str | None:
        sized = {label: str(mebibytes)} if mebibytes is not None else {}
        return unfit(pod, node("gpu", {**GPU_NODE, "zone": zone, **sized}), [])

    refused = "node(s) didn't match Pod's node affinity/selector"
    assert on("a", 16384) == refused and on("b", 40959) == refused
    assert on("a", 40960) is None and on("b", 81920) is None
    assert on("a", None) is None, "a node group without the label"
    assert on("c", 81920) == refused, "the models' own terms still hold"
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    sized = [t["matchExpressions"][-1]["operator"] for t in terms["nodeSelectorTerms"]]
    assert sized == ["Gt", "Gt", "DoesNotExist", "DoesNotExist"], "sized terms first"


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
