"""CRUD of every stored kind through the official client, with the real API's Status shapes."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from kubernetes import client

from sim.apiserver import RunningApiServer
from tests.fixtures_sim import apps_v1, coordination_v1, core_v1, status_of


def _pod(name: str = "", generate: str = "", **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name} if name else {"generateName": generate}
    return {
        "metadata": meta,
        "spec": {"containers": [{"name": "main", "image": "busybox"}], **spec},
    }


def _error(raised: pytest.ExceptionInfo[client.ApiException]) -> dict[str, Any]:
    body: dict[str, Any] = status_of(raised.value)
    return body


def test_default_namespaces_exist(kube_api: client.ApiClient) -> None:
    names = {n.metadata.name for n in core_v1(kube_api).list_namespace().items}
    assert {"default", "kube-system", "tritonshare-system"} <= names


def test_kubeconfig_file_works_with_load_kube_config(
    apiserver: RunningApiServer, kubeconfig: Path
) -> None:
    configuration = client.Configuration()
    kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig), client_configuration=configuration
    )
    assert configuration.host == apiserver.url
    with client.ApiClient(configuration) as api:
        namespace = core_v1(api).read_namespace("default")
    assert namespace.status.phase == "Active"


def test_pod_create_sets_identity_and_defaults(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    first = v1.create_namespaced_pod("default", _pod(generate="model-"))
    second = v1.create_namespaced_pod("default", _pod(generate="model-"))
    assert re.fullmatch(r"model-[a-z0-9]{5}", first.metadata.name)
    assert first.metadata.name != second.metadata.name
    assert first.metadata.uid and first.metadata.uid != second.metadata.uid
    assert first.metadata.creation_timestamp is not None
    assert first.metadata.namespace == "default"
    assert int(second.metadata.resource_version) > int(first.metadata.resource_version)
    assert first.status.phase == "Pending"
    assert first.spec.scheduler_name == "default-scheduler"
    assert first.spec.termination_grace_period_seconds == 30
    got = v1.read_namespaced_pod(first.metadata.name, "default")
    assert got.metadata.uid == first.metadata.uid


def test_create_twice_is_409_already_exists(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    v1.create_namespaced_pod("default", _pod("p1"))
    with pytest.raises(client.ApiException) as raised:
        v1.create_namespaced_pod("default", _pod("p1"))
    assert raised.value.status == 409
    assert _error(raised) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "p1" already exists',
        "reason": "AlreadyExists",
        "details": {"name": "p1", "kind": "pods"},
        "code": 409,
    }


def test_missing_object_is_404_not_found_with_group(kube_api: client.ApiClient) -> None:
    with pytest.raises(client.ApiException) as raised:
        coordination_v1(kube_api).read_namespaced_lease("nope", "default")
    assert raised.value.status == 404
    body = _error(raised)
    assert body["reason"] == "NotFound"
    assert body["message"] == 'leases.coordination.k8s.io "nope" not found'
    assert body["details"] == {"name": "nope", "group": "coordination.k8s.io", "kind": "leases"}


def test_create_in_missing_namespace_is_404(kube_api: client.ApiClient) -> None:
    with pytest.raises(client.ApiException) as raised:
        core_v1(kube_api).create_namespaced_pod("ghost", _pod("p"))
    assert raised.value.status == 404
    assert _error(raised)["message"] == 'namespaces "ghost" not found'


def test_invalid_objects_are_422_with_field_causes(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    with pytest.raises(client.ApiException) as raised:
        v1.create_namespaced_pod("default", _pod("Bad_Name"))
    body = _error(raised)
    assert raised.value.status == 422 and body["reason"] == "Invalid"
    assert body["details"]["causes"][0]["field"] == "metadata.name"
    with pytest.raises(client.ApiException) as raised:
        v1.create_namespaced_pod(
            "default", {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}
        )
    assert raised.value.status == 422
    assert "spec.containers[0].image: Required value" in _error(raised)["message"]
    with pytest.raises(client.ApiException) as raised:
        v1.create_namespaced_pod("default", {"metadata": {}, "spec": _pod()["spec"]})
    assert "name or generateName is required" in _error(raised)["message"]


def test_update_with_stale_resource_version_is_409_conflict(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    node = v1.create_node({"metadata": {"name": "n1"}})
    node.metadata.labels = {"zone": "a"}
    updated = v1.replace_node("n1", node)
    assert updated.metadata.labels == {"zone": "a"}
    assert int(updated.metadata.resource_version) > int(node.metadata.resource_version)
    node.metadata.labels = {"zone": "b"}
    with pytest.raises(client.ApiException) as raised:
        v1.replace_node("n1", node)
    body = _error(raised)
    assert raised.value.status == 409 and body["reason"] == "Conflict"
    assert body["message"] == (
        'Operation cannot be fulfilled on nodes "n1": the object has been modified; please apply'
        " your changes to the latest version and try again"
    )
    assert v1.read_node("n1").metadata.labels == {"zone": "a"}


def test_lease_lifecycle_and_create_on_update(kube_api: client.ApiClient) -> None:
    coord = coordination_v1(kube_api)
    ns = "tritonshare-system"
    lease = client.V1Lease(
        metadata=client.V1ObjectMeta(name="tritonshare-agent-n1"),
        spec=client.V1LeaseSpec(holder_identity="n1", lease_duration_seconds=40),
    )
    created = coord.replace_namespaced_lease("tritonshare-agent-n1", ns, lease)
    assert created.spec.holder_identity == "n1"
    created.spec.renew_time = "2030-01-01T00:00:00.000000Z"
    renewed = coord.replace_namespaced_lease("tritonshare-agent-n1", ns, created)
    assert renewed.spec.renew_time is not None
    renewed.metadata.resource_version = None
    with pytest.raises(client.ApiException) as raised:
        coord.replace_namespaced_lease("tritonshare-agent-n1", ns, renewed)
    assert raised.value.status == 422
    assert "must be specified for an update" in _error(raised)["message"]
    names = [item.metadata.name for item in coord.list_namespaced_lease(ns).items]
    assert names == ["tritonshare-agent-n1"]
    status = coord.delete_namespaced_lease("tritonshare-agent-n1", ns)
    assert status["kind"] == "Status" and status["status"] == "Success"
    assert status["details"]["name"] == "tritonshare-agent-n1"
    assert coord.list_namespaced_lease(ns).items == []


def test_node_status_subresource_is_separate_from_spec(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    v1.create_node({"metadata": {"name": "n1"}, "status": {"capacity": {"cpu": "4"}}})
    with_status = v1.patch_node_status(
        "n1", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    )
    assert with_status.status.conditions[0].type == "Ready"
    # A write to the main resource keeps the stored status, as upstream's strategy does.
    node = v1.read_node("n1")
    node.status.conditions = []
    node.spec.unschedulable = True
    replaced = v1.replace_node("n1", node)
    assert replaced.spec.unschedulable is True
    assert [c.type for c in replaced.status.conditions] == ["Ready"]
    # A write to /status keeps the stored spec.
    replaced.spec.unschedulable = False
    replaced.status.conditions[0].status = "False"
    after = v1.replace_node_status("n1", replaced)
    assert after.spec.unschedulable is True
    assert after.status.conditions[0].status == "False"


def test_pod_spec_is_immutable_except_images(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    pod = v1.create_namespaced_pod("default", _pod("p"))
    pod.spec.node_name = "n1"
    with pytest.raises(client.ApiException) as raised:
        v1.replace_namespaced_pod("p", "default", pod)
    assert raised.value.status == 422
    assert "pod updates may not change fields" in _error(raised)["message"]
    pod = v1.read_namespaced_pod("p", "default")
    pod.spec.containers[0].image = "busybox:2"
    assert v1.replace_namespaced_pod("p", "default", pod).spec.containers[0].image == "busybox:2"
    gated = _pod("g", schedulingGates=[{"name": "a"}, {"name": "b"}])
    v1.create_namespaced_pod("default", gated)
    opened = v1.patch_namespaced_pod(
        "g", "default", [{"op": "remove", "path": "/spec/schedulingGates/0"}]
    )
    assert [g.name for g in opened.spec.scheduling_gates] == ["b"]
    with pytest.raises(client.ApiException) as raised:
        v1.patch_namespaced_pod(
            "g",
            "default",
            [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "c"}}],
        )
    assert raised.value.status == 422


def test_events_are_namespaced_and_filterable(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    event = client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name="p."),
        involved_object=client.V1ObjectReference(kind="Pod", name="p", namespace="default"),
        reason="FailedScheduling",
        message="0/3 nodes are available",
        type="Warning",
    )
    created = v1.create_namespaced_event("default", event)
    assert created.metadata.name.startswith("p.")
    found = v1.list_namespaced_event(
        "default", field_selector="involvedObject.name=p,reason=FailedScheduling"
    )
    assert [e.message for e in found.items] == ["0/3 nodes are available"]
    assert v1.list_namespaced_event("kube-system").items == []
    assert v1.list_event_for_all_namespaces().items[0].metadata.name == created.metadata.name


def test_deleting_a_namespace_deletes_its_objects(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    v1.create_namespace({"metadata": {"name": "team-a"}})
    v1.create_namespaced_pod("team-a", _pod("p"))
    v1.delete_namespace("team-a")
    assert v1.list_pod_for_all_namespaces().items == []
    with pytest.raises(client.ApiException) as raised:
        v1.read_namespace("team-a")
    assert raised.value.status == 404


def _raw(url: str, method: str = "GET", body: Any = None) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_raw_http_discovery_and_unknown_resource(apiserver: RunningApiServer) -> None:
    code, body = _raw(f"{apiserver.url}/api/v1")
    assert code == 200
    names = {r["name"] for r in body["resources"]}
    assert {"pods", "pods/binding", "pods/status", "nodes", "events", "namespaces"} <= names
    code, body = _raw(f"{apiserver.url}/apis/coordination.k8s.io/v1")
    assert code == 200 and body["resources"][0]["name"] == "leases"
    code, body = _raw(f"{apiserver.url}/api/v1/widgets")
    assert code == 404 and body["kind"] == "Status" and body["reason"] == "NotFound"
    code, body = _raw(f"{apiserver.url}/api/v1/namespaces/default/pods", "POST", [1, 2])
    assert code == 400 and body["reason"] == "BadRequest"


def test_audit_records_every_request_with_user_agent(
    apiserver: RunningApiServer, kube_api: client.ApiClient
) -> None:
    kube_api.user_agent = "tritonshare-test/1"
    v1 = core_v1(kube_api)
    apiserver.audit.clear()
    v1.create_node({"metadata": {"name": "n1"}})
    v1.patch_node("n1", {"metadata": {"labels": {"a": "b"}}})
    v1.read_node("n1")
    v1.list_node()
    with pytest.raises(client.ApiException):
        v1.read_node("n2")
    records = list(apiserver.audit)
    assert [(r.verb, r.resource, r.name, r.code) for r in records] == [
        ("create", "nodes", "", 201),
        ("patch", "nodes", "n1", 200),
        ("get", "nodes", "n1", 200),
        ("list", "nodes", "", 200),
        ("get", "nodes", "n2", 404),
    ]
    assert {r.user_agent for r in records} == {"tritonshare-test/1"}
    assert [r.verb for r in apiserver.audit.writes("tritonshare-test")] == ["create", "patch"]
    assert [r.verb for r in apiserver.audit[-2:]] == ["list", "get"]
    assert len(apiserver.audit) == 5


def test_system_namespaces_cannot_be_deleted(kube_api: client.ApiClient) -> None:
    with pytest.raises(client.ApiException) as raised:
        core_v1(kube_api).delete_namespace("kube-system")
    assert raised.value.status == 403
    assert status_of(raised.value)["reason"] == "Forbidden"
    assert core_v1(kube_api).read_namespace("kube-system").status.phase == "Active"


def test_dry_run_creates_nothing_and_other_dry_runs_are_refused(
    kube_api: client.ApiClient,
) -> None:
    """A create with dryRun=All is defaulted, validated and admitted, answered with the object,
    and stored nowhere; dry runs of other writes are refused rather than applied."""
    v1 = core_v1(kube_api)
    pod = {
        "metadata": {"generateName": "probe-"},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }
    answered = v1.create_namespaced_pod("default", pod, dry_run="All")
    assert answered.metadata.name.startswith("probe-")
    assert answered.spec.scheduler_name == "default-scheduler"  # defaulted
    assert v1.list_namespaced_pod("default").items == []
    with pytest.raises(client.ApiException) as raised:
        bad = {"metadata": {"name": "Not_A_Name"}, "spec": pod["spec"]}
        v1.create_namespaced_pod("default", bad, dry_run="All")
    assert raised.value.status == 422  # validated as a real create is
    with pytest.raises(client.ApiException) as raised:
        v1.create_node({"metadata": {"name": "n1"}}, dry_run="Bogus")
    assert raised.value.status == 400
    assert status_of(raised.value)["message"] == (
        'dryRun: Unsupported value: "Bogus": supported values: "All"'
    )
    v1.create_node({"metadata": {"name": "n1"}})
    with pytest.raises(client.ApiException) as raised:
        v1.patch_node("n1", {"metadata": {"labels": {"a": "b"}}}, dry_run="All")
    assert raised.value.status == 400
    assert "dryRun is not implemented" in status_of(raised.value)["message"]
    assert v1.read_node("n1").metadata.labels is None


def test_daemonsets_are_stored(kube_api: client.ApiClient) -> None:
    """DaemonSets are stored and listed (no controller acts on them)."""
    labels = {"app": "agent"}
    template = {
        "metadata": {"labels": labels},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }
    body = {
        "metadata": {"name": "agent", "namespace": "kube-system"},
        "spec": {"selector": {"matchLabels": labels}, "template": template},
    }
    apps_v1(kube_api).create_namespaced_daemon_set("kube-system", body)
    listed = apps_v1(kube_api).list_daemon_set_for_all_namespaces().items
    assert [(d.metadata.namespace, d.metadata.name) for d in listed] == [("kube-system", "agent")]
