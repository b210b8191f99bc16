"""Autoscaling on concurrency, end to end: KServe's experiment on the simulated cluster.

Target concurrency 1, `--clients` callers (5) sending back to back for `--duration` seconds (30)
through the Service's ready endpoints, then idle: the simulated cluster with a real Triton on the
CPU serves a model Deployment whose ScaledObject scales it on the proxies' concurrency integral,
read by a real Prometheus (Debian's `prometheus`) and acted on by the simulated KEDA and HPA
controller (`sim.controllers.hpa`), with the production intervals by default: Prometheus scrapes
every 15 s, the HPA syncs every 15 s. Each request keeps its replica's model busy
`--request-seconds` (0.1), as a model on a GPU would, so concurrency builds up at a replica under
load. A light client keeps sending while the Deployment scales back to one replica.

Printed: the replicas asked for and Ready over time, each new replica's cold start by phase
(seconds after the pod's creation: bound, files in the pod, loaded, Ready, first answer), the
same for the replicas of a second scale-up after the scale-down, whose node kept the model's
files (unless `--once`), the
requests' latency percentiles and failures during the load, the scale-down's failures, and one
closing line:

    autoscale: target 1, concurrency 5 -> R replicas Ready in T s; cold start p50/max A/B s
    (files on the node) C/D s (files sent); ...

With `--as tritonmodel`, the same experiment on a TritonModel instead of a Deployment: its
ScaledObject's `scaleTargetRef` names the TritonModel, Prometheus scrapes the namespace's model
hosts (the query keeps the model's series, by its `model` label), and the cluster has `--nodes`
real nodes (the maximum replicas by default: a TritonModel has one replica per node at most),
each with its own Triton, agent, gateway and kubelet. Each new replica is timed by its own
phases (seconds after the TritonModel asked for it: placed, its host running, loaded on its node,
labelled to serve, its host Ready, both (in the Service's endpoints), first answer), then where
the seconds from the load's start to the last new replica's first answer go: the built-in
autoscaler's decisions (from the binder's log), that replica's phases since the load started,
and each step's median over the new replicas.

With `--autoscaler builtin` (needs `--as tritonmodel`), the binder's built-in autoscaler
scales the TritonModel instead (its spec.autoscaling: target 1, `--max-replicas`, stable window
`--window`, Knative's 60s by default): no Prometheus, HPA or ScaledObject; with `--autoscaler
both`, the built-in run and then the HPA's, each on a fresh cluster of the same layout, and one
closing line each, side by side.

With `--cost N`, no cluster: the built-in autoscaler's CPU seconds per second (one tick a
second) for N TritonModels of 1 to 5 replicas, over hosts of `--models-per-host` models each,
every host's /autoscaling answer decoded and every model decided (`binder.autoscaler.kpa`), as
`binder.autoscaler.loop`'s tick does without its network.

With `--cold-start-only`, no autoscaler and no Prometheus: the Deployment is scaled from one
replica to 1 + `--new-replicas` (files sent), back to one, and up again (the node kept the
files), under two back-to-back callers, and each new replica's phases are printed, then:

    cold start: N at once, p50/max A/B s (files on the node, K from the kept copy) C/D s
    (files sent); requests R, failed F

Run: .venv/bin/python -m benchmarks.autoscale [--clients 5 --duration 30 --max-replicas 5
     --sync-period 15 --scrape-interval 15s --signal irate --scale-down-window 30 --once
     --model-mib 0 --as pods|tritonmodel --nodes N --autoscaler hpa|builtin|both --window 60s]
     | [--cold-start-only --new-replicas 1] | [--cost 10000 --models-per-host 20]

Goals, printed as met or NOT MET (the run exits 1 when one is not, `--no-goal`: 0 anyway): no
request fails, under load or during the scale-down; the built-in autoscaler has every replica
Ready within 10 s of the load's start; with `--cost`, at most 1 CPU second a second.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import random
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks import goals
from binder.autoscaler.kpa import Decider, scaling_from
from sim.cluster import NodeSpec, SimCluster
from sim.demo import autoscale
from sim.demo.scenario import MODELS_DIR, NODES
from sim.triton import TritonInstall

NAMESPACE = "models"
KEPT_LOG = "was installed from the node's kept copy"
"""What the agent logs for an install from its kept copy (agent/api/service.py)."""


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.autoscale",
        description="KServe's concurrency autoscaling experiment on the simulated cluster "
        "(real Triton, real Prometheus, the simulated KEDA and HPA controller).",
    )
    parser.add_argument("--clients", type=int, default=5, help="callers in flight (5)")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load (30)")
    parser.add_argument("--max-replicas", type=int, default=5, help="maxReplicaCount (5)")
    parser.add_argument(
        "--sync-period", type=float, default=15.0, help="the HPA's sync period, seconds (15)"
    )
    parser.add_argument(
        "--scrape-interval", default="15s", help="Prometheus's scrape interval (15s)"
    )
    parser.add_argument(
        "--signal",
        choices=("irate", "rate"),
        default="irate",
        help="irate or rate over 1m of the concurrency integral (irate)",
    )
    parser.add_argument(
        "--scale-down-window",
        type=int,
        default=30,
        help="the HPA's scale-down stabilization window, seconds (30)",
    )
    parser.add_argument(
        "--request-seconds", type=float, default=0.1, help="model time per request (0.1)"
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="scale up once only (default: a second scale-up after the scale-down, whose "
        "replicas start on a node that kept the model's files)",
    )
    parser.add_argument(
        "--model-mib", type=int, default=0, help="MiB of weights added to the model (0)"
    )
    parser.add_argument(
        "--cold-start-only",
        action="store_true",
        help="no autoscaler: scale the Deployment from 1 to 1 + --new-replicas (files sent), "
        "back to 1, and up again (files on the node), and print each new replica's phases",
    )
    parser.add_argument(
        "--new-replicas",
        type=int,
        default=1,
        help="replicas each scale-up of --cold-start-only adds at once (1)",
    )
    parser.add_argument(
        "--as",
        dest="target",
        choices=("pods", "tritonmodel"),
        default="pods",
        help="scale a model Deployment (pods, the default) or a TritonModel (tritonmodel)",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        help="with --as tritonmodel: real nodes, each with its own Triton (--max-replicas)",
    )
    parser.add_argument(
        "--autoscaler",
        choices=("hpa", "builtin", "both"),
        default="hpa",
        help="with --as tritonmodel: the HPA of a KEDA ScaledObject (hpa, the default), the "
        "binder's built-in autoscaler (builtin), or both one after the other",
    )
    parser.add_argument(
        "--window",
        default="60s",
        help="the built-in autoscaler's stable window (60s, Knative's; 6s at least)",
    )
    parser.add_argument(
        "--cost", type=int, metavar="MODELS", help="the built-in autoscaler's CPU, no cluster"
    )
    parser.add_argument(
        "--models-per-host", type=int, default=20, help="with --cost: models per host (20)"
    )
    goals.add_flag(parser)
    args = parser.parse_args()
    if args.cost is not None:
        return goals.exit_code([cost(args.cost, args.models_per_host)], args.no_goal)
    if args.autoscaler != "hpa" and args.target != "tritonmodel":
        parser.error("the built-in autoscaler scales TritonModels: add --as tritonmodel")
    if args.new_replicas < 1:
        parser.error(f"--new-replicas must be at least 1, not {args.new_replicas}")
    if args.target == "pods" and args.nodes is not None:
        parser.error("--nodes is for --as tritonmodel: a Deployment's pods share one real node")
    if args.target == "tritonmodel" and args.cold_start_only:
        parser.error("--cold-start-only times a Deployment's pods: leave out --as tritonmodel")
    nodes = args.nodes if args.nodes is not None else args.max_replicas
    if nodes < 1:
        parser.error(f"--nodes must be at least 1, not {nodes}")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.cold_start_only:
        return cold_start_only(args.new_replicas, args.request_seconds)
    prometheus = shutil.which("prometheus")
    if prometheus is None and args.autoscaler != "builtin":
        print("prometheus is not installed: apt-get install prometheus", file=sys.stderr)
        return 2
    TritonInstall.find()  # fails early, with what to install, when nvidia-pytriton is missing
    started = time.strftime("%Y-%m-%d")
    lines = []
    met: list[bool] = []
    for which in ("builtin", "hpa") if args.autoscaler == "both" else (args.autoscaler,):
        print(f"\n== {BY[which]} ==")
        with one_node_cluster(
            "tritonshare-autoscale-", nodes if args.target == "tritonmodel" else 0
        ) as made:
            if made is None:
                return 2
            cluster, work = made
            result = autoscale.run(
                cluster,
                MODELS_DIR / "add_one",
                work / "autoscale",
                NAMESPACE,
                None if which == "builtin" else prometheus,
                clients=args.clients,
                duration=args.duration,
                max_replicas=args.max_replicas,
                sync_period=args.sync_period,
                scrape_interval=args.scrape_interval,
                scale_down_window=args.scale_down_window,
                request_seconds=args.request_seconds,
                signal=args.signal,
                again=not args.once,
                padding=args.model_mib * 1024 * 1024,
                target="tritonmodel" if args.target == "tritonmodel" else "deployment",
                window=args.window,
                say=print,
            )
            # The agents' own logs, wherever the simulated kubelet wrote them.
            log = "".join(p.read_text(errors="replace") for p in (work / "cluster").rglob("*.log"))
            binder_log = "".join(
                p.read_text(errors="replace") for p in (work / "cluster").rglob("binder-*.log")
            )
        report(args, result, log, started)
        if args.target == "tritonmodel":
            print_breakdown(
                result, scale_ups(binder_log, result.load_started) if which == "builtin" else []
            )
        lines.append(f"{BY[which]}: {result.line()}")
        met += check_goals(which, result)
    if len(lines) > 1:
        print("\nside by side:")
        for line in lines:
            print(f"  {line}")
    return goals.exit_code(met, args.no_goal)


READY_GOAL_SECONDS = 10.0
"""The built-in autoscaler: every replica Ready at most this long after the load's start."""
COST_GOAL = 1.0
"""The built-in autoscaler's CPU seconds a second, at most (`--cost`)."""


def check_goals(which: str, result: autoscale.AutoscaleResult) -> list[bool]:
    """One run's goals, each printed with met or NOT MET."""
    met = [
        goals.check(f"{BY[which]}: requests failed under load", len(result.failed), 0),
        goals.check(f"{BY[which]}: requests failed in the scale-down",
                    len(result.scale_down_failed), 0),
    ]  # fmt: skip
    if which == "builtin":
        ready = float("inf") if result.ready_after is None else result.ready_after
        met.append(
            goals.check(f"{BY[which]}: every replica Ready", ready, READY_GOAL_SECONDS, unit=" s")
        )
    return met


BY = {
    "builtin": "the built-in autoscaler",
    "hpa": "KEDA's HPA through Prometheus",
}


def report(
    args: argparse.Namespace, result: autoscale.AutoscaleResult, log: str, started: str
) -> None:
    """Print one run's figures."""
    print(f"\n{started}, `{' '.join(['python -m benchmarks.autoscale', *sys.argv[1:]])}`")
    print("replicas over time (s since the load started: asked / Ready):")
    for at, asked, ready in result.timeline:
        print(f"  {at:6.1f} s  {asked} / {ready}")
    created = (
        "the TritonModel asked for it" if args.target == "tritonmodel" else "the pod was created"
    )
    phases = autoscale.REPLICA_PHASES if args.target == "tritonmodel" else autoscale.PHASES
    print_phases(f"cold start of each new replica (s after {created}):", result.cold_starts, phases)
    if result.kept_starts:
        print_phases(
            "cold start of each replica of the second scale-up (files on the node):",
            result.kept_starts,
            phases,
        )
    print(
        f"requests under load: {result.requests}, failed {len(result.failed)}; latency "
        f"p50 {result.percentile(0.5) * 1000:.0f} ms, p90 {result.percentile(0.9) * 1000:.0f} "
        f"ms, p99 {result.percentile(0.99) * 1000:.0f} ms"
    )
    print(
        f"scale-down: {result.scale_down_requests} requests, failed {len(result.scale_down_failed)}"
    )
    for failure in (result.failed + result.scale_down_failed)[:5]:
        print(f"  failed: {failure}")
    for condition in result.hpa_status.get("conditions") or ():
        print(
            f"HPA {condition['type']}={condition['status']} ({condition['reason']}): "
            f"{condition['message']}"
        )
    print(
        f"installs on the node: {log.count('was received from pod')} sent, "
        f"{log.count(KEPT_LOG)} from the node's kept copy"
    )
    print(result.line())


SCALES = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) .*TritonModel \S+/scaler scales from (\d+): "
    r"New size: (\d+)",
    re.MULTILINE,
)
"""The built-in autoscaler's log line of a decision (`binder.autoscaler.loop`), local time."""


def scale_ups(log: str, since: float) -> list[tuple[float, int]]:
    """The built-in autoscaler's scale-ups in the binder's `log`: (seconds after the epoch
    time `since`, the new size)."""
    found = []
    for stamp, millis, before, after in SCALES.findall(log):
        at = time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000
        if int(after) > int(before) and at >= since - 1:
            found.append((at - since, int(after)))
    return found


def print_breakdown(result: autoscale.AutoscaleResult, decisions: list[tuple[float, int]]) -> None:
    """Where the seconds from the load's start to the last new replica serving go: the
    autoscaler's decisions, then the phases of the replica that answered last, then each
    step's median over the new replicas."""
    starts = [s for s in result.since_load if "first answer" in s]
    if not starts:
        print("where the time goes: no new replica answered")
        return
    print("where the time goes (s since the load started):")
    for at, size in decisions:
        print(f"  {at:6.2f}  the autoscaler decides {size} replicas (binder log)")
    last = max(starts, key=lambda s: s["first answer"])
    for phase in ("asked", *autoscale.REPLICA_PHASES):
        if phase in last:
            print(f"  {last[phase]:6.2f}  {phase} (the replica answering last)")
    print(f"each step, median over {len(starts)} new replicas (s):")
    for step, seconds in autoscale.steps(starts):
        print(f"  {seconds:6.2f}  {step}")


def cost(models: int, per_host: int, ticks: int = 30, seed: int = 1) -> bool:
    """The built-in autoscaler's CPU per tick for `models` TritonModels (no cluster)."""
    rng = random.Random(seed)
    scaling = scaling_from({"target": 1, "maxReplicas": 5})
    placed = [rng.randint(1, 5) for _ in range(models)]
    host_count = max(1, math.ceil(sum(placed) / per_host))
    hosts_of = [rng.sample(range(host_count), min(r, host_count)) for r in placed]
    models_of: list[list[int]] = [[] for _ in range(host_count)]
    for model, hosts in enumerate(hosts_of):
        for host in hosts:
            models_of[host].append(model)
    held = [[0.0, 0] for _ in range(models)]
    deciders = [Decider() for _ in range(models)]
    spent = 0.0
    for tick in range(ticks):
        for model in range(models):  # the proxies' side: not the autoscaler's CPU
            held[model][0] += rng.random() * 3
            held[model][1] += rng.randint(0, 30)
        answers = [json.dumps({f"model-{m:05d}": held[m] for m in ms}).encode() for ms in models_of]
        began = time.process_time()
        counts = [json.loads(answer) for answer in answers]
        for model, decider in enumerate(deciders):
            name = f"model-{model:05d}"
            counters = {str(h): counts[h][name][0] for h in hosts_of[model]}
            decider.observe(float(tick), counters, scaling)
            decider.decide(float(tick), scaling, placed[model], placed[model])
        spent += time.process_time() - began
    per_second = spent / ticks
    print(
        f"{time.strftime('%Y-%m-%d')}, "
        f"`{' '.join(['python -m benchmarks.autoscale', *sys.argv[1:]])}`\n"
        f"autoscaler cost: {models} TritonModels, {sum(placed)} replicas on {host_count} hosts "
        f"({per_host} models a host): {per_second:.3f} CPU s per second (one tick a second), "
        f"{per_second / models * 1e6:.1f} us a model"
    )
    return goals.check("the built-in autoscaler's CPU a second", per_second, COST_GOAL, unit=" s")


@contextlib.contextmanager
def one_node_cluster(prefix: str, real_nodes: int = 0) -> Iterator[tuple[SimCluster, Path] | None]:
    """The simulated cluster the runs use (the webhook, the models' namespace; one node, or
    `real_nodes` one-T4 nodes each with its own Triton) in a temporary directory, with that
    directory; None, said on stderr, when it misses a part."""
    nodes = [NODES[0]]
    if real_nodes:
        nodes = [NodeSpec(f"t4-node-{i}", "1xT4", real=True) for i in range(real_nodes)]
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        work = Path(tmp)
        with SimCluster(work / "cluster", nodes, binders=1, webhook=True) as cluster:
            if cluster.missing:
                print(f"the simulated cluster is missing {cluster.missing}", file=sys.stderr)
                yield None
                return
            cluster.core.create_namespace({"metadata": {"name": NAMESPACE}})
            yield cluster, work


def print_phases(
    title: str, starts: list[dict[str, float]], names: tuple[str, ...] = autoscale.PHASES
) -> None:
    print(title)
    print("  " + "  ".join(f"{phase:>16}" for phase in names))
    for phases in starts:
        cells = (f"{phases[p]:16.2f}" if p in phases else f"{'-':>16}" for p in names)
        print("  " + "  ".join(cells))


def cold_start_only(new_replicas: int, request_seconds: float) -> int:
    """Scale 1 -> 1 + `new_replicas` -> 1 -> 1 + `new_replicas` and print the new replicas'
    phases: the cold start alone, without Prometheus and the HPA's periods around it."""
    TritonInstall.find()
    started = time.strftime("%Y-%m-%d")
    with one_node_cluster("tritonshare-coldstart-") as made:
        if made is None:
            return 2
        cluster, work = made
        result = autoscale.cold_starts(
            cluster,
            MODELS_DIR / "add_one",
            work / "coldstart",
            NAMESPACE,
            replicas=new_replicas,
            request_seconds=request_seconds,
            say=print,
        )
    print(f"\n{started}, `{' '.join(['python -m benchmarks.autoscale', *sys.argv[1:]])}`")
    print_phases("files sent (s after the pod was created):", result.sent)
    print_phases("files on the node (s after the pod was created):", result.kept)
    for failure in result.failed[:5]:
        print(f"  failed: {failure}")
    print(result.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
