"""`init_failure`: which init container of a model pod failed and why, read from the pod's status
as the kubelet reports it, for the agent's `InitContainerFailed` Event (end to end:
tests/e2e/test_short_form.py, a model URI with a typo)."""

from __future__ import annotations

from typing import Any

from agent.pods.modelpods import init_failure


def _pod(*statuses: dict[str, Any]) -> dict[str, Any]:
    return {"status": {"initContainerStatuses": list(statuses)}}


def _terminated(code: int, message: str = "") -> dict[str, Any]:
    return {
        "terminated": {
            "exitCode": code,
            "reason": "Error" if code else "Completed",
            "message": message,
        }
    }


def test_nothing_failed() -> None:
    assert init_failure({}) is None
    running = {"name": "loader", "state": {"running": {}}}
    done = {"name": "storage-initializer", "state": _terminated(0, "fetched")}
    assert init_failure(_pod(done, running)) is None


def test_the_failed_container_and_its_termination_message() -> None:
    # Backing off: the run that failed is lastState, the state says CrashLoopBackOff.
    backing_off = {
        "name": "storage-initializer",
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": _terminated(
            1, "the model could not be fetched:\n  https://x/a.tgz answered HTTP 404"
        ),
    }
    assert init_failure(_pod(backing_off)) == (
        "storage-initializer",
        "the model could not be fetched: https://x/a.tgz answered HTTP 404",
    )
    loader = {"name": "loader", "state": _terminated(4)}
    ok = {"name": "storage-initializer", "state": _terminated(0)}
    assert init_failure(_pod(ok, loader)) == ("loader", "exit code 4, no termination message")


def test_a_long_message_keeps_its_end() -> None:
    failed = {"name": "loader", "state": _terminated(1, "x" * 5000 + " the reason")}
    _, why = init_failure(_pod(failed)) or ("", "")
    assert len(why) == 1000 and why.endswith("the reason")
