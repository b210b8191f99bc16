"""Benchmark: what ModelMesh's address (`modelmesh-serving`, a model host's mesh ports) costs over
the model's own Service (the host's own ports).

Starts a real Triton serving add_one and three model host proxies as their own processes
(`python -m proxy --models-file`, relay mode): A serves add_one and listens on the mesh ports too;
B serves add_one (standing for add_one's own Service's hosts); C serves another model and listens
on the mesh ports, its routes file sending add_one to B. In each round, back to back (the order
reversed every other round):

- local: add_one through A's mesh ports against A's own ports: the same table entry, the same
  relay; the goal is at most +0.05 ms at c=1 (gRPC from a blocking grpc client, REST from wrk);
  throughput at c=16 (h2load, wrk) is printed as the share kept;
- relayed: add_one through C's mesh ports (relayed to B) against B's own ports: one more hop,
  printed, with no goal.

The figures are medians over rounds of the per-round differences (c=1) and ratios (c=16).

    .venv/bin/python benchmarks/modelmesh_router.py [--rounds 3] [--seconds 2] [--no-goal]

Exits 1 when the goal is not met (`--no-goal`: 0 anyway).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import goals  # noqa: E402
from benchmarks.proxy_latency import (  # noqa: E402
    MODEL,
    Hop,
    Loads,
    Results,
    running_proxy,
    running_triton,
)
from sim.triton import free_port  # noqa: E402

LOCAL_ADDED_GOAL_MS = 0.05
"""The most a request to a model on the host reached may take longer through the mesh port."""
MEASURES = ("grpc1", "rest1", "grpc16", "rest16")


@contextmanager
def host(
    upstream: tuple[str, str], work: Path, name: str, models: list[str], routes: list[object]
) -> Iterator[tuple[Hop, Hop]]:
    """A host proxy serving `models`; its own ports' hop, and its mesh ports' (with `routes`)."""
    table, routes_file = work / f"{name}-models.json", work / f"{name}-routes.json"
    table.write_text(json.dumps([{"model": m} for m in models]))
    routes_file.write_text(json.dumps(routes))
    mesh_http, mesh_grpc = free_port(), free_port()
    extra = [
        f"--listen-mesh-http=127.0.0.1:{mesh_http}",
        f"--listen-mesh-grpc=127.0.0.1:{mesh_grpc}",
        f"--routes-file={routes_file}",
    ]
    with running_proxy(upstream, extra, models_file=table) as own:
        yield own, Hop(f"127.0.0.1:{mesh_http}", f"127.0.0.1:{mesh_grpc}", own.cpu)


def _median_added(results: Results, measure: str, name: str, base: str, kept: bool) -> float:
    pairs = zip(results[(measure, name)], results[(measure, base)], strict=True)
    return statistics.median([p / b if kept else p - b for p, b in pairs])


CASES = (("local", "mesh", "own"), ("relayed", "relayed", "service"))
"""(case, hop, the hop it is set against)."""


def check_goals(results: Results) -> list[bool]:
    """Print both cases' figures, the local one's c=1 beside its goal; each goal's verdict."""
    verdicts = []
    for case, name, base in CASES:
        print(f"{case}: modelmesh-serving ({name}) against the model's own Service ({base})")
        for measure in MEASURES:
            kept = measure.endswith("16")
            figures = [statistics.median(results[(measure, n)]) for n in (name, base)]
            difference = _median_added(results, measure, name, base, kept)
            unit = "req/s" if kept else "ms"
            change = f"{difference:.1%} kept" if kept else f"{difference:+.3f} ms"
            print(f"  {measure}: {figures[0]:.3f} vs {figures[1]:.3f} {unit}; {change}")
            if case == "local" and not kept:
                what = f"{case} {measure} added over the model's own Service"
                verdicts.append(goals.check(what, difference, LOCAL_ADDED_GOAL_MS, unit=" ms"))
    return verdicts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    goals.add_flag(parser)
    args = parser.parse_args()
    results: Results = {}
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        triton = stack.enter_context(running_triton(work))
        upstream = (triton.http_url, triton.grpc_url)
        b_own, _ = stack.enter_context(host(upstream, work, "b", [MODEL], []))
        http, grpc = (int(a.rpartition(":")[2]) for a in (b_own.rest, b_own.grpc))
        route = {"model": MODEL, "address": "127.0.0.1", "http": http, "grpc": grpc}
        a_own, a_mesh = stack.enter_context(host(upstream, work, "a", [MODEL], [route]))
        _, c_mesh = stack.enter_context(host(upstream, work, "c", ["other"], [route]))
        hops = {"own": a_own, "mesh": a_mesh, "service": b_own, "relayed": c_mesh}
        loads = Loads(work, args.seconds)
        for hop in hops.values():
            loads.warm_up(hop, rest=True, with_hey=False)
        for number in range(args.rounds):
            order = list(hops.items())
            if number % 2:
                order.reverse()
            for measure in MEASURES:
                for name, hop in order:
                    loads.measure(results, measure, name, hop)
            print(f"round {number + 1} of {args.rounds} done", flush=True)
    return goals.exit_code(check_goals(results), args.no_goal)


if __name__ == "__main__":
    sys.exit(main())
