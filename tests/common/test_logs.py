"""JSON log lines carry the pod, namespace, node and model they are about as fields."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from common.logs import configure_logging, subject


@pytest.fixture
def root() -> Iterator[logging.Logger]:
    logger = logging.getLogger()
    saved = logger.handlers[:], logger.level
    try:
        yield logger
    finally:
        logger.handlers[:], level = saved
        logger.setLevel(level)


def test_subject_splits_a_pod_key_and_leaves_out_what_is_empty() -> None:
    assert subject(pod="models/bert-0", node="gpu-1", model="bert") == {
        "pod": "bert-0",
        "namespace": "models",
        "node": "gpu-1",
        "model": "bert",
    }
    assert subject(pod="bert-0") == {"pod": "bert-0"}
    assert subject() == {}


def test_json_lines_carry_the_process_fields_and_their_own(
    root: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("INFO", "json", fields=subject(node="gpu-1"))
    log = logging.getLogger("agent.models.reconcile")
    log.info("Model %s is loaded again.", "bert", extra=subject(pod="models/bert-0", model="bert"))
    log.info("The node has 2 GPUs.")
    log.info("Moved.", extra=subject(node="gpu-2"))
    first, second, third = (json.loads(line) for line in capsys.readouterr().err.splitlines())
    assert first["message"] == "Model bert is loaded again."
    assert (first["pod"], first["namespace"], first["model"], first["node"]) == (
        "bert-0", "models", "bert", "gpu-1",
    )  # fmt: skip
    assert second["node"] == "gpu-1" and "pod" not in second
    assert third["node"] == "gpu-2", "a line's own field wins over the process's"


def test_text_lines_are_unchanged_sentences(
    root: logging.Logger, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("INFO", "text", name="agent", fields=subject(node="gpu-1"))
    logging.getLogger("agent").info("Pod %s is bound.", "m/p", extra=subject(pod="m/p"))
    line = capsys.readouterr().err.strip()
    assert line.endswith("agent INFO agent: Pod m/p is bound.") and "gpu-1" not in line
