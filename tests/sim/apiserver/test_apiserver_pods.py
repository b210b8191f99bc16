"""Pod binding and graceful deletion, as a scheduler and a kubelet see them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from sim.apiserver import RunningApiServer
from tests.fixtures_sim import coordination_v1, core_v1, new_watch, status_of


def _pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "tritonshare",
            "containers": [{"name": "main", "image": "busybox"}],
            **spec,
        },
    }


def _bind(v1: Any, name: str, node: str, **meta: Any) -> tuple[int, dict[str, Any]]:
    """Post a Binding; the raw answer (the real API answers a Status, not a Binding)."""
    body = client.V1Binding(
        metadata=client.V1ObjectMeta(name=name, **meta),
        target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
    )
    try:
        response = v1.create_namespaced_pod_binding(name, "default", body, _preload_content=False)
        return response.status, json.loads(response.data)
    except client.ApiException as e:
        return e.status, status_of(e)


def test_binding_assigns_node_sets_pod_scheduled_and_copies_annotations(
    kube_api: client.ApiClient,
) -> None:
    v1 = core_v1(kube_api)
    v1.create_namespaced_pod("default", _pod("p"))
    code, body = _bind(v1, "p", "gpu-1", annotations={"tritonshare.io/gpu": "GPU-1234"})
    assert code == 201
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": 201,
    }
    pod = v1.read_namespaced_pod("p", "default")
    assert pod.spec.node_name == "gpu-1"
    assert pod.metadata.annotations == {"tritonshare.io/gpu": "GPU-1234"}
    scheduled = [c for c in pod.status.conditions if c.type == "PodScheduled"]
    assert len(scheduled) == 1 and scheduled[0].status == "True"
    assert scheduled[0].last_transition_time is not None


def test_binding_twice_is_409_and_keeps_the_first_node(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    v1.create_namespaced_pod("default", _pod("p"))
    assert _bind(v1, "p", "gpu-1")[0] == 201
    code, body = _bind(v1, "p", "gpu-2")
    assert code == 409
    assert body["reason"] == "Conflict"
    assert body["message"] == (
        'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node'
        ' "gpu-1"'
    )
    assert v1.read_namespaced_pod("p", "default").spec.node_name == "gpu-1"


def test_binding_errors(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    code, body = _bind(v1, "ghost", "gpu-1")
    assert (code, body["reason"], body["message"]) == (404, "NotFound", 'pods "ghost" not found')
    pod = v1.create_namespaced_pod("default", _pod("p"))
    code, body = _bind(v1, "p", "gpu-1", uid="not-the-uid")
    assert code == 409 and "Precondition failed: UID in precondition" in body["message"]
    code, body = _bind(v1, "p", "gpu-1", resource_version="1")
    assert code == 409 and "Precondition failed: ResourceVersion" in body["message"]
    code, _ = _bind(v1, "p", "gpu-1", uid=pod.metadata.uid)
    assert code == 201
    gated = {**_pod("gated"), "spec": {**_pod("x")["spec"], "schedulingGates": [{"name": "g"}]}}
    v1.create_namespaced_pod("default", gated)
    code, body = _bind(v1, "gated", "gpu-1")
    assert code == 409 and "non-empty .spec.schedulingGates" in body["message"]


def test_legacy_bindings_collection_binds_too(apiserver: RunningApiServer) -> None:
    with apiserver.api_client() as api:
        v1 = core_v1(api)
        v1.create_namespaced_pod("default", _pod("p"))
        body = {"metadata": {"name": "p"}, "target": {"kind": "Node", "name": "gpu-9"}}
        response = v1.create_namespaced_binding("default", body, _preload_content=False)
        assert response.status == 201
        assert v1.read_namespaced_pod("p", "default").spec.node_name == "gpu-9"


def test_unbound_pod_is_deleted_at_once(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    v1.create_namespaced_pod("default", _pod("p"))
    deleted = v1.delete_namespaced_pod("p", "default")
    assert deleted.metadata.name == "p"
    assert v1.list_namespaced_pod("default").items == []


def test_graceful_deletion_of_a_bound_pod(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    v1.create_namespaced_pod("default", _pod("p", terminationGracePeriodSeconds=20))
    _bind(v1, "p", "gpu-1")
    start = v1.list_namespaced_pod("default").metadata.resource_version
    terminating = v1.delete_namespaced_pod("p", "default")
    assert terminating.metadata.deletion_timestamp is not None
    assert terminating.metadata.deletion_grace_period_seconds == 20
    # The pod stays until the kubelet confirms with a zero grace period.
    still = v1.read_namespaced_pod("p", "default")
    assert still.metadata.deletion_timestamp == terminating.metadata.deletion_timestamp
    # A later delete with a longer grace period changes nothing; a shorter one shortens it.
    again = v1.delete_namespaced_pod("p", "default", grace_period_seconds=60)
    assert again.metadata.resource_version == terminating.metadata.resource_version
    shorter = v1.delete_namespaced_pod("p", "default", grace_period_seconds=5)
    assert shorter.metadata.deletion_grace_period_seconds == 5
    v1.delete_namespaced_pod("p", "default", grace_period_seconds=0)
    assert v1.list_namespaced_pod("default").items == []
    events = [
        (e["type"], e["object"].metadata.deletion_grace_period_seconds)
        for e in new_watch().stream(
            v1.list_namespaced_pod, "default", resource_version=start, timeout_seconds=1
        )
    ]
    assert events == [("MODIFIED", 20), ("MODIFIED", 5), ("DELETED", 5)]


def test_binding_a_terminating_pod_is_409(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    v1.create_namespaced_pod(
        "default", {**_pod("p"), "metadata": {"name": "p", "finalizers": ["example.com/hold"]}}
    )
    v1.delete_namespaced_pod("p", "default")
    code, body = _bind(v1, "p", "gpu-1")
    assert code == 409 and "is being deleted" in body["message"]


def test_finalizers_hold_deletion_until_removed(kube_api: client.ApiClient) -> None:
    coord = coordination_v1(kube_api)
    ns = "default"
    coord.create_namespaced_lease(
        ns, {"metadata": {"name": "l", "finalizers": ["example.com/keep"]}, "spec": {}}
    )
    coord.delete_namespaced_lease("l", ns)
    held = coord.read_namespaced_lease("l", ns)
    assert held.metadata.deletion_timestamp is not None
    coord.patch_namespaced_lease("l", ns, [{"op": "remove", "path": "/metadata/finalizers"}])
    with pytest.raises(client.ApiException) as raised:
        coord.read_namespaced_lease("l", ns)
    assert raised.value.status == 404


def test_delete_preconditions(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    v1.create_node({"metadata": {"name": "n1"}})
    with pytest.raises(client.ApiException) as raised:
        v1.delete_node(
            "n1", body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="other"))
        )
    assert raised.value.status == 409
    assert "Precondition failed" in status_of(raised.value)["message"]
    assert v1.read_node("n1").metadata.name == "n1"
    with pytest.raises(client.ApiException) as raised:
        v1.delete_node("n-missing")
    assert raised.value.status == 404


def test_pod_status_update_keeps_spec(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    v1.create_namespaced_pod("default", _pod("p"))
    _bind(v1, "p", "gpu-1")
    pod = v1.read_namespaced_pod("p", "default")
    pod.status.phase = "Running"
    pod.spec.node_name = "elsewhere"
    after = v1.replace_namespaced_pod_status("p", "default", pod)
    assert after.status.phase == "Running"
    assert after.spec.node_name == "gpu-1"
    found = v1.list_namespaced_pod("default", field_selector="status.phase=Running")
    assert [p.metadata.name for p in found.items] == ["p"]


def test_delete_collection_deletes_each_selected_pod_as_a_single_delete_would(
    kube_api: client.ApiClient,
) -> None:
    v1 = core_v1(kube_api)
    for name, app in (("a", "x"), ("b", "x"), ("c", "y")):
        v1.create_namespaced_pod(
            "default", {**_pod(name), "metadata": {"name": name, "labels": {"app": app}}}
        )
    _bind(v1, "b", "gpu-1")
    response = v1.delete_collection_namespaced_pod(
        "default", label_selector="app=x", _preload_content=False
    )
    deleted = json.loads(response.data)
    assert deleted["kind"] == "PodList"
    assert [p["metadata"]["name"] for p in deleted["items"]] == ["a", "b"]
    left = {
        p.metadata.name: p.metadata.deletion_timestamp
        for p in v1.list_namespaced_pod("default").items
    }
    # The bound pod is terminating gracefully; the unbound one is gone; the other app untouched.
    assert set(left) == {"b", "c"}
    assert left["b"] is not None and left["c"] is None


def test_ephemeral_containers_come_only_through_their_subresource(
    kube_api: client.ApiClient,
) -> None:
    """As kubectl debug adds them: not on create, not by a pod update, only added (never changed)
    through pods/ephemeralcontainers, which changes nothing else of the pod."""
    v1 = core_v1(kube_api)
    debug = {"name": "debug", "image": "busybox"}
    with pytest.raises(client.ApiException) as raised:
        v1.create_namespaced_pod("default", _pod("p", ephemeralContainers=[debug]))
    assert raised.value.status == 422
    assert "spec.ephemeralContainers: Forbidden: cannot be set on create" in str(
        status_of(raised.value)["message"]
    )
    v1.create_namespaced_pod("default", _pod("p"))
    added = {"metadata": {"labels": {"x": "y"}}, "spec": {"ephemeralContainers": [debug]}}
    v1.patch_namespaced_pod_ephemeralcontainers("p", "default", added)
    pod = v1.read_namespaced_pod("p", "default")
    assert [c.name for c in pod.spec.ephemeral_containers] == ["debug"]
    assert not pod.metadata.labels, "the subresource changes the ephemeral containers only"
    changed = {"spec": {"ephemeralContainers": [{**debug, "image": "alpine"}]}}
    with pytest.raises(client.ApiException) as raised:
        v1.patch_namespaced_pod_ephemeralcontainers("p", "default", changed)
    assert "existing ephemeral containers may not be changed" in status_of(raised.value)["message"]
    clash = {"spec": {"ephemeralContainers": [debug, {"name": "main", "image": "busybox"}]}}
    with pytest.raises(client.ApiException) as raised:
        v1.patch_namespaced_pod_ephemeralcontainers("p", "default", clash)
    assert 'spec.ephemeralContainers[1].name: Duplicate value: "main"' in str(
        status_of(raised.value)["message"]
    )
    more = {"spec": {"ephemeralContainers": [debug, {"name": "more", "image": "busybox"}]}}
    with pytest.raises(client.ApiException):
        v1.patch_namespaced_pod("p", "default", more)
