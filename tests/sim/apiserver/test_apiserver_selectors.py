"""Label and field selectors on lists, and the 400s for bad ones."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest
from kubernetes import client

from sim.apiserver import RunningApiServer
from tests.fixtures_sim import core_v1, status_of


@pytest.fixture
def pods(kube_api: client.ApiClient) -> Any:
    v1 = core_v1(kube_api)
    specs = [
        ("a", {"app": "web", "tier": "front", "rank": "3"}, "tritonshare", "n1"),
        ("b", {"app": "web", "tier": "back", "rank": "10"}, "tritonshare", "n2"),
        ("c", {"app": "db"}, "default-scheduler", "n1"),
        ("d", {}, "tritonshare", ""),
    ]
    for name, labels, scheduler, node in specs:
        v1.create_namespaced_pod(
            "default",
            {
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "schedulerName": scheduler,
                    "containers": [{"name": "main", "image": "busybox"}],
                },
            },
        )
        if node:
            binding = {"metadata": {"name": name}, "target": {"kind": "Node", "name": node}}
            v1.create_namespaced_pod_binding(name, "default", binding, _preload_content=False)
    v1.patch_namespaced_pod_status("a", "default", {"status": {"phase": "Running"}})
    return v1


def _names(v1: Any, labels: str = "", fields: str = "") -> list[str]:
    found = v1.list_pod_for_all_namespaces(label_selector=labels, field_selector=fields)
    return [p.metadata.name for p in found.items]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=web", ["a", "b"]),
        ("app==web,tier=back", ["b"]),
        ("app!=web", ["c", "d"]),
        ("app in (db, web)", ["a", "b", "c"]),
        ("app notin (web)", ["c", "d"]),
        ("tier", ["a", "b"]),
        ("!tier", ["c", "d"]),
        ("rank>5", ["b"]),
        ("rank<5", ["a"]),
        ("app=web,!rank", []),
        ("", ["a", "b", "c", "d"]),
    ],
)
def test_label_selectors(pods: Any, selector: str, expected: list[str]) -> None:
    assert _names(pods, labels=selector) == expected


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("spec.nodeName=n1", ["a", "c"]),
        ("spec.nodeName=", ["d"]),
        ("spec.nodeName!=", ["a", "b", "c"]),
        ("spec.schedulerName=tritonshare,spec.nodeName=n1", ["a"]),
        ("spec.schedulerName==tritonshare,status.phase!=Running", ["b", "d"]),
        ("metadata.name=c", ["c"]),
        ("metadata.namespace=kube-system", []),
        ("status.phase=Running", ["a"]),
    ],
)
def test_field_selectors(pods: Any, selector: str, expected: list[str]) -> None:
    assert _names(pods, fields=selector) == expected


def test_node_scoped_list_in_one_namespace(pods: Any) -> None:
    found = pods.list_namespaced_pod("default", field_selector="spec.nodeName=n1")
    assert [p.metadata.name for p in found.items] == ["a", "c"]
    assert pods.list_namespaced_pod("kube-system", field_selector="spec.nodeName=n1").items == []


def test_node_field_selector(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    v1.create_node({"metadata": {"name": "n1"}})
    v1.create_node({"metadata": {"name": "n2"}, "spec": {"unschedulable": True}})
    assert [n.metadata.name for n in v1.list_node(field_selector="metadata.name=n2").items] == [
        "n2"
    ]
    found = v1.list_node(field_selector="spec.unschedulable=true")
    assert [n.metadata.name for n in found.items] == ["n2"]


def test_unsupported_field_is_400_with_upstream_message(kube_api: client.ApiClient) -> None:
    with pytest.raises(client.ApiException) as raised:
        core_v1(kube_api).list_pod_for_all_namespaces(field_selector="spec.foo=bar")
    body = status_of(raised.value)
    assert raised.value.status == 400
    assert (body["reason"], body["message"]) == (
        "BadRequest",
        "field label not supported: spec.foo",
    )
    with pytest.raises(client.ApiException) as raised:
        core_v1(kube_api).list_node(field_selector="spec.nodeName=x")
    assert raised.value.status == 400


@pytest.mark.parametrize(
    "selector",
    ["app=", "=web", "app in web", "app in ()", "a b", "app=web,", "bad key=x", "app=-x-"],
)
def test_malformed_label_selectors_are_400(apiserver: RunningApiServer, selector: str) -> None:
    if selector == "app=":
        # An empty value is legal: it matches objects whose label is the empty string.
        code, _ = _get(apiserver, {"labelSelector": selector})
        assert code == 200
        return
    code, body = _get(apiserver, {"labelSelector": selector})
    assert code == 400, selector
    assert body["kind"] == "Status" and body["reason"] == "BadRequest"
    assert body["message"], selector


@pytest.mark.parametrize("selector", ["spec.nodeName", "nonsense", "metadata.name~x"])
def test_malformed_field_selectors_are_400(apiserver: RunningApiServer, selector: str) -> None:
    code, body = _get(apiserver, {"fieldSelector": selector})
    assert code == 400 and body["reason"] == "BadRequest"
    assert "invalid selector" in body["message"] or "not supported" in body["message"]


def test_escaped_field_selector_values(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    event = {
        "metadata": {"name": "e1"},
        "involvedObject": {"kind": "Pod", "name": "p"},
        "reason": "a,b=c",
    }
    v1.create_namespaced_event("default", event)
    found = v1.list_namespaced_event("default", field_selector=r"reason=a\,b\=c")
    assert [e.metadata.name for e in found.items] == ["e1"]


def _get(apiserver: RunningApiServer, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
    url = f"{apiserver.url}/api/v1/pods?{urllib.parse.urlencode(query)}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
