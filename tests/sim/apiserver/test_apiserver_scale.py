"""A moderately large cluster (2,000 nodes, 20,000 pods) stays correct to list and watch.

Asserts behaviour at size, not speed: node-scoped lists return exactly that node's pods (through
the pod index), paging returns every pod once, a watch opened after the load sees new writes,
and the bounded history turns a watch from before the load into 410 Expired.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Any

import aiohttp
import pytest

from sim.apiserver import RunningApiServer
from tests.fixtures_sim import core_v1, new_watch

NODES = 2_000
PODS = 20_000


def _pod(i: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"m-{i:05d}", "labels": {"shard": str(i % 10)}},
        "spec": {
            "schedulerName": "tritonshare",
            "nodeName": f"node-{i % NODES:04d}" if i % 20 else "",
            "containers": [{"name": "proxy", "image": "tritonshare/proxy"}],
        },
    }


async def _bulk_create(url: str, path: str, bodies: list[dict[str, Any]]) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32)) as session:
        pending = iter(bodies)

        async def worker() -> None:
            for body in pending:
                async with session.post(url + path, json=body) as response:
                    assert response.status == 201, await response.text()

        await asyncio.gather(*(worker() for _ in range(32)))


@pytest.mark.slow
async def test_large_cluster_lists_and_watches(apiserver: RunningApiServer) -> None:
    before_load = apiserver.resource_version
    nodes = [{"metadata": {"name": f"node-{i:04d}"}} for i in range(NODES)]
    await _bulk_create(apiserver.url, "/api/v1/nodes", nodes)
    await _bulk_create(
        apiserver.url, "/api/v1/namespaces/default/pods", [_pod(i) for i in range(PODS)]
    )
    await asyncio.to_thread(_check_lists_and_watches, apiserver, before_load)


def _check_lists_and_watches(apiserver: RunningApiServer, before_load: int) -> None:
    with apiserver.api_client() as api:
        v1 = core_v1(api)
        # Node-scoped lists: exactly the pods bound there, from the index.
        for node in ("node-0001", "node-0777", "node-1999"):
            index = int(node.split("-")[1])
            expected = sorted(f"m-{i:05d}" for i in range(index, PODS, NODES) if i % 20)
            found = v1.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")
            assert [p.metadata.name for p in found.items] == expected
        unscheduled = v1.list_namespaced_pod("default", field_selector="spec.nodeName=")
        assert len(unscheduled.items) == PODS // 20
        both = v1.list_namespaced_pod(
            "default", field_selector="spec.nodeName=node-0003", label_selector="shard=3"
        )
        assert {p.metadata.labels["shard"] for p in both.items} == {"3"}
        # Paging returns every pod once.
        seen: list[str] = []
        token = None
        while True:
            page = json.loads(
                v1.list_pod_for_all_namespaces(
                    limit=5000, _continue=token, _preload_content=False
                ).data
            )
            seen += [item["metadata"]["name"] for item in page["items"]]
            token = page["metadata"].get("continue")
            if not token:
                break
        assert len(seen) == PODS and len(set(seen)) == PODS
        # The history holds 10,000 events: a watch from before the load has expired.
        url = f"{apiserver.url}/api/v1/pods?watch=1&resourceVersion={before_load}"
        with urllib.request.urlopen(url, timeout=30) as response:
            event = json.loads(response.readline())
        assert event["type"] == "ERROR" and event["object"]["code"] == 410
        # A watch from a fresh list sees new writes, filtered by node.
        start = v1.list_pod_for_all_namespaces(limit=1).metadata.resource_version
        for i in range(PODS, PODS + 40):
            v1.create_namespaced_pod("default", _pod(i), _preload_content=False)
        events = [
            (e["type"], e["object"].metadata.name)
            for e in new_watch().stream(
                v1.list_pod_for_all_namespaces,
                field_selector="spec.nodeName=node-0005",
                resource_version=start,
                timeout_seconds=1,
            )
        ]
        assert events == [("ADDED", f"m-{PODS + 5:05d}")]
