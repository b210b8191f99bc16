"""End to end through sim/: watch -> decide -> annotate -> bind, 5,000 GPU nodes by default.

The simulated API server runs in this process (its audit log is the independent count of API
calls); nodes with agent leases and `--placed` pods already bound to their GPUs, each with the
proof of placement the binder would have written (the binder charges only proven pods), are
created through the official client.

`--mode process` (default): `python -m binder` runs as its own process (from `--binder-root`, so
two trees can be compared side by side). Once it is ready, it is stopped (SIGSTOP), `--pods` pods
are created by 8 client threads, and it is resumed, so they reach it at once (`--no-burst`
creates them while it runs: the load generator then sets the pace). Figures: decisions per second
(bound pods over the time from the release to the last binding), the binder process's CPU per
bound pod (user + system, from psutil, over the same span; split into its event loop thread and
the others), API writes per pod from the audit log, and release-to-bind (or create-to-bind)
percentiles. The API server and the load generator share this process, the binder has its own:
on a 2-core machine they compete.

`--mode in-process`: the former measurement: the binder runs in this process and starts on a
backlog of pending pods; pods per second until the watch shows every pod bound.

In both, the proof of concept's algorithm then runs on the same server for `--poc-pods` pods: for
each decision it lists the nodes and, for every node, that node's pods.

Workloads (`--workloads plain,anti-affinity,spread`): plain model pods; replicas of a model
(8 pods sharing a label) with a required pod anti-affinity on `kubernetes.io/hostname`; replicas
with a zone and a hostname topology spread (DoNotSchedule, maxSkew 1). Every node offers
allocatable CPU, memory and pods, partly used by the placed model pods and by `--others` pods of
another scheduler, so NodeResourcesFit judges every node.

Goals, checked in code for the plain workload (`benchmarks.goals`; exit 1 when one is not met,
`--no-goal` to explore): at least DECISIONS_GOAL decisions a second and at most CPU_GOAL_MS of the
binder's CPU per bound pod (at the default scale: 5,000 nodes, 10,000 pods released at once);
and with `--baseline-root`, for every workload, no more than BASELINE_CPU_RATIO of the baseline
tree's CPU per bound pod, medians of the same run.

Run: .venv/bin/python -m benchmarks.binder_e2e [--nodes 5000 --gpus 8 --placed 40000 --pods 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import kubernetes.client

from benchmarks import command_line, goals
from binder.app import Binder
from binder.settings import Settings
from common.contract import Keys, agent_lease_name
from common.lifecycle import Lifecycle
from common.proofs import Claim, KeyRing, load_key_ring
from common.quantity import parse_quantity
from sim.apiserver import RunningApiServer, start_in_thread
from sim.cluster import write_placement_keys
from sim.triton import free_port

DECISIONS_GOAL = 1000.0
"""Plain model pods placed a second, at least (medians, the tree measured)."""
CPU_GOAL_MS = 0.5
"""The binder's CPU per bound plain model pod, at most (ms)."""
BASELINE_CPU_RATIO = 1.10
"""CPU per bound pod against the baseline tree's, at most, for every workload."""

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
    zone = f"zone-{i % 4}"
    return {
        "metadata": {
            "name": name,
            "labels": {
                "zone": zone,
                "topology.kubernetes.io/zone": zone,
                "kubernetes.io/hostname": name,
            },
            "annotations": {KEYS.gpus: json.dumps(listing), KEYS.gpu_mem_total: str(memory * gpus)},
        },
        "spec": {"taints": taints},
        "status": {"allocatable": NODE_ALLOCATABLE, "capacity": NODE_ALLOCATABLE},
    }


NODE_ALLOCATABLE = {"cpu": "64", "memory": "256Gi", "ephemeral-storage": "500Gi", "pods": "110"}
MODEL_REQUESTS = {"cpu": "100m", "memory": "128Mi"}
"""Every model pod's proxy asks this beside its GPU memory (so NodeResourcesFit has work)."""
OTHER_REQUESTS = {"cpu": "8", "memory": "32Gi"}
"""Each pod of another scheduler bound on a node (`--others`) asks this."""
REPLICAS = 8
"""Pods per model (one label set, as a Deployment's) in the affinity and spread workloads."""
WORKLOADS = ("plain", "anti-affinity", "spread")


def other_body(i: int, nodes: int) -> dict[str, Any]:
    """A pod of the default scheduler, already bound, holding CPU and memory on its node."""
    return {
        "metadata": {"name": f"other-{i}", "labels": {"app": "web"}},
        "spec": {
            "schedulerName": "default-scheduler",
            "nodeName": f"node-{i % nodes:04d}",
            "containers": [
                {"name": "web", "image": "web", "resources": {"requests": OTHER_REQUESTS}}
            ],
        },
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


def placed_body(i: int, nodes: int, gpus: int, rng: random.Random) -> dict[str, Any]:
    """A model pod already bound to a node and GPU (as the binder leaves them): 1-3Gi per pod,
    about one pod per GPU, so no GPU is over its 16Gi."""
    node = f"node-{i % nodes:04d}"
    gpu = (i // nodes) % gpus
    return {
        "metadata": {
            "name": f"placed-{i}",
            "annotations": {KEYS.model_id: f"placed-{i}", KEYS.gpu: f"GPU-{node}-{gpu}"},
        },
        "spec": {
            "schedulerName": "tritonshare",
            "nodeName": node,
            "containers": [
                {
                    "name": "proxy",
                    "image": "tritonshare/proxy",
                    "resources": {
                        "limits": {KEYS.gpu_mem: rng.choice(["1Gi", "2Gi", "3Gi"])},
                        "requests": MODEL_REQUESTS,
                    },
                }
            ],
        },
    }


def pod_body(
    i: int, rng: random.Random, prefix: str = "pod", run: str = "", workload: str = "plain"
) -> dict[str, Any]:
    """A pending model pod. `anti-affinity`: replicas of a model (REPLICAS pods sharing a label)
    must be on distinct nodes; `spread`: they spread over zones (maxSkew 1) and nodes (maxSkew
    1), both DoNotSchedule."""
    spec: dict[str, Any] = {
        "schedulerName": "tritonshare",
        "containers": [
            {
                "name": "proxy",
                "image": "tritonshare/proxy",
                "resources": {
                    "limits": {KEYS.gpu_mem: rng.choice(["1Gi", "2Gi", "3Gi"])},
                    "requests": MODEL_REQUESTS,
                },
            }
        ],
    }
    app = {"app": f"{run or prefix}-model-{i // REPLICAS}"}
    if workload == "anti-affinity":
        spec["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": app}, "topologyKey": "kubernetes.io/hostname"}
                ]
            }
        }
    elif workload == "spread":
        spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": key,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": app},
            }
            for key in ("topology.kubernetes.io/zone", "kubernetes.io/hostname")
        ]
    if i % 3 == 0:
        spec["nodeSelector"] = {"zone": f"zone-{i % 4}"}
    if i % 5 == 0:
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    metadata: dict[str, Any] = {
        "name": f"{prefix}-{i}",
        "annotations": {KEYS.model_id: f"model-{i // REPLICAS}"},
        "labels": dict(app),
    }
    if run:
        metadata["labels"]["benchmark-run"] = run
    return {"metadata": metadata, "spec": spec}


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


def create_all(core: Any, bodies: list[dict[str, Any]], what: str) -> dict[str, float]:
    """Create every body with 8 client threads; when each create returned (wall clock, the
    API server's clock too), by name."""

    def create(body: dict[str, Any]) -> tuple[str, float]:
        if what == "node":
            core.create_node(body)
        elif what == "lease":
            coordination: Any = kubernetes.client.CoordinationV1Api(core.api_client)
            coordination.create_namespaced_lease(SYSTEM, body)
        else:
            core.create_namespaced_pod("default", body)
        return str(body["metadata"]["name"]), time.time()

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return dict(pool.map(create, bodies))


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0.0


def readyz(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def create_placed(core: Any, bodies: list[dict[str, Any]], ring: KeyRing) -> None:
    """Create the placed pods with 8 client threads, each with the proof of placement the
    binder would have written (it charges only proven pods; the uid is the server's)."""

    def create(body: dict[str, Any]) -> None:
        created = core.create_namespaced_pod("default", body)
        annotations = body["metadata"]["annotations"]
        limit = body["spec"]["containers"][0]["resources"]["limits"][KEYS.gpu_mem]
        claim = Claim(
            created.metadata.uid,
            "default",
            body["metadata"]["name"],
            body["spec"]["nodeName"],
            annotations[KEYS.gpu],
            annotations[KEYS.model_id],
            parse_quantity(limit),
        )
        proof = {"metadata": {"annotations": {KEYS.placement: ring.sign(claim)}}}
        core.patch_namespaced_pod(body["metadata"]["name"], "default", proof)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(create, bodies))


def build_cluster(core: Any, args: argparse.Namespace, rng: random.Random, key_dir: Path) -> None:
    started = time.perf_counter()
    nodes = [node_body(i, args.gpus) for i in range(args.nodes)]
    create_all(core, nodes, "node")
    create_all(core, [lease_body(n["metadata"]["name"]) for n in nodes], "lease")
    placed = [placed_body(i, args.nodes, args.gpus, rng) for i in range(args.placed)]
    create_placed(core, placed, load_key_ring(key_dir))
    create_all(core, [other_body(i, args.nodes) for i in range(args.others)], "pod")
    print(
        f"cluster: {args.nodes} nodes x {args.gpus} GPUs (16Gi each), allocatable"
        f" {NODE_ALLOCATABLE}; {args.placed} placed model pods ({MODEL_REQUESTS} each),"
        f" {args.others} pods of another scheduler ({OTHER_REQUESTS} each);"
        f" created in {time.perf_counter() - started:.1f} s"
    )


def _thread_cpu(process: Any, tid: int) -> float:
    """CPU seconds (user + system) of one thread of a psutil process; 0 if it is gone."""
    for thread in process.threads():
        if thread.id == tid:
            return float(thread.user_time + thread.system_time)
    return 0.0


def run_process(
    args: argparse.Namespace,
    server: RunningApiServer,
    core: Any,
    root: Path,
    run: str,
    key_dir: Path,
    workload: str = "plain",
) -> dict[str, float]:
    """The binder from `root` as a process; the pods (labelled with `run`) created at once while
    it is stopped, or live. Prints the figures and returns them."""
    import psutil

    rng = random.Random(args.seed + 1)  # the same pods for every run
    bodies = [pod_body(i, rng, run=run, workload=workload) for i in range(args.pods)]
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = server.write_kubeconfig(Path(tmp) / "kubeconfig")
        port = free_port()
        env = {**os.environ, "PYTHONPATH": str(root)}
        log_path = Path(tmp) / "binder.log"
        argv = [
            sys.executable, "-m", "binder", "--kubeconfig", str(kubeconfig),
            "--listen-http", f"127.0.0.1:{port}", "--leader-elect", "false",
            "--bind-workers", str(args.bind_workers),
            "--log-level", args.binder_log_level,
        ]  # fmt: skip
        # A binder from before proofs of placement (--binder-root) has no key to be given.
        if "placement-key-dir" in (root / "binder" / "settings.py").read_text():
            argv += ["--placement-key-dir", str(key_dir)]
        with log_path.open("w") as log_file:
            process = subprocess.Popen(argv, cwd=root, env=env, stderr=log_file)
        try:
            t0 = time.perf_counter()
            while not readyz(port):
                if process.poll() is not None or time.perf_counter() - t0 > args.timeout:
                    raise SystemExit(
                        f"the binder did not get ready: {log_path.read_text()[-2000:]}"
                    )
                time.sleep(0.05)
            print(f"binder process from {root}: ready in {time.perf_counter() - t0:.1f} s")
            watched = psutil.Process(process.pid)
            server.audit.clear()
            cpu0 = watched.cpu_times()
            loop0 = _thread_cpu(watched, process.pid)
            if args.burst:
                watched.suspend()  # the pods reach its watch at once when it resumes
            t0 = time.perf_counter()
            created_at = create_all(core, bodies, "pod")
            created = time.perf_counter() - t0
            if args.burst:
                watched.resume()
            released = time.time()

            def bound() -> int:
                return sum(
                    1 for r in server.audit if r.subresource == "binding" and r.code in (200, 201)
                )

            while bound() < args.pods and time.perf_counter() - t0 < args.timeout:
                time.sleep(0.1)
            cpu1 = watched.cpu_times()
            loop1 = _thread_cpu(watched, process.pid)
            rss = watched.memory_info().rss
        finally:
            process.terminate()
            process.wait(timeout=60)
        relists = log_path.read_text().count("too old to resume")
    records = server.audit.snapshot()
    # From the moment the binder could see the pod: its create, or the burst's release.
    start = {name: max(at, released) if args.burst else at for name, at in created_at.items()}
    bound_at = {
        r.name: r.time for r in records if r.subresource == "binding" and r.code in (200, 201)
    }
    latencies = [bound_at[n] - start[n] for n in bound_at if n in start]
    span = max(bound_at.values()) - min(start.values()) if bound_at else 0.0
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    ours = [r for r in records if r.user_agent.startswith("tritonshare-binder/")]
    writes = Counter(
        f"{r.verb} {r.resource}{'/' + r.subresource if r.subresource else ''}"
        for r in ours
        if r.is_write
    )
    count = max(len(bound_at), 1)
    loop_cpu = loop1 - loop0
    figures = {
        "decisions/s": len(bound_at) / span if span else 0.0,
        "binder CPU ms per bound pod": 1e3 * cpu / count,
        "  of which user ms": 1e3 * (cpu1.user - cpu0.user) / count,
        "  of which system ms": 1e3 * (cpu1.system - cpu0.system) / count,
        "  event loop thread ms": 1e3 * loop_cpu / count,
        "  other threads ms": 1e3 * (cpu - loop_cpu) / count,
        "API writes per bound pod": sum(writes.values()) / count,
        "pods bound": float(len(bound_at)),
        "to-bind p50 ms": 1e3 * percentile(latencies, 0.5),
        "to-bind p90 ms": 1e3 * percentile(latencies, 0.9),
        "to-bind p99 ms": 1e3 * percentile(latencies, 0.99),
        "binder RSS MiB": rss / 2**20,
    }
    how = "while the binder was stopped, then released at once" if args.burst else "live"
    print(f"created {args.pods} pods in {created:.1f} s (8 client threads, {how})")
    print(
        f"binder: {len(bound_at)} of {args.pods} pods bound in {span:.1f} s: "
        f"{len(bound_at) / span if span else 0:.0f} decisions/s; "
        f"binder CPU {cpu:.1f} s = {1e3 * cpu / count:.2f} ms per bound pod "
        f"({100 * cpu / span if span else 0:.0f}% of a core); of which the event loop thread "
        f"(placement, cache) {1e3 * (loop1 - loop0) / count:.2f} ms, the other threads (API "
        f"calls, watch decoding) {1e3 * (cpu - (loop1 - loop0)) / count:.2f} ms; resident "
        f"memory {rss / 2**20:.0f} MiB"
    )
    print(
        f"binder: API writes per bound pod {sum(writes.values()) / count:.2f} ({dict(writes)});"
        f" all requests per pod {len(ours) / count:.2f}; watches relisted after 410: {relists}"
    )
    print(
        ("release-to-bind: " if args.burst else "create-to-bind: ")
        + ", ".join(
            f"p{int(q * 100)} {1e3 * percentile(latencies, q):.0f} ms" for q in (0.5, 0.9, 0.99)
        )
        + f", max {1e3 * max(latencies, default=0.0):.0f} ms"
    )
    return figures


def forget_run(core: Any, server: RunningApiServer, run: str, timeout: float) -> None:
    """Delete a run's pods at once (grace 0), so the next run starts from the same cluster."""
    core.delete_collection_namespaced_pod(
        "default", label_selector=f"benchmark-run={run}", grace_period_seconds=0
    )
    deadline = time.perf_counter() + timeout
    while core.list_namespaced_pod("default", label_selector=f"benchmark-run={run}").items:
        if time.perf_counter() > deadline:
            raise SystemExit(f"the pods of run {run} were not deleted in {timeout:.0f} s")
        time.sleep(0.2)


def run_trees(
    args: argparse.Namespace, server: RunningApiServer, core: Any, key_dir: Path
) -> list[bool]:
    """Per workload, each tree `--repeat` times, alternating, on the same cluster; then the
    comparison, and the goals checked (whether each is met)."""
    trees = {f"baseline {args.baseline_root}": args.baseline_root} if args.baseline_root else {}
    trees[f"this {args.binder_root}"] = args.binder_root
    results: list[bool] = []
    for workload in args.workloads.split(","):
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for repeat in range(args.repeat):
            for number, (name, root) in enumerate(trees.items()):  # alternating: drift hits both
                run = f"{workload}-r{repeat}-{number}"
                print(f"-- {workload}: {name}, run {repeat + 1} of {args.repeat}")
                figures = run_process(
                    args, server, core, Path(root).resolve(), run, key_dir, workload
                )
                runs[name].append(figures)
                forget_run(core, server, run, args.timeout)
        medians = medians_of(runs)
        if len(trees) > 1 or args.repeat > 1:
            print(f"\nworkload {workload}:")
            compare(runs)
        results += check_goals(workload, medians, bool(args.baseline_root))
    return results


def check_goals(workload: str, medians: dict[str, dict[str, float]], baseline: bool) -> list[bool]:
    """The goals of one workload's medians (the tree measured is the last, the baseline the
    first): printed beside their figures, whether each is met."""
    names = list(medians)
    this = medians[names[-1]]
    cpu = "binder CPU ms per bound pod"
    results = []
    if workload == "plain":
        results.append(goals.check("plain decisions/s", this["decisions/s"], DECISIONS_GOAL, ">="))
        results.append(
            goals.check("plain binder CPU per bound pod", this[cpu], CPU_GOAL_MS, "<=", " ms")
        )
    if baseline and medians[names[0]][cpu]:
        ratio = this[cpu] / medians[names[0]][cpu]
        results.append(
            goals.check(
                f"{workload} CPU per bound pod / baseline's", ratio, BASELINE_CPU_RATIO, "<=", "x"
            )
        )
    return results


def medians_of(runs: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Each tree's figures, the median of its runs."""
    return {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in runs.items()}


def compare(runs: dict[str, list[dict[str, float]]]) -> None:
    """Medians per tree, side by side, and the ratio of the last tree to the first."""
    names = list(runs)
    medians = medians_of(runs)
    width = max(len(n) for n in names) + 2
    print(f"\nmedians over {len(runs[names[0]])} run(s) per tree, same cluster, same pods:")
    print(f"{'':30}" + "".join(f"{n:>{width}}" for n in names) + f"{'ratio':>10}")
    for key in medians[names[0]]:
        first, last = medians[names[0]][key], medians[names[-1]][key]
        ratio = f"{last / first:9.2f}x" if first else f"{'-':>10}"
        print(f"{key:30}" + "".join(f"{medians[n][key]:{width}.2f}" for n in names) + ratio)


async def run(args: argparse.Namespace) -> list[bool]:
    """The benchmark; whether each goal checked is met (the in-process mode checks none)."""
    server = start_in_thread()
    client: Any = server.api_client()
    core: Any = kubernetes.client.CoreV1Api(client)
    rng = random.Random(args.seed)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            # One key for the whole run: the placed pods are signed with it, every binder holds it.
            key_dir = write_placement_keys(Path(tmp) / "placement-key")
            build_cluster(core, args, rng, key_dir)
            results: list[bool] = []
            if args.mode == "process":
                results = run_trees(args, server, core, key_dir)
            else:
                await run_in_process(args, server, core, rng, key_dir)
        run_poc(args, server, core, rng)
        return results
    finally:
        client.close()
        server.stop()


async def run_in_process(
    args: argparse.Namespace,
    server: RunningApiServer,
    core: Any,
    rng: random.Random,
    key_dir: Path,
) -> None:
    """The binder in this process, starting on a backlog of pending pods."""
    create_all(core, [pod_body(i, rng) for i in range(args.pods)], "pod")
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = server.write_kubeconfig(Path(tmp) / "kubeconfig")
        settings = Settings(
            kubeconfig=str(kubeconfig),
            placement_key_dir=key_dir,
            listen_http=("127.0.0.1", 0),
            leader_elect=False,
            bind_workers=args.bind_workers,
        )
        binder = Binder(settings)
        lifecycle = Lifecycle()
        t0 = time.perf_counter()
        await binder.start(lifecycle)
        warm = time.perf_counter() - t0
        server.audit.clear()
        t0 = time.perf_counter()
        while binder.cache.pending or binder.cache.state.assumed_uids():
            await asyncio.sleep(0.02)
            if time.perf_counter() - t0 > args.timeout:
                break
        elapsed = time.perf_counter() - t0
        bound = binder.controller.bound
        lifecycle.request_stop("the benchmark is over")
        await lifecycle.shutdown()
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
    print(f"binder: {binder_rate:.0f} pods/s (watch -> decide -> annotate -> bind -> seen bound)")
    print(
        f"binder: API writes per scheduled pod {sum(writes.values()) / max(bound, 1):.2f} "
        f"({dict(writes)}); all requests per pod {len(ours) / max(bound, 1):.2f}"
    )


def run_poc(
    args: argparse.Namespace, server: RunningApiServer, core: Any, rng: random.Random
) -> None:
    if not args.poc_pods:
        return
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


def main() -> None:
    parser = command_line(
        "binder_e2e",
        (
            "Measures the binder end to end through sim/ (watch, decide, annotate, bind): "
            "decisions per second, binder CPU and API writes per pod and release-to-bind "
            "percentiles for --pods pods on --nodes nodes of --gpus GPUs with --placed pods "
            "already bound; --workloads picks plain, anti-affinity or spread pods, "
            "--binder-root and --baseline-root compare two trees."
        ),
    )
    parser.add_argument("--mode", choices=("process", "in-process"), default="process")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--placed", type=int, default=40000, help="pods already bound")
    parser.add_argument("--pods", type=int, default=10000, help="pods to schedule")
    parser.add_argument(
        "--others",
        type=int,
        default=5000,
        help="pods of another scheduler already bound, each holding CPU and memory",
    )
    parser.add_argument(
        "--workloads",
        default="plain",
        help=f"comma-separated, of {', '.join(WORKLOADS)}: plain model pods, pods with a required "
        "anti-affinity on hostname, pods with a zone and a hostname topology spread",
    )
    parser.add_argument("--poc-pods", type=int, default=1)
    parser.add_argument("--binder-root", default=".", help="tree to run `python -m binder` from")
    parser.add_argument(
        "--baseline-root",
        default="",
        help="a second tree (such as `git archive main binder common` unpacked) run on the same "
        "cluster and pods in the same invocation, printed beside --binder-root with ratios",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per tree (medians printed)")
    parser.add_argument("--binder-log-level", default="INFO")
    parser.add_argument(
        "--burst",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="stop the binder (SIGSTOP) while the pods are created, so they reach it at once; "
        "--no-burst creates them while it runs (the load generator then sets the pace)",
    )
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--bind-workers", type=int, default=8)
    goals.add_flag(parser)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    sys.exit(goals.exit_code(asyncio.run(run(args)), args.no_goal))


if __name__ == "__main__":
    main()
