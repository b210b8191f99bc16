"""The three patch kinds, chosen by Content-Type, and their errors."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from kubernetes import client

from sim.apiserver import RunningApiServer
from tests.fixtures_sim import core_v1, new_watch


def _patch(
    apiserver: RunningApiServer, path: str, content_type: str, body: Any
) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        apiserver.url + path,
        data=json.dumps(body).encode(),
        method="PATCH",
        headers={"Content-Type": content_type},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


NODE = "/api/v1/nodes/n1"
NODE_STATUS = "/api/v1/nodes/n1/status"


@pytest.fixture
def node(kube_api: client.ApiClient) -> Any:
    return core_v1(kube_api).create_node(
        {
            "metadata": {
                "name": "n1",
                "labels": {"zone": "a", "pool": "gpu"},
                "annotations": {"keep": "1", "drop": "2"},
                "finalizers": ["a.example/x"],
            },
            "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]},
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "MemoryPressure", "status": "False"},
                ]
            },
        }
    )


def test_strategic_merge_patch_merges_conditions_by_type(
    apiserver: RunningApiServer, node: Any
) -> None:
    code, body = _patch(
        apiserver,
        NODE_STATUS,
        "application/strategic-merge-patch+json",
        {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Lost"}]}},
    )
    assert code == 200
    assert body["status"]["conditions"] == [
        {"type": "Ready", "status": "False", "reason": "Lost"},
        {"type": "MemoryPressure", "status": "False"},
    ]


def test_strategic_merge_patch_maps_finalizers_and_directives(
    apiserver: RunningApiServer, node: Any
) -> None:
    code, body = _patch(
        apiserver,
        NODE,
        "application/strategic-merge-patch+json",
        {
            "metadata": {
                "labels": {"zone": "b", "pool": None},
                "annotations": {"new": "3", "drop": None},
                "finalizers": ["b.example/y"],
            },
            "spec": {"taints": [{"key": "other", "effect": "NoExecute"}]},
        },
    )
    assert code == 200
    meta = body["metadata"]
    assert meta["labels"] == {"zone": "b"}
    assert meta["annotations"] == {"keep": "1", "new": "3"}
    assert meta["finalizers"] == ["a.example/x", "b.example/y"]
    # Taints have no patch strategy upstream: the list is replaced.
    assert body["spec"]["taints"] == [{"key": "other", "effect": "NoExecute"}]
    code, body = _patch(
        apiserver,
        NODE_STATUS,
        "application/strategic-merge-patch+json",
        {
            "metadata": {"$deleteFromPrimitiveList/finalizers": ["a.example/x"]},
            "status": {"conditions": [{"type": "MemoryPressure", "$patch": "delete"}]},
        },
    )
    assert code == 200
    assert body["metadata"]["finalizers"] == ["b.example/y"]
    assert [c["type"] for c in body["status"]["conditions"]] == ["Ready"]


def test_merge_patch_replaces_lists_and_deletes_nulls(
    apiserver: RunningApiServer, node: Any
) -> None:
    code, body = _patch(
        apiserver,
        NODE_STATUS,
        "application/merge-patch+json",
        {"metadata": {"labels": {"zone": None}}, "status": {"conditions": [{"type": "X"}]}},
    )
    assert code == 200
    assert body["metadata"]["labels"] == {"pool": "gpu"}
    assert body["status"]["conditions"] == [{"type": "X"}]


def test_json_patch_operations_and_failed_test(apiserver: RunningApiServer, node: Any) -> None:
    code, body = _patch(
        apiserver,
        NODE,
        "application/json-patch+json",
        [
            {"op": "test", "path": "/metadata/labels/zone", "value": "a"},
            {"op": "add", "path": "/metadata/labels/tritonshare.io~1gpu", "value": "yes"},
            {"op": "replace", "path": "/metadata/annotations/keep", "value": "2"},
            {"op": "remove", "path": "/metadata/annotations/drop"},
            {"op": "add", "path": "/spec/taints/-", "value": {"key": "k", "effect": "NoSchedule"}},
            {"op": "copy", "from": "/metadata/labels/zone", "path": "/metadata/labels/copy"},
        ],
    )
    assert code == 200
    assert body["metadata"]["labels"] == {
        "zone": "a",
        "pool": "gpu",
        "tritonshare.io/gpu": "yes",
        "copy": "a",
    }
    assert body["metadata"]["annotations"] == {"keep": "2"}
    assert [t["key"] for t in body["spec"]["taints"]] == ["gpu", "k"]
    before = body["metadata"]["resourceVersion"]
    code, body = _patch(
        apiserver,
        NODE,
        "application/json-patch+json",
        [
            {"op": "test", "path": "/metadata/labels/zone", "value": "z"},
            {"op": "add", "path": "/metadata/labels/never", "value": "x"},
        ],
    )
    assert code == 422 and body["reason"] == "Invalid"
    code, body = _patch(apiserver, NODE, "application/json-patch+json", {"op": "add"})
    assert code == 400 and body["reason"] == "BadRequest"
    with apiserver.api_client() as api:
        after = core_v1(api).read_node("n1")
    assert after.metadata.resource_version == before
    assert "never" not in after.metadata.labels


def test_patch_content_type_and_conflicts(apiserver: RunningApiServer, node: Any) -> None:
    code, body = _patch(apiserver, NODE, "application/json", {"metadata": {}})
    assert code == 415 and body["reason"] == "UnsupportedMediaType"
    code, body = _patch(
        apiserver,
        NODE,
        "application/merge-patch+json",
        {"metadata": {"resourceVersion": "1", "labels": {"x": "y"}}},
    )
    assert code == 409 and body["reason"] == "Conflict"
    code, body = _patch(
        apiserver, "/api/v1/nodes/missing", "application/merge-patch+json", {"metadata": {}}
    )
    assert code == 404
    code, body = _patch(
        apiserver,
        NODE,
        "application/merge-patch+json",
        {"metadata": {"resourceVersion": node.metadata.resource_version, "labels": {"x": "y"}}},
    )
    assert code == 200 and body["metadata"]["labels"]["x"] == "y"


def test_official_client_picks_patch_kind_by_body(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    v1.create_namespaced_pod(
        "default",
        {
            "metadata": {"name": "p", "annotations": {"a": "1"}},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        },
    )
    strategic = v1.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"b": "2"}}})
    assert strategic.metadata.annotations == {"a": "1", "b": "2"}
    json_patched = v1.patch_namespaced_pod(
        "p", "default", [{"op": "remove", "path": "/metadata/annotations/a"}]
    )
    assert json_patched.metadata.annotations == {"b": "2"}
    status = v1.patch_namespaced_pod_status(
        "p",
        "default",
        {"status": {"conditions": [{"type": "PodScheduled", "status": "False"}]}},
    )
    assert status.status.conditions[0].status == "False"
    assert status.spec.containers[0].image == "busybox"


def test_a_write_that_changes_nothing_keeps_the_version_and_sends_no_event(
    apiserver: RunningApiServer, node: Any
) -> None:
    version = node.metadata.resource_version
    code, body = _patch(
        apiserver,
        NODE,
        "application/strategic-merge-patch+json",
        {"metadata": {"labels": {"zone": "a"}}},
    )
    assert code == 200 and body["metadata"]["resourceVersion"] == version
    with apiserver.api_client() as api:
        v1 = core_v1(api)
        same = v1.replace_node("n1", v1.read_node("n1"))
        assert same.metadata.resource_version == version
        v1.patch_node("n1", {"metadata": {"labels": {"zone": "b"}}})
        events = [
            (e["type"], e["object"].metadata.labels["zone"])
            for e in new_watch().stream(v1.list_node, resource_version=version, timeout_seconds=1)
        ]
    assert events == [("MODIFIED", "b")]
    # The requests are still audited as writes, as the real audit log records them.
    assert [r.verb for r in apiserver.audit.writes()][-3:] == ["patch", "update", "patch"]
