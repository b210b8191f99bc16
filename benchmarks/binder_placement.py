"""Placement throughput: the binder's placement vs the proof of concept's algorithm, same input.

A snapshot of 5,000 nodes with 8 GPUs each and 40,000 placed pods, with node labels, taints
(NoSchedule, PreferNoSchedule), unschedulable nodes, and pod templates using nodeSelector, required
and preferred node affinity and tolerations. Each decision is a real one: place the pod, then
charge it (assume), as the controller does. The proof of concept scanned every pod of every node
for each decision; it runs on the same snapshot in the same process.

Run: .venv/bin/python -m benchmarks.binder_placement [--nodes 5000 --gpus 8 --pods 40000]
Prints medians over rounds and the ratio; both algorithms run on one core (one thread).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import defaultdict
from typing import Any

from binder.model import PodInfo, node_from_api, pod_from_api
from binder.placement import Placement, place
from binder.state import ClusterState
from common.contract import Keys

GI = 1024**3
KEYS = Keys()
PRODUCTS = {"t4": 16 * GI, "a10": 24 * GI, "a100": 80 * GI}
NOW = 1_000_000.0


def make_node(i: int, gpus: int, rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(list(PRODUCTS))
    name = f"node-{i:05d}"
    taints = []
    roll = rng.random()
    if roll < 0.10:
        taints.append({"key": "nvidia.com/gpu", "value": "", "effect": "NoSchedule"})
    elif roll < 0.15:
        taints.append({"key": "spot", "value": "true", "effect": "PreferNoSchedule"})
    annotations = {
        KEYS.gpus: "["
        + ",".join(
            f'{{"uuid":"GPU-{name}-{g}","index":{g},"product":"{kind}",'
            f'"memory":{PRODUCTS[kind]},"healthy":true}}'
            for g in range(gpus)
        )
        + "]",
        KEYS.gpu_mem_total: str(PRODUCTS[kind] * gpus),
    }
    return {
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "topology.kubernetes.io/zone": f"zone-{i % 4}",
                "gpu": kind,
                "pool": f"pool-{i % 10}",
            },
            "annotations": annotations,
        },
        "spec": {"taints": taints, "unschedulable": rng.random() < 0.01},
    }


def templates() -> list[dict[str, Any]]:
    """Pod spec fragments: what model pods say about placement, as in seeds/."""
    gpu_toleration = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    out: list[dict[str, Any]] = [{}]
    out += [{"nodeSelector": {"gpu": kind}} for kind in PRODUCTS]
    out += [{"nodeSelector": {"topology.kubernetes.io/zone": f"zone-{z}"}} for z in range(4)]
    out.append({"tolerations": gpu_toleration})
    out.append(
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "gpu", "operator": "In", "values": ["a10", "a100"]}
                                ]
                            }
                        ]
                    },
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 20,
                            "preference": {
                                "matchExpressions": [
                                    {"key": "pool", "operator": "NotIn", "values": ["pool-1"]}
                                ]
                            },
                        }
                    ],
                }
            },
            "tolerations": gpu_toleration,
        }
    )
    out.append(
        {
            "affinity": {
                "nodeAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 50,
                            "preference": {
                                "matchExpressions": [
                                    {"key": "gpu", "operator": "In", "values": ["t4"]}
                                ]
                            },
                        }
                    ]
                }
            },
            "tolerations": [{"key": "spot", "operator": "Exists"}],
        }
    )
    return out


def make_pod(
    i: int, rng: random.Random, spec_extra: dict[str, Any], node: str = "", gpu: str = ""
) -> dict[str, Any]:
    mem = rng.choice(["512Mi", "1Gi", "2Gi", "3Gi", "4Gi"])
    annotations = {KEYS.model_id: f"model-{rng.randrange(20000)}"}
    if gpu:
        annotations[KEYS.gpu] = gpu
    spec: dict[str, Any] = {
        "schedulerName": "tritonshare",
        "containers": [{"name": "proxy", "resources": {"limits": {KEYS.gpu_mem: mem}}}],
        **spec_extra,
    }
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {
            "name": f"pod-{i}",
            "namespace": "models",
            "uid": f"uid-{i}",
            "annotations": annotations,
        },
        "spec": spec,
        "status": {"phase": "Running" if node else "Pending"},
    }


def build(
    nodes: int, gpus: int, placed: int, seed: int
) -> tuple[ClusterState, list[dict[str, Any]], list[PodInfo]]:
    rng = random.Random(seed)
    state = ClusterState(reserve=GI // 2)
    node_objs = [make_node(i, gpus, rng) for i in range(nodes)]
    for obj in node_objs:
        state.set_node(node_from_api(obj, KEYS))
        state.set_lease(obj["metadata"]["name"], NOW + 40)
    bound: list[PodInfo] = []
    for i in range(placed):
        obj = node_objs[rng.randrange(nodes)]
        name = obj["metadata"]["name"]
        pod = pod_from_api(make_pod(i, rng, {}, name, f"GPU-{name}-{rng.randrange(gpus)}"), KEYS)
        state.set_pod(pod)
        bound.append(pod)
    return state, node_objs, bound


def poc_decide(
    node_objs: list[dict[str, Any]],
    pods_by_node: dict[str, list[PodInfo]],
    pod: PodInfo,
    rng: random.Random,
) -> str | None:
    """The proof of concept: for every node, scan all the pods of that node (what its per-node
    pod list returned, here already grouped, so no API cost is counted) to sum their GPU memory
    and collect their model ids; compare with the node's total; pick a random fitting node."""
    fitting = []
    for obj in node_objs:
        name = obj["metadata"]["name"]
        total = int(obj["metadata"]["annotations"][KEYS.gpu_mem_total])
        used = 0
        models = set()
        for other in pods_by_node.get(name, ()):
            used += other.request
            models.add(other.model_id)
        if total - used >= pod.request and pod.model_id not in models:
            fitting.append(name)
    return rng.choice(fitting) if fitting else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pods", type=int, default=40000, help="pods already placed")
    parser.add_argument("--decisions", type=int, default=1000, help="binder decisions per round")
    parser.add_argument("--poc-decisions", type=int, default=50, help="PoC decisions per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    started = time.perf_counter()
    state, node_objs, bound = build(args.nodes, args.gpus, args.pods, args.seed)
    print(
        f"snapshot: {args.nodes} nodes x {args.gpus} GPUs, {len(bound)} placed pods, "
        f"{len(templates())} pod templates; built in {time.perf_counter() - started:.1f} s"
    )
    pods_by_node: dict[str, list[PodInfo]] = defaultdict(list)
    for pod in bound:
        pods_by_node[pod.node_name].append(pod)
    rng = random.Random(args.seed + 1)
    shapes = templates()
    counter = args.pods
    ours: list[float] = []
    poc: list[float] = []
    outcomes: dict[str, int] = defaultdict(int)
    for round_ in range(args.rounds):
        pending = []
        for _ in range(args.decisions):
            counter += 1
            pending.append(pod_from_api(make_pod(counter, rng, rng.choice(shapes)), KEYS))
        t0 = time.perf_counter()
        for pod in pending:
            result = place(state, pod, now=NOW)
            if isinstance(result, Placement):
                state.assume(pod, result.node, result.gpu.uuid)
                outcomes["placed"] += 1
            else:
                outcomes["unschedulable"] += 1
        ours.append(args.decisions / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        for pod in pending[: args.poc_decisions]:
            poc_decide(node_objs, pods_by_node, pod, rng)
        poc.append(args.poc_decisions / (time.perf_counter() - t0))
        print(f"round {round_ + 1}: binder {ours[-1]:8.0f} pods/s, proof of concept {poc[-1]:6.1f}")
    ours_median = statistics.median(ours)
    poc_median = statistics.median(poc)
    print(f"outcomes: {dict(outcomes)}; placed pods now {len(state.assigned_pods())}")
    print(
        f"median binder:           {ours_median:8.0f} pods/s ({1e3 / ours_median:.3f} ms/decision)"
    )
    print(f"median proof of concept: {poc_median:8.1f} pods/s ({1e3 / poc_median:.1f} ms/decision)")
    print(
        f"ratio binder / proof of concept: {ours_median / poc_median:.0f}x  (target >= 2000 pods/s)"
    )
    # A pod that fits nowhere (an A100's worth of memory on a T4 node): every node is filtered
    # and every reason counted, the cost paid for each waiting pod when a helpful cluster change
    # retries them all.
    misfits = []
    for i in range(200):
        obj = make_pod(counter + 1 + i, rng, {"nodeSelector": {"gpu": "t4"}})
        obj["spec"]["containers"][0]["resources"]["limits"][KEYS.gpu_mem] = "79Gi"
        misfits.append(pod_from_api(obj, KEYS))
    t0 = time.perf_counter()
    refused = [place(state, pod, now=NOW) for pod in misfits]
    rate = len(misfits) / (time.perf_counter() - t0)
    sample = next((r for r in refused if not isinstance(r, Placement)), None)
    print(f"unschedulable decisions: {rate:8.0f} pods/s; e.g. {getattr(sample, 'message', '-')}")


if __name__ == "__main__":
    main()
