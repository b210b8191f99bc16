"""Probe: what each process of the full path does per gRPC call at concurrency 1, by strace.

Latency on a shared box swings by tens of microseconds; what a hop does per call does not. This
starts a real Triton serving add_one, the node gateway and a relay-mode proxy in front of it as
`proxy_latency`'s full path runs them (`--private-name` as there), warms the path up, attaches
`strace -f` to the gateway and the proxy, sends `--calls` back-to-back ModelInfer calls with the
python grpc client (`--h2load`: h2load's framing, one stream at a time on one connection), and
prints per call, for each process: every system call's count, and for each of its connections
(named by who is at the other end) the reads and writes that carried HTTP/2 frames and the frames
they carried, by kind (`*`: END_STREAM, or ACK on SETTINGS and PING). It shows
that the gateway reads and writes the same frames with either client, two reads and two writes a
call, and that a call costs it the same system calls as the bare relay plus the share's clock.

    .venv/bin/python -m benchmarks.proxy_framing [--calls 500] [--h2load] [--native]
        [--private-name NAME]

strace slows the traced processes many times over: the counts are what to read, not the times.
"""

from __future__ import annotations

import collections
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from benchmarks import command_line
from benchmarks.proxy_latency import (
    POD_ADDRESS,
    grpc_request,
    running_gateway,
    running_proxy,
    running_triton,
    source_trees,
)

KINDS = {0: "DATA", 1: "HEADERS", 3: "RST_STREAM", 4: "SETTINGS", 6: "PING", 7: "GOAWAY"}
KINDS |= {8: "WINDOW_UPDATE", 9: "CONTINUATION"}
_FLAGGED = {0, 1, 4, 6}
"""Kinds whose flag 0x1 means something to a reader of the counts (END_STREAM, ACK)."""
_CALL = re.compile(r"^\d+\s+(\w+)\((\d+)?(.*)\)\s+=\s+(-?\d+)")
_DATA = re.compile(r'^, "((?:\\x[0-9a-f]{2})*)"')
_STRACE = ("strace", "-f", "-xx", "-s", "65536")
"""Every thread, every system call, written data in hex, whole (frames are parsed from it)."""
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def frame_kinds(data: bytes) -> list[str]:
    """The kinds of the HTTP/2 frames that `data` starts with (a connection preface skipped)."""
    if data.startswith(_PREFACE):
        data = data[len(_PREFACE) :]
    kinds, pos = [], 0
    while pos + 9 <= len(data):
        length, kind, flags = (
            int.from_bytes(data[pos : pos + 3], "big"),
            data[pos + 3],
            data[pos + 4],
        )
        name = KINDS.get(kind, f"type {kind}")
        kinds.append(name + ("*" if kind in _FLAGGED and flags & 1 else ""))
        pos += 9 + length
    return kinds


def peers(pid: int, upstream: dict[int, str], clients: dict[int, str]) -> dict[str, str]:
    """Each TCP socket of `pid` ("fd N") named for the process at its other end: `upstream` by
    the port it connected to, `clients` by the port of `pid` they connected to."""
    inodes: dict[str, str] = {}
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = fd.readlink().name if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes[target[8:-1]] = fd.name
    named = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, inode = int(fields[1][-4:], 16), int(fields[2][-4:], 16), fields[9]
        if inode in inodes and remote:  # a listening socket has no other end
            other = upstream.get(remote) or clients.get(local) or f"port {remote}"
            named[f"fd {inodes[inode]}"] = other
    return named


def per_call(trace: Path, connections: dict[str, str], calls: int) -> list[str]:
    """The lines to print for one process's trace: system calls, then frames by connection."""
    syscalls: collections.Counter[str] = collections.Counter()
    frames: collections.Counter[tuple[str, str]] = collections.Counter()
    for line in trace.read_text(errors="replace").splitlines():
        match = _CALL.match(line)
        if match is None:
            continue
        call, fd, rest, result = match.groups()
        syscalls[call] += 1
        data = _DATA.match(rest)
        if fd is None or data is None or int(result) <= 0 or call not in ("read", "write"):
            continue
        payload = bytes.fromhex(data[1].replace("\\x", ""))[: int(result)]
        # A connection opened during the calls (h2load's own) was not there to be named.
        where = connections.get(f"fd {fd}", f"a connection opened meanwhile (fd {fd})")
        direction = "reads from" if call == "read" else "writes to"
        frames[(f"{direction} {where}", call + "s")] += 1
        for kind in frame_kinds(payload):
            frames[(f"{direction} {where}", kind)] += 1
    lines = [
        "  system calls: " + ", ".join(f"{n} {c / calls:.2f}" for n, c in syscalls.most_common())
    ]
    for place in sorted({place for place, _ in frames}):
        counts = [
            f"{kind} {c / calls:.2f}" for (p, kind), c in sorted(frames.items()) if p == place
        ]
        lines.append(f"  {place}: {', '.join(counts)}")
    return lines


def main() -> int:
    parser = command_line(
        "proxy_framing",
        (
            "Counts, by strace, the system calls and HTTP/2 frames the node gateway and a "
            "proxy spend per gRPC call at concurrency 1 over --calls calls (--h2load: "
            "h2load's framing; --native: the compiled build); the counts are what to read, "
            "not the times."
        ),
    )
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--h2load", action="store_true", help="h2load's framing, not grpc's")
    parser.add_argument("--native", action="store_true", help="the native build, as proxy_latency")
    parser.add_argument("--private-name", default="", help="as proxy_latency's --private-name")
    args = parser.parse_args()
    tree, _ = source_trees(args.native, None)
    request = grpc_request()
    with tempfile.TemporaryDirectory(prefix="proxy-framing-") as tmp:
        work = Path(tmp)
        framed = work / "infer.grpc"
        framed.write_bytes(b"\x00" + len(request).to_bytes(4, "big") + request)
        with (
            running_triton(work, args.private_name) as triton,
            running_gateway(
                (triton.http_url, triton.grpc_url), work, tree, private_name=args.private_name
            ) as gateway,
            running_proxy(
                (gateway.rest, gateway.grpc),
                ["--grpc-mode", "relay", "--source-address", POD_ADDRESS],
                tree,
            ) as hop,
        ):
            gateway_pid, proxy_pid = gateway.cpu[0][1], hop.cpu[0][1]
            with grpc.insecure_channel(hop.grpc) as channel:
                call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer", None, None)
                for _ in range(100):  # every connection open before the sockets are named
                    call(request, timeout=10)
                named = {
                    "gateway": peers(
                        gateway_pid,
                        {_port(triton.grpc_url): "Triton"},
                        {_port(gateway.grpc): "the proxy"},
                    ),
                    "proxy": peers(
                        proxy_pid,
                        {_port(gateway.grpc): "the gateway"},
                        {_port(hop.grpc): "the client"},
                    ),
                }
                traces = {name: work / f"strace.{name}" for name in named}
                tracers = [
                    subprocess.Popen(
                        [*_STRACE, "-o", str(traces[name]), "-p", str(pid)],
                        stderr=subprocess.DEVNULL,
                    )
                    for name, pid in (("gateway", gateway_pid), ("proxy", proxy_pid))
                ]
                time.sleep(1.0)  # strace attached to every thread
                if args.h2load:
                    command = ["h2load", "-n", str(args.calls), "-c", "1", "-m", "1", "-t", "1"]
                    command += ["-d", str(framed), "-H", "content-type: application/grpc"]
                    command += ["-H", "te: trailers"]
                    command.append(f"http://{hop.grpc}/inference.GRPCInferenceService/ModelInfer")
                    subprocess.run(command, check=True, capture_output=True)
                else:
                    for _ in range(args.calls):
                        call(request, timeout=10)
                for tracer in tracers:
                    tracer.send_signal(signal.SIGINT)  # detaches; the traced process goes on
                    tracer.wait(30)
            client = "h2load, one connection" if args.h2load else "the python grpc client"
            print(f"Per call, {args.calls} calls at c=1 with {client} (strace; counts only):")
            for name, trace in traces.items():
                print(f"{name}:")
                print("\n".join(per_call(trace, named[name], args.calls)))
    return 0


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


if __name__ == "__main__":
    sys.exit(main())
