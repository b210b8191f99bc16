"""What a request to the API server can fail with, for every part alike.

An answer that is not a success keeps the HTTP status the API server gave, so callers decide by
category (`ConflictError`, `NotFoundError`, `GoneError`, `UnavailableError`) instead of by parsing
messages; settings that name no usable server are a `KubeConfigError`. Standard library only.
"""

from __future__ import annotations


class KubeConfigError(Exception):
    """The kubeconfig or the in-cluster service account names no usable API server; the message
    says where it was read from and what to do."""


class ApiError(Exception):
    """The Kubernetes API answered with an error status (0: no answer came)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class UnavailableError(ApiError):
    """The API server could not be reached (status 0: refused, reset, timed out) or asked us to
    come back later (429, 5xx): worth retrying after a delay, never a verdict on the request.

    `retry_after` is the server's Retry-After in seconds, None when it sent none.
    """

    def __init__(
        self, status: int, reason: str, message: str, retry_after: float | None = None
    ) -> None:
        super().__init__(status, reason, message)
        self.retry_after = retry_after


class ConflictError(ApiError):
    """409: someone else changed the object first (or the pod is already bound)."""


class NotFoundError(ApiError):
    """404: the object is gone."""


class GoneError(ApiError):
    """410: the resourceVersion is too old to watch from; relist."""


_BY_STATUS: dict[int, type[ApiError]] = {409: ConflictError, 404: NotFoundError, 410: GoneError}


def api_error(status: int, reason: str, message: str, retry_after: float | None = None) -> ApiError:
    """The right ApiError subclass for an HTTP status (0 when no answer came)."""
    if status == 0 or status == 429 or status >= 500:
        return UnavailableError(status, reason, message, retry_after)
    return _BY_STATUS.get(status, ApiError)(status, reason, message)
