"""What a REST request must pass on its way to Triton: its head's admission, its body's checks.

Admission (`admit`) decides what becomes of a request the router forwards, from its prepared head
and the proxy's state alone: relayed now, relayed once the model's limiter gives a slot, relayed
as a health call, answered here (readiness while draining or asleep, a parked model's), or
refused. `head_refusal`, its part that reads the head only: a body over --max-body, a
non-inference request larger than `refusals.SMALL_REQUEST` or chunked, a compressed chunked
body, and an inference body whose JSON part cannot be checked (over `shapes.MAX_JSON_BYTES`) are
refused before a byte of the body is read. The body checks follow what Triton's parsers would
do with the body: its JSON nesting (`policy.nesting`; Triton's parser recurses) and its inputs'
shapes against what it carries (`policy.shapes`; Triton allocates by the declared shape), for a
body that arrived whole (`check_whole`) or as it passes in pieces (`BodyChecks`, one per
connection, fed by `exchange.Exchange`), so that the last piece goes on only once the body
passed.

What it must not do: hold more of a body than its JSON part, take a slot, or write anything:
verdicts are returned and refusals raised, and the connection acts on them.
"""

from __future__ import annotations

from typing import Final

from proxy.http1.framing import RequestHead
from proxy.policy import admission, refusals
from proxy.policy.inflation import Sink
from proxy.policy.limiter import Limiter
from proxy.policy.nesting import MAX_NESTING, Nesting
from proxy.policy.routing import (
    JSON,
    Answer,
    Forward,
    error_body,
    health_body,
    parked_message,
    stopping_body,
)
from proxy.policy.shapes import MAX_JSON_BYTES, Shapes, check_json, json_too_large
from proxy.processflags import ProxyState
from proxy.table import Served

ADMITTED: Final = min(refusals.SMALL_REQUEST, MAX_JSON_BYTES)
"""A body of at most this many bytes, not chunked and within --max-body, is never refused by
`head_refusal`: the relay asks it only of the others."""


def too_large(limit: int) -> str:
    """Why a body over --max-body is refused, and what to do."""
    return (
        f"the request body is over the proxy's limit of {limit} bytes; send a smaller request "
        f"or raise --max-body"
    )


def checks_shapes(route: str, head: RequestHead) -> bool:
    """Whether the request is one whose JSON Triton reads for inputs' shapes (`policy.shapes`):
    an inference request (Triton answers any other method on its path 405 unread)."""
    return route == "infer" and head.method == "POST"


def head_refusal(
    head: RequestHead, decision: Forward, max_body: int
) -> tuple[refusals.ProxyError, bool] | None:
    """Why the request of `head`, to be relayed by `decision`, is refused before its body is
    read, and whether the connection closes (True: the body cannot be read safely) or reads the
    body, drops it and goes on (False); None when it may go on."""
    length = head.content_length or 0
    if length > max_body:
        return refusals.BodyTooLargeError(too_large(max_body)), True
    if length > MAX_JSON_BYTES and checks_shapes(decision.route, head) and not head.encoding:
        json_bytes = head.json_bytes
        if json_bytes < 0 or json_bytes > MAX_JSON_BYTES:
            # Its JSON part cannot be checked (`policy.shapes`).
            return json_too_large(length if json_bytes < 0 else json_bytes), False
    if (length > refusals.SMALL_REQUEST or head.chunked) and not decision.limited:
        chunked = " (chunked: of no stated size)" if head.chunked else ""
        return refusals.small_request(f"a {decision.route} request{chunked}"), True
    if head.encoding and head.chunked:
        return (
            refusals.UnsupportedError(
                "a compressed request body must come with Content-Length, not chunked"
            ),
            True,
        )
    return None


FORWARD: Final = admission.FORWARD
"""`admit`'s verdict: relay the request to Triton now."""
SLOT_FIRST: Final = admission.SLOT_FIRST
"""`admit`'s verdict: relay the request once its limiter gives a slot (an inference call, or
any call of a parked model: it waits for the model's wake)."""
HEALTH: Final = -1
"""`admit`'s verdict: relay the health or readiness call; Triton's answer gets the protocol's
JSON body (`relay.HealthBody`)."""
_DRAINING_BODY: Final = error_body("the model proxy is shutting down: use another replica")


def admit(
    head: RequestHead,
    decision: Forward,
    served: Served | None,
    limiter: Limiter,
    max_body: int,
    state: ProxyState,
) -> int | Answer | tuple[refusals.ProxyError, bool]:
    """What becomes of the request of `head`, which `decision` forwards to `served` (the table's
    entry of its model, as picked; None: a server-wide route) under `limiter` (the model's, or
    the proxy's): `FORWARD`, `SLOT_FIRST` or `HEALTH`; an `Answer` to give here; or a refusal
    and whether the connection closes after it (as `head_refusal`). The body's rules are REST's
    own; the rest is the one decision of every protocol, `policy.admission`."""
    length = head.content_length or 0
    # Most requests are none of these: nothing `head_refusal` could refuse.
    if length > ADMITTED or length > max_body or head.chunked:
        refused = head_refusal(head, decision, max_body)
        if refused is not None:
            return refused
    route = decision.route
    verdict = admission.admit(
        decision.readiness,
        route == "ready",
        decision.limited,
        served is not None and served.entry.parked,
        limiter,
        state,
    )
    if verdict <= SLOT_FIRST:  # to Triton: most requests
        return HEALTH if decision.health and verdict == FORWARD else verdict
    if verdict == admission.QUARANTINED:
        refusal = limiter.refusal
        assert refusal is not None
        return refusal, False
    if verdict == admission.DRAINING:
        return Answer(route, 503, JSON, _DRAINING_BODY)
    if verdict == admission.STOPPING:
        return Answer(route, 503, JSON, stopping_body(limiter.unready))
    if verdict == admission.ASLEEP:
        return Answer(route, 200, JSON, health_body(route, decision.model, True))
    assert served is not None  # admission.PARKED
    return Answer(route, 400, JSON, error_body(parked_message(served.model_id)))


def check_whole(buffer: bytes, start: int, end: int, head: RequestHead, route: str) -> None:
    """Check a whole uncompressed body, `buffer[start:end]`, where it lies; raises ProxyError."""
    # Triton's JSON parser recurses and dies of deep enough nesting: a body's depth is at most
    # its length and its openings, counted at C speed; only a body with more than the bound of
    # both is followed.
    if (
        end - start > MAX_NESTING
        and buffer.count(b"[", start, end) + buffer.count(b"{", start, end) > MAX_NESTING
    ):
        Nesting(head.json_bytes).feed(buffer, start, end)
    if route == "infer" and head.method == "POST":  # `checks_shapes`, inline: every request
        # Triton allocates each input by its declared shape before reading the data.
        json_end = head.json_bytes
        json_end = end if json_end < 0 else min(end, start + json_end)
        check_json(buffer[start:json_end], end - start)


class BodyChecks:
    """The checks of the body one connection relays in pieces, set up by `begin` for each.

    `nesting` follows the body's JSON (a body no longer than the bound cannot nest past it, so
    only longer ones, or of a length not known yet, are followed); `shapes` collects the JSON
    part of a chunked or compressed inference body for its check before the last piece, and
    `pending` says a Content-Length inference body's shapes are still to be checked
    (`plain`, which collects it only once it spans pieces); `inflated` is where a compressed
    body's inflated bytes go."""

    __slots__ = ("_json_bytes", "_length", "inflated", "nesting", "pending", "shapes")

    def __init__(self) -> None:
        self.nesting: Nesting | None = None
        self.shapes: Shapes | None = None
        self.pending = False
        self.inflated: Sink | None = None
        self._json_bytes = -1
        self._length = 0

    def begin(self, head: RequestHead, route: str, remaining: int) -> None:
        """A body of `head` (`remaining` bytes of it by Content-Length) is relayed in pieces."""
        nested = head.chunked or head.encoding or remaining > MAX_NESTING
        self.nesting = Nesting(head.json_bytes) if nested else None
        checked = checks_shapes(route, head)
        self.pending = checked and not head.chunked and not head.encoding
        framed = checked and not self.pending
        self.shapes = Shapes(head.json_bytes, not head.encoding) if framed else None
        self.inflated = self.nesting
        if self.shapes is not None and self.nesting is not None and head.encoding:
            self.inflated = _Both(self.nesting, self.shapes)
        self._json_bytes = head.json_bytes
        self._length = head.content_length or 0

    def end(self) -> None:
        """The body is done: nothing more is kept or checked."""
        self.shapes = None
        self.pending = False

    def plain(self, data: bytes, start: int, step: int, last: bool) -> None:
        """`data[start:start + step]`, a piece of a Content-Length body, the `last` one if so:
        followed, and collected to check the body's shapes before its last piece goes (Triton
        has not begun reading it); raises ProxyError."""
        if self.nesting is not None:
            self.nesting.feed(data, start, start + step)
        if not self.pending or not step:
            return
        shapes = self.shapes
        if shapes is None:
            if last:  # the whole body in one piece: checked as it is, nothing kept
                self.pending = False
                json_end = start + step
                if 0 <= self._json_bytes < step:
                    json_end = start + self._json_bytes
                check_json(data[start:json_end], self._length)
                return
            shapes = self.shapes = Shapes(self._json_bytes)
        shapes.feed(data, start, start + step)
        if last:
            self.shapes = None
            self.pending = False
            shapes.check(self._length)


class _Both:
    """Passes a compressed inference body's inflated bytes to both of its checks."""

    __slots__ = ("_first", "_second")

    def __init__(self, first: Sink, second: Sink) -> None:
        self._first = first
        self._second = second

    def feed(self, data: bytes) -> None:
        self._first.feed(data)
        self._second.feed(data)
