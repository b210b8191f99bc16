"""Fixtures every test folder shares: a real Triton, the shipped test models, and leak guards.

A test that needs a tool (the tritonserver binary, promtool, kubectl, h2load) skips when the tool
is missing on a developer's machine, and fails when it is missing in CI (`CI=true`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import pytest_asyncio

from sim.triton import TritonInstall, TritonServer, TritonUnavailableError
from tests.native_build import building_processes, start_building, stop_building
from tests.process_tree import descendant_pids

pytest_plugins = ["tests.fixtures_sim", "tests.parallel"]

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


def pytest_collection_finish(session: pytest.Session) -> None:
    start_building(session)


def pytest_sessionfinish(session: pytest.Session) -> None:
    stop_building(session)


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
        server.discard()


@pytest.fixture(autouse=True)
def _no_leaked_processes_or_threads(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves child processes or non-daemon threads running (the session's
    background native build and what it runs are not the test's)."""
    me = os.getpid()
    children_before = descendant_pids(me)
    threads_before = {t.ident for t in threading.enumerate()}
    yield
    new = descendant_pids(me) - children_before
    # After the listing, so that it has all they started; only when there is something to exempt.
    exempt = building_processes(request.session) if new else set()
    leaked = []
    for pid in sorted(new - exempt):
        with contextlib.suppress(psutil.NoSuchProcess):
            leaked.append(psutil.Process(pid))
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


LEAK_REPORT = os.environ.get("TRITONSHARE_LEAK_REPORT", "")
"""A file to append leaked tasks to instead of failing (one JSON line a test): for surveying the
whole suite at once. Empty (the default, and always in CI): a leaked task fails its test."""


TASK_GRACE_SECONDS = 1.0
"""How long tasks still running after a test's teardown may take to end on their own (a request
iterator finishing its last sleep, a callback chain unwinding) before they count as leaked."""


def pending_tasks(loop: asyncio.AbstractEventLoop) -> list[asyncio.Task[object]]:
    """The tasks still pending on `loop` after `TASK_GRACE_SECONDS` to end on their own."""
    running = asyncio.all_tasks(loop)
    if running:
        loop.run_until_complete(asyncio.wait(running, timeout=TASK_GRACE_SECONDS))
    return [task for task in asyncio.all_tasks(loop) if not task.done()]


@pytest.fixture(autouse=True)
def _no_leaked_asyncio_tasks(
    request: pytest.FixtureRequest, _no_leaked_processes_or_threads: None
) -> Iterator[None]:
    """Fail an async test that leaves asyncio tasks pending once its own fixtures are torn down.

    pytest-asyncio's runner cancels such tasks silently when it closes the loop, so a server or a
    watch a test forgot to stop would go unnoticed (and in the product, a task nobody awaits is a
    task nobody stops). Requesting the runner here makes it outlive this fixture: this teardown
    runs after the test's async fixtures have stopped what they started, before the loop closes.
    """
    if not pytest_asyncio.is_async_test(request.node):
        yield
        return
    runner = request.getfixturevalue("_function_scoped_runner")
    yield
    loop = runner.get_loop()
    leaked = pending_tasks(loop)
    if not leaked:
        return
    names = sorted(f"{task.get_name()}: {task.get_coro()!r}" for task in leaked)
    for task in leaked:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*leaked, return_exceptions=True))
    if LEAK_REPORT:
        with Path(LEAK_REPORT).open("a", encoding="utf-8") as report:
            report.write(json.dumps({"test": request.node.nodeid, "tasks": names}) + "\n")
        return
    pytest.fail(f"the test left asyncio tasks pending: {names}", pytrace=False)
