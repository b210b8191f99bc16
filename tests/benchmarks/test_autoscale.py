"""`python -m benchmarks.autoscale` times each phase of a cold start from the pods' own status
(or, for a TritonModel, from the model's placements and its hosts' conditions), and refuses
flags it cannot run before starting anything."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from benchmarks import autoscale as bench
from common.contract import Keys
from common.hosted import loaded_condition, serves_label
from sim.demo.autoscale import KEPT_MESSAGE, PodWatch, ReplicaWatch, steps


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


def _model(replicas: int, placed: dict[int, str]) -> dict[str, Any]:
    placements = [{"replica": r, "node": node} for r, node in placed.items()]
    return {"spec": {"replicas": replicas}, "status": {"placements": placements}}


def _host(node: str, loaded: bool = False, ready: bool = False, replica: int = 0) -> dict[str, Any]:
    keys = Keys()
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if loaded:
        conditions.append({"type": loaded_condition(keys, "scaler", replica), "status": "True"})
    labels = {serves_label(keys, "scaler"): "true"} if ready else {}
    return {
        "metadata": {"name": f"host-{node}", "labels": labels},
        "spec": {"nodeName": node},
        "status": {"podIP": f"127.1.0.{node[-1]}", "conditions": conditions},
    }


def test_a_tritonmodel_replica_is_timed_from_its_placement_and_its_hosts_conditions(
    tmp_path: Path,
) -> None:
    watch = ReplicaWatch(kubernetes.client.ApiClient(), "models", "scaler", tmp_path / "t.json")
    watch._model_seen(_model(1, {0: "n1"}))
    watch._host_seen("ADDED", _host("n1", loaded=True, ready=True))
    first = set(watch.pods)
    watch._model_seen(_model(2, {0: "n1"}))
    [new] = set(watch.pods) - first
    assert watch.pods[new].phases == {}
    watch._model_seen(_model(2, {0: "n1", 1: "n2"}))
    watch._host_seen("ADDED", _host("n2"))
    watch.answered("127.1.0.2", 1e12)
    assert set(watch.pods[new].phases) == {"placed", "host started"}, (
        "no answer before it is in the Service"
    )
    watch._host_seen("MODIFIED", _host("n2", loaded=True, replica=1))
    assert "labelled" not in watch.pods[new].phases and "host ready" not in watch.pods[new].phases
    watch._host_seen("MODIFIED", _host("n2", loaded=True, ready=True, replica=1))
    watch.answered("127.1.0.2", 1e12)
    phases = watch.pods[new].since_created()
    assert set(phases) == {
        "placed",
        "host started",
        "loaded",
        "labelled",
        "host ready",
        "ready",
    } | {"first answer"}
    assert phases["placed"] <= phases["loaded"] <= phases["ready"] <= phases["first answer"]
    # Prometheus scrapes both hosts' proxies; a host being deleted leaves the targets.
    assert "127.1.0.2:9002" in (tmp_path / "t.json").read_text()
    watch._host_seen("DELETED", _host("n2", loaded=True, ready=True))
    assert "127.1.0.2" not in (tmp_path / "t.json").read_text()
    # Scaled down and up again: a new record for the same ordinal.
    watch._model_seen(_model(1, {0: "n1"}))
    watch._model_seen(_model(2, {0: "n1"}))
    assert len(set(watch.pods) - first) == 2


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--nodes", "3"], "--nodes is for --as tritonmodel"),
        (["--as", "tritonmodel", "--cold-start-only"], "--cold-start-only times a Deployment"),
        (["--as", "tritonmodel", "--nodes", "0"], "--nodes must be at least 1, not 0"),
    ],
)
def test_flags_that_do_not_go_together_are_refused_with_what_to_change(
    argv: list[str],
    error: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("sys.argv", ["autoscale.py", *argv])
    with pytest.raises(SystemExit) as exited:
        bench.main()
    assert exited.value.code == 2
    assert error in capsys.readouterr().err


def test_a_start_is_broken_down_into_steps_each_the_median_over_the_replicas() -> None:
    starts = [
        {"asked": 1.0, "placed": 1.1, "host started": 2.0, "loaded": 3.0, "labelled": 3.2}
        | {"host ready": 8.0, "ready": 8.0, "first answer": 8.3},
        {"asked": 2.0, "placed": 2.1, "host started": 3.0, "loaded": 5.0, "labelled": 5.2}
        | {"host ready": 4.0, "ready": 5.2, "first answer": 5.4},
        {"asked": 3.0, "placed": 3.1},  # not loaded yet: counted only in the steps it went through
    ]
    found = dict(steps(starts))
    assert found["asked -> placed"] == pytest.approx(0.1)
    assert found["placed -> host started"] == pytest.approx(0.9)
    assert found["host started -> loaded"] == pytest.approx(1.5)
    assert found["loaded -> ready"] == pytest.approx((5.0 + 0.2) / 2)
    assert found["ready -> first answer"] == pytest.approx(0.25)
    assert found["loaded -> labelled"] == pytest.approx(0.2)
    # A host Ready before its replica loaded (it serves others) is no wait: 0, not negative.
    assert found["loaded -> host ready"] == pytest.approx(2.5)


def test_the_autoscalers_scale_ups_are_read_from_the_binders_log() -> None:
    since = time.mktime(time.strptime("2026-11-26 07:00:00", "%Y-%m-%d %H:%M:%S"))
    log = (
        "2026-11-26 07:00:01,500 INFO binder.autoscaler.loop: "
        "TritonModel models/scaler scales from "
        "1: New size: 2; reason: concurrency 0.83 over the 6 s panic window\n"
        "2026-11-26 07:00:02,250 INFO binder.autoscaler.loop: "
        "TritonModel models/scaler scales from "
        "2: New size: 5; reason: ...\n"
        "2026-11-26 07:01:30,000 INFO binder.autoscaler.loop: "
        "TritonModel models/scaler scales from "
        "5: New size: 3; reason: ...\n"
    )
    assert bench.scale_ups(log, since) == [(1.5, 2), (2.25, 5)]
