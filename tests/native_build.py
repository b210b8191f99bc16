"""The native build, and the proxy's tests run again against it, started in the background as the
session starts (tests/proxy/test_native.py waits for them): the compiler and the second run
(mostly waiting on its servers: about 25 s of CPU in 70 s) then use the core the rest of the suite
leaves idle, instead of holding the suite up for two minutes when that module's turn comes. Under
pytest-xdist (`make test`) no core is idle: the module's worker builds and reruns in the foreground.

`python -m tests.native_build [--rerun]` is that background job: the build, then (with --rerun)
`NATIVE_TESTS` against it; exit 0, `BUILD_FAILED` or `RERUN_FAILED`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

from proxy import native
from tests.process_tree import descendant_pids

MODULE = "tests/proxy/test_native.py"
RERUN_TEST = f"{MODULE}::test_the_end_to_end_tests_pass_against_the_native_build"
BUILD_FAILED = 3
RERUN_FAILED = 4

NATIVE_TESTS = (
    "tests/proxy/test_forwarding.py",
    "tests/proxy/test_isolation.py",
    "tests/proxy/grpc/test_conformance.py",
    "tests/proxy/grpc/test_edges.py",
    "tests/proxy/grpc/test_relay_channel.py",
    "tests/proxy/http1/test_relay.py",
    "tests/proxy/http2/test_headers.py",
    "tests/proxy/http2/test_state.py",
    "tests/proxy/gateway/test_gateway.py",
    "tests/proxy/gateway/test_inflate_attacks.py",
    "tests/proxy/gateway/test_private_names.py",
    "tests/proxy/gateway/test_spread.py",
    "tests/proxy/gateway/test_isolation_private.py",
    "tests/proxy/grpc/test_renaming.py",
    "tests/proxy/policy/test_naming.py",
    "tests/proxy/grpc/test_large_stream.py",
    "tests/proxy/grpc/test_pieces.py",
    "tests/proxy/policy/test_inflation.py",
    "tests/proxy/policy/test_finals.py",
    "tests/proxy/gateway/test_stream_flood.py",
    "tests/proxy/policy/test_holdings.py",
    "tests/proxy/policy/test_tensors.py",
    "tests/proxy/gateway/test_triton_crash.py",
    "tests/proxy/test_parking_calls.py",
    "tests/proxy/test_lost_calls.py",
)
"""Tests run a second time against the compiled proxy (none of them patch what they test).
http2/test_reader.py runs pure only: it hands the reader a sink of its own, and a compiled
`FrameSink` takes no interpreted subclass; the compiled reader's rules are read through the
relay by the conformance and edge tests."""


def native_env(build: Path = native.DEFAULT_OUT) -> dict[str, str]:
    """The environment in which `proxy` is imported from `build`."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join((str(build), str(native.ROOT)))}


def rerun_command() -> list[str]:
    """pytest over `NATIVE_TESTS`, with build/native's `proxy` first (`python -P` and
    `--import-mode=append`, so neither the working directory nor the rootdir comes before it)."""
    return [sys.executable, "-P", "-m", "pytest", "--import-mode=append", "-p", "no:cacheprovider",
            "-p", "no:randomly", "-q", "-x", *NATIVE_TESTS]  # fmt: skip


def tools_problem() -> str:
    """Why the native build cannot run here ('' when it can)."""
    compiler = os.environ.get("CC") or sysconfig.get_config_var("CC") or "gcc"
    if shutil.which(compiler.split()[0]) is None:
        return f"no C compiler ({compiler}) for mypyc"
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.is_file():
        return f"no Python headers ({headers}): install python3-dev"
    return ""


@dataclass
class Building:
    """A `python -m proxy.native` running, its output going to a file (a pipe nobody reads
    until the end could fill and stall it)."""

    process: subprocess.Popen[bytes]
    output: IO[bytes]

    rerun: bool
    """Whether the job also runs `NATIVE_TESTS` against the build."""
    result: tuple[int, str] | None = None

    def wait(self, timeout: float) -> tuple[int, str]:
        """The job's exit code and output, once it has ended; raises BuildFailedError if the
        build failed."""
        if self.result is None:
            code = self.process.wait(timeout)
            self.output.seek(0)
            self.result = (code, self.output.read().decode(errors="replace"))
            self.output.close()
        if self.result[0] not in (0, RERUN_FAILED):  # BUILD_FAILED, or the job was killed
            raise BuildFailedError(self.result[1])
        return self.result


class BuildFailedError(Exception):
    """The background build exited with an error; the message is its output."""


BUILD_IN_BACKGROUND = pytest.StashKey[Building]()
"""The build `start_building` started, if it did."""


def in_xdist_worker() -> bool:
    """Whether this process is a pytest-xdist worker (`make test` runs two)."""
    return "PYTEST_XDIST_WORKER" in os.environ


def start_building(session: pytest.Session) -> None:
    """Start `python -m proxy.native` when collection has chosen `MODULE`'s tests; never in an
    xdist worker (every worker collects every test, and the workers already keep the cores busy:
    `MODULE` builds and reruns in the foreground there)."""
    if in_xdist_worker() or tools_problem():
        return
    if not any(item.nodeid.startswith(MODULE) for item in session.items):
        return
    rerun = any(item.nodeid == RERUN_TEST for item in session.items)
    output = tempfile.TemporaryFile()  # noqa: SIM115 (closed by Building.wait or stop_building)
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.native_build", *(["--rerun"] if rerun else [])],
        cwd=native.ROOT, stdout=output, stderr=subprocess.STDOUT,
    )  # fmt: skip
    session.config.stash[BUILD_IN_BACKGROUND] = Building(process, output, rerun)


def building_processes(session: pytest.Session) -> set[int]:
    """The pids of the background build and everything it runs (none once it has ended)."""
    building = session.config.stash.get(BUILD_IN_BACKGROUND, None)
    if building is None or building.process.poll() is not None:
        return set()
    return {building.process.pid} | descendant_pids(building.process.pid)


def stop_building(session: pytest.Session) -> None:
    """End a background build the session no longer waits for (a run stopped early)."""
    building = session.config.stash.get(BUILD_IN_BACKGROUND, None)
    if building is not None and not building.output.closed:
        if building.process.poll() is None:
            building.process.kill()
        building.process.wait()
        building.output.close()


def rerun_in_foreground(build: Path, timeout: float) -> tuple[int, str]:
    """`NATIVE_TESTS` against `build`, now (in a process that is no xdist worker): the exit code
    and the output."""
    env = {k: v for k, v in native_env(build).items() if not k.startswith("PYTEST_XDIST")}
    done = subprocess.run(
        rerun_command(), cwd=native.ROOT, env=env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def main(argv: list[str]) -> int:
    """The background job: build, then (with --rerun) the tests against the build."""
    built = subprocess.run([sys.executable, "-m", "proxy.native"], cwd=native.ROOT, check=False)
    if built.returncode != 0:
        return BUILD_FAILED
    if "--rerun" not in argv:
        return 0
    print("--- NATIVE_TESTS against build/native ---", flush=True)
    tested = subprocess.run(rerun_command(), cwd=native.ROOT, env=native_env(), check=False)
    return 0 if tested.returncode == 0 else RERUN_FAILED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
