"""Deployments and ReplicaSets through the official client against the simulated API server,
rolled by the simulated controller manager (`sim.controllers.manager`). The test plays the
kubelet where a pod's readiness or its termination must be held (`Kubelet` below); the clock is
the API server's, moved forward instead of sleeping."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from functools import partial
from typing import Any, cast

import kubernetes.client
import pytest

from sim.apiserver import RunningApiServer
from sim.controllers.manager import ControllerManager
from sim.controllers.podtemplate import HASH_LABEL, rfc3339
from sim.node.kubelet import HollowKubelet
from sim.processes import wait_until
from tests.deploy.rendering import chart_crds
from tests.fixtures_sim import apps_v1, core_v1, status_of

NS = "default"
Obj = dict[str, Any]


def make_deployment(name: str, replicas: int, node: str, **spec: Any) -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": {"model-uri": "v1"}},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
            },
            **spec,
        },
    }


@pytest.fixture
def hollow(apiserver: RunningApiServer) -> Iterator[None]:
    """Node `auto`, whose pods a hollow kubelet makes Ready at once and removes once deleted."""
    api = apiserver.api_client()
    core_v1(api).create_node({"metadata": {"name": "auto"}})
    with HollowKubelet(api, ["auto"]):
        yield
    api.close()  # type: ignore[no-untyped-call]


class Kubelet:
    """The test's hand on node `held`: pods are Ready only when it says, and stay terminating
    until it removes them."""

    def __init__(self, apiserver: RunningApiServer, core: Any) -> None:
        self.apiserver = apiserver
        self.core = core

    def ready(self, pod: Any) -> None:
        stamp = rfc3339(self.apiserver.clock.now())
        body = {
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": stamp}],
            }
        }
        self.core.patch_namespaced_pod_status(pod.metadata.name, NS, body)

    def remove(self, pod: Any) -> None:
        self.core.delete_namespaced_pod(pod.metadata.name, NS, grace_period_seconds=0)


def pods_of(core: Any, app: str) -> list[Any]:
    return sorted(
        core.list_namespaced_pod(NS, label_selector=f"app={app}").items,
        key=lambda p: p.metadata.creation_timestamp,
    )


def live(pods: list[Any]) -> list[Any]:
    return [p for p in pods if p.metadata.deletion_timestamp is None]


def condition(d: Any, kind: str) -> Any:
    return next((c for c in d.status.conditions or [] if c.type == kind), None)


def test_apps_v1_is_discovered_with_status_and_scale_and_defaults_as_upstream(
    kube_api: kubernetes.client.ApiClient,
) -> None:
    apps = apps_v1(kube_api)
    names = {(r.name, r.kind) for r in apps.get_api_resources().resources}
    assert {("deployments", "Deployment"), ("deployments/scale", "Scale")} <= names
    assert {("replicasets/status", "ReplicaSet"), ("replicasets/scale", "Scale")} <= names
    created = apps.create_namespaced_deployment(NS, make_deployment("web", 2, "none"))
    strategy = created.spec.strategy
    assert (strategy.type, strategy.rolling_update.max_surge) == ("RollingUpdate", "25%")
    assert strategy.rolling_update.max_unavailable == "25%"
    assert (created.spec.revision_history_limit, created.spec.progress_deadline_seconds) == (
        10,
        600,
    )
    assert created.metadata.generation == 1
    scale = apps.patch_namespaced_deployment_scale("web", NS, {"spec": {"replicas": 5}})
    assert (scale.spec.replicas, scale.status.selector) == (5, "app=web")
    again = apps.read_namespaced_deployment("web", NS)
    assert (again.spec.replicas, again.metadata.generation) == (5, 2)


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        (
            {
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "0%"},
                }
            },
            "spec.strategy.rollingUpdate.maxUnavailable",
            "may not be 0 when `maxSurge` is 0",
        ),
        (
            {"strategy": {"type": "Recreate", "rollingUpdate": {"maxSurge": 1}}},
            "spec.strategy.rollingUpdate",
            "may not be specified when strategy `type` is 'Recreate'",
        ),
        (
            {"selector": {"matchLabels": {"app": "other"}}},
            "spec.template.metadata.labels",
            "`selector` does not match template `labels`",
        ),
        (
            {
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": "1", "maxUnavailable": 1},
                }
            },
            "spec.strategy.rollingUpdate.maxSurge",
            "must be an integer or percentage",
        ),
        (
            {"minReadySeconds": 30, "progressDeadlineSeconds": 30},
            "spec.progressDeadlineSeconds",
            "must be greater than minReadySeconds",
        ),
    ],
)
def test_an_invalid_deployment_is_refused_with_upstreams_message(
    kube_api: kubernetes.client.ApiClient, change: Obj, field: str, message: str
) -> None:
    body = make_deployment("web", 1, "none")
    body["spec"].update(change)
    with pytest.raises(kubernetes.client.ApiException) as refused:
        apps_v1(kube_api).create_namespaced_deployment(NS, body)
    assert refused.value.status == 422
    causes = status_of(refused.value)["details"]["causes"]
    assert any(c["field"] == field and message in c["message"] for c in causes), causes


def test_the_selector_of_a_deployment_is_immutable(kube_api: kubernetes.client.ApiClient) -> None:
    apps = apps_v1(kube_api)
    apps.create_namespaced_deployment(NS, make_deployment("web", 1, "none"))
    patch = {
        "spec": {
            "selector": {"matchLabels": {"app": "web", "tier": "x"}},
            "template": {"metadata": {"labels": {"tier": "x"}}},
        }
    }
    with pytest.raises(kubernetes.client.ApiException) as refused:
        apps.patch_namespaced_deployment("web", NS, patch)
    assert refused.value.status == 422
    assert "field is immutable" in status_of(refused.value)["message"]


def test_a_deployment_rolls_to_a_new_template_through_revisions_and_owners(
    kube_api: kubernetes.client.ApiClient, manager: ControllerManager, hollow: None
) -> None:
    apps, core = apps_v1(kube_api), core_v1(kube_api)
    apps.create_namespaced_deployment(NS, make_deployment("web", 3, "auto"))

    def rolled(revision: str) -> Any:
        d = apps.read_namespaced_deployment("web", NS)
        done = condition(d, "Progressing")
        if (
            (d.metadata.annotations or {}).get("deployment.kubernetes.io/revision") == revision
            and d.status.observed_generation == d.metadata.generation
            and (d.status.updated_replicas, d.status.available_replicas) == (3, 3)
            and d.status.replicas == 3
            and done is not None
            and done.reason == "NewReplicaSetAvailable"
        ):
            return d
        return None

    wait_until("revision 1 rolled out", partial(rolled, "1"), 20)
    [first] = apps.list_namespaced_replica_set(NS).items
    digest = first.metadata.labels[HASH_LABEL]
    assert first.metadata.name == f"web-{digest}"
    assert first.metadata.owner_references[0].kind == "Deployment"
    pods = pods_of(core, "web")
    assert len(pods) == 3
    for pod in pods:
        assert pod.metadata.labels[HASH_LABEL] == digest
        [owner] = pod.metadata.owner_references
        assert (owner.kind, owner.name, owner.controller) == (
            "ReplicaSet",
            first.metadata.name,
            True,
        )

    apps.patch_namespaced_deployment(
        "web", NS, {"spec": {"template": {"metadata": {"annotations": {"model-uri": "v2"}}}}}
    )
    wait_until("revision 2 rolled out", partial(rolled, "2"), 20)
    replica_sets = {rs.metadata.name: rs for rs in apps.list_namespaced_replica_set(NS).items}
    assert replica_sets[first.metadata.name].spec.replicas == 0
    [second] = [rs for name, rs in replica_sets.items() if name != first.metadata.name]
    assert second.metadata.annotations["deployment.kubernetes.io/revision"] == "2"
    assert second.metadata.labels[HASH_LABEL] != digest
    wait_until("only revision 2's pods left", lambda: len(pods_of(core, "web")) == 3, 20)
    assert {p.metadata.annotations["model-uri"] for p in pods_of(core, "web")} == {"v2"}


def test_the_default_strategy_on_one_replica_surges_and_never_counts_a_terminating_pod(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient, manager: ControllerManager
) -> None:
    apps, core = apps_v1(kube_api), core_v1(kube_api)
    kubelet = Kubelet(apiserver, core)
    core.create_node({"metadata": {"name": "held"}})
    apps.create_namespaced_deployment(NS, make_deployment("one", 1, "held"))
    [first] = wait_until("the first pod", lambda: pods_of(core, "one") or None, 10)
    kubelet.ready(first)
    wait_until(
        "one available",
        lambda: apps.read_namespaced_deployment("one", NS).status.available_replicas == 1,
        10,
    )
    apps.patch_namespaced_deployment(
        "one", NS, {"spec": {"template": {"metadata": {"annotations": {"model-uri": "v2"}}}}}
    )
    # maxSurge 25% of 1 rounds up to 1, maxUnavailable down to 0: a second pod, the first kept.
    pods = wait_until(
        "the surge pod", lambda: pods_of(core, "one")[1:] and pods_of(core, "one"), 10
    )
    [old] = [p for p in pods if p.metadata.name == first.metadata.name]
    [new] = [p for p in pods if p.metadata.name != first.metadata.name]
    assert old.metadata.deletion_timestamp is None
    manager.resync()
    d = apps.read_namespaced_deployment("one", NS)
    assert (d.status.replicas, d.status.updated_replicas, d.status.available_replicas) == (2, 1, 1)
    assert old.metadata.deletion_timestamp is None

    kubelet.ready(new)
    # The old pod is deleted only once the new one is available; the kubelet holds it
    # terminating, and it is no longer counted anywhere.
    wait_until(
        "the old pod terminating",
        lambda: core.read_namespaced_pod(old.metadata.name, NS).metadata.deletion_timestamp,
        10,
    )

    def settled() -> Any:
        d = apps.read_namespaced_deployment("one", NS)
        s = d.status
        return d if (s.replicas, s.updated_replicas, s.available_replicas) == (1, 1, 1) else None

    d = wait_until("the deployment counts the new pod only", settled, 10)
    assert d.status.ready_replicas == 1
    old_rs = next(rs for rs in apps.list_namespaced_replica_set(NS).items if rs.spec.replicas == 0)
    assert (old_rs.status.replicas, old_rs.status.available_replicas or 0) == (0, 0)
    kubelet.remove(old)
    wait_until("the old pod gone", lambda: len(pods_of(core, "one")) == 1, 10)


def test_min_ready_seconds_holds_availability_until_the_clock_passes_it(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient, manager: ControllerManager
) -> None:
    apps, core = apps_v1(kube_api), core_v1(kube_api)
    kubelet = Kubelet(apiserver, core)
    core.create_node({"metadata": {"name": "held"}})
    apps.create_namespaced_deployment(NS, make_deployment("slow", 1, "held", minReadySeconds=300))
    [pod] = wait_until("the pod", lambda: pods_of(core, "slow") or None, 10)
    kubelet.ready(pod)
    wait_until(
        "ready but not available",
        lambda: apps.read_namespaced_deployment("slow", NS).status.ready_replicas == 1,
        10,
    )
    assert not apps.read_namespaced_deployment("slow", NS).status.available_replicas
    apiserver.clock.advance(301)
    manager.resync()
    wait_until(
        "available after minReadySeconds",
        lambda: apps.read_namespaced_deployment("slow", NS).status.available_replicas == 1,
        10,
    )


def test_a_rollout_without_progress_exceeds_its_progress_deadline(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient, manager: ControllerManager
) -> None:
    apps, core = apps_v1(kube_api), core_v1(kube_api)
    core.create_node({"metadata": {"name": "held"}})
    apps.create_namespaced_deployment(
        NS, make_deployment("stuck", 1, "held", progressDeadlineSeconds=60)
    )
    wait_until("the pod", lambda: pods_of(core, "stuck") or None, 10)
    progressing = wait_until(
        "Progressing",
        lambda: condition(apps.read_namespaced_deployment("stuck", NS), "Progressing"),
        10,
    )
    assert progressing.status == "True"
    manager.resync()
    assert condition(apps.read_namespaced_deployment("stuck", NS), "Progressing").status == "True"
    apiserver.clock.advance(62)
    manager.resync()

    def exceeded() -> Any:
        found = condition(apps.read_namespaced_deployment("stuck", NS), "Progressing")
        return found if found.reason == "ProgressDeadlineExceeded" else None

    found = wait_until("ProgressDeadlineExceeded", exceeded, 10)
    assert found.status == "False" and "has timed out progressing" in found.message


def test_recreate_starts_new_pods_only_once_the_old_ones_are_gone(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient, manager: ControllerManager
) -> None:
    apps, core = apps_v1(kube_api), core_v1(kube_api)
    kubelet = Kubelet(apiserver, core)
    core.create_node({"metadata": {"name": "held"}})
    apps.create_namespaced_deployment(
        NS, make_deployment("re", 2, "held", strategy={"type": "Recreate"})
    )
    pods = wait_until("two pods", lambda: pods_of(core, "re")[1:] and pods_of(core, "re"), 10)
    for pod in pods:
        kubelet.ready(pod)
    apps.patch_namespaced_deployment(
        "re", NS, {"spec": {"template": {"metadata": {"annotations": {"model-uri": "v2"}}}}}
    )
    wait_until("both old pods terminating", lambda: not live(pods_of(core, "re")), 10)
    manager.resync()
    assert len(apps.list_namespaced_replica_set(NS).items) == 1, "no new ReplicaSet yet"
    kubelet.remove(pods[0])
    manager.resync()
    assert len(apps.list_namespaced_replica_set(NS).items) == 1, "one old pod is still there"
    kubelet.remove(pods[1])
    fresh = wait_until(
        "two new pods", lambda: live(pods_of(core, "re"))[1:] and pods_of(core, "re"), 10
    )
    assert {p.metadata.annotations["model-uri"] for p in fresh} == {"v2"}


def test_deleting_a_deployment_collects_its_replica_sets_and_their_pods(
    kube_api: kubernetes.client.ApiClient, manager: ControllerManager, hollow: None
) -> None:
    apps, core = apps_v1(kube_api), core_v1(kube_api)
    apps.create_namespaced_deployment(NS, make_deployment("gone", 2, "auto"))
    wait_until("two pods", lambda: len(pods_of(core, "gone")) == 2, 10)
    # A pod with an owner the manager never saw is not its to collect.
    stray = copy.deepcopy(make_deployment("x", 1, "auto")["spec"]["template"])
    stray["metadata"].update(
        name="stray",
        labels={"app": "gone-stray"},
        ownerReferences=[
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "n",
                "uid": "u",
                "controller": True,
            }
        ],
    )
    core.create_namespaced_pod(NS, stray)
    apps.delete_namespaced_deployment("gone", NS)
    wait_until(
        "its ReplicaSet and pods collected",
        lambda: not apps.list_namespaced_replica_set(NS).items and not pods_of(core, "gone"),
        15,
    )
    assert core.read_namespaced_pod("stray", NS).metadata.deletion_timestamp is None


def test_deleting_a_replica_set_collects_its_pods(
    kube_api: kubernetes.client.ApiClient, manager: ControllerManager, hollow: None
) -> None:
    apps, core = apps_v1(kube_api), core_v1(kube_api)
    body = make_deployment("rs", 3, "auto")
    body["kind"] = "ReplicaSet"
    apps.create_namespaced_replica_set(NS, body)
    wait_until("three pods", lambda: len(pods_of(core, "rs")) == 3, 10)
    # The controller counts the pods in the status on the sync after its cache sees them.
    wait_until(
        "the scale's status counting them",
        lambda: apps.read_namespaced_replica_set_scale("rs", NS).status.replicas == 3,
        10,
    )
    assert apps.read_namespaced_replica_set_scale("rs", NS).spec.replicas == 3
    apps.delete_namespaced_replica_set("rs", NS)
    wait_until("its pods collected", lambda: not pods_of(core, "rs"), 15)


def _budget(kube_api: kubernetes.client.ApiClient, app: str, **spec: Any) -> Any:
    policy = cast(Any, kubernetes.client.PolicyV1Api(kube_api))
    policy.create_namespaced_pod_disruption_budget(
        NS,
        {"metadata": {"name": app}, "spec": {"selector": {"matchLabels": {"app": app}}, **spec}},
    )

    def read() -> tuple[int, int]:
        status = policy.read_namespaced_pod_disruption_budget(app, NS).status
        return int(status.expected_pods or 0), int(status.desired_healthy or 0)

    return read


def test_a_budget_expects_a_replica_sets_scale_not_its_pods(
    kube_api: kubernetes.client.ApiClient, manager: ControllerManager, hollow: None
) -> None:
    apps, core = apps_v1(kube_api), core_v1(kube_api)
    budget = _budget(kube_api, "rs", maxUnavailable=1)
    body = make_deployment("rs", 3, "auto")
    body["kind"] = "ReplicaSet"
    apps.create_namespaced_replica_set(NS, body)
    wait_until("three pods", lambda: len(pods_of(core, "rs")) == 3, 10)
    wait_until("the budget expects 3", lambda: budget() == (3, 2), 10)
    # With no controller to add pods, the scale alone moves the budget: 5 expected, 3 pods.
    manager.stop()
    apps.patch_namespaced_replica_set_scale("rs", NS, {"spec": {"replicas": 5}})
    wait_until("the budget expects 5", lambda: budget() == (5, 4), 10)
    assert len(pods_of(core, "rs")) == 3


def test_pods_the_api_refuses_mark_the_replica_set_and_the_deployment_replica_failure(
    kube_api: kubernetes.client.ApiClient, manager: ControllerManager
) -> None:
    """The manager creates pods through admission: a policy refusing them is the Deployment's
    ReplicaFailure condition, with the API's message, and it is retried, not repeated at once."""
    admission = cast(Any, kubernetes.client.AdmissionregistrationV1Api(kube_api))
    rule = {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["CREATE"],
        "resources": ["pods"],
    }
    admission.create_validating_admission_policy(
        {
            "metadata": {"name": "no-pods"},
            "spec": {
                "matchConstraints": {"resourceRules": [rule]},
                "validations": [{"expression": "false", "message": "pods are closed today"}],
            },
        }
    )
    admission.create_validating_admission_policy_binding(
        {
            "metadata": {"name": "no-pods"},
            "spec": {"policyName": "no-pods", "validationActions": ["Deny"]},
        }
    )
    apps = apps_v1(kube_api)
    apps.create_namespaced_deployment(NS, make_deployment("closed", 3, "none"))

    def failure() -> Any:
        return condition(apps.read_namespaced_deployment("closed", NS), "ReplicaFailure")

    found = wait_until("the Deployment's ReplicaFailure", failure, 10)
    assert (found.status, found.reason) == ("True", "FailedCreate")
    assert "pods are closed today" in found.message
    [rs] = apps.list_namespaced_replica_set(NS).items
    assert any(c.type == "ReplicaFailure" for c in rs.status.conditions)
    assert rs.status.replicas == 0
    # Slow start: one refused create per attempt, not three.
    admission.delete_validating_admission_policy_binding("no-pods")
    wait_until(
        "the pods once the policy is gone",
        lambda: len(pods_of(core_v1(kube_api), "closed")) == 3,
        15,
    )
    wait_until("the condition cleared", lambda: failure() is None, 15)


def test_a_budget_on_a_deployments_pods_expects_the_deployments_replicas(
    kube_api: kubernetes.client.ApiClient, manager: ControllerManager, hollow: None
) -> None:
    apps, core = apps_v1(kube_api), core_v1(kube_api)
    budget = _budget(kube_api, "web", minAvailable="50%")
    apps.create_namespaced_deployment(NS, make_deployment("web", 2, "auto"))
    wait_until("two pods", lambda: len(pods_of(core, "web")) == 2, 10)
    wait_until("2 expected, 1 desired", lambda: budget() == (2, 1), 10)
    # The Deployment's scale, found through its pods' ReplicaSet (whose own spec.replicas is
    # still 2, with no controller running): 6 expected, 50% of 6 is 3.
    manager.stop()
    apps.patch_namespaced_deployment_scale("web", NS, {"spec": {"replicas": 6}})
    wait_until("6 expected, 3 desired", lambda: budget() == (6, 3), 10)
    [rs] = apps.list_namespaced_replica_set(NS).items
    assert rs.spec.replicas == 2 and len(pods_of(core, "web")) == 2


def test_objects_owned_by_custom_resources_go_once_all_their_owners_are_gone(
    kube_api: kubernetes.client.ApiClient, manager: ControllerManager
) -> None:
    """The collector watches every kind a CRD serves from the moment the CRD appears: a pod
    owned by one TritonModel goes with it, a pod owned by two loses its reference to the first
    and goes with the second, and a custom object owned by a pod goes with the pod."""
    (crd,) = chart_crds()
    cast(Any, kubernetes.client.ApiextensionsV1Api(kube_api)).create_custom_resource_definition(crd)
    custom = cast(Any, kubernetes.client.CustomObjectsApi(kube_api))
    core = core_v1(kube_api)
    model = ("tritonshare.io", "v1alpha1", NS, "tritonmodels")

    def create_model(name: str, owners: list[Obj]) -> Obj:
        body = {
            "apiVersion": "tritonshare.io/v1alpha1",
            "kind": "TritonModel",
            "metadata": {"name": name, "ownerReferences": owners},
            "spec": {"storageUri": "s3://models/m", "gpuMemory": "1Gi"},
        }
        created: Obj = custom.create_namespaced_custom_object(*model, body)
        return created

    def reference(obj: Obj, kind: str, api_version: str) -> Obj:
        meta = obj["metadata"]
        return {"apiVersion": api_version, "kind": kind, "name": meta["name"], "uid": meta["uid"]}

    a = create_model("a", [])
    b = create_model("b", [])

    def pod(name: str, owners: list[Obj]) -> Obj:
        body = {
            "metadata": {"name": name, "ownerReferences": owners},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        }
        created: Obj = core.create_namespaced_pod(NS, body).to_dict()
        return created

    ref_a = reference(a, "TritonModel", "tritonshare.io/v1alpha1")
    ref_b = reference(b, "TritonModel", "tritonshare.io/v1alpha1")
    pod("of-a", [ref_a])
    shared = core.create_namespaced_pod(
        NS,
        {
            "metadata": {"name": "of-both", "ownerReferences": [ref_a, ref_b]},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        },
    )
    owned_by_pod = reference(
        {"metadata": {"name": "of-both", "uid": shared.metadata.uid}}, "Pod", "v1"
    )
    create_model("of-the-pod", [owned_by_pod])

    def pods() -> set[str]:
        return {p.metadata.name for p in core.list_namespaced_pod(NS).items}

    def models() -> set[str]:
        return {
            m["metadata"]["name"] for m in custom.list_namespaced_custom_object(*model)["items"]
        }

    kind = "tritonmodels.tritonshare.io"
    wait_until("the models' kind watched", lambda: kind in manager.synced_kinds(), 10)
    custom.delete_namespaced_custom_object(*model, "a")
    wait_until("the pod of a collected", lambda: pods() == {"of-both"}, 15)
    assert models() == {"b", "of-the-pod"}, "a pod with an owner left stays, and what it owns"

    def owners_of_shared() -> list[str]:
        references = core.read_namespaced_pod("of-both", NS).metadata.owner_references or []
        return [r.uid for r in references]

    wait_until("its reference to a dropped", lambda: owners_of_shared() == [ref_b["uid"]], 15)
    custom.delete_namespaced_custom_object(*model, "b")
    wait_until(
        "the shared pod and its model collected", lambda: not pods() and models() == set(), 15
    )
