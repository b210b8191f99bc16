"""Residency: how many GPUs a fleet of mostly idle models needs with every model `always`
against the tail `on-demand` at a few over-commit factors, and what the tail pays in wakes.

Placement runs through the binder's own placement core, as `benchmarks/density.py` drives it: a
`ClusterState`, `place()` for each pod, its charge kept on the state; a one-GPU node (80 GiB, an
A100's size, 0.5 GiB reserve) is added whenever a pod fits nowhere, so the GPUs a configuration
opens are the GPUs it needs. All configurations place the same pods in the same (shuffled)
order. The models outside the top `--always-share` by request rate are `on-demand`.

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

    residency: GPUs all-always X, with the tail on-demand Y (R.Rx fewer); wake p50/p99 A/B s;
    always p99 C.Cx alone

`--quick` shrinks both halves (300 models, half an hour replayed; 2 on-demand models, 2 rounds).

Run: .venv/bin/python -m benchmarks.residency [--quick] [--no-live] [--live-models 3
     --rounds 10 --idle-seconds 2 --alone-seconds 10]
"""

from __future__ import annotations

import argparse
import math
import random
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks import command_line, residency_live
from benchmarks import results as results_page
from binder.model import Gpu, NodeInfo, PodInfo
from binder.placement import Placement, place
from binder.state import ClusterState

GI = 1 << 30
GPU_MEMORY = 80 * GI
RESERVE = GI // 2
NOW = 1_000_000.0
DAY = 86_400.0


@dataclass(frozen=True)
class Model:
    name: str
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
        models.append(Model(f"m{rank:05d}", size, rate, on_demand_tail and rank >= always))
    rng.shuffle(models)
    return models


def pack(models: list[Model], factor: float) -> dict[str, str]:
    """Each model's GPU (one-GPU nodes, added while a pod fits nowhere)."""
    state = ClusterState(reserve=RESERVE)
    where: dict[str, str] = {}

    def add_node() -> None:
        name = f"node-{len(state.nodes):05d}"
        gpu = Gpu(f"GPU-{name}", 0, "A100-80GB", GPU_MEMORY, True)
        state.set_node(
            NodeInfo(name, {"kubernetes.io/hostname": name}, gpus=(gpu,), overcommit=factor)
        )
        state.set_lease(name, NOW + DAY)

    add_node()
    for model in models:
        pod = PodInfo(
            uid=f"uid-{model.name}",
            namespace="models",
            name=model.name,
            scheduler_name="tritonshare",
            request=model.size,
            model_id=model.name,
            on_demand=model.on_demand,
        )
        decision = place(state, pod, now=NOW)
        if not isinstance(decision, Placement):
            add_node()
            decision = place(state, pod, now=NOW)
        assert isinstance(decision, Placement), decision
        state.set_pod(pod.bound(decision.node, decision.gpu.uuid, ""))
        where[model.name] = decision.node
    return where


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
    usable = GPU_MEMORY - RESERVE
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


def main() -> None:
    parser = command_line(
        "residency",
        (
            "Measures the GPUs a fleet of --models models needs with every model always against "
            "the tail on-demand at each of --factors, through the binder's placement core, and "
            "replays --hours of traffic with an LRU eviction per GPU for the wake rate and the "
            "share of requests that waited for a wake."
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
    args = parser.parse_args()
    if args.quick:
        args.models, args.hours, args.factors, args.rate = 300, 0.5, "1,3", 20.0
        args.live_models, args.rounds, args.idle_seconds, args.alone_seconds = 2, 2, 1.0, 3.0
    with results_page.captured() as printed:
        base_gpus, tail_gpus = run(args)
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
            live_figures = f"; wake p50/p99 {p50:.2f}/{p99:.2f} s; always p99 {ratio:.1f}x alone"
        print(
            f"residency: GPUs all-always {base_gpus}, with the tail on-demand {tail_gpus} "
            f"({base_gpus / tail_gpus:.1f}x fewer){live_figures}"
        )
    if args.write_results is not None:
        results_page.record("residency", printed.getvalue(), page=args.write_results)


def run(args: argparse.Namespace) -> tuple[int, int]:
    """The placement simulation; (GPUs all always, GPUs with the tail on-demand at best)."""
    print(
        f"{args.models} models, 0.5-16 GiB log-uniform, top 20 % take {args.top_share:.0%} of "
        f"{args.rate:g} requests/s (diurnal swing {args.swing:.0%}); 80 GiB GPUs; "
        f"{args.hours:g} h replayed; seed {args.seed}"
    )
    tail = fleet(args, on_demand_tail=True)
    tail_share = sum(m.rate for m in tail if m.on_demand) / sum(m.rate for m in tail)
    print(
        f"the on-demand tail (models outside the top {args.always_share:.0%} by rate) takes "
        f"{100 * tail_share:.2f} % of requests"
    )
    baseline = fleet(args, on_demand_tail=False)
    base_gpus = len(set(pack(baseline, 1.0).values()))
    print(f"{'configuration':<36}{'GPUs':>6}{'wakes/h':>10}{'requests that waited':>22}")
    print(f"{'all always (baseline)':<36}{base_gpus:>6}{0:>10}{'0.000 %':>22}")
    summary = []
    for factor in (float(f) for f in args.factors.split(",")):
        where = pack(tail, factor)
        gpus = len(set(where.values()))
        played = replay(tail, where, args)
        waited = 100 * played.wakes / max(played.requests, 1)
        label = f"tail on-demand, over-commit {factor:g}"
        print(f"{label:<36}{gpus:>6}{played.wakes / played.hours:>10.0f}{waited:>20.3f} %")
        summary.append((factor, gpus, waited))
    best = min(summary, key=lambda item: (item[1], item[0]))
    print(
        f"simulation: GPUs all-always {base_gpus}, with the tail on-demand {best[1]} "
        f"({base_gpus / best[1]:.1f}x fewer) at over-commit {best[0]:g}; "
        f"{best[2]:.3f} % of requests waited for a wake"
    )
    return base_gpus, best[1]


if __name__ == "__main__":
    main()
