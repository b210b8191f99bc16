"""Model hosts at scale: TritonModel replicas placed through the binder's pure core.

`--models` TritonModels of `--replicas` replicas each, in `--namespaces` namespaces, arrive in a
seeded random order, each model's replicas together (as a controller creates them); each replica
is placed by `binder.placement.place` on a `ClusterState` of `--nodes` nodes of `--node-shape`
(`benchmarks.shapes`) and charged as the binder charges what it binds (`assume`). A replica is
`binder.model.as_replica` of a pod with the model's labels and GPU memory (0.5-16 GiB,
log-uniform, the residency fleet's sizes): it takes no pod slot, its namespace's host on the
node does.

Prints the replicas placed per second (wall time) and the binder's CPU per replica (process CPU
time, one thread), the replicas refused, and the hosts used against namespaces x nodes used
(one host per (namespace, node) at most). No API server, no clock but the measurement's.

Run: .venv/bin/python -m benchmarks.model_hosts [--models 10000 --replicas 2 --namespaces 50
     --nodes 1000 --node-shape 8xA100-80GB:96:110]
"""

from __future__ import annotations

import argparse
import math
import random
import time

from benchmarks import command_line, shapes
from benchmarks import results as results_page
from binder.model import PodInfo, as_replica
from binder.placement import Placement, place
from binder.state import ClusterState

GI = 1 << 30
RESERVE = GI // 2
NOW = 1_000_000.0


def replicas(args: argparse.Namespace) -> list[PodInfo]:
    rng = random.Random(args.seed)
    out = []
    order = list(range(args.models))
    rng.shuffle(order)
    for m in order:
        namespace = f"team-{m % args.namespaces:02d}"
        name = f"model-{m:05d}"
        size = int(GI * math.exp(rng.uniform(math.log(0.5), math.log(16))))
        for r in range(args.replicas):
            pod = PodInfo(
                uid=f"{name}-{r}",
                namespace=namespace,
                name=f"{name}-{r}",
                scheduler_name="tritonshare",
                request=size,
                model_id=name,
                labels={"app": name},
                controlled=True,
                owner=f"TritonModel/{name}",
            )
            out.append(as_replica(pod))
    return out


def run(args: argparse.Namespace) -> None:
    shape: shapes.NodeShape = args.node_shape
    state = ClusterState(reserve=RESERVE)
    for i in range(args.nodes):
        name = f"node-{i:05d}"
        state.set_node(shape.node(name))
        state.set_lease(name, NOW + 3600)
    pending = replicas(args)
    print(
        f"{args.models} TritonModels x {args.replicas} replicas ({len(pending)}) in "
        f"{args.namespaces} namespaces, 0.5-16 GiB log-uniform, on {args.nodes} nodes "
        f"{shape}: {shape.describe()}; seed {args.seed}"
    )
    refused = 0
    wall, cpu = time.perf_counter(), time.process_time()
    for pod in pending:
        decision = place(state, pod, now=NOW)
        if isinstance(decision, Placement):
            state.assume(pod, decision.node, decision.gpu.uuid)
        else:
            refused += 1
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    placed = len(pending) - refused
    nodes = {name for name in state.names if state.pods_on(name)}
    hosts = state.pods.host_count()
    bound = args.namespaces * len(nodes)
    print(
        f"placed {placed}, refused {refused}; on {len(nodes)} nodes: {hosts} hosts "
        f"(namespaces x nodes used: {bound})"
    )
    print(
        f"model_hosts: {len(pending) / wall:,.0f} replicas/s, {1e3 * cpu / len(pending):.3f} ms "
        f"of binder CPU per replica; {hosts} hosts for {placed} replicas "
        f"(at most {bound}: namespaces x nodes used)"
    )


def _shape(text: str) -> shapes.NodeShape:
    try:
        return shapes.parse_shape(text)
    except shapes.ShapeError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def main() -> None:
    parser = command_line(
        "model_hosts",
        (
            "Measures how fast the binder's placement core places --models TritonModels of "
            "--replicas replicas in --namespaces namespaces on --nodes nodes (replicas per "
            "second, CPU per replica), and the model hosts they use against namespaces x nodes."
        ),
    )
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--replicas", type=int, default=2, help="per model")
    parser.add_argument("--namespaces", type=int, default=50)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument(
        "--node-shape",
        type=_shape,
        default=shapes.parse_shape("8xA100-80GB:96:110"),
        metavar="GPUSxMODEL:CPUS:PODS",
        help="the nodes (8xA100-80GB:96:110)",
    )
    parser.add_argument("--seed", type=int, default=47)
    results_page.add_flag(parser)
    args = parser.parse_args()
    for flag in ("models", "replicas", "namespaces", "nodes"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} {getattr(args, flag)}: give at least 1")
    with results_page.captured() as printed:
        run(args)
    if args.write_results is not None:
        results_page.record("model_hosts", printed.getvalue(), page=args.write_results)


if __name__ == "__main__":
    main()
