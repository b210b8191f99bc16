"""The binder's exceptions, and the one table that maps them to HTTP status codes.

Every error carries what went wrong and what to do. API failures keep the HTTP status the API
server answered, so callers decide by category (`Conflict`, `NotFound`, `Gone`) instead of by
parsing messages. This module imports nothing but the standard library.
"""

from __future__ import annotations


class BinderError(Exception):
    """Base class of every error the binder raises on purpose."""


class SettingsError(BinderError):
    """A setting is missing or malformed; the message names the flag and the fix."""


class NotReadyError(BinderError):
    """The binder cannot answer yet (caches not synced)."""


class ApiError(BinderError):
    """The Kubernetes API answered with an error status."""

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


HTTP_STATUS: dict[type[BinderError], int] = {
    NotReadyError: 503,
    SettingsError: 500,
    UnavailableError: 503,
    ApiError: 502,
    BinderError: 500,
}


def http_status(error: BinderError) -> int:
    """The HTTP status for an error, by the nearest class in HTTP_STATUS."""
    for cls in type(error).__mro__:
        if cls in HTTP_STATUS:
            return HTTP_STATUS[cls]
    return 500
