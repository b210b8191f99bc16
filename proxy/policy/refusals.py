"""The proxy's own refusals, and the one table that maps them to HTTP status and gRPC code.

Answers that imitate Triton (another model named, unknown route) are not errors of the proxy: they
are built in `routing`. What lives here is what the proxy itself refuses: overload, a head or body
too large or too slow, a malformed or unsupported request, an unreachable or broken Triton. Every
relay raises (or hands on) one of these types, and answers it with `http_status` or `grpc_code`:
no relay picks a status or a code for its own refusals.

What it must not do: know a protocol's wire format, or build an answer's bytes.
"""

from __future__ import annotations

from typing import Final

import grpc


class ProxyError(Exception):
    """A request the proxy refuses; the message says what is wrong and what to do."""


class OverloadedError(ProxyError):
    """The concurrency limit is reached and the queue is full."""


class QueueTimeoutError(ProxyError):
    """A request waited for a slot longer than the queue timeout."""


class BodyTooLargeError(ProxyError):
    """A body or message is over the configured maximum (--max-body)."""


class HeadTooLargeError(ProxyError):
    """A request head is over the proxy's limit."""


class HeadTimeoutError(ProxyError):
    """A client began a request head and did not finish it in time (--head-timeout)."""


class MalformedRequestError(ProxyError):
    """The request cannot be read safely (ambiguous framing, a model name field sent twice, a
    message flag that does not exist, a second message on a unary call)."""


class UnsupportedError(ProxyError):
    """The request uses something the proxy does not relay (a transfer coding but chunked)."""


class UnsupportedEncodingError(ProxyError):
    """A REST body compressed with a content coding Triton does not inflate (gzip and deflate
    are the ones it does), or with several."""


class OverBudgetError(ProxyError):
    """The node gateway holds more than its byte budget (--max-buffered-bytes), and this pod more
    than its share of it: its largest connections are answered with this and closed."""


class QuarantinedError(ProxyError):
    """The node quarantined the pod: its requests coincided with too many of Triton's unexpected
    exits, and the node gateway refuses every one until an operator clears it."""


class WakeError(ProxyError):
    """An on-demand model unloaded while idle could not be served: its load did not finish
    within --wake-timeout-seconds, or the agent could not load it (no room on its GPU; the
    message has the agent's reason). `retry_after` is the whole number of seconds the answer
    asks the client to wait (REST `Retry-After`)."""

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class HeldError(ProxyError):
    """The pod is on probation, and a model under suspicion loads or settles on the node (its
    trial): the node gateway refuses the pod's new requests meanwhile, so that an exit of Triton
    then is the suspect's alone. The client retries after `RETRY_SECONDS`."""

    RETRY_SECONDS: Final = 2


class UpstreamError(ProxyError):
    """Triton could not be reached, broke the connection or sent what cannot be relayed."""


_UNKNOWN_MODEL: Final = b"Request for unknown model: '"
_NO_VERSION: Final = (b"' is not found", b"' has no available versions")


def lacks_model(message: bytes) -> bool:
    """Whether Triton's error `message` (a REST answer's body, a gRPC call's `grpc-message`)
    says it has no version of the model asked for loaded (`Request for unknown model: 'NAME'
    is not found`, never loaded since Triton started; `... has no available versions`,
    unloaded); one that lacks only the version asked for says `... 'NAME' version N is not
    found`, and is the client's to fix."""
    start = message.find(_UNKNOWN_MODEL)
    if start < 0:
        return False
    start += len(_UNKNOWN_MODEL)
    return any(message.find(end, start) >= 0 for end in _NO_VERSION)


def missing_model(model_id: str) -> UpstreamError:
    """The node gateway's answer to a request Triton answered that it has no such model, though
    the gateway's table serves it (`Limiter.on_unknown`): Triton had just started again."""
    return UpstreamError(
        f"Triton did not have model {model_id} loaded again yet after a restart, so the request "
        "did not run; retry shortly"
    )


SMALL_REQUEST: Final = 16 * 1024
"""The largest body or message of a request that is not inference (health, metadata, config,
readiness, statistics: a model name and a version at most). Only inference counts against the
in-flight limits, so only inference may be large: a flood of huge metadata calls would otherwise
make Triton (and the relay) hold --max-body per call, unlimited in number."""


def small_request(what: str) -> BodyTooLargeError:
    """The refusal of a request that is not inference with a body or message over SMALL_REQUEST."""
    return BodyTooLargeError(
        f"{what} carries more than {SMALL_REQUEST} bytes; only inference requests may be larger"
    )


STATUS: Final[dict[type[ProxyError], tuple[int, grpc.StatusCode]]] = {
    OverloadedError: (503, grpc.StatusCode.RESOURCE_EXHAUSTED),
    QueueTimeoutError: (503, grpc.StatusCode.RESOURCE_EXHAUSTED),
    BodyTooLargeError: (413, grpc.StatusCode.RESOURCE_EXHAUSTED),
    HeadTooLargeError: (431, grpc.StatusCode.RESOURCE_EXHAUSTED),
    HeadTimeoutError: (408, grpc.StatusCode.DEADLINE_EXCEEDED),
    MalformedRequestError: (400, grpc.StatusCode.INVALID_ARGUMENT),
    UnsupportedError: (501, grpc.StatusCode.UNIMPLEMENTED),
    UnsupportedEncodingError: (415, grpc.StatusCode.INVALID_ARGUMENT),
    OverBudgetError: (503, grpc.StatusCode.RESOURCE_EXHAUSTED),
    QuarantinedError: (503, grpc.StatusCode.FAILED_PRECONDITION),
    UpstreamError: (502, grpc.StatusCode.UNAVAILABLE),
    WakeError: (503, grpc.StatusCode.UNAVAILABLE),
    HeldError: (503, grpc.StatusCode.UNAVAILABLE),
}
"""The one table: every refusal's (HTTP status, gRPC status code)."""


def http_status(error: ProxyError) -> int:
    """The HTTP status that answers `error`."""
    return STATUS.get(type(error), (500, grpc.StatusCode.INTERNAL))[0]


def retry_after(error: ProxyError) -> int:
    """Seconds a REST answer to `error` asks the client to wait (`Retry-After`); 0: none."""
    if isinstance(error, HeldError):
        return HeldError.RETRY_SECONDS
    return error.retry_after if isinstance(error, WakeError) else 0


def grpc_code(error: ProxyError) -> grpc.StatusCode:
    """The gRPC status code that answers `error`."""
    return STATUS.get(type(error), (500, grpc.StatusCode.INTERNAL))[1]
