"""One relayed gRPC call: the tenant's stream and Triton's, as the relay's modules share them.

A `Stream` is created when a tenant's request headers arrive (`relay`) and holds everything about
the call: the two stream states (`proxy.http2.streamstates`), both sides' windows
(`proxy.http2.flow`), the bytes held for either side, the limiter slot and the routing decision. The
modules that act on it reach each other through the two base classes here, never by importing each
other: `Channel` is what the relay, the gate and the replies need from the connection to Triton
(`channel.TritonChannel` implements it), and `TenantSide` what the channel needs from the tenant's
side (`replies.Replies`). Base classes rather than Protocols, each with its one implementation:
compiled (mypyc), a call through a Protocol looks the method up by name (a few hundred
instructions, about eight times per call), through a compiled base class it is a C call.

What it must not do: act. It is a record, and the two sides' contracts.
"""

from __future__ import annotations

import asyncio
from typing import Final

from proxy.http2.flow import ReceiveWindow, Window
from proxy.http2.headers import Fields
from proxy.http2.reader import FrameSink
from proxy.http2.streamstates import IDLE, OPEN, peer_ended
from proxy.policy.finals import Finals
from proxy.policy.inflation import Inflation
from proxy.policy.naming import AnswerNames
from proxy.policy.wire import MessageScan
from proxy.table import Served

RECEIVE_WINDOW: Final = 256 * 1024
"""The per-stream window the relay grants tenants (SETTINGS_INITIAL_WINDOW_SIZE): the most it holds
of one tenant stream while Triton's window is short. It must exceed the bytes held back to check
a message (PREFIX_HOLD) plus what is credited in one go (a quarter of it), or a stream stalls."""
CREDIT_STEP: Final = RECEIVE_WINDOW // 4
"""Credit is given back in steps this large (both ways), not a WINDOW_UPDATE per message."""

# Stream.limited values.
NO_SLOT: Final = 0
HOLDS_SLOT: Final = 1
WAITING: Final = 2


class Stream:
    """One tenant stream that reached the gate, and its stream at Triton once opened there."""

    __slots__ = (
        "answers",
        "buf",
        "channel",
        "encoding",
        "ended",
        "fields",
        "finals",
        "given",
        "held",
        "held_end",
        "held_up",
        "inflation",
        "kept",
        "kind",
        "left",
        "limited",
        "passed",
        "received",
        "replies",
        "resends",
        "responded",
        "resuming",
        "route",
        "scan",
        "served",
        "sid",
        "skip",
        "slots",
        "started",
        "streaming",
        "tenant",
        "trailers",
        "triton",
        "up",
        "up_end",
        "up_held",
        "up_sent",
        "up_window",
        "vmodel",
        "waiter",
        "window",
    )

    def __init__(self, replies: TenantSide, sid: int, kind: str, window: int) -> None:
        self.replies = replies
        self.sid = sid
        self.kind = kind
        self.streaming = False  # ModelStreamInfer: every message is checked, not just one
        self.route = kind
        self.encoding: bytes | None = None  # the grpc-encoding request header
        self.vmodel: bytes | None = None
        """ModelMesh's `mm-vmodel-id` request header: the model each message names, whatever
        its model-name field says (`gate.check` writes it there)."""
        self.buf = bytearray()
        # A message read in pieces (`intake`): its reader, its inflation when compressed, the bytes
        # of it still to come, and whether it waits for the next event-loop turn.
        self.scan: MessageScan | None = None
        self.inflation: Inflation | None = None
        self.left = 0
        self.resuming = False
        self.skip = 0  # bytes still to come of a large message refused from its prefix
        # The two streams' states (`http2.state`): the tenant's, opened by the HEADERS that made
        # this object, and Triton's, opened when the channel sends the request headers.
        self.tenant = OPEN
        self.triton = IDLE
        self.ended = False  # the tenant's END_STREAM is still to be sent on to Triton
        self.passed = False  # a unary call's one message passed the check
        self.served: Served | None = None
        """The model of the table the call names, once read (its limiter and metrics); None:
        the listener's own (a server-wide call, or one not read yet)."""
        self.limited = NO_SLOT
        """A unary call's slot; on a stream, one it took opening or its waiter got, not yet in
        `slots` (`gate.StreamGate.take`)."""
        self.waiter: asyncio.Future[None] | None = None
        # ModelStreamInfer: the slots the stream holds, one per request message in flight at
        # Triton (`policy.finals`); the last goes back once its answers reached the tenant, so
        # an idle stream holds none (`gate.StreamGate.settled`).
        self.slots = 0
        self.finals: Finals | None = None
        self.responded = False  # the tenant has the response head
        self.started = 0.0  # perf_counter() when relayed to Triton; 0 once finished
        # Tenant side (`grpc.relay`): what it may still send us, bytes to credit back to it, and
        # what waits for its window (DATA, how much of it is Triton's, then the trailers).
        self.received = ReceiveWindow(RECEIVE_WINDOW, CREDIT_STEP)
        self.window = Window(window)
        self.held = bytearray()
        self.held_end = False
        self.held_up = 0
        self.trailers: bytes | Fields | None = None
        # Triton side (`grpc.channel`): its stream id, what Triton lets us send, what waits for it,
        # and response bytes the tenant took that Triton has not been credited for yet.
        self.channel: Channel | None = None
        self.fields: Fields = ()
        """The request headers it was opened with at Triton, to open it again (`detach`)."""
        self.up = 0
        self.up_window = Window(0)
        self.up_held = bytearray()
        self.up_end = False
        self.up_sent = False  # request bytes went to a channel (`unsent`)
        self.given = 0
        self.resends = 0  # times sent again (`channel._send_again`)
        self.kept: bytearray | None = None
        """What went to Triton of a call that may be sent again (`channel._resendable`), kept
        until Triton's answer begins; None: nothing kept (a stream, another model's call, one
        past RESEND_BYTES, or one sent again RESENDS times)."""
        # Triton's answers renamed to the public model id (`channel.RenamingChannel`), if so.
        self.answers: AnswerNames | None = None

    @property
    def unsent(self) -> bool:
        """Only its headers reached Triton, and a message is still to come or waits for a
        slot or for its model's wake (`gate.admit`): nothing of it is lost with the
        connection, and nothing is answered yet."""
        if self.up_sent or self.responded:
            return False
        return self.limited == WAITING or bool(self.buf) or not peer_ended(self.tenant)

    def detach(self) -> None:
        """Its connection to Triton failed while it was `unsent`: it is opened again, on the
        listener's channel then, once its message may go (`gate`). A model parked at zero
        replicas has its calls wait so: the node gateway closes its host's connections until
        a replica of it is proven there."""
        self.channel = None
        self.triton = IDLE
        self.up = 0
        self.up_window.size = 0


class Channel(FrameSink):
    """The connection to Triton a stream is opened on (`channel.TritonChannel`); it reads
    Triton's frames, so it is its frame reader's sink too (mypyc has one base class per class)."""

    max_frame: int
    """Triton's SETTINGS_MAX_FRAME_SIZE: no DATA frame sent is larger."""

    def open(self, stream: Stream, fields: Fields, end_stream: bool) -> None:
        """Open `stream` at Triton with request header `fields`."""
        raise NotImplementedError

    def send(self, stream: Stream, payload: bytes, end_stream: bool) -> None:
        """Send request bytes now, or as soon as Triton's windows allow."""
        raise NotImplementedError

    def reset(self, stream: Stream) -> None:
        """Cancel the stream at Triton."""
        raise NotImplementedError

    def credit(self, stream: Stream, size: int) -> None:
        """The tenant took `size` response bytes: Triton may send that much more."""
        raise NotImplementedError


class TenantSide:
    """Where the channel delivers Triton's side of a stream (`replies.Replies`)."""

    __slots__ = ()

    def to_tenant(self, stream: Stream, payload: bytes, end_stream: bool, triton: int = 0) -> None:
        """DATA for the tenant; `triton` of its bytes came from Triton (credited as they leave)."""
        raise NotImplementedError

    def forwarded(self, stream: Stream, size: int) -> None:
        """`size` request bytes left the relay: the tenant may send that much more."""
        raise NotImplementedError

    def answered(self, stream: Stream, requests: int) -> None:
        """Triton's answers ended `requests` of the stream's request messages."""
        raise NotImplementedError

    def settle(self, stream: Stream) -> None:
        """Triton's DATA on `stream` passed on nothing (an answer dropped or held back): if
        none of its requests is at Triton and nothing waits for its tenant, its slot goes."""
        raise NotImplementedError

    def triton_headers(self, stream: Stream, fields: Fields, end_stream: bool) -> None:
        """Triton's response headers, or its trailers with `end_stream`."""
        raise NotImplementedError

    def triton_data(self, stream: Stream, body: bytes, end_stream: bool) -> None:
        """Triton's DATA that ends the stream, or that came padded."""
        raise NotImplementedError

    def triton_reset(self, stream: Stream, code: int) -> None:
        """Triton reset the stream (or broke a rule on it)."""
        raise NotImplementedError

    def triton_refused(self, stream: Stream) -> None:
        """Triton's GOAWAY left the stream unprocessed: the tenant may retry it."""
        raise NotImplementedError

    def triton_unavailable(self, stream: Stream) -> None:
        """The connection to Triton failed under the stream."""
        raise NotImplementedError
