"""PriorityClasses and the Priority admission plugin through the official client, as
kube-apiserver has them; and graceful pod deletions that no kubelet will finish, finished by the
API server once their grace period is over."""

from __future__ import annotations

import time
from typing import Any

import kubernetes
import pytest

from sim.apiserver import RunningApiServer
from tests.fixtures_sim import core_v1, status_of


def scheduling(api: kubernetes.client.ApiClient) -> Any:
    return kubernetes.client.SchedulingV1Api(api)


def priority_class(name: str, value: int, **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
        **extra,
    }


def pod(name: str, node: str = "", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": [{"name": "c", "image": "i"}], **spec}
    if node:
        body["nodeName"] = node
    return {"metadata": {"name": name}, "spec": body}


def refused(call: Any, *args: Any) -> dict[str, Any]:
    with pytest.raises(kubernetes.client.ApiException) as caught:
        call(*args)
    return status_of(caught.value)


def test_the_built_in_classes_exist(kube_api: kubernetes.client.ApiClient) -> None:
    listed = scheduling(kube_api).list_priority_class().items
    assert {(c.metadata.name, c.value) for c in listed} == {
        ("system-cluster-critical", 2_000_000_000),
        ("system-node-critical", 2_000_001_000),
    }


def test_a_pods_class_sets_its_priority_and_preemption_policy(
    kube_api: kubernetes.client.ApiClient,
) -> None:
    scheduling(kube_api).create_priority_class(
        priority_class("batch", 10, preemptionPolicy="Never")
    )
    created = core_v1(kube_api).create_namespaced_pod(
        "default", pod("a", priorityClassName="batch")
    )
    assert (created.spec.priority, created.spec.preemption_policy) == (10, "Never")
    plain = core_v1(kube_api).create_namespaced_pod("default", pod("b"))
    assert (plain.spec.priority, plain.spec.preemption_policy) == (0, "PreemptLowerPriority")


def test_an_unknown_class_and_a_priority_of_the_pods_own_are_refused(
    kube_api: kubernetes.client.ApiClient,
) -> None:
    core = core_v1(kube_api)
    status = refused(core.create_namespaced_pod, "default", pod("a", priorityClassName="nope"))
    assert (status["code"], status["message"]) == (
        403,
        'pods "a" is forbidden: no PriorityClass with name nope was found',
    )
    status = refused(core.create_namespaced_pod, "default", pod("b", priority=1_000_000))
    assert status["code"] == 403
    assert (
        "the integer value of priority (1000000) must not be provided in pod spec"
        in (status["message"])
    )


def test_the_global_default_applies_to_pods_without_a_class_and_only_one_may_exist(
    kube_api: kubernetes.client.ApiClient,
) -> None:
    classes = scheduling(kube_api)
    classes.create_priority_class(priority_class("normal", 100, globalDefault=True))
    created = core_v1(kube_api).create_namespaced_pod("default", pod("a"))
    assert (created.spec.priority_class_name, created.spec.priority) == ("normal", 100)
    status = refused(classes.create_priority_class, priority_class("other", 5, globalDefault=True))
    assert status["code"] == 422 and "Only one default can exist" in status["message"]


def test_reserved_names_and_values_are_refused(kube_api: kubernetes.client.ApiClient) -> None:
    classes = scheduling(kube_api)
    assert refused(classes.create_priority_class, priority_class("system-mine", 1))["code"] == 422
    status = refused(classes.create_priority_class, priority_class("huge", 1_000_000_001))
    assert status["code"] == 422 and "maximum allowed value" in status["message"]


def wait_gone(core: Any, name: str, within: float = 10.0) -> float:
    started = time.monotonic()
    while any(p.metadata.name == name for p in core.list_namespaced_pod("default").items):
        assert time.monotonic() - started < within, f"pod {name} was never removed"
        time.sleep(0.05)
    return time.monotonic() - started


def test_a_deleted_pod_on_a_node_no_kubelet_reports_is_removed_after_its_grace_period(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient
) -> None:
    core = core_v1(kube_api)
    core.create_node({"metadata": {"name": "bare"}})
    core.create_namespaced_pod("default", pod("a", node="bare"))
    core.delete_namespaced_pod("a", "default", grace_period_seconds=30)
    terminating = core.read_namespaced_pod("a", "default")
    assert terminating.metadata.deletion_timestamp is not None  # graceful, as upstream
    apiserver.clock.advance(31)  # the grace period is over
    wait_gone(core, "a")


def test_a_deleted_pod_on_a_node_whose_kubelet_reports_is_left_to_it(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient
) -> None:
    core = core_v1(kube_api)
    core.create_node({"metadata": {"name": "real"}})
    core.patch_node_status(
        "real", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    )
    core.create_namespaced_pod("default", pod("a", node="real"))
    core.delete_namespaced_pod("a", "default", grace_period_seconds=30)
    apiserver.clock.advance(31)
    # The sweep runs every 0.2 s: after several, the pod is still there for its kubelet.
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert core.read_namespaced_pod("a", "default").metadata.deletion_timestamp
        time.sleep(0.1)
