"""PodDisruptionBudgets and the pod eviction subresource, through the official client: the budget's
status kept as kube's disruption controller keeps it, and evictions answered as kube-apiserver's
EvictionREST answers them (429 when a budget would break, 500 for two budgets)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from typing import Any

import kubernetes
import pytest
from kubernetes import client

from sim.apiserver import RunningApiServer
from tests.fixtures_sim import core_v1, new_watch, status_of

NS = "default"
VIOLATES = "Cannot evict pod as it would violate the pod's disruption budget."


def policy_v1(api: client.ApiClient) -> Any:
    """PolicyV1Api typed as Any (see core_v1)."""
    return kubernetes.client.PolicyV1Api(api)


def make_pod(
    api: client.ApiClient,
    name: str,
    labels: dict[str, str],
    *,
    ready: bool | None,
    owner: str | None = None,
    namespace: str = NS,
) -> Any:
    """A pod on node-1: Running and Ready (True/False), or left Pending (ready None)."""
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if owner is not None:
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": owner}
            | {"controller": True}
        ]
    v1 = core_v1(api)
    v1.create_namespaced_pod(
        namespace,
        {
            "metadata": meta,
            "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "busybox"}]},
        },
    )
    if ready is not None:
        set_ready(api, name, ready, namespace)
    return v1.read_namespaced_pod(name, namespace)


def set_ready(api: client.ApiClient, name: str, ready: bool, namespace: str = NS) -> None:
    core_v1(api).patch_namespaced_pod_status(
        name,
        namespace,
        {
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            }
        },
    )


def make_budget(api: client.ApiClient, name: str, spec: dict[str, Any], namespace: str = NS) -> Any:
    return policy_v1(api).create_namespaced_pod_disruption_budget(
        namespace, {"metadata": {"name": name}, "spec": spec}
    )


def budget_status(api: client.ApiClient, name: str, namespace: str = NS) -> dict[str, Any]:
    """The budget's status as JSON (the client's model renames the fields)."""
    response = policy_v1(api).read_namespaced_pod_disruption_budget(
        name, namespace, _preload_content=False
    )
    status: dict[str, Any] = json.loads(response.data)["status"]
    return status


def evict(api: client.ApiClient, name: str, namespace: str = NS, **extra: Any) -> tuple[int, Any]:
    """POST pods/{name}/eviction; the HTTP code and the Status answered."""
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}} | extra
    try:
        response = core_v1(api).create_namespaced_pod_eviction(
            name, namespace, body, _preload_content=False
        )
    except client.ApiException as e:
        return e.status, status_of(e)
    return response.status, json.loads(response.data)


def _selector(app: str) -> dict[str, Any]:
    return {"matchLabels": {"app": app}}


# status


def test_budget_status_counts_ready_pods(kube_api: client.ApiClient) -> None:
    created = make_budget(kube_api, "web", {"minAvailable": 1, "selector": _selector("web")})
    assert created.metadata.generation == 1
    assert budget_status(kube_api, "web")["expectedPods"] == 0
    make_pod(kube_api, "web-a", {"app": "web"}, ready=True)
    make_pod(kube_api, "web-b", {"app": "web"}, ready=True)
    make_pod(kube_api, "other", {"app": "other"}, ready=True)
    status = budget_status(kube_api, "web")
    assert {k: status[k] for k in ("currentHealthy", "desiredHealthy", "expectedPods")} == {
        "currentHealthy": 2,
        "desiredHealthy": 1,
        "expectedPods": 2,
    }
    assert status["disruptionsAllowed"] == 1
    assert status["observedGeneration"] == 1
    [condition] = status["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "DisruptionAllowed",
        "True",
        "SufficientPods",
    )
    set_ready(kube_api, "web-b", False)
    status = budget_status(kube_api, "web")
    assert (status["currentHealthy"], status["disruptionsAllowed"]) == (1, 0)
    assert status["conditions"][0]["reason"] == "InsufficientPods"


@pytest.mark.parametrize(
    ("spec", "desired"),
    [
        ({"minAvailable": "50%"}, 2),  # 1.5 rounds up
        ({"minAvailable": "100%"}, 3),
        ({"maxUnavailable": "50%"}, 1),  # 1.5 unavailable rounds up to 2
        ({"maxUnavailable": 1}, 2),
        ({"maxUnavailable": "0%"}, 3),
        ({"minAvailable": 0}, 0),
    ],
)
def test_percentages_and_max_unavailable_round_as_kube(
    kube_api: client.ApiClient, spec: dict[str, Any], desired: int
) -> None:
    owner = str(uuid.uuid4())
    for name in ("p-0", "p-1", "p-2"):
        make_pod(kube_api, name, {"app": "p"}, ready=True, owner=owner)
    make_budget(kube_api, "p", spec | {"selector": _selector("p")})
    status = budget_status(kube_api, "p")
    assert (status["expectedPods"], status["desiredHealthy"]) == (3, desired)
    assert status["disruptionsAllowed"] == 3 - desired


def test_budget_needing_a_scale_fails_safe_without_a_controller(kube_api: client.ApiClient) -> None:
    make_pod(kube_api, "bare", {"app": "bare"}, ready=True)
    make_budget(kube_api, "bare", {"maxUnavailable": 1, "selector": _selector("bare")})
    status = budget_status(kube_api, "bare")
    assert status["disruptionsAllowed"] == 0
    assert status["conditions"][0]["reason"] == "SyncFailed"
    assert 'found no controller ref for pod "bare"' in status["conditions"][0]["message"]
    # The failed sync never caught up with generation 1: kube answers "still being processed".
    body = {"metadata": {"name": "bare"}}
    with pytest.raises(client.ApiException) as raised:
        core_v1(kube_api).create_namespaced_pod_eviction("bare", NS, body)
    answer = status_of(raised.value)
    assert (raised.value.status, answer["message"]) == (429, VIOLATES)
    assert answer["details"]["causes"][0]["message"] == (
        "The disruption budget bare is still being processed by the server."
    )
    headers: Any = raised.value.headers
    assert headers["Retry-After"] == "10"


def test_selector_absent_selects_nothing_empty_selects_all(kube_api: client.ApiClient) -> None:
    make_pod(kube_api, "x", {"app": "x"}, ready=True)
    make_budget(kube_api, "none", {"minAvailable": 1})
    make_budget(kube_api, "all", {"minAvailable": 1, "selector": {}})
    assert budget_status(kube_api, "none")["expectedPods"] == 0
    assert budget_status(kube_api, "all")["expectedPods"] == 1


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"minAvailable": 1, "maxUnavailable": 1}, "minAvailable and maxUnavailable cannot"),
        ({"minAvailable": "150%"}, "must not be greater than 100%"),
        ({"maxUnavailable": "five"}, "must be an integer or percentage (e.g '5%')"),
        ({"minAvailable": -1}, "must be greater than or equal to 0"),
        ({"unhealthyPodEvictionPolicy": "Never"}, 'Unsupported value: "Never"'),
    ],
)
def test_invalid_budget_is_refused_with_kube_message(
    kube_api: client.ApiClient, spec: dict[str, Any], problem: str
) -> None:
    with pytest.raises(client.ApiException) as raised:
        make_budget(kube_api, "bad", spec | {"selector": _selector("a")})
    assert raised.value.status == 422
    assert problem in status_of(raised.value)["message"]


def test_budget_of_wrong_type_does_not_decode(apiserver: RunningApiServer) -> None:
    # The client's own models refuse a boolean here; a raw request shows the server does too.
    body = {"metadata": {"name": "bad"}, "spec": {"minAvailable": True}}
    request = urllib.request.Request(
        f"{apiserver.url}/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=10)
    assert raised.value.code == 400
    assert "minAvailable" in json.loads(raised.value.read())["message"]


def test_spec_change_bumps_generation_and_status_follows(kube_api: client.ApiClient) -> None:
    policy = policy_v1(kube_api)
    make_pod(kube_api, "g-a", {"app": "g"}, ready=True)
    budget = make_budget(kube_api, "g", {"minAvailable": 1, "selector": _selector("g")})
    budget = policy.read_namespaced_pod_disruption_budget("g", NS)
    budget.spec.min_available = 0
    updated = policy.replace_namespaced_pod_disruption_budget("g", NS, budget)
    assert updated.metadata.generation == 2
    status = budget_status(kube_api, "g")
    assert (status["observedGeneration"], status["disruptionsAllowed"]) == (2, 1)
    # A write from a stale copy is a conflict, as for every kind.
    budget.metadata.resource_version = updated.metadata.resource_version
    with pytest.raises(client.ApiException) as raised:
        policy.replace_namespaced_pod_disruption_budget("g", NS, budget)
    assert raised.value.status == 409


def test_budgets_list_by_label_and_watch_sees_status(kube_api: client.ApiClient) -> None:
    policy = policy_v1(kube_api)
    policy.create_namespaced_pod_disruption_budget(
        NS,
        {"metadata": {"name": "w", "labels": {"team": "a"}}, "spec": {"minAvailable": 1}},
    )
    make_budget(kube_api, "other", {"minAvailable": 1})
    listed = policy.list_namespaced_pod_disruption_budget(NS, label_selector="team=a")
    assert [b.metadata.name for b in listed.items] == ["w"]
    by_name = policy.list_pod_disruption_budget_for_all_namespaces(
        field_selector="metadata.name=other"
    )
    assert [b.metadata.name for b in by_name.items] == ["other"]
    with pytest.raises(client.ApiException) as raised:
        policy.list_namespaced_pod_disruption_budget(NS, field_selector="spec.minAvailable=1")
    assert raised.value.status == 400
    start = listed.metadata.resource_version
    policy.patch_namespaced_pod_disruption_budget("w", NS, {"spec": {"selector": _selector("w")}})
    make_pod(kube_api, "w-a", {"app": "w"}, ready=True)
    seen = []
    for event in new_watch().stream(
        policy.list_namespaced_pod_disruption_budget,
        NS,
        label_selector="team=a",
        resource_version=start,
        timeout_seconds=2,
    ):
        seen.append((event["type"], event["object"].status.current_healthy))
        if event["object"].status.current_healthy == 1:
            break
    assert seen[-1] == ("MODIFIED", 1)
    policy.delete_namespaced_pod_disruption_budget("w", NS)
    with pytest.raises(client.ApiException) as raised:
        policy.read_namespaced_pod_disruption_budget("w", NS)
    assert raised.value.status == 404


def test_discovery_serves_budgets_and_eviction(kube_api: client.ApiClient) -> None:
    resources = client.CoreV1Api(kube_api).get_api_resources().resources
    eviction = next(r for r in resources if r.name == "pods/eviction")
    assert (eviction.kind, eviction.group, eviction.version, eviction.verbs) == (
        "Eviction",
        "policy",
        "v1",
        ["create"],
    )
    policy = client.PolicyV1Api(kube_api).get_api_resources().resources
    budget = next(r for r in policy if r.name == "poddisruptionbudgets")
    assert budget.short_names == ["pdb"] and budget.namespaced


# eviction


def test_eviction_refused_while_it_would_break_the_budget(kube_api: client.ApiClient) -> None:
    make_pod(kube_api, "a", {"app": "r"}, ready=True)
    make_pod(kube_api, "b", {"app": "r"}, ready=False)
    make_budget(kube_api, "r", {"minAvailable": 1, "selector": _selector("r")})
    code, answer = evict(kube_api, "a")
    assert code == 429
    assert (answer["reason"], answer["message"]) == ("TooManyRequests", VIOLATES)
    assert answer["details"]["causes"] == [
        {
            "reason": "DisruptionBudget",
            "message": "The disruption budget r needs 1 healthy pods and has 1 currently",
        }
    ]
    pod = core_v1(kube_api).read_namespaced_pod("a", NS)
    assert pod.metadata.deletion_timestamp is None
    assert budget_status(kube_api, "r")["disruptionsAllowed"] == 0


def test_allowed_eviction_deletes_gracefully_and_counts_until_gone(
    kube_api: client.ApiClient,
) -> None:
    v1 = core_v1(kube_api)
    make_pod(kube_api, "a", {"app": "r"}, ready=True)
    make_pod(kube_api, "b", {"app": "r"}, ready=True)
    make_budget(kube_api, "r", {"minAvailable": 1, "selector": _selector("r")})
    code, answer = evict(kube_api, "a")
    assert (code, answer["status"]) == (201, "Success")
    evicted = v1.read_namespaced_pod("a", NS)
    assert evicted.metadata.deletion_timestamp is not None
    assert evicted.metadata.deletion_grace_period_seconds == 30
    target = [c for c in evicted.status.conditions if c.type == "DisruptionTarget"]
    assert [(c.status, c.reason) for c in target] == [("True", "EvictionByEvictionAPI")]
    status = budget_status(kube_api, "r")
    assert (status["currentHealthy"], status["disruptionsAllowed"]) == (1, 0)
    # The terminating pod still counts against the budget: the second eviction waits.
    assert evict(kube_api, "b")[0] == 429
    # The kubelet finishes the first pod and the controller's replacement becomes Ready.
    v1.delete_namespaced_pod("a", NS, grace_period_seconds=0)
    make_pod(kube_api, "c", {"app": "r"}, ready=True)
    assert evict(kube_api, "b")[0] == 201


def test_unready_pod_is_evicted_while_the_budget_is_met(kube_api: client.ApiClient) -> None:
    make_pod(kube_api, "a", {"app": "r"}, ready=True)
    make_pod(kube_api, "sick", {"app": "r"}, ready=False)
    make_budget(kube_api, "r", {"minAvailable": 1, "selector": _selector("r")})
    assert evict(kube_api, "sick")[0] == 201
    # Deleting an unready pod spends nothing: the budget names no disrupted pod.
    assert "disruptedPods" not in budget_status(kube_api, "r")


def test_unready_pod_is_kept_while_the_budget_is_not_met(kube_api: client.ApiClient) -> None:
    make_pod(kube_api, "a", {"app": "r"}, ready=True)
    make_pod(kube_api, "sick", {"app": "r"}, ready=False)
    make_budget(kube_api, "r", {"minAvailable": 2, "selector": _selector("r")})
    assert evict(kube_api, "sick")[0] == 429
    policy = policy_v1(kube_api)
    policy.patch_namespaced_pod_disruption_budget(
        "r", NS, {"spec": {"unhealthyPodEvictionPolicy": "AlwaysAllow"}}
    )
    assert evict(kube_api, "sick")[0] == 201


def test_pending_and_terminating_pods_ignore_budgets(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    make_pod(kube_api, "pending", {"app": "r"}, ready=None)
    make_pod(kube_api, "leaving", {"app": "r"}, ready=True)
    make_budget(kube_api, "r", {"minAvailable": 5, "selector": _selector("r")})
    assert evict(kube_api, "pending")[0] == 201
    v1.delete_namespaced_pod("leaving", NS)
    assert evict(kube_api, "leaving")[0] == 201
    assert v1.read_namespaced_pod("leaving", NS).metadata.deletion_timestamp is not None


def test_pod_under_two_budgets_gets_500(kube_api: client.ApiClient) -> None:
    make_pod(kube_api, "a", {"app": "r", "tier": "x"}, ready=True)
    make_budget(kube_api, "one", {"minAvailable": 0, "selector": _selector("r")})
    make_budget(kube_api, "two", {"minAvailable": 0, "selector": {"matchLabels": {"tier": "x"}}})
    code, answer = evict(kube_api, "a")
    assert code == 500
    assert answer["message"] == (
        "This pod has more than one PodDisruptionBudget, which the eviction subresource does not"
        " support."
    )
    assert core_v1(kube_api).read_namespaced_pod("a", NS).metadata.deletion_timestamp is None


def test_eviction_of_missing_or_misnamed_pod(kube_api: client.ApiClient) -> None:
    code, answer = evict(kube_api, "ghost")
    assert (code, answer["reason"]) == (404, "NotFound")
    make_pod(kube_api, "a", {"app": "r"}, ready=True)
    code, answer = evict(kube_api, "a", metadata={"name": "b"})
    assert (code, answer["message"]) == (400, "name in URL does not match name in Eviction object")


def test_eviction_delete_options_apply(kube_api: client.ApiClient) -> None:
    make_pod(kube_api, "a", {"app": "r"}, ready=True)
    code, answer = evict(kube_api, "a", deleteOptions={"preconditions": {"uid": "not-it"}})
    assert (code, answer["reason"]) == (409, "Conflict")
    assert evict(kube_api, "a", deleteOptions={"gracePeriodSeconds": 5})[0] == 201
    pod = core_v1(kube_api).read_namespaced_pod("a", NS)
    assert pod.metadata.deletion_grace_period_seconds == 5


def test_eviction_is_audited(apiserver: RunningApiServer, kube_api: client.ApiClient) -> None:
    make_pod(kube_api, "a", {"app": "r"}, ready=True)
    evict(kube_api, "a")
    records = [r for r in apiserver.audit.snapshot() if r.subresource == "eviction"]
    assert [(r.verb, r.resource, r.name, r.code) for r in records] == [("create", "pods", "a", 201)]
