"""Scale of the simulated API server: 5,000 nodes and 50,000 pods, as the binder and agents see it.

Starts `python -m sim.apiserver` as its own process (so its RSS is its own), loads the nodes and
pods over raw HTTP with many requests in flight, then measures through the official `kubernetes`
client:
- a full pod list (all 50,000), both the server's answer (raw bytes, `_preload_content=False`)
  and the client's full model deserialisation;
- a node-scoped pod list (`fieldSelector=spec.nodeName=X`, ~10 pods of 50,000), as an agent does;
- watch latency: time from a create call's return to the ADDED event on an open watch;
- the server's resident memory.
Medians (and p95 where it helps) over rounds; single absolute times on a shared machine are noise.

The goals (checked unless `--no-goal`) are what the benchmarks and tests that run on it need of
it, so that the simulated API server is never what they measure: an agent's node-scoped pod list
in at most `NODE_LIST_GOAL_MS` (median), a watch event seen at most `WATCH_GOAL_MS` after its
create (p95), and at most `RSS_GOAL_MIB` resident once loaded.

Run: .venv/bin/python -m benchmarks.sim_apiserver [--nodes 5000 --pods 50000] [--no-goal]
"""

from __future__ import annotations

import asyncio
import json
import operator
import statistics
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import aiohttp
import kubernetes.client
import kubernetes.watch
import psutil

from benchmarks import apiserver_process, command_line, goals

NAMESPACE = "default"
NODE_LIST_GOAL_MS = 10.0
"""Milliseconds: an agent's node-scoped pod list, the median."""
WATCH_GOAL_MS = 10.0
"""Milliseconds from a create's answer to its ADDED event on an open watch, the p95."""
RSS_GOAL_MIB = 512.0
"""MiB the server holds resident with every node and pod loaded."""


def node_body(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": f"node-{i:05d}",
            "labels": {"kubernetes.io/hostname": f"node-{i:05d}", "pool": f"p{i % 7}"},
            "annotations": {"tritonshare.io/gpu-mem-total": str(16 * 1024**3)},
        },
        "status": {"capacity": {"cpu": "32", "memory": "128Gi"}},
    }


def pod_body(i: int, nodes: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"model-{i:06d}",
            "labels": {"app": f"model-{i % 500}"},
            "annotations": {"tritonshare.io/model-id": f"model-{i:06d}"},
        },
        "spec": {
            "schedulerName": "tritonshare",
            "nodeName": f"node-{i % nodes:05d}",
            "containers": [
                {
                    "name": "proxy",
                    "image": "tritonshare/proxy:latest",
                    "resources": {"limits": {"tritonshare.io/gpu-mem": "1Gi"}},
                }
            ],
        },
    }


async def bulk_create(
    url: str, path: str, bodies: list[dict[str, Any]], in_flight: int = 64
) -> float:
    """POST every body with `in_flight` requests at once; returns objects per second."""
    connector = aiohttp.TCPConnector(limit=in_flight)
    started = time.perf_counter()
    async with aiohttp.ClientSession(connector=connector) as session:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        for body in bodies:
            queue.put_nowait(body)

        async def worker() -> None:
            while not queue.empty():
                body = queue.get_nowait()
                async with session.post(url + path, json=body) as response:
                    if response.status != 201:
                        raise RuntimeError(
                            f"create failed: {response.status} {await response.text()}"
                        )
                    await response.read()

        await asyncio.gather(*(worker() for _ in range(in_flight)))
    return len(bodies) / (time.perf_counter() - started)


def timed(function: Callable[[], Any], rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return times


def p95(seconds: list[float]) -> float:
    ordered = sorted(seconds)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]


def check_goals(node_list: list[float], watch: list[float], loaded_rss_mib: float) -> list[bool]:
    """The node-scoped list's median and the watch's p95 (seconds each) and the loaded RSS
    against their goals."""
    return [
        goals.check(
            "node-scoped pod list, median",
            statistics.median(node_list) * 1000,
            NODE_LIST_GOAL_MS,
            unit=" ms",
        ),
        goals.check("watch latency, p95", p95(watch) * 1000, WATCH_GOAL_MS, unit=" ms"),
        goals.check("server RSS loaded", loaded_rss_mib, RSS_GOAL_MIB, unit=" MiB"),
    ]


def describe(name: str, seconds: list[float]) -> None:
    print(
        f"{name:<58} median {statistics.median(seconds) * 1000:9.2f} ms"
        f"   p95 {p95(seconds) * 1000:9.2f} ms   (n={len(seconds)})"
    )


def labelled_pod(i: int, nodes: int) -> dict[str, Any]:
    body = pod_body(i, nodes)
    body["metadata"]["labels"]["node"] = body["spec"]["nodeName"]
    return body


async def fanout(
    url: str, nodes: int, samples: int, *, indexed: bool, offset: int
) -> tuple[list[float], float]:
    """One pod watch per node, all open at once: the latency from a create to the event on that
    node's watch, and the create rate meanwhile. `indexed` watches select `spec.nodeName=X` (as
    every agent does; the server indexes those); the others select the same pods by a label,
    which the server must test against every watch."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.get(f"{url}/api/v1/pods", params={"limit": "1"}) as response:
            start = (await response.json())["metadata"]["resourceVersion"]

        async def open_watch(node: str) -> aiohttp.ClientResponse:
            params = {
                "watch": "1",
                "resourceVersion": start,
                "timeoutSeconds": "3600",
            }
            if indexed:
                params["fieldSelector"] = f"spec.nodeName={node}"
            else:
                params["labelSelector"] = f"node={node}"
            return await session.get(f"{url}/api/v1/pods", params=params)

        names = [f"node-{i:05d}" for i in range(nodes)]
        streams: dict[str, aiohttp.ClientResponse] = {}
        for chunk in range(0, nodes, 250):
            opened = await asyncio.gather(*(open_watch(n) for n in names[chunk : chunk + 250]))
            streams.update(zip(names[chunk : chunk + 250], opened, strict=True))

        latencies = []
        for i in range(samples):
            body = labelled_pod(offset + i, nodes)
            node = body["spec"]["nodeName"]
            sent = time.perf_counter()
            async with session.post(f"{url}/api/v1/namespaces/{NAMESPACE}/pods", json=body) as r:
                assert r.status == 201, await r.text()
            line = await asyncio.wait_for(streams[node].content.readline(), timeout=30)
            latencies.append(time.perf_counter() - sent)
            assert json.loads(line)["object"]["metadata"]["name"] == body["metadata"]["name"]
        rate = await bulk_create(
            url,
            f"/api/v1/namespaces/{NAMESPACE}/pods",
            [labelled_pod(offset + samples + i, nodes) for i in range(500)],
        )
        for stream in streams.values():
            stream.close()
    return latencies, rate


def watch_latency(api: kubernetes.client.ApiClient, samples: int, nodes: int) -> list[float]:
    """Create pods one by one; time from sending each create to seeing its ADDED event."""
    v1: Any = kubernetes.client.CoreV1Api(api)
    start = v1.list_namespaced_pod(NAMESPACE, limit=1).metadata.resource_version
    seen: dict[str, float] = {}
    arrived = threading.Condition()
    w: Any = kubernetes.watch.Watch()  # type: ignore[no-untyped-call]

    def consume() -> None:
        for event in w.stream(
            v1.list_namespaced_pod, NAMESPACE, resource_version=start, timeout_seconds=600
        ):
            with arrived:
                seen[event["raw_object"]["metadata"]["name"]] = time.perf_counter()
                arrived.notify_all()
            if len(seen) >= samples:
                w.stop()

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    latencies = []
    for i in range(samples):
        body = pod_body(1_000_000 + i, nodes)
        name = body["metadata"]["name"]
        sent = time.perf_counter()
        v1.create_namespaced_pod(NAMESPACE, body, _preload_content=False)
        with arrived:
            if not arrived.wait_for(partial(operator.contains, seen, name), timeout=30):
                raise RuntimeError(f"no watch event for {name} within 30 s")
            latencies.append(seen[name] - sent)
    thread.join(timeout=30)
    return latencies


def main() -> int:
    parser = command_line(
        "sim_apiserver",
        (
            "Measures the simulated API server at scale: list and watch times and its memory "
            "with --nodes nodes and --pods pods, through the official kubernetes client, over "
            "--rounds rounds."
        ),
    )
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument("--rounds", type=int, default=5)
    goals.add_flag(parser)
    args = parser.parse_args()
    with apiserver_process() as (url, server):
        process = psutil.Process(server.pid)
        idle_rss = process.memory_info().rss
        print(
            f"simulated API server at {url} (pid {server.pid}), idle RSS {idle_rss / 2**20:.0f} MiB"
        )
        rate = asyncio.run(
            bulk_create(url, "/api/v1/nodes", [node_body(i) for i in range(args.nodes)])
        )
        print(f"created {args.nodes} nodes at {rate:,.0f}/s")
        rate = asyncio.run(
            bulk_create(
                url,
                f"/api/v1/namespaces/{NAMESPACE}/pods",
                [pod_body(i, args.nodes) for i in range(args.pods)],
            )
        )
        print(f"created {args.pods} pods at {rate:,.0f}/s")
        loaded_rss = process.memory_info().rss
        configuration = kubernetes.client.Configuration()
        configuration.host = url
        with kubernetes.client.ApiClient(configuration) as api:
            v1: Any = kubernetes.client.CoreV1Api(api)
            rounds = args.rounds
            full = v1.list_pod_for_all_namespaces(_preload_content=False)
            assert len(json.loads(full.data)["items"]) == args.pods
            print(f"a full pod list is {len(full.data) / 2**20:.1f} MiB of JSON")

            def raw_full_list() -> None:
                response = v1.list_pod_for_all_namespaces(_preload_content=False)
                assert len(response.data) > 0

            def typed_full_list() -> None:
                assert len(v1.list_pod_for_all_namespaces().items) == args.pods

            node_names = [f"node-{(i * 97) % args.nodes:05d}" for i in range(50)]

            def node_list() -> None:
                for node in node_names:
                    pods = v1.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")
                    assert len(pods.items) == args.pods // args.nodes

            def paged_list() -> None:
                token, count = None, 0
                while True:
                    page = v1.list_pod_for_all_namespaces(
                        limit=500, _continue=token, _preload_content=False
                    )
                    body = json.loads(page.data)
                    count += len(body["items"])
                    token = body["metadata"].get("continue")
                    if not token:
                        break
                assert count == args.pods

            def node_list_all() -> None:
                assert len(v1.list_node().items) == args.nodes

            describe("full pod list, raw bytes (server + transfer)", timed(raw_full_list, rounds))
            describe("full pod list, paged by 500 (raw JSON)", timed(paged_list, args.rounds))
            describe("full node list, official client models", timed(node_list_all, args.rounds))
            per_node = [t / len(node_names) for t in timed(node_list, args.rounds)]
            describe("node-scoped pod list (official client)", per_node)
            describe("full pod list, official client models", timed(typed_full_list, 1))
            latencies = watch_latency(api, 200, args.nodes)
            describe("watch latency, create sent -> ADDED seen", latencies)
        for indexed, offset, what in (
            (True, 2_000_000, "by spec.nodeName (indexed)"),
            (False, 3_000_000, "by label (every watch tested)"),
        ):
            fan_latencies, fan_rate = asyncio.run(
                fanout(url, args.nodes, 100, indexed=indexed, offset=offset)
            )
            describe(f"same, {args.nodes} watches open {what}", fan_latencies)
            print(f"  create rate with those watches open: {fan_rate:,.0f}/s")
        final_rss = process.memory_info().rss
        print(
            f"server RSS: idle {idle_rss / 2**20:.0f} MiB, loaded {loaded_rss / 2**20:.0f} MiB,"
            f" after measuring {final_rss / 2**20:.0f} MiB"
            f" ({(loaded_rss - idle_rss) / (args.nodes + args.pods) / 1024:.1f} KiB per object)"
        )
    return goals.exit_code(check_goals(per_node, latencies, loaded_rss / 2**20), args.no_goal)


if __name__ == "__main__":
    sys.exit(main())
