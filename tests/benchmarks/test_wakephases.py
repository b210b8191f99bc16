"""`benchmarks.wakephases` reads each woken model's steps from the processes' own log lines (the
first after the requests' start) and gives each phase's p50, p95 and max across the models."""

from __future__ import annotations

from datetime import datetime

from benchmarks import wakephases

STARTED = datetime(2026, 11, 29, 16, 0, 0).timestamp()
HASH = "618bfaa90a47883ebef6bb8e"


def _logs(model: str, offset: float) -> dict[str, list[str]]:
    """One model's lines, each step one more second (plus `offset`) after 16:00:00."""

    def py(seconds: float, text: str) -> str:
        return f"2026-11-29 16:00:{seconds:02.0f},000 INFO x: {text}"

    def triton(seconds: float, text: str) -> str:
        return f"I1129 16:00:{seconds:09.6f} 10394 model_lifecycle.cc:472] {text}"

    return {
        "binder": [
            # Before the requests: not this wake's.
            f"2026-11-29 15:59:59,000 binder INFO x: TritonModel models/{model} scales from 0: New",
            py(1 + offset, f"TritonModel models/{model} scales from 1: New size: 2"),
            py(1 + offset, f"TritonModel models/{model} scales from 0: New size: 1; reason"),
        ],
        "agent": [
            py(2 + offset, f"Pod models/h: tritonshare.io/loaded-{model}_1=False (ModelPending)"),
            py(2 + offset, f"Model {model} of pod models/{model}/1 is named {model}-{HASH} in"),
            py(6 + offset, f"Pod models/h: tritonshare.io/loaded-{model}_1=True (Loaded)"),
        ],
        "loader": [py(3 + offset, f"Asking the agent to load model {model} into Triton.")],
        "triton": [
            triton(4 + offset, f'"loading: {model}-{HASH}:1"'),
            triton(5 + offset, f"\"successfully loaded '{model}-{HASH}'\""),
        ],
    }


def test_each_phase_is_the_time_from_the_step_before() -> None:
    logs = _logs("zero-8-3", 0)
    spent = wakephases.breakdown(["zero-8-3"], STARTED, [7.5], logs).models["zero-8-3"]
    assert spent == {
        "decision": 1.0,
        "slot": 1.0,
        "install": 1.0,
        "queue": 1.0,
        "load": 1.0,
        "ready": 1.0,
        "answer": 1.5,
    }


def test_percentiles_across_models_and_steps_not_found_are_counted() -> None:
    first, second = _logs("a", 0), _logs("b", 2)
    logs = {key: first[key] + second[key] for key in first}
    logs["loader"] = first["loader"]  # b's load call is not in the logs
    found = wakephases.breakdown(["a", "b"], STARTED, [7.0, 9.0], logs)
    assert found.seconds("decision") == [1.0, 3.0]
    assert found.seconds("install") == [1.0]
    assert found.seconds("queue") == [1.0]  # b's: no step before it to start from
    lines = found.lines()
    assert lines[0] == "  phases of the wake across 2 models (s): p50 / p95 / max"
    assert lines[3] == "    install     1.00   1.00   1.00 (1 not found)"
    assert "decision" in lines[1] and lines[1].endswith("3.00")


def test_a_model_with_no_lines_has_its_answer_only_if_its_steps_are_there() -> None:
    found = wakephases.breakdown(["m"], STARTED, [2.0], {})
    assert found.models["m"] == {}
    assert found.lines()[1] == "    decision  not found in the logs"
