"""The one table from the agent's gRPC codes to retry or a permanent exit code."""

from __future__ import annotations

import grpc
import pytest

from loader.errors import (
    CUT_STREAM_DETAILS,
    INSTALL,
    LOAD,
    QUERY,
    AgentFailedError,
    ExitCode,
    HostMemoryError,
    InvalidModelError,
    ModelRejectedError,
    RefusedError,
    TransientError,
    classify,
)


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.CANCELLED,
    ],
)
@pytest.mark.parametrize("phase", [INSTALL, LOAD, QUERY])
def test_a_not_yet_ready_agent_is_retried(code: grpc.StatusCode, phase: str) -> None:
    assert isinstance(classify(code, "starting", phase), TransientError)


def test_only_codes_the_agent_itself_sends_count_as_reaching_it() -> None:
    for code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        error = classify(code, "no answer", QUERY)
        assert isinstance(error, TransientError)
        assert not error.reached_agent, code
    aborted = classify(grpc.StatusCode.ABORTED, "another load won", LOAD)
    assert isinstance(aborted, TransientError)
    assert aborted.reached_agent


@pytest.mark.parametrize("phase", [INSTALL, LOAD, QUERY])
def test_a_refused_token_or_pod_fails_at_once_with_exit_4(phase: str) -> None:
    token = classify(grpc.StatusCode.UNAUTHENTICATED, "token expired", phase)
    pod = classify(grpc.StatusCode.PERMISSION_DENIED, "pod not on node", phase)
    assert isinstance(token, RefusedError)
    assert isinstance(pod, RefusedError)
    assert token.exit_code == pod.exit_code == ExitCode.REFUSED
    assert "token expired" in str(token)
    assert "pod not on node" in str(pod)


def test_invalid_argument_means_bad_files_on_install_and_a_rejected_model_on_load() -> None:
    install = classify(grpc.StatusCode.INVALID_ARGUMENT, "path escapes", INSTALL)
    load = classify(grpc.StatusCode.INVALID_ARGUMENT, "unexpected input", LOAD)
    assert isinstance(install, InvalidModelError)
    assert install.exit_code == ExitCode.INVALID_MODEL
    assert isinstance(load, ModelRejectedError)
    assert load.exit_code == ExitCode.MODEL_REJECTED
    assert "unexpected input" in str(load)


def test_an_internal_agent_error_is_not_retried_forever() -> None:
    error = classify(grpc.StatusCode.INTERNAL, "bug", LOAD)
    assert isinstance(error, AgentFailedError)
    assert error.exit_code == ExitCode.AGENT_FAILED
    assert "INTERNAL: bug" in str(error)


def test_exit_codes_are_distinct() -> None:
    codes = [c.value for c in ExitCode]
    assert len(codes) == len(set(codes))


def test_a_stream_cut_by_the_agent_mid_send_is_retried_not_fatal() -> None:
    error = classify(grpc.StatusCode.INTERNAL, CUT_STREAM_DETAILS, INSTALL)
    assert isinstance(error, TransientError)
    assert error.reached_agent
    # Any other INTERNAL is the agent's own failure and ends the loader.
    assert isinstance(classify(grpc.StatusCode.INTERNAL, "disk on fire", INSTALL), AgentFailedError)


def test_a_load_the_gpu_cannot_hold_fails_with_the_agents_reason() -> None:
    details = (
        "model 'm' of pod ns/p does not fit: GPU 0 (GPU-1) has 15Gi for models and 14Gi are "
        "booked; the pod stays unloaded, delete it so the binder places it again"
    )
    error = classify(grpc.StatusCode.RESOURCE_EXHAUSTED, details, LOAD)
    assert isinstance(error, ModelRejectedError)
    assert error.exit_code == ExitCode.MODEL_REJECTED
    assert str(error) == f"the model does not fit on its GPU now: {details}"
    assert not isinstance(error, HostMemoryError)


def test_a_load_triton_s_host_memory_cannot_hold_names_host_memory_not_the_gpu() -> None:
    details = (
        "model 'm' of pod ns/m/0 does not fit in its namespace's share of Triton's host memory: "
        "it needs 64 MiB"
    )
    error = classify(grpc.StatusCode.RESOURCE_EXHAUSTED, details, LOAD)
    assert isinstance(error, HostMemoryError) and isinstance(error, ModelRejectedError)
    assert str(error) == f"the model does not fit in Triton's host memory now: {details}"
    assert "GPU" not in str(error)


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED])
def test_a_failure_with_no_connection_is_told_from_the_agents_own_unavailable(
    code: grpc.StatusCode,
) -> None:
    lost = classify(code, "failed to connect to all addresses", QUERY, connected=False)
    assert isinstance(lost, TransientError) and lost.no_connection and not lost.reached_agent
    busy = classify(code, "this agent has as many calls as it allows", QUERY, connected=True)
    assert isinstance(busy, TransientError) and not busy.no_connection
