"""End to end through sim/: watch -> decide -> annotate -> bind, with 1,000 GPU nodes.

The simulated API server runs in this process (its audit log is the independent count of API
calls); nodes with agent leases are created through the official client, then a backlog of
pending pods. The binder starts with warm caches and the clock runs until the watch shows every
pod bound. Figures: pods per second, and API calls per scheduled pod from the audit log (writes,
and all requests). The proof of concept's algorithm runs in the same process on the same server
for a few pods: for each decision it lists the nodes and, for every node, that node's pods.

Note: the API server shares this process (and the GIL) with the binder, so absolute rates are
conservative; compare the two algorithms by their ratio.

Run: .venv/bin/python -m benchmarks.binder_e2e [--nodes 1000 --pods 2000 --poc-pods 5]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import logging
import random
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import kubernetes.client

from binder.app import Binder
from binder.settings import Settings
from common.contract import Keys, agent_lease_name
from sim.apiserver import start_in_thread
from sim.cluster import write_placement_keys

GI = 1024**3
KEYS = Keys()
SYSTEM = "tritonshare-system"


def stamp(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(ts))


def node_body(i: int, gpus: int) -> dict[str, Any]:
    name = f"node-{i:04d}"
    memory = 16 * GI
    listing = [
        {
            "uuid": f"GPU-{name}-{g}",
            "index": g,
            "product": "Tesla T4",
            "memory": memory,
            "healthy": True,
        }
        for g in range(gpus)
    ]
    taints = [{"key": "nvidia.com/gpu", "value": "", "effect": "NoSchedule"}] if i % 10 == 0 else []
    return {
        "metadata": {
            "name": name,
            "labels": {"zone": f"zone-{i % 4}"},
            "annotations": {KEYS.gpus: json.dumps(listing), KEYS.gpu_mem_total: str(memory * gpus)},
        },
        "spec": {"taints": taints},
    }


def lease_body(node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": agent_lease_name(node), "namespace": SYSTEM},
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": 3600,
            "renewTime": stamp(time.time()),
        },
    }


def pod_body(i: int, rng: random.Random, prefix: str = "pod") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "tritonshare",
        "containers": [
            {
                "name": "proxy",
                "image": "tritonshare/proxy",
                "resources": {"limits": {KEYS.gpu_mem: rng.choice(["1Gi", "2Gi", "3Gi"])}},
            }
        ],
    }
    if i % 3 == 0:
        spec["nodeSelector"] = {"zone": f"zone-{i % 4}"}
    if i % 5 == 0:
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    return {
        "metadata": {"name": f"{prefix}-{i}", "annotations": {KEYS.model_id: f"model-{i}"}},
        "spec": spec,
    }


def poc_schedule(core: Any, pod_name: str, rng: random.Random) -> str | None:
    """The proof of concept: list nodes, then every node's pods, sum memory, random fitting."""
    pod = core.read_namespaced_pod(pod_name, "default")
    want = int(pod.spec.containers[0].resources.limits[KEYS.gpu_mem].rstrip("Gi")) * GI
    model = pod.metadata.annotations[KEYS.model_id]
    fitting = []
    for node in core.list_node().items:
        total = int(node.metadata.annotations[KEYS.gpu_mem_total])
        pods = core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node.metadata.name}"
        )
        used = 0
        models = set()
        for other in pods.items:
            limit = other.spec.containers[0].resources.limits or {}
            used += int(str(limit.get(KEYS.gpu_mem, "0")).rstrip("Gi") or 0) * GI
            models.add((other.metadata.annotations or {}).get(KEYS.model_id))
        if total - used >= want and model not in models:
            fitting.append(node.metadata.name)
    if not fitting:
        return None
    choice: str = rng.choice(fitting)
    body = {"metadata": {"name": pod_name}, "target": {"kind": "Node", "name": choice}}
    core.create_namespaced_pod_binding(pod_name, "default", body, _preload_content=False)
    return choice


def create_all(core: Any, bodies: list[dict[str, Any]], what: str) -> None:
    def create(body: dict[str, Any]) -> None:
        if what == "node":
            core.create_node(body)
        elif what == "lease":
            coordination: Any = kubernetes.client.CoordinationV1Api(core.api_client)
            coordination.create_namespaced_lease(SYSTEM, body)
        else:
            core.create_namespaced_pod("default", body)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(create, bodies))


async def run(args: argparse.Namespace) -> None:
    server = start_in_thread()
    client: Any = server.api_client()
    core: Any = kubernetes.client.CoreV1Api(client)
    rng = random.Random(args.seed)
    try:
        started = time.perf_counter()
        nodes = [node_body(i, args.gpus) for i in range(args.nodes)]
        create_all(core, nodes, "node")
        create_all(core, [lease_body(n["metadata"]["name"]) for n in nodes], "lease")
        create_all(core, [pod_body(i, rng) for i in range(args.pods)], "pod")
        print(
            f"cluster: {args.nodes} nodes x {args.gpus} GPUs (16Gi each), {args.pods} pending pods;"
            f" created in {time.perf_counter() - started:.1f} s"
        )
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = server.write_kubeconfig(Path(tmp) / "kubeconfig")
            settings = Settings(
                kubeconfig=str(kubeconfig),
                placement_key_dir=write_placement_keys(Path(tmp) / "placement-key"),
                listen_http=("127.0.0.1", 0),
                leader_elect=False,
                bind_workers=args.bind_workers,
            )
            binder = Binder(settings)
            t0 = time.perf_counter()
            await binder.start()
            warm = time.perf_counter() - t0
            server.audit.clear()
            t0 = time.perf_counter()
            while binder.cache.pending or binder.cache.state.assumed_uids():
                await asyncio.sleep(0.02)
                if time.perf_counter() - t0 > args.timeout:
                    break
            elapsed = time.perf_counter() - t0
            bound = binder.controller.bound
            await binder.stop()
        records = server.audit.snapshot()
        ours = [r for r in records if r.user_agent.startswith("tritonshare-binder/")]
        writes = Counter(
            f"{r.verb} {r.resource}{'/' + r.subresource if r.subresource else ''}"
            for r in ours
            if r.is_write
        )
        print(
            f"binder ({args.bind_workers} bind workers): caches warm in {warm:.2f} s; "
            f"{bound} pods bound in {elapsed:.2f} s"
        )
        binder_rate = bound / elapsed if elapsed else 0.0
        print(
            f"binder: {binder_rate:.0f} pods/s (watch -> decide -> annotate -> bind -> seen bound)"
        )
        print(
            f"binder: API writes per scheduled pod {sum(writes.values()) / max(bound, 1):.2f} "
            f"({dict(writes)}); all requests per pod {len(ours) / max(bound, 1):.2f}"
        )
        poc_times = []
        poc_calls = []
        for i in range(args.poc_pods):
            core.create_namespaced_pod("default", pod_body(i, rng, prefix="poc"))
            before = len(server.audit)
            t0 = time.perf_counter()
            poc_schedule(core, f"poc-{i}", rng)
            poc_times.append(time.perf_counter() - t0)
            poc_calls.append(len(server.audit) - before)
        poc_rate = 1 / statistics.median(poc_times)
        print(
            f"proof of concept: {poc_rate:.2f} pods/s (median of {args.poc_pods}), "
            f"{statistics.median(poc_calls):.0f} API requests per scheduled pod"
        )
        print(f"ratio binder / proof of concept: {binder_rate / poc_rate:.0f}x pods/s")
    finally:
        client.close()
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--poc-pods", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--bind-workers", type=int, default=8)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
