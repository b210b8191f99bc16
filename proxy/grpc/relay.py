"""One tenant connection to the gRPC relay (`--grpc-mode relay`): its frames, both ways.

The relay is the tenant's HTTP/2 peer: it answers SETTINGS and PING itself, grants and enforces
its own flow-control windows, decodes the tenant's header blocks (to route on `:path`) and encodes
Triton's response headers with an HPACK encoder of its own for this tenant. Streams it forwards go
to Triton on the proxy's shared connection (`grpc.channel`), after the per-stream gate (`grpc.gate`)
checked each message. A frame the tenant gets wrong (unreadable, out of order, over a window)
closes this connection only; Triton never sees it.

`H2Connection` reads the tenant's checked frames: HEADERS open streams (planned once per distinct
request headers, then answered here or sent to Triton), DATA goes to the stream's intake, and
SETTINGS, PING, WINDOW_UPDATE and RST_STREAM act on the connection. It is built on the tenant's
socket (`connection.Connection`: the preface and reading, streams' resets and ends, and the
`outbox`, `intake`, `gate` and `replies` it composes); the gate and the replies reach back only
through `replies.ReplyHooks`, which these classes implement.

Why not grpc.aio: its per-call cost (about 0.5-0.9 ms and most of a core here) made the proxy keep
a third of Triton's gRPC throughput; this relay scans frame headers and, for a client repeating
its headers, finds its header blocks already decoded and encoded (`http2.headers`).

What it must not do: decide isolation itself, hand Triton a message it has not checked, or let
one tenant's frames reach the connection Triton shares among all of them.
"""

from __future__ import annotations

import time
from typing import Final

from proxy.grpc import framing
from proxy.grpc.connection import MAX_STREAMS, Connection, Listener
from proxy.grpc.gate import FORWARDED, READY_PATH, UNIMPLEMENTED
from proxy.grpc.stream import Stream
from proxy.http2 import frames
from proxy.http2.flow import FlowControlError
from proxy.http2.headers import (
    ENTRY_BYTES,
    KEPT_ENTRY_BYTES,
    BlockDecoder,
    Fields,
    fields_size,
    keep,
    request_problem,
    trailers_problem,
)
from proxy.http2.reader import ConnectionBrokenError
from proxy.http2.streamstates import NEXT, RECEIVED_END, active, peer_ended
from proxy.policy import admission
from proxy.policy.finals import Finals
from proxy.policy.routing import GrpcAnswer, grpc_kind

SERVER_READY: Final = GrpcAnswer("ServerReady", "OK", response=framing.READY)
"""ServerReadyResponse(ready=true), answered without Triton while the own model sleeps."""

_clock: Final = time.perf_counter
"""When a call started, for its latency (as `gate._clock`); compiled (mypyc), a C static."""
_Plan = tuple[str, bool, Fields, bytes | None, str | None, bytes | None]
_VMODEL: Final = b"mm-vmodel-id"
"""ModelMesh's header naming the model of a call (`Stream.vmodel`)."""


class H2Connection(Connection):
    """One tenant connection (see the module docstring)."""

    def __init__(self, relay: Listener) -> None:
        super().__init__(relay)
        # The listener's router and its channel to Triton for a new stream, bound once:
        # compiled (mypyc), a call or an attribute read through a Protocol is a lookup by name
        # every time.
        self._router = relay.router
        self._channel = relay.channel
        self._mesh = relay.mesh
        self._decoder = BlockDecoder()
        self._plans: dict[Fields, _Plan] = {}  # see _plan
        self._plans_bytes = 0  # what they hold, counted as `headers.fields_size` counts
        # The last plan and its fields: a client repeating its headers gets the very tuple the
        # decoder kept, recognised by identity without hashing it (CPython does not cache a
        # tuple's hash; this one is seven pairs).
        self._last_fields: Fields | None = None
        self._last_plan: _Plan = ("", False, (), None, None, None)
        self._initial_window = frames.DEFAULT_WINDOW  # the tenant's SETTINGS_INITIAL_WINDOW_SIZE

    # -- the hooks of the gate and the replies (`replies.ReplyHooks`) -----------------------------

    def finish(self, stream: Stream, code: str) -> None:
        self.gate.finish(stream, code)
        self._send_back(stream)

    def refuse(
        self,
        stream: Stream,
        code: str,
        details: str,
        response: bytes | None,
        unanswered: bool = False,
    ) -> None:
        self.gate.refuse(stream, code, details, response, 0, unanswered)
        self._send_back(stream)

    def _send_back(self, stream: Stream) -> None:
        """After a call's end, answered or refused (Triton unreachable as the node pod stops):
        its model leaves the host, or the pod its Service, so the client opens a new connection
        (through its Service, which no longer routes here) for its next call."""
        served = stream.served
        if (served is not None and served.entry.leaving) or self.relay.closing:
            self.go_away()

    def answered(self, stream: Stream, requests: int) -> None:
        self.gate.answered(stream, requests)

    def settled(self, stream: Stream) -> None:
        self.gate.settled(stream)

    # -- checked frames from the reader (`proxy.http2.reader.FrameSink`) ---------------------------

    def on_data(self, body: bytes, flags: int, sid: int, size: int) -> None:
        increment = self._received.take(size)  # the stream windows bound what the relay holds
        if increment:
            self.out.write(frames.window_update(0, increment))
        stream = self.streams.get(sid)
        if stream is None:
            if sid > self.last_sid:
                raise ConnectionBrokenError(
                    frames.PROTOCOL_ERROR, f"DATA on stream {sid}, never opened"
                )
            if self._closed_strictly(sid):
                self.on_stream_error(sid, frames.STREAM_CLOSED, f"DATA on closed stream {sid}")
            return  # answered or reset by the relay: dropped (its bytes counted above)
        if peer_ended(stream.tenant):
            self.on_stream_error(
                sid, frames.STREAM_CLOSED, f"DATA on stream {sid} after END_STREAM"
            )
            return
        if not active(stream.triton) and stream.channel is not None:
            return  # answered by the relay, kept only for its response: dropped
        try:
            stream.received.arrived(size)
        except FlowControlError:
            raise ConnectionBrokenError(
                frames.FLOW_CONTROL_ERROR, f"DATA over stream {sid}'s window"
            ) from None
        if len(body) < size:
            self.replies.forwarded(stream, size - len(body))  # padding: Triton never gets it
        if flags & frames.END_STREAM:
            stream.tenant = NEXT[stream.tenant, RECEIVED_END]
            stream.ended = True
        if len(body) == size and self.intake.whole_message(body, stream):
            # The common case, one whole message in one frame: checked and, if it passes
            # unchanged, sent on as the very bytes the tenant sent.
            self.gate.check(stream, body[5:], size, body)
            return
        stream.buf += body
        self.intake.relay_buffered(stream)

    def on_frame(self, payload: bytes, kind: int, flags: int, sid: int) -> None:
        if kind == frames.WINDOW_UPDATE:
            self._window_update(sid, frames.u31(payload))
        elif kind == frames.RST_STREAM:
            if sid > self.last_sid:
                raise ConnectionBrokenError(
                    frames.PROTOCOL_ERROR, f"RST_STREAM on idle stream {sid}"
                )
            self._reset_by_tenant(sid)
            self.closed(sid, strict=True)  # RFC 9113 5.1: frames after its RST_STREAM are errors
        elif kind == frames.SETTINGS:
            if not flags & frames.ACK:
                self._settings(frames.settings_values(payload))
                self.out.write(frames.frame(frames.SETTINGS, frames.ACK, 0))
        elif kind == frames.PING and not flags & frames.ACK:
            self.out.write(frames.frame(frames.PING, frames.ACK, 0, payload))
        # a PING ACK, GOAWAY (the tenant closes when it is done): nothing to do

    def _settings(self, values: dict[int, int]) -> None:
        window = values.get(frames.SETTINGS_INITIAL_WINDOW_SIZE)
        if window is not None:
            delta = window - self._initial_window
            self._initial_window = window
            for stream in self.streams.values():
                stream.window.shift(delta)
            self.replies.drain_all()
        size = values.get(frames.SETTINGS_MAX_FRAME_SIZE)
        if size is not None:
            self.replies.max_frame = size
        table = values.get(frames.SETTINGS_HEADER_TABLE_SIZE)
        if table is not None:
            self.replies.encoder.limit_table(table)

    def _window_update(self, sid: int, increment: int) -> None:
        if sid == 0:
            self.replies.window.grow(
                increment
            )  # past 2^31-1: FlowControlError, the connection ends
            self.replies.drain_all()
            return
        stream = self.streams.get(sid)
        if stream is None:
            if sid > self.last_sid:
                raise ConnectionBrokenError(
                    frames.PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {sid}"
                )
            return  # closed here already: a WINDOW_UPDATE may still be on its way
        try:
            stream.window.grow(increment)
        except FlowControlError as e:
            self.on_stream_error(sid, frames.FLOW_CONTROL_ERROR, str(e))
            return
        if stream in self.replies.blocked:
            self.replies.drain(stream)

    def on_headers(self, sid: int, flags: int, block: bytes) -> None:
        fields = self._decoder.decode(block)  # every block: the decoder follows the tenant's table
        end_stream = bool(flags & frames.END_STREAM)
        stream = self.streams.get(sid)
        if stream is not None:  # trailers from the tenant end its side
            if peer_ended(stream.tenant):
                self.on_stream_error(
                    sid, frames.STREAM_CLOSED, f"HEADERS on stream {sid} after its end"
                )
            elif not end_stream:
                self.on_stream_error(sid, frames.PROTOCOL_ERROR, "trailers without END_STREAM")
            elif (problem := trailers_problem(fields)) is not None:
                self.on_stream_error(sid, frames.PROTOCOL_ERROR, problem)
            else:
                stream.tenant = NEXT[stream.tenant, RECEIVED_END]
                if active(stream.triton) or stream.channel is None:  # open, or detached
                    stream.ended = True
                    self.intake.relay_buffered(stream)
            return
        if sid <= self.last_sid:
            strict = self._closed_strictly(sid)
            if strict is None:  # RFC 9113 5.1.1: stream ids only grow
                raise ConnectionBrokenError(
                    frames.PROTOCOL_ERROR,
                    f"HEADERS opening stream {sid} after stream {self.last_sid}",
                )
            if strict:
                raise ConnectionBrokenError(frames.STREAM_CLOSED, f"HEADERS on closed stream {sid}")
            return  # the relay ended the stream first: trailers it no longer needs
        if sid % 2 == 0:
            raise ConnectionBrokenError(
                frames.PROTOCOL_ERROR, f"stream {sid} is not a client stream"
            )
        self.last_sid = sid
        if sid == self._refused_sid:
            self._refused_sid = 0
            return  # reset already (a stream error in its HEADERS frame)
        if fields is self._last_fields:  # the client's previous call's headers, as decoded
            plan = self._last_plan
        else:
            found = self._plans.get(fields)
            if found is None:
                plan = self._plan(fields)  # the last plan from now on if it is kept
            else:
                plan = found
                self._last_fields, self._last_plan = fields, plan
        kind, streaming, sent, encoding, problem, vmodel = plan
        if problem is not None:
            self.on_stream_error(sid, frames.PROTOCOL_ERROR, f"a malformed request: {problem}")
            return
        stream = Stream(self.replies, sid, kind, self._initial_window)
        stream.streaming = streaming
        if end_stream:
            stream.tenant = NEXT[stream.tenant, RECEIVED_END]
        stream.encoding = encoding
        stream.vmodel = vmodel
        started = _clock()
        if self._goaway or len(self.streams) >= MAX_STREAMS:
            self.out.write(frames.rst_stream(sid, frames.REFUSED_STREAM))
            return
        router = self._router
        answer: GrpcAnswer | None = None
        if not kind:
            answer = UNIMPLEMENTED
        elif kind == "ServerReady":
            # The pod's readiness, answered here where the proxy's own state decides it (its
            # empty message adds nothing); a quarantine's refusal goes with the message (`gate`).
            limiter = self.relay.limiter
            verdict = admission.admit(
                True,  # readiness
                False,  # model_ready
                False,  # limited
                False,  # parked
                limiter,
                self.relay.state,
            )
            if verdict == admission.ASLEEP:
                answer = SERVER_READY  # the on-demand model is unloaded; its next call wakes it
            elif verdict == admission.DRAINING or verdict == admission.STOPPING:
                answer = GrpcAnswer(kind, "OK")  # ready: false
        elif kind not in FORWARDED:
            decision = router.decide(kind, b"")
            answer = decision if isinstance(decision, GrpcAnswer) else UNIMPLEMENTED
        if answer is not None:
            self.gate.answer(stream, answer, started)
            return
        stream.route = kind  # END_STREAM, if there, goes to Triton on the HEADERS frame
        if streaming:
            stream.finals = Finals()  # each request message in flight holds a slot (`gate`)
        self.streams[sid] = stream
        stream.started = started
        if self._mesh and not end_stream:
            # Opened once its message names its model (`gate.reopen`): here, or at the
            # model's Service.
            stream.fields = sent
        else:
            self._channel().open(stream, sent, end_stream)

    def _plan(self, fields: Fields) -> _Plan:
        """The RPC a tenant's request fields call, whether it streams, the fields Triton gets for
        them, their grpc-encoding (for compressed messages) and what makes them malformed (or
        None); made once per distinct fields, since a client repeats its headers call after
        call (the caller looks in `_plans` first: a hit costs no call)."""
        plan = self._plans.get(fields)
        if plan is None:
            path = next((value for name, value in fields if name == b":path"), b"")
            encoding = next((value for name, value in fields if name == b"grpc-encoding"), None)
            kind = grpc_kind(path.decode("latin-1"))
            sent = fields
            if kind == "ServerReady" and self._router.model_id:
                # The pod's readiness is its model's: ask ModelReady (a host asks Triton's own).
                sent = tuple((n, READY_PATH if n == b":path" else v) for n, v in fields)
            router = self._router
            streaming = router.is_stream(kind)
            if router.renames or router.per_model or streaming:
                # Triton's answers name the model's private name and are renamed on their way
                # back, and a stream's answers are read for the end of each request
                # (`policy.finals`), which compressed answers would hide: Triton may compress
                # only for a client that accepts it, and this one does not.
                sent = tuple((n, v) for n, v in sent if n != b"grpc-accept-encoding")
            vmodel = next((value for name, value in fields if name == _VMODEL), None)
            if vmodel is not None:
                sent = tuple((n, v) for n, v in sent if n != _VMODEL)
            plan = (kind, streaming, sent, encoding, request_problem(fields), vmodel)
            # Counted by the fields it holds (the key, and `sent` when it is a copy), as the
            # decoder counts its blocks: a block of a thousand one-byte fields is not kept.
            size = ENTRY_BYTES + fields_size(fields)
            if sent is not fields:
                size += fields_size(sent)
            self._plans_bytes = keep(self._plans, fields, plan, size, self._plans_bytes)
            if size <= KEPT_ENTRY_BYTES:
                # Only a plan kept is remembered as the last: a list of a thousand fields kept
                # here would hold what `keep` refused, uncounted.
                self._last_fields, self._last_plan = fields, plan
        return plan

    def held_bytes(self) -> int:
        """`Connection.held_bytes`, and the header blocks and plans this connection keeps."""
        return super().held_bytes() + self._decoder.kept_bytes + self._plans_bytes
