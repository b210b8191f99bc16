"""The binder's exceptions, and the one table that maps them to HTTP status codes.

Every error carries what went wrong and what to do. A failed request to the API server is one of
common.kubeapi.errors (the one error type of every part's door to it), not a BinderError.
"""

from __future__ import annotations

from common.kubeapi.errors import ApiError, UnavailableError


class BinderError(Exception):
    """Base class of every error the binder raises on purpose."""


class SettingsError(BinderError):
    """A setting is missing or malformed; the message names the flag and the fix."""


class NotReadyError(BinderError):
    """The binder cannot answer yet (caches not synced)."""


HTTP_STATUS: dict[type[Exception], int] = {
    NotReadyError: 503,
    SettingsError: 500,
    UnavailableError: 503,
    ApiError: 502,
    BinderError: 500,
}


def http_status(error: Exception) -> int:
    """The HTTP status for an error, by the nearest class in HTTP_STATUS."""
    for cls in type(error).__mro__:
        if cls in HTTP_STATUS:
            return HTTP_STATUS[cls]
    return 500
