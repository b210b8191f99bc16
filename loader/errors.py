"""The loader's failures, each with the exit code a pod's operator sees, and the one table that
maps the agent's gRPC status codes onto them.

A failure is either permanent (retrying cannot help: fix the model, the token or the settings) or
transient (the agent or Triton is not up yet, the connection was reset): only `TransientError` is
retried. This module must not do I/O; it only names and classifies failures.
"""

from __future__ import annotations

from enum import Enum

import grpc

from common.hosted import HOST_MEMORY_WORDS


class ExitCode(int, Enum):
    """The loader's process exit codes (documented in docs/loader.md)."""

    OK = 0
    AGENT_FAILED = 1
    USAGE = 2
    INVALID_MODEL = 3
    REFUSED = 4
    MODEL_REJECTED = 5
    TIMED_OUT = 6
    AGENT_UNREACHABLE = 7
    STOPPED = 143


class LoaderError(Exception):
    """A failure that ends the loader; `str(e)` is the one-line reason for the termination log."""

    exit_code = ExitCode.AGENT_FAILED


class SettingsError(LoaderError):
    """A flag, environment variable or input file is missing or malformed."""

    exit_code = ExitCode.USAGE


class InvalidModelError(LoaderError):
    """The model directory cannot be served as it is (found locally or by the agent)."""

    exit_code = ExitCode.INVALID_MODEL


class FetchError(InvalidModelError):
    """A model host cannot fetch a replica's files from its storage URI (loader/fetch.py)."""


class StoreUnavailableError(FetchError):
    """The store did not serve the files now (it answered 429 or 5xx, or could not be reached):
    it may serve them a moment later, so a host tries again within seconds, not minutes."""


class RefusedError(LoaderError):
    """The agent refused the caller: the token is invalid, or the pod may not load this model."""

    exit_code = ExitCode.REFUSED


class ModelRejectedError(LoaderError):
    """The node cannot serve the model: Triton refused to load it (the message carries Triton's
    reason), it does not fit, or the agent cannot install it."""

    exit_code = ExitCode.MODEL_REJECTED


class TritonRejectedError(ModelRejectedError):
    """Triton refused to load the model's files (the message carries Triton's reason): its
    config.pbtxt or files are invalid, as Triton judges them."""


class HostMemoryError(ModelRejectedError):
    """The agent refused the load: it would take Triton past its host memory, or the model's
    namespace past its share of it."""


class TimedOutError(LoaderError):
    """The agent was reached, but the model was not READY before the overall timeout."""

    exit_code = ExitCode.TIMED_OUT


class AgentUnreachableError(LoaderError):
    """The agent never answered before the overall timeout, or no connection to it could be had
    for the unreachable budget (the node's agent is down)."""

    exit_code = ExitCode.AGENT_UNREACHABLE


class AgentFailedError(LoaderError):
    """The agent answered with an error the loader cannot fix by retrying or by itself."""

    exit_code = ExitCode.AGENT_FAILED


class StoppedError(LoaderError):
    """The loader was asked to stop (SIGTERM, SIGINT) before the model was READY."""

    exit_code = ExitCode.STOPPED


class TransientError(Exception):
    """A failure worth retrying; `reached_agent` tells timeout from unreachable when time runs out,
    and `no_connection` says the loader had no connection to the agent at all (refused, no route,
    still connecting), as opposed to an agent that answered "busy" or "Triton is starting".

    Not a LoaderError: it never ends the process by itself.
    """

    def __init__(self, message: str, *, reached_agent: bool, no_connection: bool = False) -> None:
        super().__init__(message)
        self.reached_agent = reached_agent
        self.no_connection = no_connection


# Which agent RPC failed matters for one code: INVALID_ARGUMENT on an install means the agent found
# the files unacceptable (exit 3), on a load it means Triton rejected the model (exit 5).
INSTALL = "InstallModel"
LOAD = "LoadModel"
QUERY = "GetModel"
UNLOAD = "UnloadModel"
LIST = "ListHosted"

# Codes that mean "try again": the agent or Triton is starting or restarting, the connection broke,
# one attempt ran out of time, or a concurrent request for the same model won a race.
_TRANSIENT: dict[grpc.StatusCode, bool] = {
    # value: whether the code proves the agent answered. UNAVAILABLE is usually no connection, and
    # a deadline also passes while the channel is still connecting.
    grpc.StatusCode.UNAVAILABLE: False,
    grpc.StatusCode.DEADLINE_EXCEEDED: False,
    grpc.StatusCode.ABORTED: True,
    grpc.StatusCode.CANCELLED: True,
    grpc.StatusCode.DATA_LOSS: True,
    grpc.StatusCode.NOT_FOUND: True,
}

_PERMANENT: dict[tuple[str, grpc.StatusCode], tuple[type[LoaderError], str]] = {
    (INSTALL, grpc.StatusCode.INVALID_ARGUMENT): (
        InvalidModelError,
        "the agent refused the model files: {details}; fix the model directory",
    ),
    (LOAD, grpc.StatusCode.INVALID_ARGUMENT): (
        TritonRejectedError,
        "Triton rejected the model: {details}; fix config.pbtxt or the model files",
    ),
    (INSTALL, grpc.StatusCode.FAILED_PRECONDITION): (
        ModelRejectedError,
        "the agent cannot install the model: {details}",
    ),
    # The agent's own refusal (the node quarantined these files, another pod owns the id...):
    # its message says what is wrong and what to do.
    (LOAD, grpc.StatusCode.FAILED_PRECONDITION): (
        ModelRejectedError,
        "the agent refused to load the model: {details}",
    ),
    (LOAD, grpc.StatusCode.RESOURCE_EXHAUSTED): (
        ModelRejectedError,
        "the model does not fit on its GPU now: {details}",
    ),
    (INSTALL, grpc.StatusCode.RESOURCE_EXHAUSTED): (
        ModelRejectedError,
        "the node has no room for the model files: {details}; free disk on the node or slim "
        "the model",
    ),
}

# The agent's own message says what is wrong and what to do; docs/loader.md adds the pod-side fix.
_REFUSAL_HINT = {
    grpc.StatusCode.UNAUTHENTICATED: "the agent refused the token: {details}",
    grpc.StatusCode.PERMISSION_DENIED: "the agent refused this pod: {details}",
}


# grpc-core's client reports this when the server ended a streaming call while the client was
# still writing: the agent's own status is lost in the race, so the call is worth repeating.
CUT_STREAM_DETAILS = "Internal error from Core"


# Codes that, on a channel with no connection, mean the call never reached the agent. The agent
# itself answers UNAVAILABLE too (busy, Triton starting), but only over a connection.
_NO_ANSWER = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def classify(
    code: grpc.StatusCode, details: str, phase: str, *, connected: bool = True
) -> LoaderError | TransientError:
    """Map an agent RPC's failure onto a permanent LoaderError or a TransientError; `connected`
    says whether the channel had a connection to the agent when the call failed."""
    details = details or code.name
    if code in _NO_ANSWER and not connected:
        return TransientError(
            f"{phase}: no connection to the agent ({code.name}: {details})",
            reached_agent=False,
            no_connection=True,
        )
    if code == grpc.StatusCode.INTERNAL and details == CUT_STREAM_DETAILS:
        return TransientError(
            f"{phase}: the agent ended the stream while files were still being sent",
            reached_agent=True,
        )
    if code in _TRANSIENT:
        return TransientError(f"{phase}: {code.name}: {details}", reached_agent=_TRANSIENT[code])
    if code in _REFUSAL_HINT:
        return RefusedError(_REFUSAL_HINT[code].format(details=details))
    if (phase, code) == (LOAD, grpc.StatusCode.RESOURCE_EXHAUSTED) and HOST_MEMORY_WORDS in details:
        return HostMemoryError(f"the model does not fit in Triton's host memory now: {details}")
    if (phase, code) in _PERMANENT:
        error_type, template = _PERMANENT[(phase, code)]
        return error_type(template.format(details=details))
    return AgentFailedError(f"the agent failed the {phase} call with {code.name}: {details}")
