"""The native build started in the background as the session starts (tests/proxy/test_native.py
waits for it): the compiler then works on a core the suite leaves idle while most tests wait on
their servers, instead of holding the suite up for a minute when that module's turn comes."""

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

import psutil
import pytest

from proxy import native

MODULE = "tests/proxy/test_native.py"


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

    def wait(self, timeout: float) -> str:
        """Wait for the build to end; its output, raising BuildFailed if it failed."""
        code = self.process.wait(timeout)
        self.output.seek(0)
        text = self.output.read().decode(errors="replace")
        self.output.close()
        if code != 0:
            raise BuildFailedError(text)
        return text


class BuildFailedError(Exception):
    """The background build exited with an error; the message is its output."""


BUILD_IN_BACKGROUND = pytest.StashKey[Building]()
"""The build `start_building` started, if it did."""


def start_building(session: pytest.Session) -> None:
    """Start `python -m proxy.native` when collection has chosen `MODULE`'s tests."""
    if tools_problem() or not any(item.nodeid.startswith(MODULE) for item in session.items):
        return
    output = tempfile.TemporaryFile()  # noqa: SIM115 (closed by Building.wait or stop_building)
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy.native"],
        cwd=native.ROOT, stdout=output, stderr=subprocess.STDOUT,
    )  # fmt: skip
    session.config.stash[BUILD_IN_BACKGROUND] = Building(process, output)


def building_processes(session: pytest.Session) -> set[int]:
    """The pids of the background build and everything it runs (none once it has ended)."""
    building = session.config.stash.get(BUILD_IN_BACKGROUND, None)
    if building is None or building.process.poll() is not None:
        return set()
    try:
        root = psutil.Process(building.process.pid)
        return {root.pid} | {p.pid for p in root.children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def stop_building(session: pytest.Session) -> None:
    """End a background build the session no longer waits for (a run stopped early)."""
    building = session.config.stash.get(BUILD_IN_BACKGROUND, None)
    if building is not None and not building.output.closed:
        if building.process.poll() is None:
            building.process.kill()
        building.process.wait()
        building.output.close()
