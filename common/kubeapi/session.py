"""One request to the API server, the core every call of the agent and the binder goes through.

Blocking, meant for worker threads. `Session.request` sends one request (a watch: `stream`) over
the transport common.kubeapi.kubeconfig chose at start-up, with its credentials, and reads the
answer whole, so calls reuse a few keep-alive connections instead of opening one each. Failures
become common.kubeapi.errors' ApiError subclasses carrying the status; an unreachable server
(refused, reset, timed out) and 429/5xx answers are UnavailableError.

Writes (`write`, `retrying`) ride those out with bounded exponential backoff (honouring
Retry-After) for at most the RetryPolicy's budget and only while `retry_while()` holds (the
binder's: while the replica leads, since a write that outlives its leadership could double-book
a GPU the next leader has given away). Reads are tried once: their callers own the retry. It
knows no object kinds.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.kubeapi.errors import ApiError, UnavailableError, api_error
from common.kubeapi.transport import Answer, Stream, Transport

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]
CONNECT_TIMEOUT_SECONDS = 10.0
READ_TIMEOUT_SECONDS = 30.0
"""No call may hang a worker thread forever."""
AUTH_REFRESH_SECONDS = 1.0
"""How long the writes reuse the credential headers before reading them again."""

JSON = "application/json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
"""What the generated client sends for a dict patch body; kept, so nothing changes server-side."""
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class RetryPolicy:
    """How a write rides out an unavailable API server."""

    initial_seconds: float = 0.2
    """First wait after a failed attempt; doubles per attempt. Default 0.2 s."""
    max_seconds: float = 5.0
    """Longest wait between two attempts (a longer Retry-After is honoured). Default 5 s."""
    budget_seconds: float = 10.0
    """Give a write up once this long has passed since its first attempt. Default 10 s."""


def _retry_after(headers: dict[str, str]) -> float | None:
    value = headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the server's own clock, not worth trusting; back off instead


def _status_error(answer: Answer) -> ApiError:
    """The ApiError for an answer that is not a success, from its Status body."""
    body = answer.body.decode("utf-8", "replace")
    reason, message = answer.reason, body or answer.reason
    try:
        status_body = json.loads(body) if body else {}
        reason = str(status_body.get("reason") or reason)
        message = str(status_body.get("message") or message)
    except (ValueError, AttributeError):
        pass
    return api_error(answer.status, reason, message, _retry_after(answer.headers))


def _unreachable(e: Exception) -> UnavailableError:
    """No answer: refused, reset, timed out, or a broken stream."""
    return UnavailableError(0, type(e).__name__, f"the API server could not be reached: {e}")


class Session:
    """One transport per process, shared by every thread; every request goes through `request`
    (or `stream`, for a watch), which adds the credentials and maps failures to ApiErrors."""

    def __init__(
        self,
        configuration: Any,
        transport: Transport,
        *,
        retry: RetryPolicy,
        retry_while: Callable[[], bool] = lambda: True,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`configuration`: the client configuration common.kubeapi.kubeconfig read (the server and
        the credentials); `transport`: the one it chose. Writes are retried under `retry` only
        while `retry_while()` holds (the binder gives "this replica leads")."""
        self._configuration = configuration
        self._transport = transport
        self.retry = retry
        self.retry_while = retry_while
        self._monotonic = monotonic
        self._closing = threading.Event()
        self._auth: list[tuple[str, str]] = []
        self._auth_until = -math.inf

    @property
    def server(self) -> str:
        """The API server's URL, as the kubeconfig or the service account gave it."""
        return str(self._configuration.host)

    def close(self) -> None:
        """Stop every write's retries and close the connections."""
        self._closing.set()
        self._transport.close()

    def request(
        self,
        method: str,
        path: str,
        timeout: float = READ_TIMEOUT_SECONDS,
        body: JsonObject | None = None,
        content_type: str = JSON,
        *,
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
    ) -> bytes:
        """One request (`path` with its query), its answer read whole; the body of a 2xx answer,
        else the ApiError the answer's Status names. UnavailableError when no answer came."""
        headers = [("Accept", JSON), *self._auth_headers()]
        payload = b""
        if body is not None:
            payload = json.dumps(body, separators=(",", ":")).encode()
            headers.append(("Content-Type", content_type))
        try:
            answer = self._transport.request(
                method, path, headers, payload, timeout, min(connect_timeout, timeout)
            )
        except OSError as e:
            raise _unreachable(e) from e
        if not 200 <= answer.status <= 299:
            raise _status_error(answer)
        return answer.body

    def read(self, path: str) -> JsonObject:
        """GET one object or document at `path` (`/version`, an object's path); one attempt."""
        result: JsonObject = json.loads(self.request("GET", path))
        return result

    def stream(self, path: str, timeout: float) -> Stream:
        """A GET whose answer is read as it comes (a watch); ApiError as `request`."""
        headers = [("Accept", JSON), *self._auth_headers()]
        try:
            stream = self._transport.stream("GET", path, headers, timeout, CONNECT_TIMEOUT_SECONDS)
        except OSError as e:
            raise _unreachable(e) from e
        if not 200 <= stream.status <= 299:
            try:
                body = stream.read()
            except OSError as e:
                raise _unreachable(e) from e
            finally:
                stream.close()
            raise _status_error(Answer(stream.status, stream.reason, stream.headers, body))
        return stream

    def _auth_headers(self) -> list[tuple[str, str]]:
        """The credential headers, read through the client's refresh hook at most once per
        AUTH_REFRESH_SECONDS. The hook re-reads an expired in-cluster token (the client itself
        does so once a minute), and re-applies the whole kubeconfig or in-cluster settings to the
        configuration each time, whose `host` setter scans the environment for proxies: 0.08 ms
        a write, more than the write itself."""
        now = self._monotonic()
        if now >= self._auth_until:
            headers = []
            for auth in self._configuration.auth_settings().values():
                if auth.get("in") == "header" and auth.get("value"):
                    headers.append((str(auth["key"]), str(auth["value"])))
            self._auth = headers
            self._auth_until = now + AUTH_REFRESH_SECONDS
        return self._auth

    def write(
        self,
        what: str,
        method: str,
        path: str,
        body: JsonObject | None = None,
        content_type: str = JSON,
    ) -> bytes:
        """One write request, retried as `retrying` says; `what` names it in the logs."""
        return self.retrying(
            what, lambda timeout: self.request(method, path, timeout, body, content_type)
        )

    def retrying(self, what: str, attempt: Callable[[float], bytes]) -> bytes:
        """Run `attempt(read_timeout)` until the server gives a verdict, backing off while it is
        unavailable, within the retry budget and while `retry_while()` holds."""
        policy = self.retry
        started = self._monotonic()
        deadline = started + policy.budget_seconds
        delay = policy.initial_seconds
        tries = 1
        while True:
            left = deadline - self._monotonic()
            try:
                return attempt(max(1.0, min(READ_TIMEOUT_SECONDS, left)))
            except UnavailableError as e:
                wait = max(delay, e.retry_after or 0.0)
                if self._closing.is_set() or not self.retry_while():
                    raise
                if self._monotonic() + wait > deadline:
                    log.warning(
                        "Giving up %s after %d attempts in %.1f s: the API server is unavailable "
                        "(%s).",
                        what,
                        tries,
                        self._monotonic() - started,
                        e,
                    )
                    raise
                log.info(
                    "%s has failed (%s): attempt %d, trying again in %.1f s.",
                    what[:1].upper() + what[1:],
                    e,
                    tries,
                    wait,
                )
                self._closing.wait(wait)
                delay = min(delay * 2, policy.max_seconds)
                tries += 1
