"""The proxy's optional native build: the relays' hot modules compiled with mypyc.

`python -m proxy.native [--out build/native]` (or `make native`) copies the packages that
`python -m proxy` and `python -m proxy.gateway` run from (`PACKAGES`) into `--out` and compiles
`COMPILED` there with mypyc, the same source and types, no rewrites; then

    PYTHONPATH=build/native python -m proxy ...

runs the compiled proxy (and `python -m proxy.gateway` the compiled gateway), while the working
tree stays pure Python: no `.so` file ever sits next to a source file a test or an editor reads.
The copy is rebuilt only when what it was built from changed (a hash of the copied files, the
module list, mypy's and Python's versions, kept in `STAMP`), so calling `build` before every use
costs a hash when nothing changed and never leaves a stale copy in use. The image build
(Dockerfile) compiles the same list and puts the extensions next to the installed package.

What is compiled and what is not (with why) is `COMPILED` and `LEFT_OUT`; the figures are in
docs/proxy.md (Performance). Compiled modules must keep mypyc's rules: only assignments in class
bodies, no identity tests on values whose static type is a fixed-length tuple (mypyc unpacks and
packs them again), no monkeypatching of compiled classes or functions (tests that patch run the
pure tree only).

What it must not do: write anywhere but `--out`, or be imported by the running proxy.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "build" / "native"
STAMP = ".native-stamp"
"""File in the build holding the hash of what it was built from."""
PACKAGES = ("proxy", "common", "protos")
"""What `python -m proxy` and `python -m proxy.gateway` import from this repository."""
COMPILED = (
    "proxy/http1/__init__.py",
    "proxy/http1/answers.py",
    "proxy/http1/connection.py",
    "proxy/http1/cycle.py",
    "proxy/http1/exchange.py",
    "proxy/http1/framing.py",
    "proxy/http1/gate.py",
    "proxy/http1/listener.py",
    "proxy/http1/relay.py",
    "proxy/http1/renaming.py",
    "proxy/http1/upstream.py",
    "proxy/http2/__init__.py",
    "proxy/http2/flow.py",
    "proxy/http2/frames.py",
    "proxy/http2/headers.py",
    "proxy/http2/reader.py",
    "proxy/http2/streamstates.py",
    "proxy/grpc/__init__.py",
    "proxy/grpc/channel.py",
    "proxy/grpc/connection.py",
    "proxy/grpc/framing.py",
    "proxy/grpc/gate.py",
    "proxy/grpc/intake.py",
    "proxy/grpc/messages.py",
    "proxy/grpc/outbox.py",
    "proxy/grpc/relay.py",
    "proxy/grpc/replies.py",
    "proxy/grpc/server.py",
    "proxy/grpc/stream.py",
    "proxy/policy/__init__.py",
    "proxy/policy/admission.py",
    "proxy/policy/finals.py",
    "proxy/policy/inflation.py",
    "proxy/policy/limiter.py",
    "proxy/policy/naming.py",
    "proxy/policy/nesting.py",
    "proxy/policy/refusals.py",
    "proxy/policy/routing.py",
    "proxy/policy/shapes.py",
    "proxy/policy/share.py",
    "proxy/policy/tensors.py",
    "proxy/policy/throttle.py",
    "proxy/policy/wire.py",
    "proxy/metrics.py",
    "proxy/table.py",
)
"""Every module a request passes through in the REST and gRPC relays (both the proxy's and the
gateway's), and what they call per request; compiled as one group, so calls between them are C
calls."""
LEFT_OUT = {
    "proxy/grpc/grpcio.py": "the --grpc-mode grpcio path: its cost is grpc.aio's, not its own",
    "proxy/app.py": "wiring and the lifecycle, run once per process",
    "proxy/policy/inflight.py": "the node's in-flight pools: only the gateway calls it, "
    "where each call is a few dictionary look-ups beside a whole relayed request",
    "proxy/policy/probation.py": "the gateway's probation lane: only pods on probation, after "
    "an unexpected exit of Triton, touch it",
    "proxy/policy/holdings.py": "the node's byte budget: asked by a pod's read only past its "
    "allowance, and by the gateway's walk every 0.1 s, never per request",
    "proxy/reconnect.py": "connecting again while the upstream refuses: a restart's moments, "
    "never per request",
    "proxy/gateway/": "wiring, the caller table and its metrics: the gateway's requests run "
    "through the compiled relays",
    "proxy/__main__.py": "run once per process (also proxy/settings, state, sockets, runner, "
    "idle, readiness, agentclient, residency: startup, the idle sweep, the agent and an "
    "on-demand model's sleep and wake, not per request)",
    "common/, protos/": "other parts' code; nothing per request",
}
"""Modules left interpreted on purpose, with why."""


def _sources(root: Path) -> list[Path]:
    """The files copied into a build, relative to `root`, in a fixed order."""
    files = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".so":
                files.append(path.relative_to(root))
    return files


def fingerprint(root: Path = ROOT) -> str:
    """What a build of `root` depends on: its sources, the module list, mypy and Python."""
    digest = hashlib.sha256()
    digest.update(repr((COMPILED, sys.version, importlib.metadata.version("mypy"))).encode())
    for relative in [Path("pyproject.toml"), *_sources(root)]:
        digest.update(str(relative).encode() + b"\0")
        digest.update((root / relative).read_bytes() + b"\0")
    return digest.hexdigest()


def up_to_date(out: Path = DEFAULT_OUT, root: Path = ROOT) -> bool:
    """Whether `out` holds a finished build of `root` as it is now."""
    stamp = out / STAMP
    return stamp.is_file() and stamp.read_text().strip() == fingerprint(root)


def _mypy_ini(root: Path) -> str:
    """pyproject.toml's [tool.mypy] as a mypy.ini for mypyc (a copy of pyproject.toml would also
    hand setuptools the project's own packaging). Without `strict` and with missing stubs
    ignored: `make types` holds the code to those; the build only needs the types, also where
    the test extra's stub packages (grpc-stubs, types-protobuf) are not installed, as in the
    image."""
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mypy"]
    for strictness in ("strict", "warn_unreachable"):
        config.pop(strictness, None)
    config["ignore_missing_imports"] = True

    def section(name: str, options: dict[str, object]) -> str:
        lines = [f"[{name}]"]
        for key, value in options.items():
            if key not in ("module", "exclude"):
                lines.append(f"{key} = {value}")
        return "\n".join(lines) + "\n"

    overrides = config.pop("overrides", [])
    text = section("mypy", config)
    for override in overrides:
        modules = override["module"]
        modules = [modules] if isinstance(modules, str) else modules
        text += section("mypy-" + ",".join(modules), override)
    return text


_SETUP = """
import sys
from setuptools import setup
from mypyc.build import mypycify

setup(name="tritonshare-native", ext_modules=mypycify(sys.argv[1:], opt_level="3"),
      script_args=["build_ext", "--inplace", "--build-temp", ".native-tmp"])
"""


def build(out: Path = DEFAULT_OUT, root: Path = ROOT, force: bool = False) -> bool:
    """Copy `PACKAGES` of `root` into `out` and compile `COMPILED` there, unless `out` already
    holds a build of the same sources; True when it built. Raises CalledProcessError (with
    mypyc's and the compiler's output) when the build fails; `out` is then left as it was."""
    stamp = fingerprint(root)
    if not force and up_to_date(out, root):
        return False
    work = out.with_name(out.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for relative in _sources(root):
        (work / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / relative, work / relative)
    compile_in(work, out, COMPILED, _mypy_ini(root), stamp)
    return True


def compile_in(work: Path, out: Path, modules: Sequence[str], mypy_ini: str, stamp: str) -> None:
    """Compile `modules` (paths under `work`, which holds a copy of their sources) with mypyc
    in place under `mypy_ini`, then put `work` where `out` was, marked with `stamp` in `STAMP`.
    Raises CalledProcessError (with mypyc's and the compiler's output) when the build fails:
    `work` is removed and `out` left as it was."""
    (work / "mypy.ini").write_text(mypy_ini)
    env = {**os.environ, "PYTHONPATH": str(work), "MYPY_CACHE_DIR": str(work / ".mypy_cache")}
    try:
        subprocess.run(
            [sys.executable, "-c", _SETUP, *modules],
            cwd=work, env=env, check=True, capture_output=True, text=True,
        )  # fmt: skip
    except subprocess.CalledProcessError:
        shutil.rmtree(work, ignore_errors=True)
        raise
    for scratch in (".native-tmp", ".mypy_cache", "build"):
        shutil.rmtree(work / scratch, ignore_errors=True)
    (work / STAMP).write_text(stamp + "\n")
    shutil.rmtree(out, ignore_errors=True)
    work.rename(out)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to build")
    parser.add_argument("--force", action="store_true", help="build even when up to date")
    args = parser.parse_args(argv)
    out: Path = args.out.resolve()
    try:
        built = build(out, force=args.force)
    except subprocess.CalledProcessError as e:
        print(f"{e.stdout}{e.stderr}\nproxy.native: the mypyc build failed", file=sys.stderr)
        return 1
    state = "built" if built else "up to date"
    print(f"proxy.native: {out} {state}: PYTHONPATH={out} python -m proxy runs it compiled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
