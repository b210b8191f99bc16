"""The gRPC relay against h2spec's `generic` group, re-expressed as tests (RFC 9113, RFC 7541).

The `generic` group sends what a server must accept: the connection preface, every frame type
used validly, a few request shapes, every HPACK representation. Each case is h2spec's, by its id,
run on the harness of `h2spec.py`; "accepted" here means more than h2spec asks (a HEADERS frame
back): the call reaches Triton as a gRPC request with the fields and message the tenant meant,
Triton's answer reaches the tenant (read by the `h2` client), and the connection still answers
PING. Where h2spec's exchange is not a gRPC call, it is re-expressed as the nearest one:

| h2spec sends                              | re-expressed as, and why                            |
|-------------------------------------------|-----------------------------------------------------|
| `GET /` with END_STREAM (its usual        | a ModelInfer call, END_STREAM on its HEADERS (no    |
| request: 2/2-2/5, 3.2, 3.3, 3.9/2, 3.10)  | message): the frames under test are the same, and   |
|                                           | only a gRPC path reaches Triton                     |
| DATA "test" (3.1, 4/3, 4/4)               | DATA carrying a gRPC message: "test" is not one     |
|                                           | (the relay would answer it INVALID_ARGUMENT itself) |
| 4/1 `GET /`, 4/2 `HEAD /`                 | sent as h2spec sends them; not gRPC calls, so by    |
|                                           | policy the relay answers UNIMPLEMENTED itself       |
|                                           | (docs/proxy.md G10), a Trailers-Only HEADERS frame: |
|                                           | h2spec's check passes; Triton hears nothing         |
| 4/3 `POST /` with a body                  | a ModelInfer call (POST / is UNIMPLEMENTED as 4/1)  |

No case is left out. For the never-indexed representations (5/10 to 5/13) the relay, an
intermediary, must also pass the field on never-indexed (RFC 7541 6.2.3): checked on what Triton
decodes, and (the last test, not h2spec's) on what the tenant decodes of Triton's response head.
Those failed before the fix in `http2.headers.BlockDecoder` (it rebuilt hpack's field tuples
as plain ones, dropping the mark, so the channel's encoder indexed the field at Triton); every
other case passed as the relay was.
"""

from __future__ import annotations

from collections.abc import Callable

import h2.events
import pytest
from hpack import NeverIndexedHeaderTuple

from proxy.grpc.relay import H2Connection
from proxy.http2 import frames as f
from tests.proxy.grpc.h2spec import (
    ALIVE,
    BLOCK,
    MESSAGE,
    Conversation,
    TritonRequest,
    answer_of,
    assert_triton_saw_only_the_relay,
    conversation,
    integer,
    string,
)
from tests.proxy.grpc.rig import HEADERS, Recording, Rig

INFER_PATH = dict(HEADERS)[b":path"]
ROOT = [(b":scheme", b"http"), (b":path", b"/"), (b":authority", b"proxy")]
"""h2spec's usual request fields (its CommonHeaders) after :method."""
PRIORITY_FIELDS = b"\x00\x00\x00\x00\xff"  # no dependency, weight 256


def priority(sid: int, depends_on: int = 0, weight: int = 255, exclusive: bool = False) -> bytes:
    dependency = depends_on | (1 << 31 if exclusive else 0)
    return f.frame(f.PRIORITY, 0, sid, dependency.to_bytes(4, "big") + bytes((weight,)))


def request(talk: Conversation, sid: int = 1, block: bytes = BLOCK, end: bool = True) -> bytes:
    """A request's HEADERS frame, crafted by hand (the h2 client is told it sent it)."""
    talk.claim(sid, end_stream=end)
    flags = f.END_HEADERS | (f.END_STREAM if end else 0)
    return f.frame(f.HEADERS, flags, sid, block)


def answered(talk: Conversation, sid: int = 1) -> TritonRequest:
    """Tenant stream `sid` reached Triton as a ModelInfer call (the last one opened there),
    Triton answers it, the tenant reads the response head, and the connection goes on; what
    Triton got, for the case to check."""
    seen = assert_triton_saw_only_the_relay(talk.rig)
    assert seen, "the call never reached Triton"
    up = max(seen)
    assert dict(seen[up].fields)[b":path"] == INFER_PATH
    talk.triton_answers(up)
    assert talk.responses(sid), f"no response head on stream {sid}"
    assert answer_of(talk, []) == ALIVE
    return seen[up]


def fields_of(sent: TritonRequest) -> list[tuple[bytes, bytes]]:
    return [(name, value) for name, value in sent.fields]


Case = Callable[[Conversation], None]
CASES: dict[str, Case] = {}


def case(name: str) -> Callable[[Case], Case]:
    def register(run: Case) -> Case:
        CASES[name] = run
        return run

    return register


# -- 1 starting HTTP/2, 2 streams and multiplexing ------------------------------------------------


async def test_1_1_the_servers_preface_is_a_settings_frame() -> None:
    rig = Rig()
    tenant = H2Connection(rig.relay)
    out = Recording()
    tenant.connection_made(out)  # type: ignore[arg-type]
    tenant.data_received(f.PREFACE + f.settings({f.SETTINGS_INITIAL_WINDOW_SIZE: 65535}))
    rig.relay.flush()
    frames = out.take()
    assert frames[0][:3] == (f.SETTINGS, 0, 0), "the first frame must be a SETTINGS, not an ACK"
    assert (f.SETTINGS, f.ACK, 0, b"") in frames


@case("2/1 PRIORITY on an idle stream")
def _(talk: Conversation) -> None:
    assert answer_of(talk, talk.send(priority(1))) == ALIVE


def _window_zero_then_one(talk: Conversation, before: bytes) -> None:
    """The tenant's stream window 0: Triton's answer waits in the relay until the tenant
    grants one byte on the half-closed stream, then exactly that byte comes."""
    talk.client.update_settings({f.SETTINGS_INITIAL_WINDOW_SIZE: 0})
    talk.send(talk.client.data_to_send() + request(talk) + before)
    seen = assert_triton_saw_only_the_relay(talk.rig)
    talk.triton_answers(max(seen))
    assert talk.responses(1) and not _data(talk)
    talk.client.increment_flow_control_window(1, stream_id=1)
    talk.send(talk.client.data_to_send())
    assert _data(talk) == 1


def _data(talk: Conversation) -> int:
    received = h2.events.DataReceived
    return sum(len(e.data) for e in talk.events if isinstance(e, received) and e.stream_id == 1)


@case("2/2 WINDOW_UPDATE on a half-closed (remote) stream")
def _(talk: Conversation) -> None:
    _window_zero_then_one(talk, b"")


@case("2/3 PRIORITY on a half-closed (remote) stream")
def _(talk: Conversation) -> None:
    _window_zero_then_one(talk, priority(1))


@case("2/4 RST_STREAM on a half-closed (remote) stream")
def _(talk: Conversation) -> None:
    talk.send(request(talk))
    talk.client.reset_stream(1, f.CANCEL)
    assert answer_of(talk, talk.send(talk.client.data_to_send())) == ALIVE
    [up] = assert_triton_saw_only_the_relay(talk.rig).values()
    assert up.reset, "Triton must be told the call was cancelled"


@case("2/5 PRIORITY on a closed stream")
def _(talk: Conversation) -> None:
    talk.send(request(talk))
    answered(talk)
    assert 1 not in talk.tenant.streams
    assert answer_of(talk, talk.send(priority(1))) == ALIVE


# -- 3 frame definitions --------------------------------------------------------------------------


@case("3.1/1 a DATA frame")
def _(talk: Conversation) -> None:
    talk.send(request(talk, end=False) + f.frame(f.DATA, f.END_STREAM, 1, MESSAGE))
    sent = answered(talk)
    assert sent.body == MESSAGE and sent.ended


@case("3.1/2 several DATA frames")
def _(talk: Conversation) -> None:
    first = f.frame(f.DATA, 0, 1, MESSAGE[:7])
    talk.send(request(talk, end=False) + first + f.frame(f.DATA, f.END_STREAM, 1, MESSAGE[7:]))
    sent = answered(talk)
    assert sent.body == MESSAGE and sent.ended


@case("3.1/3 a DATA frame with padding")
def _(talk: Conversation) -> None:
    padded = f.frame(f.DATA, f.END_STREAM | f.PADDED, 1, b"\x05" + MESSAGE + b"\x00" * 5)
    talk.send(request(talk, end=False) + padded)
    sent = answered(talk)
    assert sent.body == MESSAGE and sent.ended, "padding is not the tenant's message"


@case("3.2/1 a HEADERS frame")
def _(talk: Conversation) -> None:
    talk.send(request(talk))
    assert answered(talk).ended


@case("3.2/2 a HEADERS frame with padding")
def _(talk: Conversation) -> None:
    talk.claim(1, end_stream=True)
    flags = f.END_HEADERS | f.END_STREAM | f.PADDED
    talk.send(f.frame(f.HEADERS, flags, 1, b"\x08" + BLOCK + b"\x00" * 8))
    assert answered(talk).ended


@case("3.2/3 a HEADERS frame with priority")
def _(talk: Conversation) -> None:
    talk.claim(1, end_stream=True)
    flags = f.END_HEADERS | f.END_STREAM | f.PRIORITY_FLAG
    talk.send(f.frame(f.HEADERS, flags, 1, PRIORITY_FIELDS + BLOCK))
    assert answered(talk).ended


@case("3.3/1 PRIORITY with weight 1")
def _(talk: Conversation) -> None:
    talk.send(priority(1, weight=0) + request(talk))
    answered(talk)


@case("3.3/2 PRIORITY with weight 256")
def _(talk: Conversation) -> None:
    talk.send(priority(1, weight=255) + request(talk))
    answered(talk)


@case("3.3/3 PRIORITY with a stream dependency")
def _(talk: Conversation) -> None:
    talk.send(priority(3, depends_on=1, weight=0) + request(talk))
    answered(talk)


@case("3.3/4 PRIORITY with the exclusive flag")
def _(talk: Conversation) -> None:
    talk.send(priority(1, weight=0, exclusive=True) + request(talk))
    answered(talk)


@case("3.3/5 PRIORITY on an idle stream, then HEADERS on a lower one")
def _(talk: Conversation) -> None:
    talk.send(priority(3) + request(talk))
    answered(talk)
    talk.send(request(talk, sid=3))  # stream 3 is still idle: it may open
    answered(talk, 3)


@case("3.4/1 a RST_STREAM frame")
def _(talk: Conversation) -> None:
    talk.send(request(talk, end=False))
    talk.client.reset_stream(1, f.CANCEL)
    assert answer_of(talk, talk.send(talk.client.data_to_send())) == ALIVE
    [up] = assert_triton_saw_only_the_relay(talk.rig).values()
    assert up.reset and not up.ended


@case("3.5/1 a SETTINGS frame with every defined setting")
def _(talk: Conversation) -> None:
    talk.client.update_settings(
        {
            f.SETTINGS_HEADER_TABLE_SIZE: 4096,
            f.SETTINGS_ENABLE_PUSH: 1,
            f.SETTINGS_MAX_CONCURRENT_STREAMS: 100,
            f.SETTINGS_INITIAL_WINDOW_SIZE: 65535,
            f.SETTINGS_MAX_FRAME_SIZE: 16384,
            6: 100,  # SETTINGS_MAX_HEADER_LIST_SIZE: advice the relay may ignore
        }
    )
    frames = talk.send(talk.client.data_to_send())
    assert (f.SETTINGS, f.ACK, 0, b"") in frames
    assert any(isinstance(e, h2.events.SettingsAcknowledged) for e in talk.events)
    talk.send(request(talk))
    answered(talk)


@case("3.7/1 a PING frame")
def _(talk: Conversation) -> None:
    talk.client.ping(b"h2spec\x00\x00")
    frames = talk.send(talk.client.data_to_send())
    assert frames == [(f.PING, f.ACK, 0, b"h2spec\x00\x00")]


@case("3.8/1 a GOAWAY frame")
def _(talk: Conversation) -> None:
    goaway = f.frame(f.GOAWAY, 0, 0, b"\x00" * 8 + b"h2spec")  # last stream 0, NO_ERROR
    assert answer_of(talk, talk.send(goaway)) == ALIVE  # h2spec: PING answered, or closed


@case("3.9/1 a WINDOW_UPDATE on the connection")
def _(talk: Conversation) -> None:
    assert answer_of(talk, talk.send(f.window_update(0, 1))) == ALIVE


@case("3.9/2 a WINDOW_UPDATE on stream 1")
def _(talk: Conversation) -> None:
    talk.send(request(talk) + f.window_update(1, 1))
    answered(talk)


@case("3.10/1 a CONTINUATION frame")
def _(talk: Conversation) -> None:
    talk.claim(1, end_stream=True)
    head = f.frame(f.HEADERS, f.END_STREAM, 1, BLOCK[:5])
    talk.send(head + f.frame(f.CONTINUATION, f.END_HEADERS, 1, BLOCK[5:]))
    assert answered(talk).ended


@case("3.10/2 several CONTINUATION frames")
def _(talk: Conversation) -> None:
    talk.claim(1, end_stream=True)
    head = f.frame(f.HEADERS, f.END_STREAM, 1, BLOCK[:5])
    middle = f.frame(f.CONTINUATION, 0, 1, BLOCK[5:10])
    talk.send(head + middle + f.frame(f.CONTINUATION, f.END_HEADERS, 1, BLOCK[10:]))
    assert answered(talk).ended


# -- 4 HTTP message exchanges ---------------------------------------------------------------------


def _not_a_grpc_call(talk: Conversation, method: bytes) -> None:
    """Not a gRPC call: the relay answers UNIMPLEMENTED itself (Trailers-Only), Triton hears
    nothing, and the connection goes on."""
    fields = [(b":method", method), *ROOT]
    talk.send(request(talk, block=f.header_block(fields)))
    [head] = talk.responses(1)
    assert isinstance(head, h2.events.ResponseReceived)
    assert (b"grpc-status", b"12") in head.headers
    assert any(isinstance(e, h2.events.StreamEnded) for e in talk.events)
    assert assert_triton_saw_only_the_relay(talk.rig) == {}
    assert answer_of(talk, []) == ALIVE


@case("4/1 a GET request")
def _(talk: Conversation) -> None:
    _not_a_grpc_call(talk, b"GET")


@case("4/2 a HEAD request")
def _(talk: Conversation) -> None:
    _not_a_grpc_call(talk, b"HEAD")


@case("4/3 a POST request")
def _(talk: Conversation) -> None:
    talk.send(request(talk, end=False) + f.frame(f.DATA, f.END_STREAM, 1, MESSAGE))
    sent = answered(talk)
    assert sent.body == MESSAGE and sent.ended


@case("4/4 a POST request with trailers")
def _(talk: Conversation) -> None:
    head = f.header_block([*HEADERS, (b"trailer", b"x-test")])
    data = request(talk, block=head, end=False) + f.frame(f.DATA, 0, 1, MESSAGE)
    trailers = f.header_block([(b"x-test", b"ok")])
    talk.send(data + f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, trailers))
    sent = answered(talk)
    assert sent.body == MESSAGE and sent.ended, "the trailers end the request at Triton"


# -- 5 HPACK --------------------------------------------------------------------------------------

USER_AGENT = 58  # the static table's `user-agent`
NEWEST = 62  # the newest entry of the dynamic table
UA = (b"user-agent", b"h2spec")
X_TEST = (b"x-test", b"h2spec")
INDEXED, NOT_INDEXED, NEVER_INDEXED = "indexed", "not indexed", "never indexed"
_PATTERN = {INDEXED: (6, 0x40), NOT_INDEXED: (4, 0x00), NEVER_INDEXED: (4, 0x10)}


def literal(how: str, field: tuple[bytes, bytes], huffman: bool, name_index: int = 0) -> bytes:
    """A literal field representation (RFC 7541 6.2): `how` it is indexed, its name by index
    (`name_index`) or as a string."""
    bits, pattern = _PATTERN[how]
    name = integer(name_index, bits, pattern)
    if not name_index:
        name += string(field[0], huffman)
    return name + string(field[1], huffman)


Representation = tuple[bytes, tuple[bytes, bytes], str]
"""A field's encoded bytes, the field, and how it is indexed ("" for an indexed field)."""


def _literal(
    how: str, field: tuple[bytes, bytes], huffman: bool, name_index: int = 0
) -> Representation:
    return literal(how, field, huffman, name_index), field, how


REPRESENTATIONS: dict[str, Representation] = {
    "5/1 an indexed field": (integer(USER_AGENT, 7, 0x80), (b"user-agent", b""), ""),
    "5/2 incremental indexing, indexed name": _literal(INDEXED, UA, False, USER_AGENT),
    "5/3 incremental indexing, indexed name, Huffman": _literal(INDEXED, UA, True, USER_AGENT),
    "5/4 incremental indexing, new name": _literal(INDEXED, X_TEST, False),
    "5/5 incremental indexing, new name, Huffman": _literal(INDEXED, X_TEST, True),
    "5/6 without indexing, indexed name": _literal(NOT_INDEXED, UA, False, USER_AGENT),
    "5/7 without indexing, indexed name, Huffman": _literal(NOT_INDEXED, UA, True, USER_AGENT),
    "5/8 without indexing, new name": _literal(NOT_INDEXED, X_TEST, False),
    "5/9 without indexing, new name, Huffman": _literal(NOT_INDEXED, X_TEST, True),
    "5/10 never indexed, indexed name": _literal(NEVER_INDEXED, UA, False, USER_AGENT),
    "5/11 never indexed, indexed name, Huffman": _literal(NEVER_INDEXED, UA, True, USER_AGENT),
    "5/12 never indexed, new name": _literal(NEVER_INDEXED, X_TEST, False),
    "5/13 never indexed, new name, Huffman": _literal(NEVER_INDEXED, X_TEST, True),
}


def _representation(name: str) -> Case:
    representation, field, how = REPRESENTATIONS[name]

    def run(talk: Conversation) -> None:
        talk.send(request(talk, block=BLOCK + representation))
        sent = answered(talk)
        assert field in fields_of(sent), "the field did not reach Triton as sent"
        [at_triton] = [x for x in sent.fields if tuple(x) == field]
        never = isinstance(at_triton, NeverIndexedHeaderTuple)
        assert never == (how == NEVER_INDEXED), "RFC 7541 6.2.3: never indexed stays so"
        if how == INDEXED:  # the relay's table has the entry: the next call may point at it
            talk.send(request(talk, sid=3, block=BLOCK + integer(NEWEST, 7, 0x80)))
            assert field in fields_of(answered(talk, 3))

    return run


for _name in REPRESENTATIONS:
    CASES[_name] = _representation(_name)


@case("5/14 a dynamic table size update")
def _(talk: Conversation) -> None:
    talk.send(request(talk, block=integer(128, 5, 0x20) + BLOCK))
    answered(talk)
    # The table now holds 128 octets: an entry of 6 + 6 + 32 fits and can be pointed at.
    talk.send(request(talk, sid=3, block=BLOCK + literal(INDEXED, X_TEST, False)))
    answered(talk, 3)
    talk.send(request(talk, sid=5, block=BLOCK + integer(NEWEST, 7, 0x80)))
    assert X_TEST in fields_of(answered(talk, 5))


@case("5/15 two dynamic table size updates")
def _(talk: Conversation) -> None:
    talk.send(request(talk, block=integer(128, 5, 0x20) + integer(4096, 5, 0x20) + BLOCK))
    answered(talk)


@pytest.mark.parametrize("name", sorted(CASES))
async def test_h2spec_generic_case(name: str) -> None:
    talk = conversation("idle")
    CASES[name](talk)


async def test_a_never_indexed_field_from_triton_reaches_the_tenant_never_indexed() -> None:
    """The other direction of RFC 7541 6.2.3: the relay is an intermediary for Triton's
    response heads too."""
    talk = conversation("half-closed")
    channel, _ = talk.rig.channel()
    secret = NeverIndexedHeaderTuple(b"x-secret", b"s3cret")
    head = talk.rig.triton_encoder.encode([(b":status", b"200"), secret])
    channel.data_received(f.frame(f.HEADERS, f.END_HEADERS, 1, head))
    talk.send(b"")
    [response] = talk.responses(1)
    assert isinstance(response, h2.events.ResponseReceived)
    [at_tenant] = [x for x in response.headers if x[0] == b"x-secret"]
    assert isinstance(at_tenant, NeverIndexedHeaderTuple)
