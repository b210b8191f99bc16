"""Run `python -m loader` as the kubelet would: a process, its exit code, logs, termination log."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class LoaderRun:
    """One finished loader process."""

    returncode: int
    logs: str
    termination_message: str

    def explain(self) -> str:
        """Everything a failed assertion should show."""
        return (
            f"exit {self.returncode}\n--- termination log\n{self.termination_message}\n"
            f"--- logs\n{self.logs}"
        )


def run_loader(
    tmp_path: Path,
    model_dir: Path,
    model_id: str,
    agent_address: str,
    token_file: Path,
    *extra: str,
    timeout: float = 120.0,
) -> LoaderRun:
    """Run the loader to completion (killed after `timeout` seconds, which fails the test)."""
    termination_log = tmp_path / f"termination-log-{len(list(tmp_path.glob('termination-*')))}"
    command = [
        sys.executable,
        "-m",
        "loader",
        "--model-dir",
        str(model_dir),
        "--model-id",
        model_id,
        "--agent-address",
        agent_address,
        "--token-file",
        str(token_file),
        "--termination-log",
        str(termination_log),
        *extra,
    ]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TRITONSHARE_")}
    done = subprocess.run(
        command,
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    message = termination_log.read_text() if termination_log.exists() else ""
    return LoaderRun(done.returncode, done.stderr + done.stdout, message)
