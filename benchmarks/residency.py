"""Residency: how many GPUs a fleet of mostly idle models needs with every model `always`
against the tail `on-demand` at a few over-commit factors, and what the tail pays in wakes.

Placement runs through the binder's own placement core, as `benchmarks/density.py` drives it: a
`ClusterState`, `place()` for each model, its charge kept on the state; a node of `--node-shape`
(`benchmarks.shapes`: GPUs, allocatable CPUs, memory and pods less its node pod's requests and
slot; 0.5 GiB reserve per GPU) is added
whenever a model fits nowhere, so the GPUs of the nodes a configuration opens are the GPUs it
needs, and the binder's reasons for the model that fitted no node say which resource ran out
first (GPU memory, pods, CPU). `--as pods`: each model is a pod with the requests the webhook
writes; `--as tritonmodels`: each is a TritonModel replica, with no pod of its own, charged its
share of its namespace's model host, and the host one pod slot and a proxy's requests per
(namespace, node) (`binder.cluster.modelviews.as_replica`). The models belong to `--namespaces`
namespaces. All configurations place the same models in the same (shuffled) order. The models
outside the top `--always-share` by request rate are `on-demand`.

Traffic (seeded): each model's rate follows a Zipf law whose exponent is chosen so the top 20 %
of models take `--top-share` of requests; the total rate swings over a day (a sine, peak
`1 + --swing` times the mean, trough `1 - --swing`). Requests are replayed against each
configuration's placement with an LRU rule per GPU, a pure model of what the agent does: a
request for an unloaded on-demand model evicts the least recently used idle on-demand models on
its GPU until the model fits beside the always-resident ones and those still loaded, then loads
it (a wake: the request waits for the load). A model is idle when it had no request for
`--busy` seconds. No API server, no clock: seconds are simulated.

Then (unless `--no-live`) the live run, `benchmarks.residency_live`: small on-demand models
sleeping and waking on the simulated cluster with a real Triton on the CPU, beside an always
model, for the wake latency and the always model's p99 while others wake against its p99 alone.
The closing line:

    residency: GPUs all-always X, with the tail on-demand Y (R.Rx fewer); SHAPE nodes as pods,
    bound by B (all-always) and T (tail); wake p50/p99 A/B s (Triton's own load L/M s);
    always p99 C.Cx alone

The live run's goals (`residency_live.check_goals`: wake p99 1.5 s and +0.1 s over Triton's own
load, the always model's p99 1.2x alone, no failure) are printed as met or NOT MET; the run exits
1 when one is not met (`--no-goal`: 0 anyway). The placement simulation's goal (`check_placement`):
all `always`, the binder opens at most `BOUND_GOAL` times the GPUs of `lower_bound`, the fewest
whole nodes whose GPU memory holds every model and, as pods, whose room holds their requests and
pod slots (a TritonModel replica's host is left out: a bound still).

`--quick` shrinks both halves (300 models, half an hour replayed; 2 on-demand models, 2 rounds).

Run: .venv/bin/python -m benchmarks.residency [--quick] [--no-live] [--node-shape
     8xA100-80GB:96:110] [--as pods|tritonmodels] [--live-models 3 --rounds 10
     --idle-seconds 2 --alone-seconds 10] [--no-goal]
"""

from __future__ import annotations

import argparse
import math
import random
import tempfile
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks import command_line, goals, residency_live, shapes
from benchmarks import results as results_page
from binder.cluster.clusterstate import ClusterState
from binder.cluster.modelviews import as_replica
from binder.cluster.objects import PodInfo
from binder.framework.noderules import NODE_RULES
from binder.framework.placement import Placement, place

GI = 1 << 30
RESERVE = GI // 2
NOW = 1_000_000.0
DAY = 86_400.0
DEFAULT_SHAPE = "8xA100-80GB:96:110"
BOUND_GOAL = 1.02
"""All `always`: the GPUs the binder opens over `lower_bound`'s, at most."""
AS = ("pods", "tritonmodels")


@dataclass(frozen=True)
class Model:
    name: str
    namespace: str
    size: int
    rate: float
    """Mean requests per second."""
    on_demand: bool


def zipf_exponent(count: int, top: float, share: float) -> float:
    """The Zipf exponent s for which the top `top` of `count` ranks take `share` of the mass."""
    ranks = np.arange(1, count + 1, dtype=np.float64)
    cut = max(1, int(count * top))
    low, high = 0.0, 5.0
    for _ in range(60):
        s = (low + high) / 2
        weights = ranks**-s
        if weights[:cut].sum() / weights.sum() < share:
            low = s
        else:
            high = s
    return (low + high) / 2


def fleet(args: argparse.Namespace, on_demand_tail: bool) -> list[Model]:
    rng = random.Random(args.seed)
    s = zipf_exponent(args.models, 0.2, args.top_share)
    weights = [(rank + 1) ** -s for rank in range(args.models)]
    total = sum(weights)
    always = int(args.models * args.always_share)
    models = []
    for rank in range(args.models):
        # 0.5 to 16 GiB, log-uniform: the sizes of most served models (density.py's first bands).
        size = int(GI * math.exp(rng.uniform(math.log(0.5), math.log(16))))
        rate = args.rate * weights[rank] / total
        namespace = f"team-{rank % args.namespaces:02d}"
        on_demand = on_demand_tail and rank >= always
        models.append(Model(f"m{rank:05d}", namespace, size, rate, on_demand))
    rng.shuffle(models)
    return models


@dataclass(frozen=True)
class Packed:
    where: dict[str, str]
    """Each model's GPU (its UUID)."""
    gpus: int
    """GPUs of the nodes opened."""
    used: int
    """Of those, the GPUs that hold a model."""
    hosts: int
    """Model hosts (for `--as tritonmodels`; 0 for pods)."""
    refused: Counter[str]
    """For the models that fitted no node opened before them: how many each resource refused
    (a model refused by several resources counts for each)."""


def pack(models: list[Model], factor: float, shape: shapes.NodeShape, as_: str) -> Packed:
    """Each model's GPU, on nodes of `shape` added while a model fits nowhere."""
    state = ClusterState(rules=NODE_RULES, reserve=RESERVE)
    where: dict[str, str] = {}
    refused: Counter[str] = Counter()
    requests = shapes.model_pod_requests()

    def add_node() -> None:
        name = f"node-{len(state.nodes):05d}"
        state.set_node(shape.node(name, overcommit=factor))
        state.set_lease(name, NOW + DAY)

    add_node()
    for model in models:
        pod = PodInfo(
            uid=f"uid-{model.name}",
            namespace=model.namespace,
            name=model.name,
            scheduler_name="tritonshare",
            request=model.size,
            model_id=model.name,
            resources=requests,
            on_demand=model.on_demand,
        )
        if as_ == "tritonmodels":
            pod = as_replica(pod)
        decision = place(state, pod, now=NOW)
        if not isinstance(decision, Placement):
            refused.update(shapes.resources_refused(decision.reasons))
            add_node()
            decision = place(state, pod, now=NOW)
        assert isinstance(decision, Placement), decision
        state.assume(pod, decision.node, decision.gpu.uuid)
        where[model.name] = decision.gpu.uuid
    gpus = len(state.nodes) * shape.gpus
    return Packed(where, gpus, len(set(where.values())), state.pods.host_count(), refused)


@dataclass(frozen=True)
class Replay:
    requests: int
    wakes: int
    hours: float


def replay(models: list[Model], where: dict[str, str], args: argparse.Namespace) -> Replay:
    """Replay a day of requests with the LRU eviction rule on each GPU."""
    rng = np.random.default_rng(args.seed)
    mean = sum(m.rate for m in models)
    count = int(mean * args.hours * 3600)
    # Arrival times with the diurnal swing, by thinning a uniform draw.
    times = rng.uniform(0, args.hours * 3600, int(count * (1 + args.swing)))
    keep = rng.uniform(0, 1 + args.swing, times.size) < 1 + args.swing * np.sin(
        2 * np.pi * times / DAY
    )
    times = np.sort(times[keep])
    probabilities = np.array([m.rate for m in models]) / mean
    chosen = rng.choice(len(models), size=times.size, p=probabilities)
    usable = args.node_shape.gpu_memory - RESERVE
    always_held: dict[str, int] = {}
    for model in models:
        if not model.on_demand:
            always_held[where[model.name]] = always_held.get(where[model.name], 0) + model.size
    loaded: dict[str, OrderedDict[int, float]] = {}
    held: dict[str, int] = {}
    wakes = 0
    for t, m in zip(times.tolist(), chosen.tolist(), strict=True):
        model = models[m]
        if not model.on_demand:
            continue
        gpu = where[model.name]
        lru = loaded.setdefault(gpu, OrderedDict())
        if m in lru:
            lru[m] = t
            lru.move_to_end(m)
            continue
        wakes += 1
        room = usable - always_held.get(gpu, 0) - held.get(gpu, 0)
        for victim, last in list(lru.items()):
            if room >= model.size:
                break
            if t - last < args.busy:
                continue  # busy: never evicted
            del lru[victim]
            room += models[victim].size
            held[gpu] -= models[victim].size
        lru[m] = t
        held[gpu] = held.get(gpu, 0) + model.size
    return Replay(int(times.size), wakes, args.hours)


def main() -> int:
    parser = command_line(
        "residency",
        (
            "Measures the GPUs a fleet of --models models needs with every model always against "
            "the tail on-demand at each of --factors, through the binder's placement core on "
            "nodes of --node-shape, the models placed --as pods or TritonModel replicas, and "
            "which resource bound the placement; and replays --hours of traffic with an LRU "
            "eviction per GPU for the wake rate and the share of requests that waited for a "
            "wake."
        ),
    )
    parser.add_argument("--models", type=int, default=2000)
    parser.add_argument("--top-share", type=float, default=0.95, help="of requests, top 20 %%")
    parser.add_argument("--always-share", type=float, default=0.2, help="models kept always")
    parser.add_argument("--rate", type=float, default=50.0, help="mean requests/s, all models")
    parser.add_argument("--swing", type=float, default=0.6, help="diurnal amplitude, 0..1")
    parser.add_argument("--hours", type=float, default=24.0, help="replayed, simulated")
    parser.add_argument("--busy", type=float, default=1.0, help="seconds a model stays busy")
    parser.add_argument("--factors", default="1,2,3,4,6", help="over-commit factors to compare")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--node-shape",
        type=_shape,
        default=shapes.parse_shape(DEFAULT_SHAPE),
        metavar="GPUSxMODEL:CPUS:PODS",
        help=f"the nodes added ({DEFAULT_SHAPE}; also {', '.join(shapes.NAMED_SHAPES[1:])})",
    )
    parser.add_argument(
        "--as",
        dest="as_",
        choices=AS,
        default="pods",
        help="each model a pod, or a TritonModel replica on its namespace's host (pods)",
    )
    parser.add_argument("--namespaces", type=int, default=50, help="the models' namespaces")
    parser.add_argument("--no-live", action="store_true", help="the placement simulation only")
    parser.add_argument("--live-models", type=int, default=3, help="on-demand pods, live (3)")
    parser.add_argument("--rounds", type=int, default=10, help="wakes of each, live (10)")
    parser.add_argument("--idle-seconds", type=float, default=2.0, help="their idle time (2)")
    parser.add_argument(
        "--alone-seconds", type=float, default=10.0, help="the always model alone, live (10)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small: 300 models, 0.5 h, factors 1,3; live 2 models, 2 rounds, 1 s idle",
    )
    results_page.add_flag(parser)
    goals.add_flag(parser)
    args = parser.parse_args()
    if args.quick:
        args.models, args.hours, args.factors, args.rate = 300, 0.5, "1,3", 20.0
        args.live_models, args.rounds, args.idle_seconds, args.alone_seconds = 2, 2, 1.0, 3.0
    if args.namespaces < 1:
        parser.error(f"--namespaces {args.namespaces}: give at least 1")
    with results_page.captured() as printed:
        base_gpus, tail_gpus, bound, met = run(args)
        if args.no_live:
            live_figures = ""
        else:
            print("live, on the simulated cluster:")
            with tempfile.TemporaryDirectory(prefix="tritonshare-residency-") as tmp:
                result = residency_live.run_live(
                    Path(tmp),
                    models=args.live_models,
                    rounds=args.rounds,
                    idle=args.idle_seconds,
                    alone_seconds=args.alone_seconds,
                )
            p50, p99, ratio = residency_live.report(result)
            met += residency_live.check_goals(result)
            # Triton's own load beside the wake: the difference is tritonshare's overhead.
            loads = [residency_live.percentile(result.triton_loads, q) for q in (0.5, 0.99)]
            live_figures = (
                f"; wake p50/p99 {p50:.2f}/{p99:.2f} s (Triton's own load {loads[0]:.2f}/"
                f"{loads[1]:.2f} s); always p99 {ratio:.1f}x alone"
            )
        print(
            f"residency: GPUs all-always {base_gpus}, with the tail on-demand {tail_gpus} "
            f"({base_gpus / tail_gpus:.1f}x fewer); {args.node_shape} nodes as {args.as_}, "
            f"bound by {bound}{live_figures}"
        )
    if args.write_results is not None:
        results_page.record("residency", printed.getvalue(), page=args.write_results)
    return goals.exit_code(met, args.no_goal)


def _shape(text: str) -> shapes.NodeShape:
    try:
        return shapes.parse_shape(text)
    except shapes.ShapeError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def lower_bound(sizes: list[int], shape: shapes.NodeShape, as_: str) -> int:
    """GPUs of the fewest whole nodes of `shape` that hold `sizes` in GPU memory and, `as_` pods,
    their requests and pod slots in the nodes' room."""
    nodes = math.ceil(sum(sizes) / ((shape.gpu_memory - RESERVE) * shape.gpus))
    if as_ == "pods":
        asks = {**shapes.model_pod_requests(), "pods": 1}
        room = min(shape.room[name] // amount for name, amount in asks.items() if amount)
        nodes = max(nodes, math.ceil(len(sizes) / max(room, 1)))
    return nodes * shape.gpus


def check_placement(gpus: int, bound: int) -> list[bool]:
    """All `always`: the binder's GPUs within `BOUND_GOAL` of the lower bound's."""
    return [goals.check("all always: GPUs / the lower bound's", gpus / bound, BOUND_GOAL, unit="x")]


def run(args: argparse.Namespace) -> tuple[int, int, str, list[bool]]:
    """The placement simulation; (GPUs all always, GPUs with the tail on-demand at best, what
    bound each, its goal's verdict)."""
    shape: shapes.NodeShape = args.node_shape
    print(
        f"{args.models} models in {args.namespaces} namespaces, 0.5-16 GiB log-uniform, top 20 % "
        f"take {args.top_share:.0%} of {args.rate:g} requests/s (diurnal swing "
        f"{args.swing:.0%}); {args.hours:g} h replayed; seed {args.seed}"
    )
    each = (
        "a pod with the webhook's requests, " + _requests(shapes.model_pod_requests())
        if args.as_ == "pods"
        else "a TritonModel replica on its namespace's model host"
    )
    print(f"nodes {shape}: {shape.describe()}; each model {each}")
    usable = shape.gpu_memory - RESERVE
    tail = [m for m in fleet(args, on_demand_tail=True) if m.size <= usable]
    if len(tail) < args.models:
        print(f"{args.models - len(tail)} models larger than one GPU left out")
    tail_share = sum(m.rate for m in tail if m.on_demand) / sum(m.rate for m in tail)
    print(
        f"the on-demand tail (models outside the top {args.always_share:.0%} by rate) takes "
        f"{100 * tail_share:.2f} % of requests"
    )
    always = [m for m in fleet(args, on_demand_tail=False) if m.size <= usable]
    baseline = pack(always, 1.0, shape, args.as_)
    least = lower_bound([m.size for m in always], shape, args.as_)
    print(
        f"{'configuration':<36}{'GPUs':>6}{'in use':>8}{'hosts':>7}{'wakes/h':>10}"
        f"{'requests that waited':>22}  bound by (models that fitted no node)"
    )
    _row("all always (baseline)", baseline, 0.0, 0.0)
    print(f"{'lower bound, all always':<36}{least:>6}")
    summary = []
    for factor in (float(f) for f in args.factors.split(",")):
        packed = pack(tail, factor, shape, args.as_)
        played = replay(tail, packed.where, args)
        waited = 100 * played.wakes / max(played.requests, 1)
        _row(f"tail on-demand, over-commit {factor:g}", packed, played.wakes / played.hours, waited)
        summary.append((factor, packed, waited))
    factor, best, waited = min(summary, key=lambda item: (item[1].gpus, item[0]))
    base_gpus = baseline.gpus
    met = check_placement(base_gpus, least)
    print(
        f"simulation: GPUs all-always {base_gpus}, with the tail on-demand {best.gpus} "
        f"({base_gpus / best.gpus:.1f}x fewer) at over-commit {factor:g}; "
        f"{waited:.3f} % of requests waited for a wake"
    )
    bound = f"{shapes.binding(baseline.refused)} (all-always) and {shapes.binding(best.refused)}"
    return base_gpus, best.gpus, f"{bound} (tail)", met


def _row(label: str, packed: Packed, wakes: float, waited: float) -> None:
    refused = ", ".join(f"{r} {n}" for r, n in sorted(packed.refused.items())) or "-"
    print(
        f"{label:<36}{packed.gpus:>6}{packed.used:>8}{packed.hosts:>7}{wakes:>10.0f}"
        f"{waited:>20.3f} %  {shapes.binding(packed.refused)} ({refused})"
    )


def _requests(resources: Mapping[str, int]) -> str:
    cpu, memory = resources.get("cpu", 0), resources.get("memory", 0)
    return f"{cpu}m CPU, {memory >> 20}Mi"


if __name__ == "__main__":
    raise SystemExit(main())
