"""`python -m benchmarks.autoscale` times each phase of a cold start from the pods' own status,
and its single-scale-up mode refuses a count it cannot run before starting anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from benchmarks import autoscale as bench
from sim.demo.autoscale import KEPT_MESSAGE, PodWatch


def _pod(loader: dict[str, Any] | None = None, ready: bool = False) -> dict[str, Any]:
    initializer = {"name": "storage-initializer", "state": {"terminated": {"exitCode": 0}}}
    return {
        "metadata": {"name": "scaler-1"},
        "spec": {"nodeName": "n1"},
        "status": {
            "podIP": "127.1.0.5",
            "initContainerStatuses": [initializer] + ([loader] if loader else []),
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def test_loaded_is_when_the_loader_saw_the_model_ready_and_says_where_the_files_came_from(
    tmp_path: Path,
) -> None:
    # Nothing is watched: the phases come from the pod objects handed to it.
    watch = PodWatch(kubernetes.client.ApiClient(), "models", tmp_path / "targets.json")
    watch._seen("ADDED", _pod())
    running = {"name": "loader", "state": {"running": {}}}
    watch._seen("MODIFIED", _pod(running))
    times = watch.pods["scaler-1"]
    assert set(times.phases) == {"bound", "files in the pod"}

    message = f"model scaler is READY on GPU 0 after 2.0 s: its 2 files {KEPT_MESSAGE}"
    done = {"name": "loader", "state": {"terminated": {"exitCode": 0, "message": message}}}
    watch._seen("MODIFIED", _pod(done))
    assert "loaded" in times.phases and "ready" not in times.phases
    assert times.kept
    watch._seen("MODIFIED", _pod(done, ready=True))
    phases = times.since_created()
    assert phases["bound"] <= phases["loaded"] <= phases["ready"]

    sent = {"name": "loader", "state": {"terminated": {"exitCode": 0, "message": "sent 2 files"}}}
    other = PodWatch(kubernetes.client.ApiClient(), "models", tmp_path / "other.json")
    other._seen("MODIFIED", _pod(sent))
    assert not other.pods["scaler-1"].kept


def test_a_scale_up_of_no_replicas_is_refused_with_the_flag_to_fix(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.argv", ["autoscale.py", "--cold-start-only", "--new-replicas", "0"])
    with pytest.raises(SystemExit) as exited:
        bench.main()
    assert exited.value.code == 2
    assert "--new-replicas must be at least 1, not 0" in capsys.readouterr().err
