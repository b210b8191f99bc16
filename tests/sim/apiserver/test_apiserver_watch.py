"""List and watch: resume from a resourceVersion, 410 recovery, bookmarks, selector transitions,
paging and exact-version lists."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from kubernetes import client

from sim.apiserver import ApiServerSettings, RunningApiServer, start_in_thread
from tests.fixtures_sim import core_v1, new_watch, status_of


def _pod(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }


@pytest.fixture
def small_history() -> Iterator[RunningApiServer]:
    server = start_in_thread(settings=ApiServerSettings(history_size=5))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def quick_bookmarks() -> Iterator[RunningApiServer]:
    server = start_in_thread(settings=ApiServerSettings(bookmark_interval_seconds=0.1))
    try:
        yield server
    finally:
        server.stop()


def test_watch_without_version_starts_with_current_objects(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    v1.create_node({"metadata": {"name": "b"}})
    v1.create_node({"metadata": {"name": "a"}})
    seen = [
        (e["type"], e["object"].metadata.name)
        for e in new_watch().stream(v1.list_node, timeout_seconds=1)
    ]
    assert seen == [("ADDED", "a"), ("ADDED", "b")]


def test_list_then_watch_resumes_after_the_list(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    v1.create_namespaced_pod("default", _pod("before"))
    listed = v1.list_namespaced_pod("default")
    assert [p.metadata.name for p in listed.items] == ["before"]
    v1.create_namespaced_pod("default", _pod("after"))
    v1.patch_namespaced_pod("before", "default", {"metadata": {"labels": {"x": "1"}}})
    v1.delete_namespaced_pod("after", "default")
    stream = new_watch().stream(
        v1.list_namespaced_pod,
        "default",
        resource_version=listed.metadata.resource_version,
        timeout_seconds=1,
    )
    events = [(e["type"], e["object"].metadata.name) for e in stream]
    assert events == [("ADDED", "after"), ("MODIFIED", "before"), ("DELETED", "after")]


def test_watch_sees_live_writes_from_another_thread(
    apiserver: RunningApiServer, kube_api: client.ApiClient
) -> None:
    v1 = core_v1(kube_api)
    start = v1.list_node().metadata.resource_version

    def writer() -> None:
        with apiserver.api_client() as api:
            for i in range(5):
                core_v1(api).create_node({"metadata": {"name": f"n{i}"}})

    thread = threading.Thread(target=writer)
    thread.start()
    w = new_watch()
    names = []
    for event in w.stream(v1.list_node, resource_version=start, timeout_seconds=30):
        names.append(event["object"].metadata.name)
        if len(names) == 1:
            # The open watch is already in the audit log, as a watch on nodes.
            watches = [r for r in apiserver.audit if r.verb == "watch"]
            assert [(r.resource, r.code) for r in watches] == [("nodes", 200)]
        if len(names) == 5:
            w.stop()
    thread.join()
    assert names == [f"n{i}" for i in range(5)]


def test_too_old_version_is_410_in_stream_and_relist_recovers(
    small_history: RunningApiServer,
) -> None:
    with small_history.api_client() as api:
        v1 = core_v1(api)
        old = v1.list_node().metadata.resource_version
        for i in range(10):
            v1.create_node({"metadata": {"name": f"n{i}"}})
        # Raw watch: HTTP 200 and one ERROR event carrying a 410 Expired Status.
        url = f"{small_history.url}/api/v1/nodes?watch=1&resourceVersion={old}"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
            lines = response.read().decode().splitlines()
        event = json.loads(lines[0])
        assert event["type"] == "ERROR"
        assert event["object"]["code"] == 410 and event["object"]["reason"] == "Expired"
        assert event["object"]["message"].startswith(f"too old resource version: {old} (")
        # The official client raises the 410 when it cannot retry (timeout set).
        with pytest.raises(client.ApiException) as raised:
            list(new_watch().stream(v1.list_node, resource_version=old, timeout_seconds=1))
        assert raised.value.status == 410
        # An exact list at that version has expired too.
        with pytest.raises(client.ApiException) as raised:
            v1.list_node(resource_version=old, resource_version_match="Exact")
        assert raised.value.status == 410
        assert status_of(raised.value)["reason"] == "Expired"
        # Recovery: relist, then watch from the list's version.
        listed = v1.list_node()
        assert len(listed.items) == 10
        v1.delete_node("n0")
        events = [
            (e["type"], e["object"].metadata.name)
            for e in new_watch().stream(
                v1.list_node, resource_version=listed.metadata.resource_version, timeout_seconds=1
            )
        ]
        assert events == [("DELETED", "n0")]


def test_bookmarks_carry_the_current_version(quick_bookmarks: RunningApiServer) -> None:
    with quick_bookmarks.api_client() as api:
        v1 = core_v1(api)
        start = v1.list_node().metadata.resource_version
        v1.create_node({"metadata": {"name": "n1"}})
        current = v1.list_node().metadata.resource_version
        w = new_watch()
        kinds = []
        for event in w.stream(
            v1.list_node, resource_version=start, allow_watch_bookmarks=True, timeout_seconds=30
        ):
            kinds.append(event["type"])
            if event["type"] == "BOOKMARK":
                assert event["raw_object"]["kind"] == "Node"
                assert event["raw_object"]["metadata"]["resourceVersion"] == current
                w.stop()
        assert kinds == ["ADDED", "BOOKMARK"]
        assert w.resource_version == current
        # Without allowWatchBookmarks, none are sent.
        plain = [
            e["type"]
            for e in new_watch().stream(v1.list_node, resource_version=start, timeout_seconds=1)
        ]
        assert plain == ["ADDED"]


def test_selectors_turn_modifications_into_added_and_deleted(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    start = v1.list_namespaced_pod("default").metadata.resource_version
    v1.create_namespaced_pod("default", _pod("p", {"app": "a"}))
    v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"app": "b"}}})
    v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"app": "a"}}})
    v1.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"x": "1"}}})
    v1.create_namespaced_pod("default", _pod("other", {"app": "b"}))
    v1.delete_namespaced_pod("p", "default")
    events = [
        (e["type"], e["object"].metadata.name, e["object"].metadata.labels["app"])
        for e in new_watch().stream(
            v1.list_namespaced_pod,
            "default",
            label_selector="app=a",
            resource_version=start,
            timeout_seconds=1,
        )
    ]
    assert events == [
        ("ADDED", "p", "a"),
        ("DELETED", "p", "a"),  # stopped matching: the previous state is reported as deleted
        ("ADDED", "p", "a"),
        ("MODIFIED", "p", "a"),
        ("DELETED", "p", "a"),
    ]


def test_field_selector_watch_of_unscheduled_pods(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    start = v1.list_namespaced_pod("default").metadata.resource_version
    v1.create_namespaced_pod("default", _pod("p"))
    binding = {"metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}}
    v1.create_namespaced_pod_binding("p", "default", binding, _preload_content=False)
    events = [
        (e["type"], e["object"].spec.node_name)
        for e in new_watch().stream(
            v1.list_pod_for_all_namespaces,
            field_selector="spec.nodeName=",
            resource_version=start,
            timeout_seconds=1,
        )
    ]
    assert events == [("ADDED", None), ("DELETED", None)]


def test_watch_from_a_future_version_is_504(apiserver: RunningApiServer) -> None:
    url = f"{apiserver.url}/api/v1/nodes?watch=true&resourceVersion=999999"
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(url, timeout=10)
    assert raised.value.code == 504
    body = json.loads(raised.value.read())
    assert body["reason"] == "Timeout" and "Too large resource version" in body["message"]


def test_paged_list_with_limit_and_continue(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    for i in range(7):
        v1.create_node({"metadata": {"name": f"n{i}"}})
    first = v1.list_node(limit=3)
    assert [n.metadata.name for n in first.items] == ["n0", "n1", "n2"]
    assert first.metadata.remaining_item_count == 4
    v1.delete_node("n3")
    names = [n.metadata.name for n in first.items]
    token = first.metadata._continue
    while token:
        page = v1.list_node(limit=3, _continue=token)
        assert page.metadata.resource_version == first.metadata.resource_version
        names += [n.metadata.name for n in page.items]
        token = page.metadata._continue
    assert names == ["n0", "n1", "n2", "n4", "n5", "n6"]
    with pytest.raises(client.ApiException) as raised:
        v1.list_node(_continue="not-a-token")
    assert raised.value.status == 400


def test_exact_version_list_shows_the_past(kube_api: client.ApiClient) -> None:
    v1 = core_v1(kube_api)
    v1.create_node({"metadata": {"name": "n1", "labels": {"v": "1"}}})
    then = v1.list_node().metadata.resource_version
    v1.patch_node("n1", {"metadata": {"labels": {"v": "2"}}})
    v1.create_node({"metadata": {"name": "n2"}})
    past = v1.list_node(resource_version=then, resource_version_match="Exact")
    assert past.metadata.resource_version == then
    assert [(n.metadata.name, n.metadata.labels["v"]) for n in past.items] == [("n1", "1")]
    assert len(v1.list_node(resource_version="0").items) == 2
    with pytest.raises(client.ApiException) as raised:
        v1.list_node(resource_version_match="Exact")
    assert raised.value.status == 422


async def test_many_node_scoped_watches_each_see_only_their_node(
    apiserver: RunningApiServer,
) -> None:
    nodes = [f"gpu-{i}" for i in range(20)]
    url = apiserver.url
    async with aiohttp.ClientSession() as session:
        listed = await (await session.get(f"{url}/api/v1/pods")).json()
        start = listed["metadata"]["resourceVersion"]
        streams = [
            await session.get(
                f"{url}/api/v1/pods",
                params={
                    "watch": "1",
                    "resourceVersion": start,
                    "fieldSelector": f"spec.nodeName={node}",
                    "timeoutSeconds": "60",
                },
            )
            for node in nodes
        ]
        for i, node in enumerate(nodes):
            pod = _pod(f"p{i}")
            async with session.post(f"{url}/api/v1/namespaces/default/pods", json=pod) as r:
                assert r.status == 201
            binding = {"metadata": {"name": f"p{i}"}, "target": {"kind": "Node", "name": node}}
            async with session.post(
                f"{url}/api/v1/namespaces/default/pods/p{i}/binding", json=binding
            ) as r:
                assert r.status == 201
        # Then a last pod created on each node, so each watch knows when it has seen all.
        for node in nodes:
            last = {**_pod(f"last-{node}"), "spec": {**_pod("x")["spec"], "nodeName": node}}
            async with session.post(f"{url}/api/v1/namespaces/default/pods", json=last) as r:
                assert r.status == 201
        # Each watch sees its own pod arrive (ADDED: it starts matching when bound), then its
        # last pod, and nothing from the other nodes.
        for i, stream in enumerate(streams):
            events: list[tuple[str, str]] = []
            while not events or events[-1][1] != f"last-{nodes[i]}":
                line = await asyncio.wait_for(stream.content.readline(), timeout=60)
                event = json.loads(line)
                assert event["object"]["spec"]["nodeName"] == nodes[i]
                events.append((event["type"], event["object"]["metadata"]["name"]))
            stream.close()
            assert events == [("ADDED", f"p{i}"), ("ADDED", f"last-{nodes[i]}")]


def test_streaming_list_sends_initial_events_then_an_annotated_bookmark(
    apiserver: RunningApiServer, kube_api: client.ApiClient
) -> None:
    v1 = core_v1(kube_api)
    v1.create_node({"metadata": {"name": "n1"}})
    v1.create_node({"metadata": {"name": "n2"}})
    current = v1.list_node().metadata.resource_version
    query = (
        "watch=1&sendInitialEvents=true&allowWatchBookmarks=true"
        "&resourceVersionMatch=NotOlderThan&timeoutSeconds=1"
    )
    with urllib.request.urlopen(f"{apiserver.url}/api/v1/nodes?{query}", timeout=30) as response:
        events = [json.loads(line) for line in response.read().splitlines()]
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in events[:3]] == [
        ("ADDED", "n1"),
        ("ADDED", "n2"),
        ("BOOKMARK", None),
    ]
    marker = events[2]["object"]["metadata"]
    assert marker["resourceVersion"] == current
    assert marker["annotations"] == {"k8s.io/initial-events-end": "true"}


async def test_watches_opened_during_writes_miss_and_repeat_nothing(
    apiserver: RunningApiServer,
) -> None:
    """Watches that start behind (replaying history) while writes keep coming switch to live
    delivery without losing or repeating an event."""
    url = apiserver.url
    created: dict[str, int] = {}
    async with aiohttp.ClientSession() as session:

        async def create(i: int) -> None:
            body = {"metadata": {"name": f"n{i:04d}"}}
            async with session.post(f"{url}/api/v1/nodes", json=body) as response:
                assert response.status == 201
                obj = await response.json()
                created[obj["metadata"]["name"]] = int(obj["metadata"]["resourceVersion"])

        async def watch_from(rv: int) -> list[tuple[str, int]]:
            params = {"watch": "1", "resourceVersion": str(rv), "timeoutSeconds": "60"}
            seen = []
            async with session.get(f"{url}/api/v1/nodes", params=params) as response:
                async for line in response.content:
                    event = json.loads(line)
                    assert event["type"] == "ADDED"
                    meta = event["object"]["metadata"]
                    if meta["name"] == "zz-last":
                        break
                    seen.append((meta["name"], int(meta["resourceVersion"])))
            return seen

        start = apiserver.resource_version
        writers = [asyncio.create_task(create(i)) for i in range(150)]
        await asyncio.gather(*writers[:50])
        middle = max(created.values())
        watchers = [asyncio.create_task(watch_from(rv)) for rv in (start, middle, start + 10)]
        await asyncio.gather(*writers[50:])
        # A last write every watch will see, so each knows it has read everything before it.
        async with session.post(f"{url}/api/v1/nodes", json={"metadata": {"name": "zz-last"}}):
            pass
        results = await asyncio.gather(*watchers)
    for rv, seen in zip((start, middle, start + 10), results, strict=True):
        expected = sorted((name, version) for name, version in created.items() if version > rv)
        assert sorted(seen) == expected
        assert [version for _, version in seen] == sorted(version for _, version in seen)
