"""Per-stream gate of the gRPC relay: each message's check, its slots, the relay's own answers.

A message has its model-name field checked by `policy.routing`, exactly as the grpc.aio proxy
checks it (an inference message also its inputs against its data, `policy.tensors`). A unary call
takes a concurrency slot once its message passed; a ModelStreamInfer stream takes one for each
request message in flight, given back when Triton's answers end it (`policy.finals`), the last
once those answers have all left for the tenant (`settled`): an open stream with nothing at
Triton and nothing for its tenant holds no slot, so an idle stream cannot starve its pod's or
namespace's other calls. With none free, the stream's messages wait in its buffer (its window
bounds it) for the queue's time; one refused for a full queue or its timeout gets an in-stream
error and the stream goes on. A probationer's stream gives its last slot back with its last
request's end, whatever its tenant has read. The relay's
own answers (another model, refused APIs, overload) go on the stream through the same windows as
Triton's.

A stream whose model leaves the host or left its table ends UNAVAILABLE, with GOAWAY on its
connection, as soon as none of its requests is at Triton and its answers are out (at once when
idle, else after its last answer), so that its client opens it again through the model's
Service; a message that comes meanwhile for a model gone from the table waits, unsent, and
ends with it.

One `StreamGate` per tenant connection, fed by its `intake.StreamIntake` (reached back through
`GateHooks`); it writes through the connection's `outbox.Outbox`, answers through its
`replies.Replies`, and reaches the listener through `GateContext`. What it must not do: decide
isolation itself, or hand Triton a message it has not checked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, Final, Protocol

from proxy.grpc import framing
from proxy.grpc.outbox import Outbox
from proxy.grpc.replies import Replies
from proxy.grpc.stream import HOLDS_SLOT, NO_SLOT, WAITING, Channel, Stream
from proxy.http2.streamstates import active
from proxy.metrics import ProxyMetrics
from proxy.policy import admission, finals, refusals, routing, wire
from proxy.policy.limiter import Limiter
from proxy.policy.routing import GRPC_SERVICE, GrpcAnswer, GrpcRouter
from proxy.processflags import ProxyState
from proxy.table import Served

_clock: Final = time.perf_counter
"""The latency clock (`metrics.observe`), bound once: compiled (mypyc), a C static."""
READY_PATH: Final = f"/{GRPC_SERVICE}/ModelReady".encode()
UNIMPLEMENTED: Final = GrpcAnswer("unknown", "UNIMPLEMENTED", "Method not found!")
FORWARDED: Final = frozenset(
    {"ServerLive", "ServerMetadata", "ServerReady", "ModelReady", "ModelMetadata", "ModelConfig",
     "ModelInfer", "ModelStatistics", "ModelStreamInfer"}
)  # fmt: skip
"""The RPCs a stream is opened at Triton for; `policy.routing` decides every other one locally."""
OTHER_MODEL: Final = (
    "this stream serves model {}, which its first message named; open a stream per model"
)
UNSERVED: Final = (
    "model {} is no longer served here (it moves to another host, or its host is replaced): "
    "open the stream again, through the model's Service"
)


def unserved(served: Served | None) -> bool:
    """Whether `served` is a model that leaves this host (`table.Entry.leaving`) or left its
    table (draining, or removed): its streams end once idle (`StreamGate.end_unserved`)."""
    return served is not None and (served.entry.leaving or served.draining_since is not None)


class GateContext(Protocol):
    """What the gate needs from the listener (`server.GrpcRelay`)."""

    router: GrpcRouter
    limiter: Limiter
    metrics: ProxyMetrics
    served: dict[bytes, Served]
    state: ProxyState
    max_message: int
    max_inflated: int

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
        """Run `coro` on a task the listener owns (cancelled when it stops)."""

    def channel(self) -> Channel:
        """The connection to Triton a new stream goes on (or a detached one, again)."""

    def route_channel(self, route: tuple[str, int, int]) -> Channel:
        """The connection to a relayed model's Service (`table.Served.route`)."""


class GateHooks:
    """What the gate needs from the reader of its streams' buffers (`intake.StreamIntake`, the
    one implementation). A base class rather than a Protocol: compiled (mypyc), a call through a
    Protocol looks the method up by name (as `replies.ReplyHooks`)."""

    def relay_buffered(self, stream: Stream) -> None:
        """Check and relay every complete message in the stream's buffer."""
        raise NotImplementedError

    def refuse_head(self, stream: Stream, error: refusals.ProxyError) -> None:
        """Refuse the stream message at the head of its buffer, and go on with the next."""
        raise NotImplementedError

    def later(self, stream: Stream) -> None:
        """Go on reading `stream` at the next event-loop turn."""
        raise NotImplementedError


class StreamGate:
    """The per-stream checks of one tenant connection (see the module docstring)."""

    __slots__ = (
        "_limiter",
        "_metrics",
        "_router",
        "_served",
        "_state",
        "context",
        "hooks",
        "out",
        "replies",
        "streams",
    )

    def __init__(
        self,
        context: GateContext,
        streams: dict[int, Stream],
        out: Outbox,
        replies: Replies,
        hooks: GateHooks,
    ) -> None:
        self.context = context
        # The context's parts every call uses, read once: compiled (mypyc), reading an attribute
        # through the Protocol is a lookup by name every time.
        self._limiter = context.limiter
        self._metrics = context.metrics
        self._router = context.router
        self._served = context.served
        self._state = context.state
        self.streams = streams  # the connection's open streams, shared with it and the replies
        self.out = out
        self.replies = replies
        self.hooks = hooks

    def serve(self, stream: Stream, model: bytes) -> None:
        """`stream` counts against `model`'s limiter and metrics from now, unless it holds or
        waits for a slot already (whose limiter must get it back)."""
        if stream.limited == NO_SLOT and not stream.slots:
            self._pick(stream, self._served.get(model))

    def _pick(self, stream: Stream, served: Served | None) -> None:
        """`stream` counts against `served` (the table's entry of its model), or one of its
        replicas, from now."""
        if served is not None and served.replicas is not None:
            served = served.replicas.pick()  # one of several replicas: named once picked
        stream.served = served
        if served is not None and served.resend and not stream.streaming:
            stream.kept = bytearray()  # sent again if the connection goes under it

    def admit(self, stream: Stream) -> bool:
        """Take a slot for `stream` now, or queue for one on a task; False while it waits."""
        served = stream.served
        limiter = self._limiter if served is None else served.limiter
        if limiter.try_acquire():
            stream.limited = HOLDS_SLOT
            return True
        stream.limited = WAITING
        stream.waiter = self.context.spawn(self._wait_slot(stream, limiter))
        return False

    def idle_back(self) -> None:
        """The pod went on probation: the slots its open streams keep with no message at
        Triton go back (its streams keep none idle from now on, `opened`, `answered`)."""
        for stream in self.streams.values():
            tracker = stream.finals
            if tracker is None:
                continue
            served = stream.served
            limiter = self._limiter if served is None else served.limiter
            if limiter.probation is None:
                continue
            if stream.limited == HOLDS_SLOT and not stream.buf:
                stream.limited = NO_SLOT
                limiter.release()
            while stream.slots > tracker.pending:
                stream.slots -= 1
                limiter.release()

    def take(self, stream: Stream) -> bool:
        """A slot for the next request message of a stream, on `admission`'s verdict as for a
        unary call (an inference call: a slot first, unless the pod is quarantined): one it
        holds and no message uses (kept from its last message until its answers left, or one
        its waiter got), or a free one; else queue for one (False): the message waits in the
        stream's buffer. A slot kept from an earlier message is not reused by a probationer's
        stream, nor while the pod is held: it goes back and the message takes one through the
        limiter, which holds or queues it for its lane's turn as it does a unary request.
        Quarantined (False), the stream gives back the slots no message uses and the message
        is refused in the stream (`_refuse_message`); the stream goes on."""
        tracker = stream.finals
        assert tracker is not None
        served = stream.served
        limiter = self._limiter if served is None else served.limiter
        verdict = admission.admit(
            False,  # readiness
            False,  # model_ready
            True,  # limited: a stream's request message is an inference call
            served is not None and served.entry.parked,
            limiter,
            self._state,
        )
        if verdict == admission.QUARANTINED:
            if stream.limited == HOLDS_SLOT:
                stream.limited = NO_SLOT
                limiter.release()
            while stream.slots > tracker.pending:
                stream.slots -= 1
                limiter.release()
            refusal = limiter.refusal
            assert refusal is not None
            stream.limited = WAITING  # the buffer waits until the message is refused
            stream.waiter = self.context.spawn(self._refuse_message(stream, refusal))
            return False
        if stream.limited == HOLDS_SLOT:  # taken through the limiter for this message
            stream.limited = NO_SLOT
            stream.slots += 1
            if tracker.pending < stream.slots:
                return True
        elif tracker.pending < stream.slots:
            if limiter.probation is None and not limiter.holding:
                return True
            stream.slots -= 1
            limiter.release()
        if not self.admit(stream):
            return False  # queued: `_wait_slot` relays the buffer again with the slot
        stream.limited = NO_SLOT
        stream.slots += 1
        return True

    def answered(self, stream: Stream, requests: int) -> None:
        """Triton's answers ended `requests` of the stream's request messages: the slots past
        those still in flight go back (to the oldest waiter first, or, under the node's budget,
        to the namespace's pods in turn). The last is kept until the answers have left for the
        tenant (`settled`), so a stream holding answers its tenant has not read counts: the
        pod's streams holding anything are at most its limit and queue (`gateway.budget`)."""
        tracker = stream.finals
        if not requests or tracker is None:
            return
        served = stream.served
        limiter = self._limiter if served is None else served.limiter
        # A probationer's stream keeps none idle: its turn on the lane ends with its requests.
        keep = max(tracker.pending, 1) if limiter.probation is None else tracker.pending
        release = limiter.release
        while stream.slots > keep:
            stream.slots -= 1
            release()
        if stream.limited == WAITING and tracker.pending < stream.slots:
            # Its next message queued for a slot while one it holds was still in use: it
            # takes that one now rather than wait for another (with a limit of one, forever).
            if stream.waiter is not None:
                stream.waiter.cancel()
                stream.waiter = None
            stream.limited = NO_SLOT
            self.hooks.later(stream)

    def settled(self, stream: Stream) -> None:
        """None of the stream's requests is at Triton and its answers all left for the tenant
        (`replies.Replies.settle`): the slot it kept goes back; open and idle, it holds none."""
        served = stream.served
        limiter = self._limiter if served is None else served.limiter
        while stream.slots:
            stream.slots -= 1
            limiter.release()
        if served is not None and (served.entry.leaving or served.draining_since is not None):
            self.end_unserved(stream)

    def end_unserved(self, stream: Stream, model: str = "") -> None:
        """`stream`'s model leaves the host or left its table (`unserved`) and none of its
        requests is at Triton: it ends UNAVAILABLE (what it buffered was never sent) and its
        connection takes no new stream (GOAWAY; not at the node gateway, whose tenant is a
        pod's proxy), so that its client opens it again through the model's Service, which
        routes to a host that serves it."""
        if self.streams.get(stream.sid) is not stream or not stream.started:
            return
        served = stream.served
        if not self._router.per_model:  # the node gateway's tenant is a proxy: no GOAWAY
            self.replies.hooks.go_away()
        name = served.model_id if served is not None else model
        self.refuse(stream, "UNAVAILABLE", UNSERVED.format(name), None, 1)

    def end_idle_unserved(self) -> None:
        """The table changed: every open stream of a model that leaves the host or left its
        table, and that has nothing at Triton nor for its tenant, ends now (`end_unserved`);
        the others end as their last answers leave (`settled`)."""
        for stream in list(self.streams.values()):
            tracker = stream.finals
            if (
                tracker is not None
                and unserved(stream.served)
                and not tracker.pending
                and tracker.quiet
                and not stream.held
            ):
                self.end_unserved(stream)

    def _unsent(
        self, stream: Stream, message: bytes, framed: bytes | None, model: str = ""
    ) -> bool:
        """A message of a stream whose model left the table: kept unsent in the buffer; the
        stream ends now if nothing of it is at Triton, else once its answers are out
        (`settled`). False: the stream reads no further."""
        stream.buf[:0] = framed or framing.grpc_message(message)
        tracker = stream.finals
        assert tracker is not None
        if not tracker.pending and not stream.slots:
            self.end_unserved(stream, model)
        return False

    def _left_table(self, message: bytes) -> str:
        """The model a stream message names when it left the table moments ago
        (`table.LEFT_SECONDS`); '' otherwise: a model never served here gets Triton's
        unknown-model answer in the stream."""
        try:
            name = wire.string_fields(message, (1,)).get(1, b"")
        except wire.WireError:
            return ""
        return name.decode() if name in self._router.left else ""

    async def _wait_slot(self, stream: Stream, limiter: Limiter) -> None:
        try:
            await limiter.acquire()
        except refusals.ProxyError as e:
            self._refused(stream, e)
            return
        stream.waiter = None
        if self.streams.get(stream.sid) is not stream:  # the tenant left while it waited
            limiter.release()
            stream.limited = NO_SLOT
            return
        stream.limited = HOLDS_SLOT
        self.hooks.relay_buffered(stream)

    async def _refuse_message(self, stream: Stream, error: refusals.ProxyError) -> None:
        """Refuse the stream message at the head of its buffer with `error` (the pod's
        quarantine, `take`), on the next turn as a refusal of the limiter's comes."""
        self._refused(stream, error)

    def _refused(self, stream: Stream, error: refusals.ProxyError) -> None:
        """The message that waited for a slot was refused with `error`: a stream's in the
        stream, that message only; a unary call's as the call's answer."""
        served = stream.served
        (self._metrics if served is None else served.metrics).rejected(type(error).__name__)
        stream.waiter = None
        stream.limited = NO_SLOT
        if stream.streaming and len(stream.buf) >= 5 and self.streams.get(stream.sid) is stream:
            self.hooks.refuse_head(stream, error)  # that message only: the stream goes on
            return
        self.refuse_error(stream, error)

    def inject(self, stream: Stream, response: bytes) -> None:
        """Send the tenant an in-stream response of the relay's own (Triton never sees it),
        after the response head: Triton's may not have come yet (`Replies.triton_headers` then
        sends none of its own)."""
        if not stream.responded:
            self.out.write(framing.local_head(stream.sid))
            stream.responded = True
        self.replies.to_tenant(stream, framing.grpc_message(response), False)

    def check(self, stream: Stream, message: bytes, total: int, framed: bytes | None) -> bool:
        """Check one whole message and relay it, or answer it; False when the stream ended.
        `framed` is the message as the tenant sent it (length-prefixed; compressed when `message`
        was inflated from it), when the relay may send those very bytes on."""
        router = self._router
        vmodel = stream.vmodel
        if vmodel is not None:
            # ModelMesh's header names the model: the message names it too from here on.
            try:
                named = wire.with_string_value(message, 1, vmodel)
            except wire.WireError:
                named = message  # malformed: refused by the check below
            if named != message:
                self.replies.forwarded(stream, total - len(named) - 5)
                total = len(named) + 5
                message, framed = named, None
        if stream.streaming:
            served = stream.served
            if served is not None and served.draining_since is not None:
                return self._unsent(stream, message, framed)  # its model left the table
            refusal = router.decide_stream_message(message)
            if refusal is None and router.per_model:
                refusal = self._other_than_served(stream, message)
            if refusal is None:
                if stream.served is None:
                    # A stream's requests count against the model its first one names.
                    self.serve(stream, wire.string_fields(message, (1,)).get(1, b""))
                if not self.take(stream):
                    stream.buf[:0] = framed or framing.grpc_message(message)  # checked again
                    return False
                request_id, asked = finals.request_facts(message)
                if router.renames:
                    sent = router.renamed(message)
                elif router.per_model and stream.served is not None:
                    served = stream.served
                    sent = (
                        router.renamed_to(message, served.public, served.private)
                        if served.spread
                        else router.renamed_as(message, served.public)
                    )
                else:
                    sent = message
                if not asked:
                    sent += finals.ASK  # so that Triton marks the request's end
                if sent is not message:
                    self.replies.forwarded(stream, total - len(sent) - 5)
                    framed = None
                tracker = stream.finals
                assert tracker is not None
                tracker.sent(request_id, asked)
                self._tail(stream, sent, framed)
                return True
            if stream.served is None and self._router.left:
                gone = self._left_table(message)
                if gone:  # a new stream's first message, for a model that left
                    return self._unsent(stream, message, framed, gone)
            self.replies.forwarded(stream, total)
            self.inject(stream, refusal)
            return True
        if stream.passed:  # a second message on a unary call
            error = refusals.MalformedRequestError("a unary call carries exactly one message")
            self.refuse_error(stream, error)
            return False
        decision = router.decide(stream.kind, message)
        stream.route = decision.route
        if isinstance(decision, GrpcAnswer):
            ok = decision.code == "OK"
            retry_after = 0
            if decision.code == "UNAVAILABLE":  # a model that left the host (`routing.left`)
                if not router.per_model:  # the client's next call: through the Service
                    self.replies.hooks.go_away()
                retry_after = 1
            response = decision.response if ok else None
            self.refuse(stream, decision.code, decision.details, response, retry_after)
            return False
        limiter = self._limiter
        model = decision.model
        # The model's own limiter and metrics: one look-up (its entry, whichever replica).
        entry = self._served.get(model) if model else None
        verdict = admission.admit(
            decision.readiness,
            decision.route == "ModelReady",
            decision.limited,
            entry is not None and entry.entry.parked,
            limiter,
            self._state,
        )
        if verdict == admission.QUARANTINED:
            # Refused before a model is picked, so that the refusal counts in the listener's
            # metrics.
            quarantine = limiter.refusal
            assert quarantine is not None
            self.refuse_error(stream, quarantine)
            return False
        request = decision.request
        if model:
            if stream.limited == NO_SLOT and not stream.slots:
                self._pick(stream, entry)
            picked = stream.served
            if picked is not None and picked.spread:
                request = router.renamed_to(request, picked.public, picked.private)
        if verdict > admission.SLOT_FIRST:  # answered here: ready, or not
            # Not ready: DRAINING, STOPPING (the node gateway's: the pod leaves its Service while
            # its node pod stops) or PARKED (`routing.parked_message`).
            self.refuse(stream, "OK", "", framing.READY if verdict == admission.ASLEEP else b"")
            return False
        stream.passed = True
        if verdict == admission.SLOT_FIRST and stream.limited == NO_SLOT and not self.admit(stream):
            stream.buf[:0] = framed or framing.grpc_message(message)  # checked again once admitted
            stream.route = stream.kind
            stream.passed = False
            return False
        if request is not message:
            # Narrowed or renamed (sent uncompressed, which gRPC allows per message): the tenant
            # is credited what it sent, the difference now and the new message's bytes as they
            # go on (a longer one makes the difference negative: the sum is what it sent).
            self.replies.forwarded(stream, total - len(request) - 5)
            message, framed = request, None
        self._tail(stream, message, framed)
        return True

    def _other_than_served(self, stream: Stream, message: bytes) -> bytes | None:
        """With per-model names (a model host at the node gateway), a stream serves the one
        model its first message names, whose private name its answers are renamed from: the
        in-stream refusal of a message naming another, or None."""
        served = stream.served
        if served is None:
            return None
        name = wire.string_fields(message, (1,)).get(1, b"")
        if name == served.public:
            return None
        return routing.stream_refusal(OTHER_MODEL.format(served.model_id), message)

    def _tail(self, stream: Stream, message: bytes, framed: bytes | None) -> None:
        """Send the message on, ending the stream if it is the last."""
        last = stream.ended and not stream.buf
        if last:
            stream.ended = False  # END_STREAM rides on this frame, not on an empty one after
        if framed is None:
            framed = framing.grpc_message(message)
        channel = stream.channel
        if channel is None:
            channel = self.reopen(stream)
        if len(framed) <= channel.max_frame:  # `up`'s common case, without the call
            channel.send(stream, framed, last)
        else:
            self.up(stream, framed, last)

    def reopen(self, stream: Stream) -> Channel:
        """Open `stream` at Triton again, on the listener's channel: its connection failed
        before its message went (`Stream.detach`); or for the first time, on the router's port
        (`server.GrpcRelay.mesh`), at its model's Service when another host serves it."""
        served = stream.served
        route = served.route if served is not None else None
        channel = self.context.channel() if route is None else self.context.route_channel(route)
        channel.open(stream, stream.fields, False)
        return channel

    def up(self, stream: Stream, payload: bytes, end_stream: bool) -> None:
        """Request bytes of `stream` for Triton, split to frames Triton takes."""
        channel = stream.channel
        if channel is None:
            channel = self.reopen(stream)
        step = channel.max_frame
        if len(payload) <= step:
            channel.send(stream, payload, end_stream)
            return
        for pos in range(0, len(payload), step):
            last = pos + step >= len(payload)
            channel.send(stream, payload[pos : pos + step], end_stream and last)

    def refuse_error(self, stream: Stream, error: refusals.ProxyError) -> None:
        """Answer `stream` with one of the proxy's own refusals (its code from the table, and
        the seconds to wait before a retry, `framing.retry_fields`)."""
        code = refusals.grpc_code(error).name
        self.refuse(stream, code, str(error), None, refusals.retry_after(error))

    def refuse(
        self,
        stream: Stream,
        code: str,
        details: str,
        response: bytes | None = None,
        retry_after: int = 0,
        unanswered: bool = False,
    ) -> None:
        """Answer `stream` ourselves and reset it at Triton (`unanswered`: Triton's connection
        was lost under it, `framing.UNANSWERED`)."""
        self.streams.pop(stream.sid, None)
        stream.scan = None
        stream.inflation = None
        if active(stream.triton):
            assert stream.channel is not None
            stream.channel.reset(stream)
        stream.buf.clear()
        answer = GrpcAnswer(stream.route, code, details)
        self.answer(stream, answer, None, response, retry_after, unanswered)

    def answer(
        self,
        stream: Stream,
        answer: GrpcAnswer,
        started: float | None,
        response: bytes | None = None,
        retry_after: int = 0,
        unanswered: bool = False,
    ) -> None:
        """Answer `stream` with `answer` (and `response`, or the answer's own for an OK one)."""
        if response is None and answer.code == "OK":
            response = answer.response
        head = not stream.responded
        if response is not None:
            if head:
                self.out.write(framing.local_head(stream.sid))
                stream.responded = True
                head = False
            self.replies.to_tenant(stream, framing.grpc_message(response), False)
        self.replies.end_to_tenant(
            stream,
            framing.local_trailers(
                stream.sid, answer.code, answer.details, head, retry_after, unanswered
            ),
        )
        if started is not None:
            served = stream.served
            metrics = self._metrics if served is None else served.metrics
            metrics.observe("grpc", answer.route, answer.code, _clock() - started)
        else:
            self.finish(stream, answer.code)

    def finish(self, stream: Stream, code: str) -> None:
        started = stream.started
        if not started:
            return  # never relayed, or finished already
        stream.started = 0.0
        if stream.waiter is not None:
            stream.waiter.cancel()
            stream.waiter = None
        served = stream.served
        limiter = self._limiter if served is None else served.limiter
        if stream.limited == HOLDS_SLOT:
            limiter.release()
        stream.limited = NO_SLOT
        # A direct call in the loop: compiled (mypyc), binding `release` first made a bound
        # method object on every call, though a unary call holds no stream slots.
        while stream.slots:
            stream.slots -= 1
            limiter.release()
        (self._metrics if served is None else served.metrics).observe(
            "grpc", stream.route, code, _clock() - started
        )
