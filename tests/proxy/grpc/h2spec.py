"""The harness of the h2spec conformance tests (`test_conformance*`): a tenant connection to a real
relay whose every answer the `h2` library's client reads, and the check of what Triton heard.

h2spec (summerwind/h2spec, a Go tool not available here) drives a server through short exchanges;
the tests re-express them in process on `rig.Rig`. `Conversation` feeds the relay the tenant's
bytes and hands the relay's frames to an `h2` client, which raises on anything that is not valid
HTTP/2 and turns the answers into events (GOAWAY and RST_STREAM codes, responses, PING ACKs).
Bytes a case crafts by hand are sent raw; `Conversation.claim` tells the client it sent them, so
it reads the relay's answers on that stream too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import hpack
from hpack import HeaderTuple
from hpack.hpack import encode_integer
from hpack.huffman import HuffmanEncoder
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH

from proxy.grpc import framing
from proxy.grpc.relay import H2Connection
from proxy.http2 import frames as f
from tests.proxy.grpc.rig import HEADERS, Frame, Recording, Rig, infer

BLOCK = f.header_block(HEADERS)
MESSAGE = framing.grpc_message(infer())
PING = f.frame(f.PING, 0, 0, b"h2spec!!")


HUFFMAN = HuffmanEncoder(REQUEST_CODES, REQUEST_CODES_LENGTH)


def integer(value: int, prefix_bits: int, pattern: int) -> bytes:
    """An HPACK integer (RFC 7541 5.1) with `pattern` in the first octet's high bits."""
    encoded = encode_integer(value, prefix_bits)
    encoded[0] |= pattern
    return bytes(encoded)


def string(data: bytes, huffman: bool = False) -> bytes:
    """An HPACK string literal (RFC 7541 5.2), Huffman-coded or as is."""
    if huffman:
        data = HUFFMAN.encode(data)
        return integer(len(data), 7, 0x80) + data
    return integer(len(data), 7, 0) + data


def settings_payload(values: dict[int, int]) -> bytes:
    return b"".join(k.to_bytes(2, "big") + v.to_bytes(4, "big") for k, v in values.items())


@dataclass
class Conversation:
    """A tenant connection brought to a stream state, with an `h2` client reading every answer."""

    rig: Rig
    tenant: H2Connection
    out: Recording
    client: h2.connection.H2Connection
    events: list[h2.events.Event]

    def send(self, data: bytes) -> list[Frame]:
        """Feed the relay `data`; the frames it answered (also read by the h2 client)."""
        self.tenant.data_received(data)
        self.rig.relay.flush()
        frames = self.out.take()
        # The h2 client reads the answers about the connection and the streams it opened itself
        # (it refuses, rightly for a client, a RST_STREAM on streams only raw bytes opened).
        known = b"".join(
            f.frame(kind, flags, sid, payload)
            for kind, flags, sid, payload in frames
            if sid == 0 or sid in self.client.streams
        )
        self.events += self.client.receive_data(known)  # raises if it is not valid HTTP/2
        self.client.data_to_send()  # the client's own acknowledgements: not needed here
        return frames

    def claim(self, sid: int, end_stream: bool) -> None:
        """Make the h2 client believe it opened stream `sid` (the bytes that did are crafted by
        hand), so it reads the relay's answers on it."""
        self.client.send_headers(sid, HEADERS, end_stream=end_stream)
        self.client.data_to_send()

    def triton_answers(self, sid: int = 1, body: bytes = b"ok") -> None:
        """Triton answers the call the relay opened at it as its stream `sid`: a response head,
        a message and trailers, which the relay passes on to the tenant."""
        channel, _ = self.rig.channel()
        self.rig.respond(channel, sid, framing.grpc_message(body), trailers=True)
        self.send(b"")

    def responses(self, sid: int) -> list[h2.events.Event]:
        """The response heads the h2 client read on stream `sid`."""
        received = h2.events.ResponseReceived
        return [e for e in self.events if isinstance(e, received) and e.stream_id == sid]


def conversation(state: str) -> Conversation:
    """A tenant after the preface, with stream 1 in `state`: "idle" (never opened), "open"
    (request headers sent), "half-closed" (the request ended, Triton not answered yet), "reset"
    (the tenant reset it) or "closed" (both sides ended it)."""
    rig = Rig()
    tenant, out = rig.tenant()
    config = h2.config.H2Configuration(client_side=True, header_encoding=None)
    client = h2.connection.H2Connection(config)
    client.initiate_connection()
    client.data_to_send()  # the relay has had a client preface already (rig.tenant)
    # The client must follow the relay's SETTINGS and streams as if it had sent them itself.
    client.receive_data(f.settings({}) + f.frame(f.SETTINGS, f.ACK, 0))
    client.data_to_send()
    talk = Conversation(rig, tenant, out, client, [])
    if state == "idle":
        return talk
    client.send_headers(1, HEADERS, end_stream=False)
    opened = client.data_to_send()
    talk.send(opened)
    if state in ("half-closed", "closed"):
        client.send_data(1, MESSAGE, end_stream=True)
        talk.send(client.data_to_send())
    if state == "reset":
        client.reset_stream(1, f.CANCEL)
        talk.send(client.data_to_send())
    if state == "closed":
        talk.triton_answers()
        assert 1 not in tenant.streams
    return talk


def goaway(frames: list[Frame]) -> int | None:
    codes = [int.from_bytes(p[4:8], "big") for kind, _, _, p in frames if kind == f.GOAWAY]
    return codes[-1] if codes else None


def resets(frames: list[Frame]) -> dict[int, int]:
    return {sid: int.from_bytes(p, "big") for kind, _, sid, p in frames if kind == f.RST_STREAM}


Answer = tuple[str, int]
GOAWAY_ = "goaway"
RST = "rst"
ALIVE = ("alive", 0)


def answer_of(talk: Conversation, frames: list[Frame]) -> Answer:
    """GOAWAY (with the connection closed), a RST_STREAM, or alive: a PING still answered."""
    code = goaway(frames)
    if code is not None:
        assert talk.out.closed, "GOAWAY for an error must end the connection"
        terminated = [e for e in talk.events if isinstance(e, h2.events.ConnectionTerminated)]
        assert terminated and terminated[-1].error_code == code
        return GOAWAY_, code
    reset = resets(frames)
    if reset:
        [code] = set(reset.values())  # one stream, or (5.1.2/1) every stream over the limit
        return RST, code
    assert not talk.out.closed
    answered = talk.send(PING)
    assert (f.PING, f.ACK, 0, b"h2spec!!") in answered, "the relay stopped answering PING"
    return ALIVE


# -- what Triton hears ----------------------------------------------------------------------------

CHANNEL_SENDS = {f.HEADERS, f.DATA, f.RST_STREAM, f.WINDOW_UPDATE, f.SETTINGS, f.GOAWAY}
GRPC_PATH = b"/inference.GRPCInferenceService/"


@dataclass
class TritonRequest:
    """One stream the channel opened at Triton, as Triton read it."""

    fields: list[HeaderTuple]  # as `hpack` decoded them: a never-indexed field stays marked
    body: bytearray = field(default_factory=bytearray)
    ended: bool = False
    reset: bool = False


def assert_triton_saw_only_the_relay(rig: Rig) -> dict[int, TritonRequest]:
    """Everything on the connection to Triton is the channel's own: its preface and SETTINGS,
    header blocks a fresh HPACK decoder reads as valid gRPC requests, DATA and RST_STREAM only on
    streams it opened, no tenant PING, PRIORITY, CONTINUATION or unknown frame, nothing over
    16 KiB. Returns the requests Triton read, by its stream id."""
    if not rig.relay.channels:
        return {}
    _, up = rig.channel()
    data = bytes(up.data)
    assert data.startswith(f.PREFACE)
    pos = len(f.PREFACE)
    decoder = hpack.Decoder()
    opened: dict[int, TritonRequest] = {}
    settings_seen = 0
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 3], "big")
        kind, flags = data[pos + 3], data[pos + 4]
        sid = int.from_bytes(data[pos + 5 : pos + 9], "big")
        payload = data[pos + 9 : pos + 9 + length]
        pos += 9 + length
        assert kind in CHANNEL_SENDS, f"Triton was sent a frame of type {kind}"
        assert length <= f.DEFAULT_MAX_FRAME
        if kind == f.SETTINGS:
            settings_seen += 1
            assert settings_seen == 1 and not flags & f.ACK, "a SETTINGS not the channel's own"
        elif kind == f.HEADERS:
            assert flags & f.END_HEADERS and sid % 2 == 1 and sid not in opened
            fields = list(decoder.decode(payload, raw=True))
            assert dict(fields)[b":path"].startswith(GRPC_PATH)
            opened[sid] = TritonRequest(fields, ended=bool(flags & f.END_STREAM))
        elif kind in (f.DATA, f.RST_STREAM):
            request = opened.get(sid)
            assert request is not None, f"{kind} on stream {sid}, never opened at Triton"
            if kind == f.DATA:
                request.body += payload
                request.ended = request.ended or bool(flags & f.END_STREAM)
            else:
                request.reset = True
    assert pos == len(data)
    return opened
