"""ResourceQuotas bind TritonModel replicas as the API server binds pods: the rule
(binder.framework.quota) and the model controller refusing, then placing, replicas against the
simulated API server's quota (its status counting the namespace's pods), through the official
client."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from binder.app import Binder
from binder.framework.quota import QuotaCheck, limits_from_api
from common.contract import Keys
from common.hosted import host_name
from sim.apiserver import RunningApiServer
from tests.binder.cli.test_cli_output import run_cli
from tests.binder.simcluster import (
    add_pod,
    bound,
    eventually,
    failure,
    node_of,
    scheduled_condition,
)
from tests.binder.tritonmodels.test_tritonmodels import (  # noqa: F401 (fixtures)
    GROUP,
    PLURAL,
    VERSION,
    apiserver,
    binder,
    custom,
    hosts,
    model,
    placed,
    read,
)
from tests.conftest import require_executable
from tests.deploy.rendering import render
from tests.e2e.test_rbac import describe, grants_for

KEY = "requests.tritonshare.io/gpu-mem"
GI = 1 << 30


def _quota(name: str, hard: dict[str, str], used: dict[str, str] | None = None) -> Any:
    status: dict[str, Any] = {"hard": hard}
    if used is not None:
        status["used"] = used
    return {"metadata": {"name": name}, "spec": {"hard": hard}, "status": status}


def test_a_replica_past_a_quota_is_refused_in_the_api_servers_words() -> None:
    limits = limits_from_api([_quota("gpu", {KEY: "4Gi"}, {KEY: "1Gi"})], Keys())
    check = QuotaCheck(limits, charged=2 * GI)
    assert check.refusal(GI) == "" and not check.refused
    check.charge(GI)
    assert check.refusal(GI) == (
        f"exceeded quota: gpu, requested: {KEY}=1Gi, used: {KEY}=4Gi, limited: {KEY}=4Gi"
    )
    assert check.refused


def test_every_quota_binds_and_the_first_by_name_is_named() -> None:
    quotas = [
        _quota("wide", {KEY: "100Gi"}, {KEY: "0"}),
        # The bare key binds replicas too; the API server charges no pod to it.
        _quota("narrow", {"tritonshare.io/gpu-mem": "3G", KEY: "2Gi"}, {KEY: "0"}),
    ]
    check = QuotaCheck(limits_from_api(quotas, Keys()), charged=0)
    assert check.refusal(3_100_000_000) == (
        "exceeded quota: narrow, requested:"
        f" {KEY}=3100M,tritonshare.io/gpu-mem=3100M,"
        f" used: {KEY}=0,tritonshare.io/gpu-mem=0,"
        f" limited: {KEY}=2Gi,tritonshare.io/gpu-mem=3G"
    )
    assert check.refusal(1536 << 20) == ""


def test_a_quota_not_yet_counted_refuses_and_another_prefix_is_not_ours() -> None:
    unknown = QuotaCheck(limits_from_api([_quota("new", {KEY: "4Gi"})], Keys()), charged=0)
    assert unknown.refusal(GI) == f"status unknown for quota: new, resources: {KEY}"
    other = limits_from_api([_quota("q", {KEY: "1Gi"}, {KEY: "0"})], Keys("seldon.io/trtis-"))
    assert other == []


def test_a_quota_scoped_to_what_no_replica_is_does_not_bind_it() -> None:
    hard, used = {KEY: "0"}, {KEY: "0"}
    scoped = [
        {**_quota("jobs", hard, used), "spec": {"hard": hard, "scopes": ["Terminating"]}},
        {
            **_quota("idle", hard, used),
            "spec": {
                "hard": hard,
                "scopeSelector": {
                    "matchExpressions": [{"scopeName": "BestEffort", "operator": "Exists"}]
                },
            },
        },
        {**_quota("long", hard, used), "spec": {"hard": hard, "scopes": ["NotTerminating"]}},
    ]
    assert [limit.quota for limit in limits_from_api(scoped, Keys())] == ["long"]


def test_a_priority_class_scope_selects_the_replicas_of_its_classes() -> None:
    hard, used = {KEY: "4Gi"}, {KEY: "1Gi"}

    def scoped(operator: str, *values: str) -> Any:
        expression = {"scopeName": "PriorityClass", "operator": operator, "values": list(values)}
        spec = {"hard": hard, "scopeSelector": {"matchExpressions": [expression]}}
        return {**_quota(operator, hard, used), "spec": spec}

    quotas = [
        scoped("In", "urgent"),
        scoped("NotIn", "urgent"),
        scoped("Exists"),
        scoped("DoesNotExist"),
        {**_quota("listed", hard, used), "spec": {"hard": hard, "scopes": ["PriorityClass"]}},
    ]

    def bound(priority_class: str | None) -> list[str]:
        return sorted({lim.quota for lim in limits_from_api(quotas, Keys(), priority_class)})

    assert bound("urgent") == ["Exists", "In", "listed"]
    assert bound("normal") == ["Exists", "NotIn", "listed"]
    assert bound("") == ["NotIn"]
    assert bound(None) == sorted(q["metadata"]["name"] for q in quotas), "unknown: fail closed"
    # A scoped quota's use counts only the replicas it selects.
    check = QuotaCheck(limits_from_api(quotas[:1], Keys(), "urgent"), 3 * GI, {"In": GI})
    assert check.refusal(2 * GI) == ""
    check.charge(2 * GI)
    assert check.refusal(GI).startswith("exceeded quota: In, requested: ")


async def test_a_namespace_quota_binds_its_replicas_until_it_is_raised(
    binder: Binder,  # noqa: F811 (the fixtures imported above)
    custom: Any,  # noqa: F811
    core: Any,
    apiserver: RunningApiServer,  # noqa: F811
) -> None:
    core.create_namespaced_resource_quota("default", _quota("gpu", {KEY: "4Gi"}))
    # Another namespace's replicas use none of this namespace's quota.
    core.create_namespace({"metadata": {"name": "team-b"}})
    custom.create_namespaced_custom_object(GROUP, VERSION, "team-b", PLURAL, model("big", 2))

    def other_placed() -> bool:
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, "team-b", PLURAL, "big")
        return bool((obj.get("status") or {}).get("replicas") == 2)

    await eventually(other_placed, what="team-b's replicas placed")
    limits = {"tritonshare.io/gpu-mem": "1Gi"}
    core.create_namespaced_pod(
        "default",
        {
            "metadata": {"name": "model-pod"},
            "spec": {"containers": [{"name": "m", "image": "x", "resources": {"limits": limits}}]},
        },
    )

    def pod_counted() -> bool:
        # The binder decides on the quota's status as its watch has shown it, as
        # kube-scheduler does: the model comes once the pod's 1Gi is in that view.
        quota = binder.ledger.quotas.get("default", {}).get("gpu") or {}
        return bool(((quota.get("status") or {}).get("used") or {}).get(KEY) == "1Gi")

    await eventually(pod_counted, what="the pod counted in the binder's view of the quota")
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("resnet", 3))

    def refused() -> dict[str, Any] | None:
        status = read(custom, "resnet").get("status") or {}
        conditions = [c for c in status.get("conditions") or [] if c["type"] == "Placed"]
        return conditions[0] if conditions and conditions[0]["status"] == "False" else None

    condition = await eventually(refused, what="Placed=False")
    assert condition["reason"] == "ExceededQuota"
    assert condition["message"] == (
        f'tritonmodel "resnet" replica 1: exceeded quota: gpu, requested: {KEY}=2Gi,'
        f" used: {KEY}=3Gi, limited: {KEY}=4Gi"
    )
    status = read(custom, "resnet")["status"]
    assert [p["replica"] for p in status["placements"]] == [0]

    def events() -> list[Any]:
        found = core.list_namespaced_event("default", field_selector="involvedObject.name=resnet")
        return [e for e in found.items if e.reason == "FailedScheduling"]

    [event] = await eventually(events, what="the FailedScheduling event")
    assert (event.type, event.message) == ("Warning", condition["message"])

    core.patch_namespaced_resource_quota("gpu", "default", {"spec": {"hard": {KEY: "7Gi"}}})
    obj = await eventually(lambda: placed(custom, "resnet", 3), what="3 replicas placed")
    [condition] = [c for c in obj["status"]["conditions"] if c["type"] == "Placed"]
    assert (condition["status"], condition["reason"]) == ("True", "AllReplicasPlaced")

    # Every call the binder made here is one deploy/'s RBAC grants it, the quotas' watch too.
    grants = grants_for("tritonshare-binder", render(require_executable("kubectl"), "base"))
    calls = [r for r in apiserver.audit if r.user_agent.startswith("tritonshare-binder/")]
    assert not sorted({describe(c) for c in calls if not any(g.allows(c) for g in grants)})
    reads = [c for c in calls if c.resource == "resourcequotas"]
    assert {(c.verb, c.namespace or "") for c in reads} == {("list", ""), ("watch", "")}


async def test_a_host_past_a_pod_quota_is_reported_to_its_models_until_it_fits(
    binder: Binder,  # noqa: F811 (the fixtures imported above)
    custom: Any,  # noqa: F811
    core: Any,
) -> None:
    core.create_namespaced_resource_quota("default", _quota("count", {"pods": "1"}))
    core.create_namespaced_pod(
        "default",
        {"metadata": {"name": "other"}, "spec": {"containers": [{"name": "m", "image": "x"}]}},
    )
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("resnet", 1))
    obj = await eventually(lambda: placed(custom, "resnet", 1), what="the replica placed")
    node = obj["status"]["placements"][0]["node"]

    def events() -> list[Any]:
        found = core.list_namespaced_event("default", field_selector="involvedObject.name=resnet")
        return [e for e in found.items if e.reason == "FailedCreate"]

    [event] = await eventually(events, what="the FailedCreate event")
    name = host_name(node)
    assert (event.type, event.message) == (
        "Warning",
        f'the binder cannot create model host {name} on node {node}: pods "{name}" is'
        " forbidden: exceeded quota: count, requested: pods=1, used: pods=1, limited: pods=1",
    )
    assert not hosts(core)

    core.patch_namespaced_resource_quota("count", "default", {"spec": {"hard": {"pods": "2"}}})
    await eventually(lambda: node in hosts(core), what="the host once the quota allows it")
    assert len(events()) == 1, "one Event per refusal, not one per retry"


def _exceeded(used: str, requested: str = "7Gi", limited: str = "7Gi", name: str = "gpu") -> str:
    return (
        f"exceeded quota: {name}, requested: {KEY}={requested}, used: {KEY}={used},"
        f" limited: {KEY}={limited}"
    )


async def test_a_pod_after_replicas_past_the_quota_stays_pending_until_they_leave(
    binder: Binder,  # noqa: F811 (the fixtures imported above)
    custom: Any,  # noqa: F811
    core: Any,
    kubeconfig: Path,
) -> None:
    core.create_namespaced_resource_quota("default", _quota("gpu", {KEY: "7Gi"}))
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("m", 1, "7Gi"))
    await eventually(lambda: placed(custom, "m", 1), what="the replica placed")
    # The API server counts pods only: it admits the pod.
    add_pod(core, "p", mem="7Gi")

    condition = await eventually(lambda: scheduled_condition(core, "p"), what="PodScheduled")
    assert (condition.status, condition.message) == ("False", _exceeded("7Gi"))
    assert failure(core, "p") == _exceeded("7Gi")
    assert not node_of(core, "p")
    # The namespace's use, pods (as the quota counts them: admitted) and replicas together.
    code, text = run_cli(kubeconfig, "quota", "default")
    assert code == 0
    assert text.split("\n")[1].split() == [
        "default",
        "gpu",
        KEY,
        *["7Gi", "7Gi", "7Gi", "14Gi", "0", "0"],
    ]
    code, text = run_cli(kubeconfig, "quota", "-o", "json")
    assert json.loads(text)["quotas"] == [
        {
            "namespace": "default",
            "quota": "gpu",
            "key": KEY,
            "hard": 7 * GI,
            "pods": 7 * GI,
            "replicas": 7 * GI,
            "used": 14 * GI,
            "allowance": 0,
        }
    ]

    custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "m")
    await eventually(lambda: node_of(core, "p"), what="the pod placed once the replica left")


async def test_replicas_after_a_pod_are_refused_past_the_quota(
    binder: Binder,  # noqa: F811 (the fixtures imported above)
    custom: Any,  # noqa: F811
    core: Any,
) -> None:
    core.create_namespaced_resource_quota("default", _quota("gpu", {KEY: "7Gi"}))
    add_pod(core, "p", mem="7Gi")
    await eventually(lambda: node_of(core, "p"), what="the pod placed")
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("m", 1, "7Gi"))

    def refused() -> dict[str, Any] | None:
        conditions = (read(custom, "m").get("status") or {}).get("conditions") or []
        return next(
            (c for c in conditions if c["type"] == "Placed" and c["status"] == "False"), None
        )

    condition = await eventually(refused, what="Placed=False")
    assert condition["reason"] == "ExceededQuota"
    assert condition["message"] == f'tritonmodel "m" replica 0: {_exceeded("7Gi")}'


async def test_pods_and_replicas_raced_together_never_pass_the_quota(
    binder: Binder,  # noqa: F811 (the fixtures imported above)
    custom: Any,  # noqa: F811
    core: Any,
) -> None:
    """Pods and replicas, 2Gi each, created at once under an 8Gi quota that admits every pod (it
    counts pods only), while the binder has just read the quota for a replica: it places 8Gi of
    them, whatever comes first."""
    core.create_namespaced_resource_quota("default", _quota("gpu", {KEY: "8Gi"}))
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("a", 1, "2Gi"))
    await eventually(lambda: placed(custom, "a", 1), what="the first replica placed")
    pods = [f"p{i}" for i in range(3)]
    for pod in pods:
        add_pod(core, pod, mem="2Gi")
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, model("m", 3, "2Gi"))

    def settled() -> tuple[dict[str, str], int] | None:
        replicas = 1 + len((read(custom, "m").get("status") or {}).get("placements") or [])
        placed_pods = bound(core, pods)
        refused = [p for p in pods if p not in placed_pods and failure(core, p)]
        if len(placed_pods) + len(refused) == 3 and replicas + len(placed_pods) >= 4:
            return placed_pods, replicas
        return None

    placed_pods, replicas = await eventually(settled, what="every pod and replica decided")
    assert 2 * (len(placed_pods) + replicas) == 8, "the namespace holds exactly its 8Gi"
    for pod in pods:
        if pod not in placed_pods:
            assert failure(core, pod) == _exceeded("8Gi", "2Gi", "8Gi")
    # Nothing placed later takes it past, whatever the retries.
    await asyncio.sleep(1.5)
    replicas = 1 + len(read(custom, "m")["status"].get("placements") or [])
    assert 2 * (len(bound(core, pods)) + replicas) == 8


def test_a_limits_key_binds_the_pods_the_binder_placed_and_the_replicas() -> None:
    limits_key = "limits.tritonshare.io/gpu-mem"
    quota = _quota("gpu", {limits_key: "4Gi"}, {})  # the API server counts no pod to it
    [limit] = limits_from_api([quota], Keys())
    assert (limit.key, limit.used) == (limits_key, 0)
    check = QuotaCheck([limit], charged=GI, pods_placed=2 * GI)
    assert check.refusal(GI) == ""
    assert check.refusal(2 * GI) == (
        f"exceeded quota: gpu, requested: {limits_key}=2Gi, used: {limits_key}=3Gi,"
        f" limited: {limits_key}=4Gi"
    )


def test_a_pod_is_not_counted_twice_and_a_stale_status_hides_no_placed_pod() -> None:
    # The pod (2Gi) is in status.used already: used 3Gi means 1Gi of other pods.
    check = QuotaCheck(limits_from_api([_quota("gpu", {KEY: "4Gi"}, {KEY: "3Gi"})], Keys()), 0)
    check.pod = 2 * GI
    assert check.refusal(2 * GI) == ""
    # A status not updated yet (0) hides none of the 3Gi of pods the binder placed.
    stale = QuotaCheck(limits_from_api([_quota("gpu", {KEY: "4Gi"}, {KEY: "0"})], Keys()), 0)
    stale.pod, stale.pods_placed = 2 * GI, 3 * GI
    assert stale.refusal(2 * GI).startswith(f"exceeded quota: gpu, requested: {KEY}=2Gi")
