"""Benchmark: the proxy's own CPU per request, through its entry point, against a bare byte relay.

Starts a real Triton serving the Python-backend model add_one, the proxy as a pod runs it
(`python -m proxy`, relay mode, as `proxy_latency.py` starts it) and, as the baseline in the same
run, a bare TCP relay (`benchmarks/tcp_relay.py`: bytes copied both ways on uvloop, nothing
parsed, the floor of one Python hop), both in front of that Triton. `--baseline-tree DIR` adds the
proxy of another source tree (e.g. `git archive <commit> | tar -x -C DIR`) as one more column, so a
change's before and after read in one run. Nothing of the proxy is imported: what is measured is
the process a pod runs, with its real sockets, uvloop and Triton behind it.

`--native` measures the native build (`python -m proxy.native`, built first when stale, as
`proxy_latency --native` does) instead of this tree; `--baseline-tree build/native` adds it as the
baseline column instead (and `--native --baseline-tree .` reads native against pure). `--gateway`
measures the node gateway (`python -m proxy.gateway`) instead of the proxy: started as
`proxy_latency` starts its full path, with a caller table, behind a proxy of the same tree (not
measured) sending from the table's address; the bare relay then runs behind such a proxy too, in
the same place of a chain, and the baseline tree's column is its gateway.

Load: h2load, a fixed number of requests after a warm-up, at concurrency 16 and at 1: REST with
`--h1` and the JSON infer body, gRPC with a framed ModelInfer (`content-type: application/grpc`,
`te: trailers`, one stream per connection). Every run must have every request succeed (REST: all
2xx; gRPC: all 200 with a response message of the size Triton's own answer has: a call the proxy
refused itself carries no message), or the benchmark fails.

Two figures per row:

- Instructions per request (callgrind): each hop runs under `valgrind --tool=callgrind`; after the
  warm-up its counters are zeroed (`callgrind_control --zero`), the measured load runs, and they
  are dumped (`--dump`). User-space instructions of the whole process: they do not depend on the
  box's load, so they compare before/after to a percent or two (c=1: to 0.1%). The kernel's work
  (system calls) is not counted. Under valgrind a hop is many times slower, so at c=16 more
  requests arrive per read than without it (fewer wake-ups per request), and how many depends on
  timing; the c=1 rows have no such batching.
- CPU time per request from /proc (the time the hop's threads ran, `schedstat`, in nanoseconds),
  the hops run without valgrind: medians over interleaved rounds (the hop order reversed every
  other run), and the median of the per-round ratios. They price the system calls and the wake-ups
  the instruction counts leave out. By default every process runs wherever the kernel puts it, as
  `proxy_latency` runs them, and the box's noise moves a round's figure by tens of percent.
  `--pin` runs each measured hop alone on the last CPU and Triton, h2load and any hop in front of
  it on the others: rounds then agree within a few percent, but every hop's figure is higher (its
  CPU goes idle between requests, and each wake-up from idle costs more on this virtual machine),
  so a pinned and an unpinned figure do not compare; ratios within one run do.

The upstream is a real Triton in both parts: its own CPU is not in either figure (each is read from
the hop's process alone), it only makes the /proc figures noisier by sharing the 2 cores, so no
canned upstream is needed. Every h2load run opens its connections anew, so a row's figure includes
accepting them, spread over requests / concurrency requests each. Child processes run with
PYTHONHASHSEED=0, so the hashing of strings (the caches' keys, dict layouts) is the same in every
run.

    .venv/bin/python -m benchmarks.proxy_hotpath [--requests 4000] [--warmup 300]
        [--proc-requests 10000] [--rounds 5] [--baseline-tree DIR] [--parts callgrind,proc]
        [--native] [--gateway [--private-name NAME]] [--pin] [--keep-dumps DIR]

`--keep-dumps DIR` keeps each callgrind dump (`callgrind.HOP.PROTOCOL.cN`) for
`callgrind_annotate --inclusive=yes [--tree=calling]`: where a hop's instructions go.

Goal, from the /proc figures at c=16 (the median of per-round ratios to the bare relay): the proxy
at most 1.15x (REST) and 1.3x (gRPC), the gateway at most 1.3x (both); printed as met or NOT MET,
the run exits 1 when one is not (`--no-goal`: 0 anyway). Instructions have no goal.

About 5-7 minutes on a 2-core box with the defaults and a baseline tree (half of it the /proc
rounds, most of the rest the hops' start under valgrind).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from benchmarks import command_line, goals
from benchmarks.proxy_latency import (
    MODEL,
    REST_BODY,
    Hop,
    cpu_seconds,
    grpc_request,
    running_chain,
    running_floor,
    running_full_path,
    running_proxy,
    running_triton,
    source_trees,
)
from proxy import native

MEASURES = (("REST", 16), ("REST", 1), ("gRPC", 16), ("gRPC", 1))
"""(protocol, concurrency) of every row, in the order they run."""
START_TIMEOUT = 600.0
"""Seconds a hop under valgrind may take to listen (the imports run many times slower there)."""


@dataclass(frozen=True)
class Loads:
    """The load generator's inputs and what a successful run must report."""

    body: Path
    framed: Path
    response_bytes: int
    """Bytes of DATA per successful gRPC call: Triton's framed ModelInferResponse."""
    cpus: frozenset[int] | None = None
    """The CPUs h2load runs on (`--pin`), or wherever the kernel puts it."""

    @classmethod
    def write(cls, work: Path, triton: Hop) -> Loads:
        """The request files, and the size of Triton's answer read from Triton directly."""
        body = work / "infer.json"
        body.write_text(REST_BODY)
        message = grpc_request()
        framed = work / "infer.grpc"
        framed.write_bytes(b"\x00" + struct.pack(">I", len(message)) + message)
        probe = cls(body, framed, 0)
        return cls(body, framed, probe.run("gRPC", triton.grpc, 16, 64) // 64)

    def run(self, protocol: str, address: str, concurrency: int, requests: int) -> int:
        """`requests` requests at `concurrency` through `address`; fails unless all succeeded.
        Returns the bytes of DATA received (the probe, response_bytes 0, checks no size)."""
        command = ["h2load", "-n", str(requests), "-c", str(concurrency), "-t", "1"]
        if protocol == "REST":
            command += ["--h1", "-d", str(self.body), "-H", "content-type: application/json"]
            command.append(f"http://{address}/v2/models/{MODEL}/infer")
        else:
            command += ["-m", "1", "-d", str(self.framed), "-H", "content-type: application/grpc"]
            command += ["-H", "te: trailers"]
            command.append(f"http://{address}/inference.GRPCInferenceService/ModelInfer")
        cpus = self.cpus
        out = subprocess.run(
            command,
            capture_output=True,
            text=True,
            check=False,
            preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
        ).stdout
        done = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded", out)
        statuses = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
        data = re.search(r"traffic: .* total, .* headers .*, \S+ \((\d+)\) data", out)
        wrong = []
        if done is None or int(done[1]) != requests:
            wrong.append("not every request succeeded")
        if statuses is None or int(statuses[1]) != requests:
            wrong.append("not every status was 2xx")
        received = -1 if data is None else int(data[1])
        if (
            protocol == "gRPC"
            and self.response_bytes
            and received != requests * self.response_bytes
        ):
            wrong.append(f"not every call got Triton's {self.response_bytes}-byte answer")
        if wrong:
            raise RuntimeError(
                f"{protocol} c={concurrency} through {address}: {'; '.join(wrong)}:\n"
                f"{' '.join(command)}\n{out}"
            )
        return received


def _address(hop: Hop, protocol: str) -> str:
    return hop.rest if protocol == "REST" else hop.grpc


def _pid(hop: Hop) -> int:
    return hop.cpu[0][1]


@dataclass(frozen=True)
class Trees:
    """What runs as the measured hop, and from which source trees."""

    main: Path
    baseline: Path | None
    gateway: bool
    """The gateway (behind a proxy of its tree, not measured) instead of the proxy."""
    work: Path
    """Where the gateway's caller table is written."""
    private_name: str = ""
    """The model's private name in Triton the gateways map to; empty: none. A
    baseline tree from before private names ignores it and reaches the model under its id."""


@contextlib.contextmanager
def running_hops(
    upstream: tuple[str, str], trees: Trees, wrap: Callable[[str], list[str]]
) -> Iterator[dict[str, Hop]]:
    """The proxy (or gateway), the bare relay and the baseline tree's proxy (or gateway), each
    measured command prefixed by `wrap(name)`, all in front of `upstream`."""
    relay_mode = ["--grpc-mode", "relay"]

    def measured(name: str, root: Path) -> contextlib.AbstractContextManager[Hop]:
        if trees.gateway:
            return running_full_path(
                upstream,
                relay_mode,
                trees.work,
                root,
                wrap(name),
                START_TIMEOUT,
                trees.private_name,
            )
        return running_proxy(upstream, relay_mode, root, wrap(name), START_TIMEOUT)

    with contextlib.ExitStack() as stack:
        hops = {
            "proxy": stack.enter_context(measured("proxy", trees.main)),
            # For the gateway, the bare relay sits behind a proxy as the gateway does: the load
            # reaching a second hop is not the load reaching a first.
            "bare": stack.enter_context(
                running_chain(upstream, relay_mode, trees.main, wrap("bare"), START_TIMEOUT)
                if trees.gateway
                else running_floor(upstream, wrap("bare"), START_TIMEOUT)
            ),
        }
        if trees.baseline is not None:
            hops["baseline"] = stack.enter_context(measured("baseline", trees.baseline))
        yield hops


Figures = dict[tuple[str, int, str], list[float]]
"""(protocol, concurrency, hop) -> one figure per round (callgrind: a single one)."""


def _dumped_instructions(out: Path, pid: int, keep: Path | None, label: str) -> int:
    """Dump `pid`'s counters and read their sum (callgrind numbers each dump `out.N`); with
    `keep`, the dump is copied there as `label` (for `callgrind_annotate`)."""
    dumps = set(out.parent.glob(out.name + ".*"))
    subprocess.run(["callgrind_control", "--dump", str(pid)], capture_output=True, check=True)
    new = set(out.parent.glob(out.name + ".*")) - dumps
    if len(new) != 1:
        raise RuntimeError(f"callgrind_control --dump {pid} wrote {sorted(new)}, not one file")
    dump = new.pop()
    if keep is not None:
        shutil.copyfile(dump, keep / label)
    summary = re.search(r"^summary: (\d+)$", dump.read_text(errors="replace"), re.MULTILINE)
    if summary is None:
        raise RuntimeError(f"no summary line in {out}'s dump")
    return int(summary[1])


def measure_instructions(
    loads: Loads, upstream: tuple[str, str], trees: Trees, args: argparse.Namespace
) -> Figures:
    """Instructions per request of every hop under callgrind, counters zeroed after the warm-up."""

    def valgrind(name: str) -> list[str]:
        return [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={trees.work / ('callgrind.' + name)}",
            f"--log-file={trees.work / ('valgrind.' + name)}",
        ]

    figures: Figures = {}
    with running_hops(upstream, trees, valgrind) as hops:
        for name, hop in hops.items():
            for protocol, concurrency in MEASURES:
                address, pid = _address(hop, protocol), _pid(hop)
                loads.run(protocol, address, concurrency, args.warmup)
                subprocess.run(
                    ["callgrind_control", "--zero", str(pid)], capture_output=True, check=True
                )
                loads.run(protocol, address, concurrency, args.requests)
                spent = _dumped_instructions(
                    trees.work / f"callgrind.{name}",
                    pid,
                    args.keep_dumps,
                    f"callgrind.{name}.{protocol}.c{concurrency}",
                )
                figures[(protocol, concurrency, name)] = [spent / args.requests]
                print(
                    f"callgrind: {protocol} c={concurrency} {name}: "
                    f"{spent / args.requests:.0f} instructions per request",
                    file=sys.stderr,
                )
    return figures


def pin(pid: int, cpus: frozenset[int]) -> None:
    """Every thread of `pid`, and of the processes under it (Triton's Python backend stubs are
    its children), onto `cpus` only."""
    top = psutil.Process(pid)
    for process in [top, *top.children(recursive=True)]:
        for thread in process.threads():
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.sched_setaffinity(thread.id, cpus)


def measure_cpu(
    loads: Loads,
    upstream: tuple[str, str],
    trees: Trees,
    args: argparse.Namespace,
    triton_pid: int,
) -> Figures:
    """CPU seconds per request of every hop from /proc, in interleaved rounds. With `args.pin`,
    each measured hop runs alone on the last CPU, and Triton, h2load and any hop in front of the
    measured one (the gateway's proxy) on the others."""
    figures: Figures = {}
    with running_hops(upstream, trees, lambda name: []) as hops:
        if args.pin:
            cpus = sorted(os.sched_getaffinity(0))
            hop_cpu, others = frozenset(cpus[-1:]), frozenset(cpus[:-1])
            pin(triton_pid, others)
            for hop in hops.values():
                pin(_pid(hop), hop_cpu)
                for _, pid in hop.cpu[1:]:
                    pin(pid, others)
            loads = dataclasses.replace(loads, cpus=others)
        for hop in hops.values():  # the proxies' pools of upstream connections grow to 16
            for protocol, concurrency in MEASURES:
                loads.run(protocol, _address(hop, protocol), concurrency, args.warmup)
        turn = 0
        for round_number in range(args.rounds):
            for protocol, concurrency in MEASURES:
                order = list(hops.items())
                if turn % 2:
                    order.reverse()  # no hop always runs first, or last
                turn += 1
                for name, hop in order:
                    before = cpu_seconds(_pid(hop))
                    loads.run(protocol, _address(hop, protocol), concurrency, args.proc_requests)
                    spent = cpu_seconds(_pid(hop)) - before
                    figures.setdefault((protocol, concurrency, name), []).append(
                        spent / args.proc_requests
                    )
            print(f"/proc: round {round_number + 1}/{args.rounds} done", file=sys.stderr)
    return figures


def _per_round(
    figures: Figures, protocol: str, concurrency: int, name: str, base: str
) -> list[float]:
    """Each round's ratio of hop `name` to hop `base`."""
    pairs = zip(
        figures[(protocol, concurrency, name)], figures[(protocol, concurrency, base)], strict=True
    )
    return [a / b if b else float("inf") for a, b in pairs]


CPU_GOALS = {"proxy": {"REST": 1.15, "gRPC": 1.3}, "gateway": {"REST": 1.3, "gRPC": 1.3}}
"""At c=16, the hop's CPU per request at most this times the bare relay's (/proc)."""


def check_goals(cpu: Figures, what: str) -> list[bool]:
    """The /proc figures' goals (`CPU_GOALS`), each printed with met or NOT MET."""
    return [
        goals.check(
            f"{what} {protocol} c=16 CPU per request / the bare relay's",
            statistics.median(_per_round(cpu, protocol, 16, "proxy", "bare")),
            most,
            unit="x",
        )
        for protocol, most in CPU_GOALS[what].items()
    ]


def _ratios(figures: Figures, protocol: str, concurrency: int, name: str, base: str) -> str:
    """The median of per-round ratios of hop `name` to hop `base`, with their range when there
    are several rounds."""
    ratios = _per_round(figures, protocol, concurrency, name, base)
    text = f"{statistics.median(ratios):.2f}x"
    if len(ratios) > 1:
        text += f" ({min(ratios):.2f}-{max(ratios):.2f})"
    return text


def table(figures: Figures, title: str, unit: Callable[[float], str], what: str) -> list[str]:
    """One row per measure: the proxy (or gateway, as `what` says), bare relay, their ratio
    and, if run, the baseline tree's and the ratio to it (ratios: the median of per-round ratios,
    and their range)."""
    baseline = any(name == "baseline" for _, _, name in figures)
    rounds = len(next(iter(figures.values())))
    width = 18 if rounds > 1 else 6
    head = f"  {'':10} {what:>8} {'bare relay':>11} {'ratio':>{width}}"
    if baseline:
        head += f" {'baseline':>9} {what + '/baseline':>{width}}"
    lines = [title, head]
    for protocol, concurrency in MEASURES:

        def median(name: str, protocol: str = protocol, concurrency: int = concurrency) -> str:
            return unit(statistics.median(figures[(protocol, concurrency, name)]))

        ratio = _ratios(figures, protocol, concurrency, "proxy", "bare")
        line = (
            f"  {protocol + ' c=' + str(concurrency):10} {median('proxy'):>8} "
            f"{median('bare'):>11} {ratio:>{width}}"
        )
        if baseline:
            against = _ratios(figures, protocol, concurrency, "proxy", "baseline")
            line += f" {median('baseline'):>9} {against:>{width}}"
        lines.append(line)
    return lines


def main() -> int:
    parser = command_line(
        "proxy_hotpath",
        (
            "Measures the proxy's own CPU per request (callgrind instructions and /proc CPU "
            "time) through `python -m proxy` against a bare TCP relay, REST and gRPC, in "
            "front of a real Triton; --baseline-tree compares two trees, --native the "
            "compiled build, --gateway the node gateway."
        ),
    )
    parser.add_argument(
        "--requests", type=int, default=4000, help="requests per callgrind measure (default 4000)"
    )
    parser.add_argument(
        "--warmup", type=int, default=300, help="requests before each measure (default 300)"
    )
    parser.add_argument(
        "--proc-requests", type=int, default=10000, help="requests per /proc run (default 10000)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="/proc rounds (default 5)")
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        help="another source tree (e.g. `git archive` of an older commit) whose `python -m "
        "proxy` runs as one more column",
    )
    parser.add_argument(
        "--native",
        action="store_true",
        help="measure the native build (`python -m proxy.native`, built first when stale); a "
        "--baseline-tree of build/native is brought up to date the same way",
    )
    parser.add_argument(
        "--private-name",
        default="",
        help="with --gateway: the gateway maps the model id to this private name in Triton "
        "(a --baseline-tree from before ignores it); default: none",
    )
    parser.add_argument(
        "--gateway",
        action="store_true",
        help="measure the node gateway (behind a proxy, as in a node) instead of the proxy",
    )
    parser.add_argument(
        "--parts", default="callgrind,proc", help="which figures: callgrind, proc or both"
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="/proc figures with each measured hop alone on the last CPU and Triton and h2load "
        "on the others (steadier rounds; see the module docstring)",
    )
    parser.add_argument(
        "--keep-dumps",
        type=Path,
        help="a folder to keep each callgrind dump in (`callgrind.HOP.PROTOCOL.cN`), for "
        "`callgrind_annotate --inclusive=yes`; default: none kept",
    )
    goals.add_flag(parser)
    args = parser.parse_args()
    if args.keep_dumps is not None:
        args.keep_dumps.mkdir(parents=True, exist_ok=True)
    parts = set(args.parts.split(","))
    if not parts or parts - {"callgrind", "proc"}:
        parser.error(f"--parts {args.parts!r}: callgrind, proc or callgrind,proc")
    if args.pin and len(os.sched_getaffinity(0)) < 2:
        parser.error("--pin needs two CPUs or more: one for the hop, the rest for the load")
    if min(args.requests, args.warmup, args.proc_requests) < 16:
        parser.error("every load needs at least 16 requests (one per connection at c=16)")
    if args.private_name and not args.gateway:
        parser.error("--private-name is the gateway's: add --gateway")
    baseline = args.baseline_tree
    if (
        baseline is not None
        and baseline.resolve() != native.DEFAULT_OUT  # built below when missing
        and not (baseline / "proxy").is_dir()
    ):
        parser.error(f"--baseline-tree {baseline}: no proxy/ package there")
    tools = ["h2load", *(["valgrind", "callgrind_control"] if "callgrind" in parts else [])]
    for tool in tools:
        if shutil.which(tool) is None:
            print(f"{tool} is missing: apt-get install -y nghttp2-client valgrind", file=sys.stderr)
            return 2
    main_tree, baseline = source_trees(args.native, baseline)
    os.environ["PYTHONHASHSEED"] = "0"  # the hops' string hashes, the same in every run
    what = "gateway" if args.gateway else "proxy"
    lines = []
    cpu: Figures = {}
    with tempfile.TemporaryDirectory(prefix="proxy-hotpath-") as tmp:
        trees = Trees(main_tree, baseline, args.gateway, Path(tmp), args.private_name)
        with running_triton(trees.work, args.private_name) as triton:
            upstream = (triton.http_url, triton.grpc_url)
            loads = Loads.write(trees.work, Hop(*upstream))
            if "callgrind" in parts:
                instructions = measure_instructions(loads, upstream, trees, args)
                lines += table(
                    instructions,
                    f"Instructions per request (callgrind, user space; {args.requests} requests "
                    f"after {args.warmup}):",
                    lambda value: f"{value / 1000:.1f}k",
                    what,
                )
            if "proc" in parts:
                assert triton.process is not None
                cpu = measure_cpu(loads, upstream, trees, args, triton.process.pid)
                placed = (
                    "each hop pinned alone on a CPU, Triton and h2load on the others"
                    if args.pin
                    else "hops, Triton and h2load wherever the kernel runs them"
                )
                lines += table(
                    cpu,
                    f"CPU per request (/proc schedstat, us; {placed}; medians of {args.rounds} "
                    f"rounds of {args.proc_requests}; ratios: medians of per-round ratios):",
                    lambda value: f"{value * 1e6:.1f}",
                    what,
                )
    entry = "proxy.gateway` (behind a proxy" if args.gateway else "proxy` (relay mode"
    build = "native build" if args.native else "pure tree"
    print(
        f"{what} hot path through `python -m {entry}, the {build}) and a bare relay"
        f"{' (behind a proxy too)' if args.gateway else ''}, real Triton; cpus={os.cpu_count()}"
    )
    print("\n".join(lines))
    return goals.exit_code(check_goals(cpu, what) if cpu else [], args.no_goal)


if __name__ == "__main__":
    sys.exit(main())
