"""Placement throughput: the binder's placement (the free-memory index), the whole-class scan
it replaced for the common case, and the proof of concept's algorithm, on the same input.

A snapshot of 5,000 nodes with 8 GPUs each and 40,000 placed pods, with node labels, taints
(NoSchedule, PreferNoSchedule), 1% cordoned nodes, 1% dead agents (expired leases), 2% unhealthy
GPUs, measured GPU memory on a fifth of the nodes (the gpu-usage annotation), and pod templates
using nodeSelector, required and preferred node affinity and tolerations. Each decision is the
live binder's: `place()` as the controller calls it, then charge the pod (assume).

Each round decides the same pending pods twice on the same state: with the index (the default,
what the binder runs), then, after the first round's charges are undone, with `scan_budget=0`
(every node of the class scored, the way every decision was made before). The two must choose
the same node and GPU for every pod, and the benchmark stops if they do not. The proof of
concept scanned every pod of every node for each decision; it runs on the same snapshot.

Run: .venv/bin/python -m benchmarks.binder_placement [--nodes 5000 --gpus 8 --pods 40000]
[--clock cpu] (CPU time instead of wall time, for a machine other work loads)
[--on-demand 0.5 --overcommit 3] (that share of the placed and pending pods `on-demand`, every
node labelled with that over-commit factor: the cost of the residency classes)
Prints each round, then medians and ratios; all of it on one core (one thread).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections import defaultdict
from typing import Any

from benchmarks import command_line
from binder.cluster.clusterstate import ClusterState
from binder.cluster.objects import PodInfo, node_from_api, pod_from_api
from binder.framework.noderules import NODE_RULES
from binder.framework.placement import SCAN_BUDGET, Placement, Unschedulable, place
from common.contract import RESIDENCY_ON_DEMAND, Keys

GI = 1024**3
KEYS = Keys()
PRODUCTS = {"t4": 16 * GI, "a10": 24 * GI, "a100": 80 * GI}
NOW = 1_000_000.0


def make_node(i: int, gpus: int, rng: random.Random, overcommit: str = "") -> dict[str, Any]:
    kind = rng.choice(list(PRODUCTS))
    name = f"node-{i:05d}"
    taints = []
    roll = rng.random()
    if roll < 0.10:
        taints.append({"key": "nvidia.com/gpu", "value": "", "effect": "NoSchedule"})
    elif roll < 0.15:
        taints.append({"key": "spot", "value": "true", "effect": "PreferNoSchedule"})
    listing = [
        {
            "uuid": f"GPU-{name}-{g}",
            "index": g,
            "product": kind,
            "memory": PRODUCTS[kind],
            "healthy": rng.random() >= 0.02,
        }
        for g in range(gpus)
    ]
    annotations = {
        KEYS.gpus: json.dumps(listing),
        KEYS.gpu_mem_total: str(PRODUCTS[kind] * gpus),
    }
    if rng.random() < 0.2:  # the agent's NVML measurements: some memory in use beyond requests
        annotations[KEYS.gpu_usage] = json.dumps(
            {
                gpu["uuid"]: {"used": rng.choice([1, 2, 4]) * GI, "models": {}}
                for gpu in listing
                if rng.random() < 0.5
            }
        )
    return {
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "topology.kubernetes.io/zone": f"zone-{i % 4}",
                "gpu": kind,
                "pool": f"pool-{i % 10}",
                **({KEYS.gpu_mem_overcommit: overcommit} if overcommit else {}),
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
    i: int,
    rng: random.Random,
    spec_extra: dict[str, Any],
    node: str = "",
    gpu: str = "",
    on_demand: float = 0.0,
) -> dict[str, Any]:
    mem = rng.choice(["512Mi", "1Gi", "2Gi", "3Gi", "4Gi"])
    annotations = {KEYS.model_id: f"model-{rng.randrange(20000)}"}
    if on_demand and rng.random() < on_demand:
        annotations[KEYS.residency] = RESIDENCY_ON_DEMAND
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
    nodes: int, gpus: int, placed: int, seed: int, on_demand: float = 0.0, overcommit: str = ""
) -> tuple[ClusterState, list[dict[str, Any]], list[PodInfo]]:
    rng = random.Random(seed)
    state = ClusterState(rules=NODE_RULES, reserve=GI // 2)
    node_objs = [make_node(i, gpus, rng, overcommit) for i in range(nodes)]
    for obj in node_objs:
        state.set_node(node_from_api(obj, KEYS))
        dead = rng.random() < 0.01
        state.set_lease(obj["metadata"]["name"], NOW - 1 if dead else NOW + 40)
    bound: list[PodInfo] = []
    for i in range(placed):
        obj = node_objs[rng.randrange(nodes)]
        name = obj["metadata"]["name"]
        gpu = f"GPU-{name}-{rng.randrange(gpus)}"
        pod = pod_from_api(make_pod(i, rng, {}, name, gpu, on_demand), KEYS)
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


def decide_all(
    state: ClusterState, pending: list[PodInfo], *, scan_budget: int | None
) -> list[Placement | Unschedulable]:
    """Place each pod and charge it, as the controller does."""
    results = []
    for pod in pending:
        result = place(state, pod, now=NOW, scan_budget=scan_budget)
        if isinstance(result, Placement):
            state.assume(pod, result.node, result.gpu.uuid)
        results.append(result)
    return results


def main() -> None:
    parser = command_line(
        "binder_placement",
        (
            "Measures placement decisions per second: the binder's free-memory index, the "
            "whole-class scan and the proof of concept's algorithm on the same snapshot of "
            "--nodes nodes with --gpus GPUs and --pods placed pods; --decisions and "
            "--poc-decisions per round, --rounds rounds."
        ),
    )
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pods", type=int, default=40000, help="pods already placed")
    parser.add_argument("--decisions", type=int, default=1000, help="binder decisions per round")
    parser.add_argument("--poc-decisions", type=int, default=50, help="PoC decisions per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--unbounded", action="store_true", help="the index alone, never the scan (no budget)"
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="time decisions by the wall clock, or by this process's CPU time (steadier on a"
        " machine other work loads: it leaves out the time the process waits for a core)",
    )
    parser.add_argument(
        "--on-demand", type=float, default=0.0, help="share of pods `on-demand` (0: none)"
    )
    parser.add_argument("--overcommit", default="", help="every node's over-commit label")
    args = parser.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time

    started = time.perf_counter()
    state, node_objs, bound = build(
        args.nodes, args.gpus, args.pods, args.seed, args.on_demand, args.overcommit
    )
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
    scan: list[float] = []
    poc: list[float] = []
    outcomes: dict[str, int] = defaultdict(int)
    for round_ in range(args.rounds):
        pending = []
        for _ in range(args.decisions):
            counter += 1
            shape = rng.choice(shapes)
            pending.append(
                pod_from_api(make_pod(counter, rng, shape, on_demand=args.on_demand), KEYS)
            )
        t0 = clock()
        indexed = decide_all(state, pending, scan_budget=None if args.unbounded else SCAN_BUDGET)
        ours.append(args.decisions / (clock() - t0))
        for pod in pending:  # the same pods again, on the same state, the old way
            state.forget_assumed(pod.uid)
        t0 = clock()
        scanned = decide_all(state, pending, scan_budget=0)
        scan.append(args.decisions / (clock() - t0))
        if indexed != scanned:
            wrong = next(i for i, (a, b) in enumerate(zip(indexed, scanned, strict=True)) if a != b)
            raise SystemExit(f"index and scan disagree on {pending[wrong].key}: {indexed[wrong]}"
                             f" vs {scanned[wrong]}")  # fmt: skip
        for result in indexed:
            outcomes["placed" if isinstance(result, Placement) else "unschedulable"] += 1
        t0 = clock()
        for pod in pending[: args.poc_decisions]:
            poc_decide(node_objs, pods_by_node, pod, rng)
        poc.append(args.poc_decisions / (clock() - t0))
        print(
            f"round {round_ + 1}: index {ours[-1]:8.0f} pods/s, whole-class scan {scan[-1]:8.0f},"
            f" proof of concept {poc[-1]:6.1f}; same {args.decisions} answers"
        )
    ours_median = statistics.median(ours)
    scan_median = statistics.median(scan)
    poc_median = statistics.median(poc)
    print(f"outcomes: {dict(outcomes)}; placed pods now {len(state.assigned_pods())}")
    print(
        f"median index:            {ours_median:8.0f} pods/s ({1e3 / ours_median:.3f} ms/decision)"
    )
    print(
        f"median whole-class scan: {scan_median:8.0f} pods/s ({1e3 / scan_median:.3f} ms/decision)"
    )
    print(f"median proof of concept: {poc_median:8.1f} pods/s ({1e3 / poc_median:.1f} ms/decision)")
    print(
        f"ratios: index / scan {ours_median / scan_median:.1f}x, "
        f"index / proof of concept {ours_median / poc_median:.0f}x"
    )
    # A pod that fits nowhere (an A100's worth of memory on a T4 node): every node is filtered
    # and every reason counted, the cost paid for each waiting pod when a helpful cluster change
    # retries them all.
    misfits = []
    for i in range(200):
        obj = make_pod(
            counter + 1 + i, rng, {"nodeSelector": {"gpu": "t4"}}, on_demand=args.on_demand
        )
        obj["spec"]["containers"][0]["resources"]["limits"][KEYS.gpu_mem] = "79Gi"
        misfits.append(pod_from_api(obj, KEYS))
    t0 = clock()
    refused = [place(state, pod, now=NOW) for pod in misfits]
    rate = len(misfits) / (clock() - t0)
    sample = next((r for r in refused if not isinstance(r, Placement)), None)
    print(f"unschedulable decisions: {rate:8.0f} pods/s; e.g. {getattr(sample, 'message', '-')}")


if __name__ == "__main__":
    main()
