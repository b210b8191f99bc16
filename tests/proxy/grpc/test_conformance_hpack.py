"""The gRPC relay against h2spec's `hpack` group (RFC 7541), re-expressed as tests.

The relay decodes every tenant header block itself (`http2.headers.BlockDecoder`, on the `hpack`
package), so each decoding error h2spec sends is the relay's to catch: the tenant's connection
ends with GOAWAY COMPRESSION_ERROR (RFC 9113 4.3), no exception escapes, and Triton never hears
of the request. Each case is h2spec's, by its id: a valid request block with one broken
representation after it (or, for 6.3/1, before it), on stream 1 with END_STREAM. The broken
strings are built here from the RFC's rules (the Huffman code of RFC 7541 Appendix B, via
`hpack`'s table), not copied.

| h2spec id   | what the block carries                                             |
|-------------|--------------------------------------------------------------------|
| 2.3.3/1     | an indexed field past the static and dynamic tables (index 70)     |
| 2.3.3/2     | a literal whose name index is past both tables (index 70)          |
| 4.2/1       | a dynamic table size update after a header field                   |
| 5.2/1       | a Huffman string with more than 7 bits of padding                  |
| 5.2/2       | a Huffman string padded with zeros, not the EOS code's 1s          |
| 5.2/3       | a Huffman string with the EOS symbol inside                        |
| 6.1/1       | an indexed field with index 0                                      |
| 6.3/1       | a size update over SETTINGS_HEADER_TABLE_SIZE (4096: the relay     |
|             | does not send the setting)                                         |

Every case applies; none failed on the relay as it was (the `hpack` package refuses each).
"""

from __future__ import annotations

import pytest
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH

from proxy.http2 import frames as f
from tests.proxy.grpc.h2spec import (
    BLOCK,
    GOAWAY_,
    HUFFMAN,
    answer_of,
    assert_triton_saw_only_the_relay,
    conversation,
    integer,
)

EOS = 256
DEFAULT_TABLE_SIZE = 4096  # RFC 9113 6.5.2: SETTINGS_HEADER_TABLE_SIZE when never sent


def huffman_bits(symbols: list[int]) -> str:
    """The Huffman codes of `symbols` (byte values, or EOS), as a string of bits."""
    return "".join(format(REQUEST_CODES[s], f"0{REQUEST_CODES_LENGTH[s]}b") for s in symbols)


def octets(bits: str) -> bytes:
    assert len(bits) % 8 == 0
    return int(bits, 2).to_bytes(len(bits) // 8, "big")


def huffman_literal(value: bytes) -> bytes:
    """A literal without indexing, new name `x-test` (Huffman), with `value` as the string
    itself: a Huffman string already encoded, its length octet's H bit set."""
    name = HUFFMAN.encode(b"x-test")
    return b"\x00" + integer(len(name), 7, 0x80) + name + integer(len(value), 7, 0x80) + value


def _padding_over_7_bits() -> bytes:
    return huffman_literal(HUFFMAN.encode(b"test") + b"\xff")


def _padded_with_zeros() -> bytes:
    bits = huffman_bits(list(b"test"))
    padding = -len(bits) % 8
    assert padding, "the case needs a string that does not end on an octet boundary"
    return huffman_literal(octets(bits + "0" * padding))


def _eos_inside() -> bytes:
    bits = huffman_bits([*b"tes", EOS, *b"t"])
    return huffman_literal(octets(bits + "1" * (-len(bits) % 8)))


CASES: dict[str, bytes] = {
    "2.3.3/1 an indexed field past both tables": BLOCK + integer(70, 7, 0x80),
    "2.3.3/2 a literal with a name index past both tables": BLOCK + integer(70, 6, 0x40) + b"\x00",
    "4.2/1 a dynamic table size update after a header field": BLOCK + integer(1, 5, 0x20),
    "5.2/1 Huffman padding longer than 7 bits": BLOCK + _padding_over_7_bits(),
    "5.2/2 Huffman padding of zeros": BLOCK + _padded_with_zeros(),
    "5.2/3 the EOS symbol inside a Huffman string": BLOCK + _eos_inside(),
    "6.1/1 an indexed field with index 0": BLOCK + integer(0, 7, 0x80),
    "6.3/1 a size update over SETTINGS_HEADER_TABLE_SIZE": (
        integer(DEFAULT_TABLE_SIZE + 1, 5, 0x20) + BLOCK
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
async def test_h2spec_hpack_case(name: str, caplog: pytest.LogCaptureFixture) -> None:
    talk = conversation("idle")
    frames = talk.send(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1, CASES[name]))
    assert answer_of(talk, frames) == (GOAWAY_, f.COMPRESSION_ERROR)
    assert any("unreadable header block" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.exc_info], "the tenant's error is not a crash"
    assert not [frame for frame in frames if frame[0] == f.HEADERS], "the request was answered"
    assert assert_triton_saw_only_the_relay(talk.rig) == {}, "Triton heard of the request"


@pytest.mark.parametrize("name", sorted(CASES))
async def test_h2spec_hpack_case_after_a_call_in_flight(name: str) -> None:
    """The same block while another call of the tenant's is open at Triton: that call is reset
    there (nobody is left to answer), and nothing of the broken block reaches Triton."""
    talk = conversation("half-closed")
    frames = talk.send(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 3, CASES[name]))
    assert answer_of(talk, frames) == (GOAWAY_, f.COMPRESSION_ERROR)
    talk.tenant.connection_lost(None)  # the transport closed: its calls end
    talk.rig.relay.flush()
    seen = assert_triton_saw_only_the_relay(talk.rig)
    assert list(seen) == [1] and seen[1].reset
