"""The proxy's own refusals, and the one table that maps them to HTTP status and gRPC code.

Answers that imitate Triton (another model named, unknown route) are not errors of the proxy: they
are built in `routing`. What lives here is what the proxy itself refuses: overload, shutdown, too
large a body, a malformed request, an unreachable Triton.
"""

from __future__ import annotations

import grpc


class ProxyError(Exception):
    """A request the proxy refuses; the message says what is wrong and what to do."""


class OverloadedError(ProxyError):
    """The concurrency limit is reached and the queue is full."""


class QueueTimeoutError(ProxyError):
    """A request waited for a slot longer than the queue timeout."""


class DrainingError(ProxyError):
    """The proxy is shutting down and takes no new inference requests."""


class BodyTooLargeError(ProxyError):
    """A body or message is over the configured maximum."""


class MalformedRequestError(ProxyError):
    """The request cannot be read safely (for example a model name field sent twice)."""


class RefusedRouteError(ProxyError):
    """A server-wide administrative API that tenants may not use through the proxy."""


class UpstreamError(ProxyError):
    """Triton could not be reached or broke the connection."""


# One place maps every refusal to its wire answers: (HTTP status, gRPC status code).
STATUS: dict[type[ProxyError], tuple[int, grpc.StatusCode]] = {
    OverloadedError: (503, grpc.StatusCode.RESOURCE_EXHAUSTED),
    QueueTimeoutError: (503, grpc.StatusCode.RESOURCE_EXHAUSTED),
    DrainingError: (503, grpc.StatusCode.UNAVAILABLE),
    BodyTooLargeError: (413, grpc.StatusCode.RESOURCE_EXHAUSTED),
    MalformedRequestError: (400, grpc.StatusCode.INVALID_ARGUMENT),
    RefusedRouteError: (403, grpc.StatusCode.PERMISSION_DENIED),
    UpstreamError: (502, grpc.StatusCode.UNAVAILABLE),
}


def http_status(error: ProxyError) -> int:
    """The HTTP status that answers `error`."""
    return STATUS.get(type(error), (500, grpc.StatusCode.INTERNAL))[0]


def grpc_code(error: ProxyError) -> grpc.StatusCode:
    """The gRPC status code that answers `error`."""
    return STATUS.get(type(error), (500, grpc.StatusCode.INTERNAL))[1]
