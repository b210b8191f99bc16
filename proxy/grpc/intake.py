"""What a tenant's gRPC stream sends, read from its buffer into messages for the gate.

A message up to HOLD_LIMIT bytes (a compressed one that inflates to at most SMALL_INFLATE) is held
whole and checked by `gate.StreamGate.check`. A larger one is first decided from its prefix
(another model: refused before Triton sees a byte), then read in pieces as it passes
(`wire.MessageScan`, inflated in bounded slices under the inflate cap by `policy.inflation`,
yielding to the event loop every BUDGET inflated bytes) and relayed all but its last byte, which
goes on only once the whole message passed: Triton cannot act on it, or inflate it, before. Such a
message is never held whole: what the relay holds of it is what the stream's window lets the tenant
send ahead. Bytes the relay drops are credited back to the tenant's stream at once.

One `StreamIntake` per tenant connection, composed by `connection.Connection`: it owns the
connection's `gate.StreamGate`, which reaches back to it through `gate.GateHooks`. What it must not
do: hand Triton a byte of a message its prefix did not clear, or the last byte of one not checked.
"""

from __future__ import annotations

import asyncio
from typing import Final

from proxy.grpc import messages
from proxy.grpc.gate import OTHER_MODEL, GateContext, GateHooks, StreamGate
from proxy.grpc.outbox import Outbox
from proxy.grpc.replies import Replies
from proxy.grpc.stream import NO_SLOT, WAITING, Stream
from proxy.http2.streamstates import active
from proxy.policy import finals, inflation, refusals, routing, tensors, wire
from proxy.policy.routing import GrpcAnswer

HOLD_LIMIT: Final = 16 * 1024
"""Messages up to this size are held whole before the check; larger ones stream minus a byte."""
PREFIX_HOLD: Final = 32 * 1024
"""How much of a large message is held while its model name has not been read: held bytes are not
credited back, so this stays well inside RECEIVE_WINDOW or the stream would stall; the name is
field 1 and serializers write it first, so only crafted messages ever reach this."""
SMALL_INFLATE: Final = 64 * 1024
"""A compressed message that inflates to at most this is inflated whole, inline, and checked like
an uncompressed one; a larger one is read in pieces."""
_ENDED: Final = "; the message was too large to hold back whole, so the stream ends here"
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
_FLAG: Final = (
    "a gRPC message's compressed flag is {}, but only 0 and 1 exist; send a valid gRPC message"
)


class StreamIntake(GateHooks):
    """The buffered request bytes of one tenant connection (see the module docstring)."""

    __slots__ = ("_max_message", "_spent", "_turn", "context", "gate", "replies", "streams")

    def __init__(
        self, context: GateContext, streams: dict[int, Stream], out: Outbox, replies: Replies
    ) -> None:
        self.context = context
        self._max_message = context.max_message  # read once, as the gate reads its parts
        self.streams = streams  # the connection's open streams, shared with it and the gate
        self.replies = replies
        self._spent = 0  # bytes inflated on this connection in this event-loop turn
        self._turn = False  # a callback resets `_spent` at the next turn
        self.gate = StreamGate(context, streams, out, replies, self)

    def whole_message(self, payload: bytes, stream: Stream) -> bool:
        """`payload` is exactly one uncompressed message within the limit, with nothing of the
        stream buffered before it and nothing waiting: the gate's `check` may take it as it is."""
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
                self.gate.refuse_error(stream, refusals.MalformedRequestError(_FLAG.format(flag)))
                return
            if size > self.context.max_message:
                too_large = _too_large(self.context.max_message)
                self.gate.refuse_error(stream, refusals.BodyTooLargeError(too_large))
                return
            if size > refusals.SMALL_REQUEST and stream.kind not in _INFERENCE:
                self.gate.refuse_error(stream, refusals.small_request(f"a {stream.kind} message"))
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
                    self.gate.refuse_error(stream, e)
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
            if not self.gate.check(stream, message, total, framed):
                return
        if stream.ended and not buf and active(stream.triton):
            self.gate.up(stream, b"", True)
            stream.ended = False  # sent on; the stream stays open until Triton's trailers

    def refuse_head(self, stream: Stream, error: refusals.ProxyError) -> None:
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
        self.gate.inject(stream, routing.stream_refusal(str(error), request))
        self.relay_buffered(stream)

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
        vmodel = stream.vmodel
        if vmodel is not None and name != vmodel and (name is not None or not held):
            # Its bytes go on as they come: the header's model cannot be written in.
            self.gate.refuse(stream, "INVALID_ARGUMENT", _VMODEL_LARGE, None)
            return False
        if name is None:
            return not held
        served = stream.served
        other = (
            stream.streaming and router.per_model and served is not None and name != served.public
        )
        if name in router.names and not other:
            self.gate.serve(stream, name)
            return True
        if request_id is None and held:
            return False  # an in-stream error echoes the request's id: wait for it
        named = wire.encode_string(1, name)
        if stream.streaming:
            echo = wire.encode_string(3, request_id) if request_id else b""
            if other:
                assert served is not None
                error = OTHER_MODEL.format(served.model_id)
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
            self.gate.inject(stream, refusal)
            return False
        decision = router.decide(stream.kind, named)
        if not isinstance(decision, GrpcAnswer):
            return True
        stream.route = decision.route
        ok = decision.code == "OK"
        self.gate.refuse(stream, decision.code, decision.details, decision.response if ok else None)
        return False

    def _begin(self, stream: Stream, flag: int, size: int) -> bool:
        """Start reading the message at the head of the buffer in pieces (its prefix decided
        it may go ahead); False while a unary call waits for its slot, which it takes first, as
        Triton gets the message's bytes from now on."""
        unary_infer = stream.kind == "ModelInfer" and not stream.passed
        if unary_infer and stream.limited == NO_SLOT and not self.gate.admit(stream):
            return False
        if stream.streaming:
            if flag:
                self.gate.refuse_error(stream, refusals.MalformedRequestError(_COMPRESSED_STREAM))
                return False
            if not self.gate.take(stream):
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
                self.gate.refuse_error(stream, refusals.MalformedRequestError(_NAME_FIRST))
                return False
            if served.private:
                return self._begin_renamed(stream, flag, size, served.public, served.private)
        if stream.streaming:  # it goes on with `finals.ASK` after its last byte
            self.replies.forwarded(stream, -len(finals.ASK))
            self.gate.up(stream, b"\x00" + (size + len(finals.ASK)).to_bytes(4, "big"), False)
        else:
            self.gate.up(stream, bytes(buf[:5]), False)
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
            self.gate.refuse_error(stream, refusals.MalformedRequestError(_COMPRESSED_RENAME))
            return False
        if len(buf) < 5 + field or bytes(buf[5 : 5 + field]) != wire.encode_string(1, own):
            self.gate.refuse_error(stream, refusals.MalformedRequestError(_NAME_FIRST))
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
        self.gate.up(stream, head, False)
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
                self.gate.refuse_error(stream, refusals.MalformedRequestError(_CUT))
            return False
        chunk = bytes(buf[:take])
        counting = stream.inflation
        if counting is None:
            scan.feed(chunk)
            taken = take
        else:
            budget = self._budget()
            if budget <= 0:
                self.later(stream)
                return False
            before = counting.size
            try:
                taken = counting.feed(chunk, budget, scan)
                if taken == stream.left:
                    counting.finish()
            except refusals.ProxyError as e:
                self.gate.refuse_error(stream, e)
                return False
            self._spent += counting.size - before
        stream.left -= taken
        if stream.left:
            if taken:
                self.gate.up(stream, chunk if taken == take else chunk[:taken], False)
                del buf[:taken]
            if taken < take:
                self.later(stream)  # this turn's budget is spent: go on at the next
            elif stream.ended:
                self.gate.refuse_error(stream, refusals.MalformedRequestError(_CUT))
            return False
        # The last byte is in: everything before it goes on, it only once the message passed.
        if taken > 1:
            self.gate.up(stream, chunk[: taken - 1], False)
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
                    words = OTHER_MODEL.format(served.model_id)
                    refusal = routing.stream_refusal(words, b"")
            if refusal is not None:
                self.gate.refuse(stream, "INVALID_ARGUMENT", _text(refusal) + _ENDED, refusal)
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
                self.gate.refuse_error(stream, error)
                return False
            decision = router.decide_scanned(stream.kind, scan)
            stream.route = decision.route
            if isinstance(decision, GrpcAnswer):
                ok = decision.code == "OK"
                response = decision.response if ok else None
                self.gate.refuse(stream, decision.code, decision.details, response)
                return False
            stream.passed = True
        end = stream.ended and not stream.buf
        if end:
            stream.ended = False  # END_STREAM rides on this frame
        channel = stream.channel
        if channel is None:
            channel = self.gate.reopen(stream)
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

    def later(self, stream: Stream) -> None:
        """Go on reading `stream` at the next event-loop turn, after other connections had
        theirs."""
        if not stream.resuming:
            stream.resuming = True
            asyncio.get_running_loop().call_soon(self._resume, stream)

    def _resume(self, stream: Stream) -> None:
        stream.resuming = False
        if self.streams.get(stream.sid) is stream:
            self.relay_buffered(stream)


_VMODEL_LARGE: Final = (
    "a message over 16 KiB with an mm-vmodel-id header must name the same model in its "
    "model_name field"
)


def _text(refusal: bytes) -> str:
    """The error_message of an in-stream refusal the router built."""
    return wire.string_fields(refusal, (1,)).get(1, b"").decode("utf-8", "replace")


def _too_large(limit: int) -> str:
    return f"the message is over the proxy's limit of {limit} bytes; send less or raise --max-body"
