"""Faults a test asks the API server to answer with: 429 with Retry-After, 500, 503, as a real API
server does under API Priority and Fairness or while etcd is unhealthy.

A fault matches requests by the start of their User-Agent and, optionally, their verb, and answers
the next `times` of them with its status instead of serving them (the request changes nothing),
or, if `committed`, after serving them (the change stays, only the answer is lost).
Safe to arm from a test's thread while the server's loop consumes. No I/O.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

REASONS = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}


@dataclass
class Fault:
    status: int
    """HTTP status to answer with (429, 500, 503...)."""
    times: int
    """How many matching requests still get it."""
    user_agent: str = ""
    """Prefix of the User-Agent of the requests it applies to; "" for every client."""
    verb: str = ""
    """Kubernetes verb it applies to (`create`, `patch`, `list`...); "" for every verb."""
    resource: str = ""
    """Resource it applies to (`pods`, `leases`...); "" for every resource."""
    retry_after: int | None = None
    """Seconds sent in a Retry-After header, as the real server does with 429; None for none."""
    delay_seconds: float = 0.0
    """Hold the request this long before answering, as an overloaded server does; a client
    with a shorter timeout sees it hang."""
    committed: bool = False
    """Serve the request first and answer with the fault anyway (the change stays), as a server
    whose answer is lost after the write reached storage (a 504 or 503 from a proxy)."""

    @property
    def reason(self) -> str:
        return REASONS.get(self.status, "InternalError")

    @property
    def message(self) -> str:
        if self.status == 429:
            return "Too many requests, please try again later."
        return f"the simulated API server was asked to fail this request with {self.status}"


class Faults:
    """The armed faults, first armed first used."""

    def __init__(self) -> None:
        self._faults: list[Fault] = []
        self._lock = threading.Lock()

    def arm(self, fault: Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def take(self, user_agent: str, verb: str, resource: str) -> Fault | None:
        """The fault that answers this request, counting it; None to serve the request."""
        with self._lock:
            for fault in self._faults:
                wanted = fault.times > 0 and user_agent.startswith(fault.user_agent)
                if wanted and fault.verb in ("", verb) and fault.resource in ("", resource):
                    fault.times -= 1
                    return fault
        return None
