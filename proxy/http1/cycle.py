"""A REST tenant connection's request cycle, pure: the bytes it sent in, what becomes of its next
request out.

As h11's `Connection`, `RequestCycle` holds no socket: fed what the tenant sent (`next_request`),
it says what the connection is to do with the request at its head, as an event: wait for the
rest of its head (`NEED_DATA`); refuse it and close (`TOO_LARGE`, `UNREADABLE`: a head that
cannot be read safely, `REFUSE_CLOSE`: a body that cannot be); answer it here (`ANSWER`: the
router's answer or admission's) or refuse it (`REFUSE`), its body read and dropped; or relay it
to Triton (`RELAY`, with admission's verdict: now, once a slot is free, or as a health call).
To say so it parses the head strictly (`framing`, through the listener's cache of prepared heads
and its own last head: keep-alive clients repeat theirs), routes it (`policy.routing`), picks its
model's entry (a replica, at the node gateway's host) with its limiter, metrics and pool, and
asks `gate.admit`, whose first rule is the pod's quarantine. What it decided stays on it until
the next request (`head`, `served`, `limiter`, ...).

`relay.ClientConnection` does what it says: the I/O around the cycle (the head's timer, writing
answers and refusals, the limiter's slot, the pool's connection, sending to Triton). What the
cycle must not do: touch a transport, a timer, a task or a slot, or read the clock.
"""

from __future__ import annotations

from typing import Final

from proxy.http1.connection import Listener, Prepared
from proxy.http1.framing import MAX_HEAD_BYTES, RequestHead
from proxy.http1.gate import HEALTH, admit
from proxy.metrics import ProxyMetrics
from proxy.policy import refusals
from proxy.policy.limiter import Limiter
from proxy.policy.routing import NOT_FOUND, Answer, Forward
from proxy.table import Served

NEED_DATA: Final = 0
"""The head is not whole yet: wait for more (the connection's head timer bounds the wait)."""
TOO_LARGE: Final = 1
"""The head is over MAX_HEAD_BYTES: refuse with `error` and close."""
UNREADABLE: Final = 2
"""The head cannot be read safely (`framing`'s refusals): refuse with `error` and close."""
ANSWER: Final = 3
"""Answer here with `answer` (a model not in the table, or admission's answer: draining,
asleep, parked); the body, from `body`, is read and dropped."""
REFUSE: Final = 4
"""Refuse with `error` (the pod quarantined, a body whose JSON cannot be checked); the body,
from `body`, is read and dropped and the connection goes on."""
REFUSE_CLOSE: Final = 5
"""Refuse with `error` and close: the body cannot be read safely."""
RELAY: Final = 6
"""Relay to Triton: `verdict` says now (`gate.FORWARD`), once the limiter gives a slot
(`gate.SLOT_FIRST`) or as a health call (`gate.HEALTH`); the body begins at `body`."""

_MODELS_PATH: Final = b" /v2/models/"
"""What precedes the model's name in the request line of a per-model route (`_renamed_head`)."""
_KNOWN_HEAD_BYTES: Final = 4096
"""The largest request head a connection remembers as its last one (as the listener's cache)."""
_NOTHING_KNOWN: Final[Prepared] = (RequestHead("", "", b"", (), None, False, False), NOT_FOUND, b"")
"""Stands for the last head until there is one (never read: `_known` is empty until then)."""
_HEALTH_UNSET: Final = Forward("", "")
"""Stands for the health call's decision until there is one (never read before)."""
_TOO_LARGE: Final = "the request head is over 64 KiB; send smaller headers"


class RequestCycle:
    """One tenant connection's request cycle (see the module docstring)."""

    __slots__ = (
        "_known",
        "_known_prepared",
        "_known_verbatim",
        "_max_body",
        "_relay",
        "_state",
        "answer",
        "body",
        "error",
        "head",
        "health",
        "limiter",
        "metrics",
        "route",
        "served",
        "upstream_head",
        "verbatim",
        "verdict",
    )

    def __init__(self, relay: Listener) -> None:
        self._relay = relay
        # The last request head read on this connection, with its blank line, as prepared:
        # keep-alive clients send the same head again and again.
        self._known = b""
        self._known_prepared = _NOTHING_KNOWN
        self._known_verbatim = False
        # What `gate.admit` reads of the listener for every request, bound once: --max-body,
        # and the proxy's state (draining, asleep).
        self._max_body = relay.max_body
        self._state = relay.state
        self.head: RequestHead = _NOTHING_KNOWN[0]
        """The request's head, parsed (from ANSWER on)."""
        self.route = ""
        """The request's route, as its metrics name it ("unreadable" for UNREADABLE)."""
        self.upstream_head = b""
        """The head to send Triton (RELAY)."""
        self.verbatim = False
        """RELAY: the head as received is `upstream_head`'s very bytes (sent without a copy)."""
        self.body = 0
        """Where the request's body begins in the buffer fed (from ANSWER on)."""
        self.served: Served | None = None
        """RELAY: the table's entry of the request's model, as picked; None: a server-wide
        route."""
        self.limiter: Limiter = relay.limiter
        """RELAY: the limiter of the request's model (or the proxy's)."""
        self.metrics: ProxyMetrics = relay.metrics
        """The metrics the request counts in (from ANSWER on)."""
        self.verdict = 0
        """RELAY: admission's verdict (`gate.FORWARD`, `gate.SLOT_FIRST`, `gate.HEALTH`)."""
        self.answer: Answer = NOT_FOUND
        """ANSWER: what to answer."""
        self.error: refusals.ProxyError | None = None
        """TOO_LARGE, UNREADABLE, REFUSE, REFUSE_CLOSE: the refusal."""
        self.health: Forward = _HEALTH_UNSET
        """RELAY as `gate.HEALTH`: the health call's decision (its route and model name the
        JSON body Triton's answer is given, `relay.HealthBody`)."""

    def next_request(self, buffer: bytes) -> int:
        """What becomes of the request at the head of `buffer` (an event, above)."""
        relay = self._relay
        known = self._known
        if known and buffer.startswith(known):
            # The same head as this connection's last request (the same bytes up to and
            # including the blank line, so its end is found at the same place): as prepared.
            head_end = len(known) - 4
            prepared = self._known_prepared
            verbatim = self._known_verbatim
        else:
            head_end = buffer.find(b"\r\n\r\n", 0, MAX_HEAD_BYTES + 4)
            if head_end < 0:
                if len(buffer) > MAX_HEAD_BYTES:
                    self.error = refusals.HeadTooLargeError(_TOO_LARGE)
                    return TOO_LARGE
                return NEED_DATA
            try:
                prepared = relay.prepare(buffer[:head_end])
            except refusals.ProxyError as e:
                self.route = "unreadable"
                self.error = e
                return UNREADABLE
            verbatim = False
            # Only a forward: an answer (a model not in the table) may change as the host's
            # table does, and a forward whose model leaves it is decided again below.
            if head_end <= _KNOWN_HEAD_BYTES and isinstance(prepared[1], Forward):
                self._known = buffer[: head_end + 4]
                self._known_prepared = prepared
                # Re-serializing gave the same bytes (as with clients that send the framing
                # header last): the head can go to Triton as received, without a copy.
                self._known_verbatim = prepared[2] == self._known
        head, decision, upstream_head = prepared
        self.head = head
        self.body = head_end + 4
        self.route = decision.route
        if isinstance(decision, Answer):  # the router's own: a model not in the table
            self.metrics = relay.metrics
            self.answer = decision
            return ANSWER
        # The model's own limiter and metrics: one look-up, whatever the table's size.
        served = relay.models.get(decision.model) if decision.model else None
        if served is not None and served.replicas is not None and served.draining_since is None:
            # One of several replicas (the node gateway's host), named once picked.
            served = served.replicas.pick()
            upstream_head = _renamed_head(upstream_head, served)
            verbatim = False
        self.served = served
        self.upstream_head = upstream_head
        self.verbatim = verbatim
        if served is not None and served.draining_since is None:
            self.limiter = served.limiter
            self.metrics = served.metrics
        elif decision.model:
            # Its model left the table since this head was prepared: as for any other name.
            gone = relay.router.decide(head.method, head.target)
            if isinstance(gone, Answer):
                self.metrics = relay.metrics
                self.answer = gone
                return ANSWER
        else:
            self.limiter = relay.limiter
            self.metrics = relay.metrics
        # What becomes of it: to Triton (a slot first, or as a health call), an answer here,
        # or a refusal.
        verdict = admit(head, decision, served, self.limiter, self._max_body, self._state)
        if isinstance(verdict, int):
            self.verdict = verdict
            if verdict == HEALTH:
                self.health = decision
            return RELAY
        if isinstance(verdict, Answer):
            self.answer = verdict
            return ANSWER
        self.error, close = verdict
        return REFUSE_CLOSE if close else REFUSE


def _renamed_head(head: bytes, served: Served) -> bytes:
    """`head`, whose request line names `served`'s public model id after /v2/models/ (as the
    router forwards a path of a replica mapped once picked), naming its private name instead."""
    if not served.private:
        return head
    start = head.index(_MODELS_PATH) + len(_MODELS_PATH)
    return head[:start] + served.private + head[start + len(served.public) :]
