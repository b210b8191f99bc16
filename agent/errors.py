"""The agent's exceptions, and the one table that maps them to gRPC codes and HTTP statuses.

Every error message says what is wrong and what to do. Callers raise these with `from e` so the
cause is kept; `agent.api.service` converts them to gRPC statuses through `GRPC_CODES` only.
"""

from __future__ import annotations

import grpc


class AgentError(Exception):
    """Base of everything the agent reports to a caller.

    `event_reason`, when set, is the reason of the Warning Event the agent records on the
    caller's pod, so its owner sees the refusal with `kubectl describe pod` as well as in the
    loader's log."""

    reason = "internal"

    def __init__(self, message: str, *, event_reason: str = "") -> None:
        super().__init__(message)
        self.event_reason = event_reason


class InvalidRequestError(AgentError):
    """The request itself is wrong (bad manifest, bad path, bad model config)."""

    reason = "invalid_request"


class DigestMismatchError(InvalidRequestError):
    """Bytes received disagree with the manifest (size or sha256)."""

    reason = "digest_mismatch"


class NotFoundError(AgentError):
    """The model is not installed."""

    reason = "not_found"


class UnauthenticatedError(AgentError):
    """No token, or a token TokenReview does not accept."""

    reason = "unauthenticated"


class PermissionDeniedError(AgentError):
    """A valid token from a caller that may not act on this model or node."""

    reason = "permission_denied"


class NotPlacedError(PermissionDeniedError):
    """The pod's placement on this node cannot be proved to be the binder's."""

    reason = "not_placed"


class OwnedByAnotherPodError(PermissionDeniedError):
    """The model id belongs to another live pod on this node (who is not said)."""

    reason = "owned_by_another_pod"


class TenantCodeNotAllowedError(PermissionDeniedError):
    """The model would run the tenant's own code inside the shared Triton, and the pod's
    namespace is not allowed to."""

    reason = "tenant_code_not_allowed"


class DeadlineExceededError(AgentError):
    """An install stream took longer than the agent allows (in total, or between chunks)."""

    reason = "deadline_exceeded"


class LoadTimedOutError(DeadlineExceededError):
    """A load held its GPU's slot past its bound (`agent.gpus.gpuqueue.load_budget`) and was
    abandoned."""

    reason = "load_timed_out"


class ConflictError(AgentError):
    """The model is in a state that forbids the request (for example still loaded)."""

    reason = "conflict"


class ResourceExhaustedError(AgentError):
    """Not enough disk, or not enough GPU memory, for the model."""

    reason = "no_space"


class HostMemoryExhaustedError(ResourceExhaustedError):
    """The load would take Triton's container past its memory limit."""

    reason = "no_host_memory"


class AgentBusyError(AgentError):
    """The agent already serves as many calls as it allows: not the caller's fault, retry."""

    reason = "busy"


class TritonError(AgentError):
    """Triton refused or failed a repository call; the message carries Triton's reason."""

    reason = "triton_error"


class TritonUnreachableError(TritonError):
    """Triton does not answer."""

    reason = "triton_unreachable"


class TritonNotConnectedError(TritonUnreachableError):
    """Triton did not take the connection: the call never reached it (it is down, starting
    again after an exit, or the agent's channel is waiting to reconnect)."""


class KubeError(AgentError):
    """The Kubernetes API failed or is unreachable."""

    reason = "kube_error"


class NvmlUnavailableError(AgentError):
    """NVML cannot be loaded or initialised."""

    reason = "nvml_unavailable"


GRPC_CODES: dict[type[AgentError], grpc.StatusCode] = {
    AgentError: grpc.StatusCode.INTERNAL,
    InvalidRequestError: grpc.StatusCode.INVALID_ARGUMENT,
    DigestMismatchError: grpc.StatusCode.DATA_LOSS,
    NotFoundError: grpc.StatusCode.NOT_FOUND,
    UnauthenticatedError: grpc.StatusCode.UNAUTHENTICATED,
    PermissionDeniedError: grpc.StatusCode.PERMISSION_DENIED,
    ConflictError: grpc.StatusCode.FAILED_PRECONDITION,
    ResourceExhaustedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
    AgentBusyError: grpc.StatusCode.UNAVAILABLE,
    DeadlineExceededError: grpc.StatusCode.DEADLINE_EXCEEDED,
    TritonError: grpc.StatusCode.FAILED_PRECONDITION,
    TritonUnreachableError: grpc.StatusCode.UNAVAILABLE,
    KubeError: grpc.StatusCode.UNAVAILABLE,
    NvmlUnavailableError: grpc.StatusCode.UNAVAILABLE,
}

HTTP_STATUSES: dict[type[AgentError], int] = {
    AgentError: 500,
    InvalidRequestError: 400,
    DigestMismatchError: 400,
    NotFoundError: 404,
    UnauthenticatedError: 401,
    PermissionDeniedError: 403,
    ConflictError: 409,
    ResourceExhaustedError: 507,
    AgentBusyError: 503,
    DeadlineExceededError: 408,
    TritonError: 502,
    TritonUnreachableError: 503,
    KubeError: 503,
    NvmlUnavailableError: 503,
}


def grpc_code(error: AgentError) -> grpc.StatusCode:
    """The gRPC code for `error`: its own class's entry, else its nearest ancestor's."""
    for cls in type(error).__mro__:
        if cls in GRPC_CODES:
            return GRPC_CODES[cls]
    return grpc.StatusCode.INTERNAL


def http_status(error: AgentError) -> int:
    """The HTTP status for `error`, by the same nearest-ancestor rule."""
    for cls in type(error).__mro__:
        if cls in HTTP_STATUSES:
            return HTTP_STATUSES[cls]
    return 500
