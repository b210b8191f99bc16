"""The loader as a process when it never gets as far as a working agent: bad settings, bad
models, a missing token, and nobody listening. Each has its own exit code and termination log."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loader.errors import ExitCode
from sim.triton import free_port
from tests.conftest import copy_model
from tests.loader.loaderprocess import ROOT, run_loader


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("not-a-real-token\n")
    return path


@pytest.fixture
def nobody() -> str:
    """An address where nothing listens."""
    return f"127.0.0.1:{free_port()}"


def test_a_config_naming_another_model_exits_3_before_contacting_the_agent(
    tmp_path: Path, token: Path, nobody: str
) -> None:
    model = copy_model("add_one", tmp_path)
    run = run_loader(tmp_path, model, "other_name", nobody, token)
    assert run.returncode == ExitCode.INVALID_MODEL, run.explain()
    assert "names the model 'add_one' but the model id is 'other_name'" in run.termination_message
    assert run.termination_message.count("\n") == 1
    assert "Attempt" not in run.logs, "a model that cannot work must not wait for the agent"


def test_a_settings_mistake_exits_2_and_says_which_flag(
    tmp_path: Path, token: Path, nobody: str
) -> None:
    model = copy_model("add_one", tmp_path)
    run = run_loader(tmp_path, model, "add_one", nobody, token, "--timeout", "soon")
    assert run.returncode == ExitCode.USAGE, run.explain()
    assert "--timeout: 'soon' is not a number of seconds" in run.termination_message


def test_a_missing_token_file_exits_2_and_says_what_to_mount(tmp_path: Path, nobody: str) -> None:
    model = copy_model("add_one", tmp_path)
    run = run_loader(tmp_path, model, "add_one", nobody, tmp_path / "no-token")
    assert run.returncode == ExitCode.USAGE, run.explain()
    assert "does not exist; mount a projected service-account token" in run.termination_message


def test_an_agent_that_never_comes_exits_7_after_the_timeout(
    tmp_path: Path, token: Path, nobody: str
) -> None:
    model = copy_model("add_one", tmp_path)
    started = time.monotonic()
    run = run_loader(tmp_path, model, "add_one", nobody, token, "--timeout", "3")
    assert run.returncode == ExitCode.AGENT_UNREACHABLE, run.explain()
    assert f"the agent at {nobody} did not answer" in run.termination_message
    assert "retrying in" in run.logs
    assert time.monotonic() - started < 60


def test_an_unreachable_agent_exits_7_after_its_own_short_budget(
    tmp_path: Path, token: Path, nobody: str
) -> None:
    """A pod bound to a node whose agent just died is not left waiting for --timeout."""
    model = copy_model("add_one", tmp_path)
    started = time.monotonic()
    run = run_loader(
        tmp_path, model, "add_one", nobody, token,
        "--timeout", "30", "--agent-unreachable-seconds", "2", "--backoff-max", "0.5",
    )  # fmt: skip
    waited = time.monotonic() - started
    assert run.returncode == ExitCode.AGENT_UNREACHABLE, run.explain()
    assert waited < 20, f"the loader waited {waited:.0f} s, as if for --timeout"
    assert f"the node's agent at {nobody} is unreachable" in run.termination_message
    assert "--agent-unreachable-seconds" in run.termination_message
    assert "node pod" in run.termination_message
    assert "retrying in" in run.logs


def test_sigterm_while_waiting_exits_143_and_says_so(
    tmp_path: Path, token: Path, nobody: str
) -> None:
    model = copy_model("add_one", tmp_path)
    termination_log = tmp_path / "termination-log"
    log_file = tmp_path / "loader.log"
    command = [
        sys.executable,
        "-m",
        "loader",
        "--model-dir",
        str(model),
        "--model-id",
        "add_one",
        "--agent-address",
        nobody,
        "--token-file",
        str(token),
        "--termination-log",
        str(termination_log),
    ]
    with log_file.open("w") as log:
        process = subprocess.Popen(command, cwd=ROOT, stderr=log, stdout=log)
    try:
        deadline = time.monotonic() + 60
        while "retrying in" not in log_file.read_text():
            assert process.poll() is None, log_file.read_text()
            assert time.monotonic() < deadline, "the loader never started retrying"
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        returncode = process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert returncode == ExitCode.STOPPED, log_file.read_text()
    assert termination_log.read_text() == "stopped by SIGTERM before model add_one was READY\n"
