"""Model hosts at scale: TritonModel replicas placed through the binder's pure core.

`--models` TritonModels of `--replicas` replicas each, in `--namespaces` namespaces, arrive in a
seeded random order, each model's replicas together (as a controller creates them); each replica
is placed by `binder.framework.placement.place` on a `ClusterState` of `--nodes` nodes of
`--node-shape` (`benchmarks.shapes`) and charged as the binder charges what it binds (`assume`). A
replica is `binder.cluster.modelviews.as_replica` of a pod with the model's labels and GPU memory
(0.5-16 GiB, log-uniform, the residency fleet's sizes): it takes no pod slot, its namespace's host
on the node does.

Prints the replicas placed per second (wall time) and the binder's CPU per replica (process CPU
time, one thread), the replicas refused, and the hosts used against namespaces x nodes used
(one host per (namespace, node) at most). No API server, no clock but the measurement's.

Then the same models under attack, through the placing half of the model controller's turns
(`Turns`: a queue as the binder's, in turns by namespace with backoff, and the controller's
`binder.tritonmodels.placer`, without API writes): beside them, a namespace holds `--unplaceable`
models of 200 GiB (more than any GPU) and one of 1 GiB scaled to `--scale-bomb` replicas. Prints
the same figures, and how long a new model of another namespace waits for its replicas once every
attacking model is due again.

Goal, for each of the two: at least 1,000 replicas placed a second and at most 0.5 ms of binder
CPU a replica; printed as met or NOT MET, the run exits 1 when one is not (`--no-goal`: 0 anyway).

Run: .venv/bin/python -m benchmarks.model_hosts [--models 10000 --replicas 2 --namespaces 50
     --nodes 1000 --node-shape 8xA100-80GB:96:110 --unplaceable 10000 --scale-bomb 1000000000]
     [--no-goal]
"""

from __future__ import annotations

import argparse
import math
import random
import time

from benchmarks import command_line, goals, shapes
from benchmarks import results as results_page
from binder.autoscaler.room import Room
from binder.cluster.clusterstate import ClusterState
from binder.cluster.ledger import Ledger
from binder.cluster.modelviews import ModelInfo, as_replica, model_from_api
from binder.cluster.objects import PodInfo
from binder.framework.noderules import NODE_RULES
from binder.framework.placement import Placement, place
from binder.framework.queue import SchedulingQueue
from binder.tritonmodels.controller import EVENT_BACKOFF_MAX_SECONDS, RETRY_SECONDS
from binder.tritonmodels.placer import ReplicaPlacer
from binder.tritonmodels.replicabook import ReplicaBook
from binder.tritonmodels.serving import Serving
from common.contract import Keys
from common.proofs import KeyRing

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


def cluster(args: argparse.Namespace) -> ClusterState:
    shape: shapes.NodeShape = args.node_shape
    state = ClusterState(rules=NODE_RULES, reserve=RESERVE)
    for i in range(args.nodes):
        name = f"node-{i:05d}"
        state.set_node(shape.node(name))
        state.set_lease(name, time.time() + 3600)
    return state


def run(args: argparse.Namespace) -> list[bool]:
    shape: shapes.NodeShape = args.node_shape
    state = cluster(args)
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
    return check_goals("", len(pending) / wall, 1e3 * cpu / len(pending))


RATE_GOAL = 1000.0
"""Replicas placed a second, at least."""
CPU_GOAL_MS = 0.5
"""Milliseconds of binder CPU a replica, at most."""


def check_goals(where: str, rate: float, cpu_ms: float) -> list[bool]:
    """The goals of one placement run, each printed with met or NOT MET."""
    return [
        goals.check(f"replicas placed a second{where}", rate, RATE_GOAL, ">="),
        goals.check(f"binder CPU a replica{where}", cpu_ms, CPU_GOAL_MS, unit=" ms"),
    ]


KEYS = Keys()


def tritonmodel(namespace: str, name: str, replicas: int, memory: int) -> ModelInfo:
    """The model the binder's cache makes of such a TritonModel."""
    obj = {
        "metadata": {"uid": f"{namespace}.{name}", "namespace": namespace, "name": name},
        "spec": {
            "storageUri": "https://models.example.com/m.tar.gz",
            "gpuMemory": str(memory),
            "replicas": replicas,
        },
    }
    return model_from_api(obj, KEYS, "tritonshare")


class Turns:
    """The placing half of the model controller's turns, without its API writes: the models of
    `ledger` taken from a queue as the binder's (in turns by namespace; a refused one backs off,
    capped) and placed by the controller's placer."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self.queue = SchedulingQueue(
            initial_seconds=RETRY_SECONDS, event_backoff_max=EVENT_BACKOFF_MAX_SECONDS
        )
        book = ReplicaBook(ledger, drain_seconds=30.0, clock=time.monotonic)
        self.placer = ReplicaPlacer(
            ledger,
            keys=KEYS,
            policy="binpack",
            placement_keys=lambda: RING,
            serving=Serving(ledger, KEYS, book, Room()),
            book=book,
            drain_seconds=30.0,
            preemption=True,
            clock=time.monotonic,
            changed=self.changed,
        )

    def changed(self, uid: str) -> None:
        model = self._ledger.models.get(uid)
        self.queue.add(uid, model.namespace if model is not None else "")

    def turn(self) -> tuple[ModelInfo, int, str] | None:
        """The next model's turn: the model, its replicas placed, and its refusal. None: no
        model's turn is due."""
        uid = self.queue.pop_ready()
        model = self._ledger.models.get(uid) if uid is not None else None
        if uid is None or model is None:
            return None
        outcome = self.placer.place(model)
        if outcome.refusal:
            self.queue.backoff(uid, capped=True)
        elif outcome.unfinished:
            self.queue.add(uid)  # its next turn after the other namespaces'
        else:
            self.queue.remove(uid)
        return model, len(outcome.placed), outcome.refusal


RING = KeyRing(b"k" * 32)


def add(ledger: Ledger, models: Turns, model: ModelInfo) -> None:
    ledger.models[model.uid] = model
    ledger.by_namespace.setdefault(model.namespace, set()).add(model.uid)
    models.changed(model.uid)


def run_attacked(args: argparse.Namespace) -> list[bool]:
    state = cluster(args)
    ledger = Ledger(state)
    models = Turns(ledger)
    rng = random.Random(args.seed)
    attack = [tritonmodel("attacker", "bomb", args.scale_bomb, GI)] if args.scale_bomb else []
    attack += [
        tritonmodel("attacker", f"huge-{i:05d}", 1, 200 * GI) for i in range(args.unplaceable)
    ]
    for model in attack:
        add(ledger, models, model)
    order = list(range(args.models))
    rng.shuffle(order)
    waiting = set()
    for m in order:
        size = int(GI * math.exp(rng.uniform(math.log(0.5), math.log(16))))
        namespace, name = f"team-{m % args.namespaces:02d}", f"model-{m:05d}"
        model = tritonmodel(namespace, name, args.replicas, size)
        add(ledger, models, model)
        waiting.add(model.uid)
    print(
        f"the same beside namespace attacker: {args.unplaceable} TritonModels of 200 GiB and "
        f"one of 1 GiB x {args.scale_bomb:,} replicas, through the model controller's turns"
    )
    wall, cpu = time.perf_counter(), time.process_time()
    placed, attacker_turns = take_turns(models, waiting)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    wanted = args.models * args.replicas
    print(
        f"model_hosts under attack: {placed / wall:,.0f} replicas/s, "
        f"{1e3 * cpu / max(placed, 1):.3f} ms of binder CPU per replica ({placed} of {wanted} "
        f"placed; {attacker_turns} attacking turns between); "
        f"{len(ledger.replica_uids('attacker.bomb'))} replicas of the scaled one placed"
    )
    met = check_goals(" under attack", placed / wall, 1e3 * cpu / max(placed, 1))
    # Every attacking model due at once (a relist), then another namespace's new model.
    for model in attack:
        models.changed(model.uid)
    newcomer = tritonmodel("newcomer", "new", 2, GI)
    wall = time.perf_counter()
    add(ledger, models, newcomer)
    placed, attacker_turns = take_turns(models, {newcomer.uid})
    wall = time.perf_counter() - wall
    print(
        f"a new TritonModel of another namespace, with {len(attack)} attacking models due: its "
        f"{placed} replicas placed in {1e3 * wall:.2f} ms ({attacker_turns} attacking "
        f"turn{'' if attacker_turns == 1 else 's'} first)"
    )
    return met


def take_turns(models: Turns, waiting: set[str]) -> tuple[int, int]:
    """Take turns until each of the `waiting` models has had one: (their replicas placed, the
    other models' turns meanwhile)."""
    placed = others = 0
    while waiting:
        took = models.turn()
        if took is None:
            time.sleep(0.001)  # only backed-off models: their waits end
            continue
        model, count, _ = took
        if model.uid in waiting:
            waiting.discard(model.uid)
            placed += count
        else:
            others += 1
    return placed, others


def _shape(text: str) -> shapes.NodeShape:
    try:
        return shapes.parse_shape(text)
    except shapes.ShapeError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def main() -> int:
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
    parser.add_argument(
        "--unplaceable", type=int, default=10_000, help="attacking models that fit nowhere"
    )
    parser.add_argument(
        "--scale-bomb", type=int, default=10**9, help="replicas of the attacking scaled model"
    )
    parser.add_argument("--seed", type=int, default=47)
    results_page.add_flag(parser)
    goals.add_flag(parser)
    args = parser.parse_args()
    for flag in ("models", "replicas", "namespaces", "nodes"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} {getattr(args, flag)}: give at least 1")
    with results_page.captured() as printed:
        met = run(args)
        if args.unplaceable or args.scale_bomb:
            met += run_attacked(args)
    if args.write_results is not None:
        results_page.record("model_hosts", printed.getvalue(), page=args.write_results)
    return goals.exit_code(met, args.no_goal)


if __name__ == "__main__":
    raise SystemExit(main())
