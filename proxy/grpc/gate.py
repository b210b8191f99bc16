"""Per-stream gate of the gRPC relay: admission, message checks, and the relay's own answers.

Every message a tenant sends on a relayed stream has its model-name field checked, whole, by
`policy.routing`, exactly as the grpc.aio proxy checks it (an inference message also its inputs
against its data, `policy.tensors`); a compressed one is read inflated and forwarded as sent. A
message past HOLD_LIMIT bytes, or one that inflates past SMALL_INFLATE, is first decided from its
prefix (another model: refused before Triton sees a byte), then read in pieces as it passes
(`wire.MessageScan`, inflated in bounded slices under the inflate cap by `policy.inflation`,
yielding to the event loop every BUDGET inflated bytes) and relayed all but its last byte, which
goes on only once the whole message passed: Triton cannot act on it, or inflate it, before. Such a
message is never held whole: what the relay holds of it is what the stream's window lets the tenant
send ahead. A unary call takes a concurrency slot once its message passed; a ModelStreamInfer stream
takes one when it opens, which its first request message in flight uses, and each further request
message in flight takes one more before it goes to Triton, given back when Triton's answers end it
(`policy.finals`): with none free, the stream's messages wait in its buffer, which its window bounds
(the tenant is not credited, so it stops sending), for the queue's time; a message refused for a
full queue or its timeout gets an in-stream error and the stream goes on. A probationer's stream
keeps no slot idle, and its every message takes one through the limiter: the probation hold,
a trial's refusal and the lane's turns apply to each, as to a unary call. Answers the relay gives
itself (another model, refused APIs, overload) go on the stream, through the same windows as
Triton's answers; bytes it drops are credited back to the tenant's stream at once.

One `StreamGate` per tenant connection, composed by `relay.H2Connection`: it writes through the
connection's `outbox.Outbox`, answers through its `replies.Replies`, and reaches the listener's
router, limiter and metrics through `GateContext`. What it must not do: decide isolation itself,
or hand Triton a message it has not checked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, Final, Protocol

from proxy.grpc import framing, messages
from proxy.grpc.outbox import Outbox
from proxy.grpc.replies import Replies
from proxy.grpc.stream import HOLDS_SLOT, NO_SLOT, WAITING, Channel, Stream
from proxy.http2.streamstates import active
from proxy.metrics import ProxyMetrics
from proxy.policy import finals, inflation, refusals, routing, tensors, wire
from proxy.policy.limiter import Limiter
from proxy.policy.routing import GRPC_SERVICE, GrpcAnswer, GrpcRouter
from proxy.table import Served

HOLD_LIMIT: Final = 16 * 1024
"""Messages up to this size are held whole before the check; larger ones stream minus a byte."""
PREFIX_HOLD: Final = 32 * 1024
"""How much of a large message is held while its model name has not been read: held bytes are not
credited back, so this stays well inside RECEIVE_WINDOW or the stream would stall; the name is
field 1 and serializers write it first, so only crafted messages ever reach this."""
SMALL_INFLATE: Final = 64 * 1024
"""A compressed message that inflates to at most this is inflated whole, inline, and checked like
an uncompressed one; a larger one is read in pieces."""
_clock: Final = time.perf_counter
"""The latency clock (`metrics.observe`), bound once: compiled (mypyc), a C static."""
_ENDED: Final = "; the message was too large to hold back whole, so the stream ends here"
READY_PATH: Final = f"/{GRPC_SERVICE}/ModelReady".encode()
UNIMPLEMENTED: Final = GrpcAnswer("unknown", "UNIMPLEMENTED", "Method not found!")
FORWARDED: Final = frozenset(
    {"ServerLive", "ServerMetadata", "ServerReady", "ModelReady", "ModelMetadata", "ModelConfig",
     "ModelInfer", "ModelStatistics", "ModelStreamInfer"}
)  # fmt: skip
"""The RPCs a stream is opened at Triton for; `policy.routing` decides every other one locally."""
_INFERENCE: Final = frozenset({"ModelInfer", "ModelStreamInfer"})
"""The RPCs whose messages may be larger than `refusals.SMALL_REQUEST`."""
_CUT: Final = "the call ended inside a message; send each message whole"
_COMPRESSED_RENAME: Final = (
    "a compressed message that inflates past 64 KiB cannot be renamed to the model's private "
    "name in the node's Triton without inflating it whole; send it uncompressed"
)
_NAME_FIRST: Final = (
    "a message over 16 KiB must carry the model name as its first field, as protobuf "
    "serializers write it; send it serialized in field order"
)
_COMPRESSED_STREAM: Final = (
    "a compressed ModelStreamInfer message that inflates past 64 KiB cannot carry the final-"
    "response parameter the relay counts each request by without inflating it whole; send it "
    "uncompressed"
)
_OTHER_MODEL: Final = (
    "this stream serves model {}, which its first message named; open a stream per model"
)
_FLAG: Final = (
    "a gRPC message's compressed flag is {}, but only 0 and 1 exist; send a valid gRPC message"
)


class GateContext(Protocol):
    """What the gate needs from the listener (`server.GrpcRelay`)."""

    router: GrpcRouter
    limiter: Limiter
    metrics: ProxyMetrics
    served: dict[bytes, Served]
    max_message: int
    max_inflated: int

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
        """Run `coro` on a task the listener owns (cancelled when it stops)."""

    def channel(self) -> Channel:
        """The connection to Triton a new stream goes on (or a detached one, again)."""


class StreamGate:
    """The per-stream checks of one tenant connection (see the module docstring)."""

    __slots__ = (
        "_limiter",
        "_max_message",
        "_metrics",
        "_router",
        "_served",
        "_spent",
        "_turn",
        "context",
        "out",
        "replies",
        "streams",
    )

    def __init__(
        self, context: GateContext, streams: dict[int, Stream], out: Outbox, replies: Replies
    ) -> None:
        self.context = context
        # The context's parts every call uses, read once: compiled (mypyc), reading an attribute
        # through the Protocol is a lookup by name every time.
        self._limiter = context.limiter
        self._metrics = context.metrics
        self._router = context.router
        self._served = context.served
        self._max_message = context.max_message
        self.streams = streams  # the connection's open streams, shared with it and the replies
        self.out = out
        self.replies = replies
        self._spent = 0  # bytes inflated on this connection in this event-loop turn
        self._turn = False  # a callback resets `_spent` at the next turn

    def _serve(self, stream: Stream, model: bytes) -> None:
        """`stream` counts against `model`'s limiter and metrics from now, unless it holds or
        waits for a slot already (whose limiter must get it back)."""
        if stream.limited == NO_SLOT and not stream.slots:
            served = self._served.get(model)
            if served is not None and served.replicas is not None:
                served = served.replicas.pick()  # one of several replicas: named once picked
            stream.served = served

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

    def opened(self, stream: Stream) -> None:
        """A stream of the model opened: it holds a slot from now on (`admit`), unless its pod
        is on probation, whose streams hold slots only for their messages at Triton (one held
        idle would keep the lane from the other probationers)."""
        if self._limiter.probation is None:
            self.admit(stream)

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

    def _take(self, stream: Stream) -> bool:
        """A slot for the next request message of a stream: one it holds and no message uses
        (the one it took when it opened, or one its waiter got), or a free one; else queue for
        one (False): the message waits in the stream's buffer. A slot kept from an earlier
        message is not reused by a probationer's stream, nor while the pod is held or
        quarantined: it goes back and the message takes one through the limiter, which holds,
        refuses or queues it for its lane's turn as it does a unary request."""
        tracker = stream.finals
        assert tracker is not None
        if stream.limited == HOLDS_SLOT:  # taken through the limiter for this message
            stream.limited = NO_SLOT
            stream.slots += 1
            if tracker.pending < stream.slots:
                return True
        elif tracker.pending < stream.slots:
            served = stream.served
            limiter = self._limiter if served is None else served.limiter
            if limiter.probation is None and limiter.refusal is None and not limiter.holding:
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
        to the namespace's pods in turn). A stream keeps one while it
        is open, so a stream holding answers its tenant has not read counts, as it did when a
        stream counted once: the pod's streams holding anything are at most its limit and
        queue (`gateway.budget`)."""
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
            self._later(stream)

    async def _wait_slot(self, stream: Stream, limiter: Limiter) -> None:
        try:
            await limiter.acquire()
        except refusals.ProxyError as e:
            served = stream.served
            (self._metrics if served is None else served.metrics).rejected(type(e).__name__)
            stream.waiter = None
            stream.limited = NO_SLOT
            if stream.streaming and len(stream.buf) >= 5 and self.streams.get(stream.sid) is stream:
                self._refuse_head(stream, e)  # that message only: the stream goes on
                return
            self.refuse_error(stream, e)
            return
        stream.waiter = None
        if self.streams.get(stream.sid) is not stream:  # the tenant left while it waited
            limiter.release()
            stream.limited = NO_SLOT
            return
        stream.limited = HOLDS_SLOT
        self.relay_buffered(stream)

    def _refuse_head(self, stream: Stream, error: refusals.ProxyError) -> None:
        """Refuse the stream message at the head of its buffer, which found no slot, with an
        in-stream error naming why (as Triton refuses one message); drop it (what is still to
        come of it too) and go on with the next."""
        buf = stream.buf
        total = 5 + int.from_bytes(buf[1:5], "big")
        whole = len(buf) >= total and not buf[0]
        request = bytes(buf[5:total]) if whole else b""
        dropped = min(total, len(buf))
        stream.skip = total - dropped
        del buf[:dropped]
        self.replies.forwarded(stream, dropped)
        self._inject(stream, routing.stream_refusal(str(error), request))
        self.relay_buffered(stream)

    def relay_buffered(self, stream: Stream) -> None:
        """Check and relay every complete message in the stream's buffer."""
        if stream.limited == WAITING:
            return  # keep buffering until the stream has its slot
        buf = stream.buf
        if stream.skip:  # the rest of a refused message: Triton never gets it, the tenant's credit
            dropped = min(stream.skip, len(buf))
            del buf[:dropped]
            stream.skip -= dropped
            self.replies.forwarded(stream, dropped)
        while True:
            if stream.scan is not None:  # a message read in pieces
                if not self._pass_on(stream):
                    return
                continue
            if len(buf) < 5:
                break
            flag = buf[0]
            size = int.from_bytes(buf[1:5], "big")
            if flag > 1:
                self.refuse_error(stream, refusals.MalformedRequestError(_FLAG.format(flag)))
                return
            if size > self.context.max_message:
                too_large = _too_large(self.context.max_message)
                self.refuse_error(stream, refusals.BodyTooLargeError(too_large))
                return
            if size > refusals.SMALL_REQUEST and stream.kind not in _INFERENCE:
                self.refuse_error(stream, refusals.small_request(f"a {stream.kind} message"))
                return
            total = 5 + size
            whole = len(buf) >= total
            if not whole and (size <= HOLD_LIMIT or len(buf) < 6):
                break  # held until whole (or until it has a byte to go ahead)
            framed = None
            message = b""
            if whole and flag:
                try:
                    small = messages.inflate_small(
                        stream.encoding, bytes(buf[5:total]), SMALL_INFLATE
                    )
                except refusals.ProxyError as e:
                    self.refuse_error(stream, e)
                    return
                if small is not None:
                    message = small
                    framed = bytes(buf[:total])  # Triton gets the tenant's compressed bytes
            elif whole:
                message = bytes(buf[5:total])
            if not whole or (flag and framed is None):
                # Large, or inflating past SMALL_INFLATE: decided from its prefix, then read in
                # pieces as it passes.
                if not self._prefix(stream, whole):
                    if whole and self.streams.get(stream.sid) is stream:
                        continue  # refused in the stream and dropped: the next message's turn
                    break
                if not self._begin(stream, flag, size):
                    break
                continue
            del buf[:total]
            if not self.check(stream, message, total, framed):
                return
        if stream.ended and not buf and active(stream.triton):
            self._up(stream, b"", True)
            stream.ended = False  # sent on; the stream stays open until Triton's trailers

    def _prefix(self, stream: Stream, whole: bool) -> bool:
        """Decide a large message from its first bytes, before any of it reaches Triton: True to
        relay it early (our model's, or the name unreadable here: checked when whole); False to
        hold it for more bytes (never when it is `whole`), or when it was refused."""
        buf = stream.buf
        prefix = bytes(buf[5 : 5 + PREFIX_HOLD])
        held = len(prefix) < PREFIX_HOLD and not whole
        router = self.context.router
        try:
            if buf[0]:  # compressed: read the name from what the prefix inflates to, bounded
                prefix = messages.inflate_prefix(stream.encoding, prefix, PREFIX_HOLD)
            name = wire.prefix_string(prefix, 1)
            request_id = wire.prefix_string(prefix, 3, ordered=True) if name is not None else None
        except (wire.WireError, refusals.ProxyError):
            return True  # malformed: refused by the full check once whole
        if name is None:
            return not held
        served = stream.served
        other = (
            stream.streaming and router.per_model and served is not None and name != served.public
        )
        if name in router.names and not other:
            self._serve(stream, name)
            return True
        if request_id is None and held:
            return False  # an in-stream error echoes the request's id: wait for it
        named = wire.encode_string(1, name)
        if stream.streaming:
            echo = wire.encode_string(3, request_id) if request_id else b""
            if other:
                assert served is not None
                error = _OTHER_MODEL.format(served.model_id)
                refusal: bytes | None = routing.stream_refusal(error, named + echo)
            else:
                refusal = router.decide_stream_message(named + echo)
            if refusal is None:  # cannot happen for another name; relay and check when whole
                return True
            # Dropped, and what is still to come of it (a whole message: the next ones stay).
            total = 5 + int.from_bytes(buf[1:5], "big")
            dropped = min(total, len(buf))
            stream.skip = total - dropped
            del buf[:dropped]
            self.replies.forwarded(stream, dropped)
            self._inject(stream, refusal)
            return False
        decision = router.decide(stream.kind, named)
        if not isinstance(decision, GrpcAnswer):
            return True
        stream.route = decision.route
        ok = decision.code == "OK"
        self.refuse(stream, decision.code, decision.details, decision.response if ok else None)
        return False

    def _begin(self, stream: Stream, flag: int, size: int) -> bool:
        """Start reading the message at the head of the buffer in pieces (its prefix decided
        it may go ahead); False while a unary call waits for its slot, which it takes first, as
        Triton gets the message's bytes from now on."""
        unary_infer = stream.kind == "ModelInfer" and not stream.passed
        if unary_infer and stream.limited == NO_SLOT and not self.admit(stream):
            return False
        if stream.streaming:
            if flag:
                self.refuse_error(stream, refusals.MalformedRequestError(_COMPRESSED_STREAM))
                return False
            if not self._take(stream):
                return False
            tracker = stream.finals
            assert tracker is not None
            tracker.pending += 1  # its slot is its own from its first byte at Triton
        watch = finals.ASK_KEY if stream.streaming else b""
        # Inference requests have their inputs checked against their data (`policy.tensors`).
        inference = stream.kind in _INFERENCE
        stream.scan = tensors.InferScan(watch) if inference else wire.MessageScan(watch)
        if flag:
            stream.inflation = inflation.Inflation(
                messages.wbits(stream.encoding),
                self.context.max_inflated,
                "the message",
                "--max-inflated",
            )
        stream.left = size
        buf = stream.buf
        router = self.context.router
        if router.renames:
            return self._begin_renamed(
                stream, flag, size, router.model_id.encode(), router.triton_name
            )
        if router.per_model:
            served = stream.served
            if served is None:  # its name was not read first: it cannot be renamed as it goes
                self.refuse_error(stream, refusals.MalformedRequestError(_NAME_FIRST))
                return False
            if served.private:
                return self._begin_renamed(stream, flag, size, served.public, served.private)
        if stream.streaming:  # it goes on with `finals.ASK` after its last byte
            self.replies.forwarded(stream, -len(finals.ASK))
            self._up(stream, b"\x00" + (size + len(finals.ASK)).to_bytes(4, "big"), False)
        else:
            self._up(stream, bytes(buf[:5]), False)
        del buf[:5]
        return True

    def _begin_renamed(
        self, stream: Stream, flag: int, size: int, own: bytes, private: bytes
    ) -> bool:
        """`_begin` where Triton knows the model `own` by its `private` name: the message's
        first field (its name, as serializers write it; its prefix named the model id) goes to
        Triton renamed, under a length prefix that counts the new name; the reader sees what the
        tenant sent. A compressed one cannot be renamed without inflating it whole: refused."""
        buf = stream.buf
        field = 2 + len(own)
        if flag:
            self.refuse_error(stream, refusals.MalformedRequestError(_COMPRESSED_RENAME))
            return False
        if len(buf) < 5 + field or bytes(buf[5 : 5 + field]) != wire.encode_string(1, own):
            self.refuse_error(stream, refusals.MalformedRequestError(_NAME_FIRST))
            return False
        scan = stream.scan
        assert scan is not None
        scan.feed(bytes(buf[5 : 5 + field]))
        named = wire.encode_string(1, private)
        extra = len(finals.ASK) if stream.streaming else 0  # sent after its last byte
        head = b"\x00" + (size - field + len(named) + extra).to_bytes(4, "big") + named
        stream.left = size - field
        del buf[: 5 + field]
        self.replies.forwarded(stream, 5 + field - len(head) - extra)  # the channel credits `head`
        self._up(stream, head, False)
        return True

    def _pass_on(self, stream: Stream) -> bool:
        """Read and relay what the buffer holds of the message being read in pieces; True once
        it is whole, checked and sent on (the next message may be read), False while it waits for
        bytes or for the next event-loop turn, or when it was refused."""
        buf = stream.buf
        scan = stream.scan
        assert scan is not None
        take = min(len(buf), stream.left)
        if not take:
            if stream.ended:
                self.refuse_error(stream, refusals.MalformedRequestError(_CUT))
            return False
        chunk = bytes(buf[:take])
        counting = stream.inflation
        if counting is None:
            scan.feed(chunk)
            taken = take
        else:
            budget = self._budget()
            if budget <= 0:
                self._later(stream)
                return False
            before = counting.size
            try:
                taken = counting.feed(chunk, budget, scan)
                if taken == stream.left:
                    counting.finish()
            except refusals.ProxyError as e:
                self.refuse_error(stream, e)
                return False
            self._spent += counting.size - before
        stream.left -= taken
        if stream.left:
            if taken:
                self._up(stream, chunk if taken == take else chunk[:taken], False)
                del buf[:taken]
            if taken < take:
                self._later(stream)  # this turn's budget is spent: go on at the next
            elif stream.ended:
                self.refuse_error(stream, refusals.MalformedRequestError(_CUT))
            return False
        # The last byte is in: everything before it goes on, it only once the message passed.
        if taken > 1:
            self._up(stream, chunk[: taken - 1], False)
            del buf[: taken - 1]
        last = bytes(buf[:1])
        del buf[:1]
        stream.scan = None
        stream.inflation = None
        scan.finish()
        return self._scanned(stream, scan, last)

    def _scanned(self, stream: Stream, scan: wire.MessageScan, last: bytes) -> bool:
        """Decide a message read in pieces, whose bytes but `last` reached Triton: send `last`
        on, or end the call (the part at Triton cannot be taken back)."""
        router = self.context.router
        if stream.streaming:
            refusal = router.decide_stream_scanned(scan)
            served = stream.served
            if refusal is None and router.per_model and served is not None:
                try:
                    other = scan.field(1) != served.public
                except wire.WireError:
                    other = True
                if other:
                    words = _OTHER_MODEL.format(served.model_id)
                    refusal = routing.stream_refusal(words, b"")
            if refusal is not None:
                self.refuse(stream, "INVALID_ARGUMENT", _text(refusal) + _ENDED, refusal)
                return False
            tracker = stream.finals
            assert tracker is not None
            # The field-3 check passed (`decide_stream_scanned`); the parameter is always sent
            # (its length was announced before the tenant's own parameters were read).
            try:
                request_id = scan.field(3)
            except wire.WireError:
                request_id = b""  # Triton refuses it, with one error answer
            tracker.note(request_id, scan.watched)
            last += finals.ASK
        else:
            if stream.passed:  # a second message on a unary call
                error = refusals.MalformedRequestError("a unary call carries exactly one message")
                self.refuse_error(stream, error)
                return False
            decision = router.decide_scanned(stream.kind, scan)
            stream.route = decision.route
            if isinstance(decision, GrpcAnswer):
                ok = decision.code == "OK"
                response = decision.response if ok else None
                self.refuse(stream, decision.code, decision.details, response)
                return False
            stream.passed = True
        end = stream.ended and not stream.buf
        if end:
            stream.ended = False  # END_STREAM rides on this frame
        channel = stream.channel
        if channel is None:
            channel = self._reopen(stream)
        channel.send(stream, last, end)
        return True

    def _budget(self) -> int:
        """What this connection may still inflate in this event-loop turn."""
        if not self._turn:
            self._turn = True
            asyncio.get_running_loop().call_soon(self._new_turn)
        return inflation.BUDGET - self._spent

    def _new_turn(self) -> None:
        self._turn = False
        self._spent = 0

    def _later(self, stream: Stream) -> None:
        """Go on reading `stream` at the next event-loop turn, after other connections had
        theirs."""
        if not stream.resuming:
            stream.resuming = True
            asyncio.get_running_loop().call_soon(self._resume, stream)

    def _resume(self, stream: Stream) -> None:
        stream.resuming = False
        if self.streams.get(stream.sid) is stream:
            self.relay_buffered(stream)

    def _inject(self, stream: Stream, response: bytes) -> None:
        """Send the tenant an in-stream response of the relay's own (Triton never sees it),
        after the response head: Triton's may not have come yet (`Replies.triton_headers` then
        sends none of its own)."""
        if not stream.responded:
            self.out.write(framing.local_head(stream.sid))
            stream.responded = True
        self.replies.to_tenant(stream, framing.grpc_message(response), False)

    def whole_message(self, payload: bytes, stream: Stream) -> bool:
        """`payload` is exactly one uncompressed message within the limit, with nothing of the
        stream buffered before it and nothing waiting: `check` may take it as it is."""
        size = len(payload) - 5
        return (
            not stream.buf
            and stream.scan is None
            and not stream.skip
            and stream.limited != WAITING
            and size >= 0
            and payload[0] == 0
            and payload[1] << 24 | payload[2] << 16 | payload[3] << 8 | payload[4] == size
            and size <= self._max_message
        )

    def check(self, stream: Stream, message: bytes, total: int, framed: bytes | None) -> bool:
        """Check one whole message and relay it, or answer it; False when the stream ended.
        `framed` is the message as the tenant sent it (length-prefixed; compressed when `message`
        was inflated from it), when the relay may send those very bytes on."""
        router = self._router
        if stream.streaming:
            refusal = router.decide_stream_message(message)
            if refusal is None and router.per_model:
                refusal = self._other_than_served(stream, message)
            if refusal is None:
                if stream.served is None:
                    # A stream's requests count against the model its first one names.
                    self._serve(stream, wire.string_fields(message, (1,)).get(1, b""))
                if not self._take(stream):
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
            self.replies.forwarded(stream, total)
            self._inject(stream, refusal)
            return True
        if stream.passed:  # a second message on a unary call
            error = refusals.MalformedRequestError("a unary call carries exactly one message")
            self.refuse_error(stream, error)
            return False
        decision = router.decide(stream.kind, message)
        stream.route = decision.route
        if isinstance(decision, GrpcAnswer):
            ok = decision.code == "OK"
            self.refuse(stream, decision.code, decision.details, decision.response if ok else None)
            return False
        if self._limiter.refusal is not None:  # a pod the node quarantined: every call
            self.refuse_error(stream, self._limiter.refusal)
            return False
        request = decision.request
        if decision.model:  # the model's own limiter and metrics: one look-up
            self._serve(stream, decision.model)
            picked = stream.served
            if picked is not None and picked.spread:
                request = router.renamed_to(request, picked.public, picked.private)
        now_served = stream.served
        parked = now_served is not None and now_served.entry.parked
        if parked and decision.route == "ModelReady":
            self.refuse(stream, "OK", "", b"")  # ready: false (`routing.parked_message`)
            return False
        stream.passed = True
        # A parked model's calls, inference or not, wait for its wake (`proxy.parking`).
        limited = decision.limited or parked
        if limited and stream.limited == NO_SLOT and not self.admit(stream):
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
        return routing.stream_refusal(_OTHER_MODEL.format(served.model_id), message)

    def _tail(self, stream: Stream, message: bytes, framed: bytes | None) -> None:
        """Send the message on, ending the stream if it is the last."""
        last = stream.ended and not stream.buf
        if last:
            stream.ended = False  # END_STREAM rides on this frame, not on an empty one after
        if framed is None:
            framed = framing.grpc_message(message)
        channel = stream.channel
        if channel is None:
            channel = self._reopen(stream)
        if len(framed) <= channel.max_frame:  # `_up`'s common case, without the call
            channel.send(stream, framed, last)
        else:
            self._up(stream, framed, last)

    def _reopen(self, stream: Stream) -> Channel:
        """Open `stream` at Triton again, on the listener's channel: its connection failed
        before its message went (`Stream.detach`)."""
        channel = self.context.channel()
        channel.open(stream, stream.fields, False)
        return channel

    def _up(self, stream: Stream, payload: bytes, end_stream: bool) -> None:
        """Request bytes of `stream` for Triton, split to frames Triton takes."""
        channel = stream.channel
        if channel is None:
            channel = self._reopen(stream)
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
    ) -> None:
        """Answer `stream` ourselves and reset it at Triton."""
        self.streams.pop(stream.sid, None)
        stream.scan = None
        stream.inflation = None
        if active(stream.triton):
            assert stream.channel is not None
            stream.channel.reset(stream)
        stream.buf.clear()
        self.answer(stream, GrpcAnswer(stream.route, code, details), None, response, retry_after)

    def answer(
        self,
        stream: Stream,
        answer: GrpcAnswer,
        started: float | None,
        response: bytes | None = None,
        retry_after: int = 0,
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
            framing.local_trailers(stream.sid, answer.code, answer.details, head, retry_after),
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


def _text(refusal: bytes) -> str:
    """The error_message of an in-stream refusal the router built."""
    return wire.string_fields(refusal, (1,)).get(1, b"").decode("utf-8", "replace")


def _too_large(limit: int) -> str:
    return f"the message is over the proxy's limit of {limit} bytes; send less or raise --max-body"
