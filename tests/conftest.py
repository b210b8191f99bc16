"""Fixtures every test folder shares: a real Triton, the shipped test models, and leak guards.

A test that needs a tool (the tritonserver binary, promtool, kubectl, h2load) skips when the tool
is missing on a developer's machine, and fails when it is missing in CI (`CI=true`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sim.triton import TritonInstall, TritonServer, TritonUnavailableError

pytest_plugins = ["tests.fixtures_sim"]

MODELS_DIR = Path(__file__).parent / "models"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_tool(available: bool, reason: str) -> None:
    """Skip outside CI, fail in CI, when a tool the test needs is missing."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: a missing tool is a failure, install it in .ci/run)")
    pytest.skip(reason)


def require_executable(name: str) -> str:
    """Path of executable `name`, or skip/fail as require_tool does."""
    path = shutil.which(name)
    require_tool(path is not None, f"{name} is not installed (apt-get install the package)")
    assert path is not None
    return path


@pytest.fixture(scope="session")
def triton_install() -> TritonInstall:
    try:
        return TritonInstall.find()
    except TritonUnavailableError as e:
        require_tool(False, str(e))
        raise


@pytest.fixture
def model_repository(tmp_path: Path) -> Path:
    """An empty Triton model repository in a temp dir."""
    repo = tmp_path / "repository"
    repo.mkdir()
    return repo


def copy_model(name: str, repository: Path, as_name: str | None = None) -> Path:
    """Copy a shipped test model into `repository` (renaming it, and its config, if asked)."""
    target = repository / (as_name or name)
    shutil.copytree(MODELS_DIR / name, target)
    if as_name and as_name != name:
        config = target / "config.pbtxt"
        config.write_text(config.read_text().replace(f'name: "{name}"', f'name: "{as_name}"', 1))
    return target


@pytest.fixture
def triton(triton_install: TritonInstall, model_repository: Path) -> Iterator[TritonServer]:
    """A real Triton on free ports, explicit model control, over an empty temp repository."""
    server = TritonServer(model_repository)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def _no_leaked_processes_or_threads() -> Iterator[None]:
    """Fail a test that leaves child processes or non-daemon threads running."""
    me = psutil.Process()
    children_before = {p.pid for p in me.children(recursive=True)}
    threads_before = {t.ident for t in threading.enumerate()}
    yield
    leaked = [p for p in me.children(recursive=True) if p.pid not in children_before]
    alive = []
    for p in leaked:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{p.pid} {' '.join(p.cmdline()[:3])}")
        except psutil.NoSuchProcess:
            continue
    for p in leaked:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    assert not alive, f"the test leaked child processes: {alive}"
    threads = [
        t.name
        for t in threading.enumerate()
        if t.ident not in threads_before and t.is_alive() and not t.daemon
    ]
    assert not threads, f"the test leaked non-daemon threads: {threads}"
