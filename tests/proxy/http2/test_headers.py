"""BlockDecoder decodes every block exactly as a plain hpack Decoder does, reuse or not.

A peer's hpack Encoder (which indexes, evicts and resizes its dynamic table like grpc-core and
nghttp2 do) encodes header lists drawn from a small pool, so blocks repeat; each block goes to a
BlockDecoder and to a plain Decoder (the oracle), and the fields must agree every time.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable, Iterable

import pytest
from hpack import Decoder, Encoder, HPACKError, NeverIndexedHeaderTuple
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.http2.headers import KEPT_BYTES, BlockDecoder, BlockEncoder, fields_size

_POOL = [
    (b":method", b"POST"),
    (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
    (b":path", b"/inference.GRPCInferenceService/ModelReady"),
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
    (b"grpc-timeout", b"10S"),
    (b"grpc-timeout", b"9999m"),
    (b"x-tenant", b"a" * 40),
    (b"x-tenant", b"b" * 40),
    (b"grpc-status", b"0"),
]

_STEP = st.one_of(
    st.lists(st.sampled_from(_POOL), min_size=1, max_size=6).map(lambda h: ("headers", h)),
    st.sampled_from([0, 64, 120, 256, 4096]).map(lambda size: ("resize", size)),
    # An earlier block again, whatever it means now: the stale-reuse case a cache can get wrong.
    st.integers(min_value=0, max_value=39).map(lambda i: ("replay", i)),
)


def _outcome(decode: Callable[[bytes], Iterable[tuple[bytes, bytes]]], block: bytes) -> object:
    try:
        return [(bytes(n), bytes(v)) for n, v in decode(block)]
    except HPACKError as e:
        return type(e)


@settings(max_examples=150, deadline=None)
@given(st.lists(_STEP, min_size=1, max_size=40))
def test_every_block_decodes_as_a_plain_decoder_decodes_it(
    steps: list[tuple[str, object]],
) -> None:
    encoder = Encoder()
    ours = BlockDecoder()
    oracle = Decoder()
    sent: list[bytes] = []
    resized = False
    for kind, value in steps:
        if kind == "replay":
            assert isinstance(value, int)
            if sent:
                block = sent[value % len(sent)]
                assert _outcome(ours.decode, block) == _outcome(
                    lambda b: oracle.decode(b, raw=True), block
                )
            continue
        if kind == "resize":
            assert isinstance(value, int)
            # hpack's Encoder sends only the last of several size changes between two blocks
            # (RFC 7541 4.2 wants the smallest too) and none for a repeated value: one at a time.
            if not resized and value != encoder.header_table_size:
                encoder.header_table_size = value  # the next block starts with a size update
                resized = True
            continue
        assert isinstance(value, list)
        block = encoder.encode(value)
        resized = False
        sent.append(block)
        # A replayed size update leaves the encoder out of step with both decoders; from there
        # blocks may fail, and must fail (or not) the same way in both.
        expected = _outcome(lambda b: oracle.decode(b, raw=True), block)
        assert _outcome(ours.decode, block) == expected


def test_a_repeated_block_is_reused_until_the_table_changes() -> None:
    encoder = Encoder()
    ours = BlockDecoder()
    oracle = Decoder()
    headers = [(b":path", b"/p"), (b"x-a", b"1")]
    first = encoder.encode(headers)  # inserts both fields into the table
    second = encoder.encode(headers)  # all indexed now: the same bytes from here on
    assert encoder.encode(headers) == second
    for block in (first, second):
        oracle.decode(block)
        ours.decode(block)
    kept = ours.decode(second)
    assert ours.decode(second) is kept  # reused, not decoded again
    assert kept == tuple(headers)
    insertion = encoder.encode([(b"x-b", b"2")])  # shifts every dynamic index by one
    oracle.decode(insertion)
    ours.decode(insertion)
    # The same bytes now mean other fields; the kept result must not be reused.
    now = [(bytes(n), bytes(v)) for n, v in oracle.decode(second, raw=True)]
    assert now != list(headers)
    assert list(ours.decode(second)) == now


def test_a_malformed_block_raises_every_time() -> None:
    ours = BlockDecoder()
    for _ in range(2):
        with pytest.raises(HPACKError):
            ours.decode(b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff")


def test_a_never_indexed_field_stays_never_indexed_through_the_relay() -> None:
    """RFC 7541 6.2.3: an intermediary passes a never-indexed field on never-indexed. The decoder
    keeps hpack's mark (also from its memory of repeated blocks), and the encoder for the next
    hop honours it (generic/5/10-13 of h2spec, in `tests/proxy/grpc`)."""
    secret = NeverIndexedHeaderTuple(b"authorization", b"Bearer t0ken")
    block = Encoder().encode([(b":method", b"POST"), secret])
    ours = BlockDecoder()
    ours.decode(block)
    fields = ours.decode(block)  # the kept result this time
    assert isinstance(fields[1], NeverIndexedHeaderTuple)
    triton = Decoder()
    encoder = BlockEncoder()
    for _ in range(2):
        forwarded = list(triton.decode(encoder.encode(fields), raw=True))
        assert isinstance(forwarded[1], NeverIndexedHeaderTuple)
        assert not triton.header_table.dynamic_entries  # never in its table either


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.lists(st.sampled_from(_POOL), min_size=1, max_size=6).map(lambda h: ("headers", h)),
            st.sampled_from([0, 64, 120, 256]).map(lambda size: ("limit", size)),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_what_the_encoder_sends_decodes_back_to_the_same_fields(
    steps: list[tuple[str, object]],
) -> None:
    """Triton's side is a plain decoder fed every block in order; it must read what was meant,
    through repeated lists (reused blocks), insertions, evictions and table limits."""
    ours = BlockEncoder()
    triton = Decoder()
    # An equal list is the same tuple each time, as a BlockDecoder's kept fields are: the encoder
    # recognises its last list by identity, which must not outlive a change of its table.
    same: dict[tuple[tuple[bytes, bytes], ...], tuple[tuple[bytes, bytes], ...]] = {}
    for kind, value in steps:
        if kind == "limit":
            assert isinstance(value, int)
            ours.limit_table(value)
            continue
        assert isinstance(value, list)
        fields = same.setdefault(tuple(value), tuple(value))
        block = ours.encode(fields)
        assert [(bytes(n), bytes(v)) for n, v in triton.decode(block, raw=True)] == value


def test_a_repeated_header_list_costs_a_few_indexed_bytes() -> None:
    ours = BlockEncoder()
    fields = tuple(_POOL[:5])
    first = ours.encode(fields)
    second = ours.encode(fields)
    assert len(second) < len(first) // 4  # indexed now, as grpc-core would send it
    assert ours.encode(fields) is second  # kept: the table did not change


def test_the_last_list_is_encoded_afresh_once_the_table_changed() -> None:
    """The encoder knows its last list by identity; another list's insertion shifts every index,
    so the same tuple must not get its old block again."""
    ours = BlockEncoder()
    triton = Decoder()
    fields = tuple(_POOL[:2])  # :path is inserted the first time, indexed after
    other = ((b"x-tenant", b"a" * 40),)
    for sent in (fields, fields, fields, other, fields, fields):
        block = ours.encode(sent)
        assert [(bytes(n), bytes(v)) for n, v in triton.decode(block, raw=True)] == list(sent)


def test_two_lists_in_turn_are_encoded_afresh_once_the_table_changed() -> None:
    """A tenant's encoder takes a response head and trailers in turn, and knows both by
    identity; a third list's insertion shifts every index, so neither may get its old block."""
    ours = BlockEncoder()
    triton = Decoder()
    head = tuple(_POOL[:2])
    trailers = ((b"grpc-status", b"0"),)
    other = ((b"x-tenant", b"a" * 40),)
    for sent in (head, trailers) * 3 + (other, head, trailers, head, trailers):
        block = ours.encode(sent)
        assert [(bytes(n), bytes(v)) for n, v in triton.decode(block, raw=True)] == list(sent)


# -- what the memories of blocks may hold --------------------------------------------------------


def _fat_block(variant: int) -> bytes:
    """1,024 bytes that decode to 1,024 fields: each byte an indexed static-table field
    (`:method: GET` or `POST`), the first 7 bytes telling 128 variants apart."""
    pattern = bytes(0x82 | ((variant >> bit) & 1) for bit in range(7))
    return pattern + b"\x82" * (1024 - len(pattern))


def _literal_block(variant: int, count: int = 40) -> bytes:
    """`count` literal fields without indexing with 2-byte names and values: each field a tuple
    and two new bytes objects, the most a field holds for what `fields_size` counts."""
    first = b"\x00\x02ab\x02" + variant.to_bytes(2, "big")
    return first + b"\x00\x02cd\x02ef" * (count - 1)


def _kept_after(feed: Callable[[], object]) -> int:
    """What `feed` leaves allocated once it returned and its garbage is collected."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        feed()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


_SLACK = 8 * 1024
"""What a memory's dict itself takes past its entries' slots (128 entries at most)."""


@pytest.mark.parametrize("block", [_fat_block, _literal_block], ids=["indexed", "literal"])
def test_what_the_decoder_keeps_is_bounded_by_what_the_blocks_decode_to(
    block: Callable[[int], bytes],
) -> None:
    """A peer sending distinct small blocks that decode to many fields (a 1 KiB block to 1,024
    fields, 72 KiB: 128 of them held 9 MiB before) cannot make the decoder keep more than
    `KEPT_BYTES`; `kept_bytes` counts at least what is really held."""
    ours = BlockDecoder()
    ours.decode(block(0))  # hpack's own state, allocated once

    def feed() -> None:
        for variant in range(1, 128):
            ours.decode(block(variant))

    held = _kept_after(feed)
    assert ours.kept_bytes <= KEPT_BYTES
    assert held <= ours.kept_bytes + _SLACK, f"{held} bytes held, {ours.kept_bytes} counted"


def test_blocks_of_a_few_fields_are_still_kept() -> None:
    """The bound keeps the cache's use: blocks a client repeats, even of 40 literal fields,
    are decoded once."""
    ours = BlockDecoder()
    blocks = [_literal_block(variant) for variant in range(4)]
    first = [ours.decode(b) for b in blocks]
    assert [ours.decode(b) for b in blocks] == first
    assert all(again is kept for again, kept in zip(map(ours.decode, blocks), first, strict=True))
    assert 4 * fields_size(first[0]) <= ours.kept_bytes <= KEPT_BYTES


def test_a_block_that_decodes_to_many_fields_is_decoded_every_time() -> None:
    ours = BlockDecoder()
    first = ours.decode(_fat_block(1))
    again = ours.decode(_fat_block(1))
    assert again == first and again is not first  # decoded afresh, and the same fields
    assert len(first) == 1024 and ours.kept_bytes == 0


def test_what_the_encoder_keeps_is_bounded_by_the_lists_it_is_given() -> None:
    """The encoder's keys are the header lists themselves (the fields of a tenant's request,
    on the channel every tenant shares): a list of 1,000 fields it indexes in 1,000 bytes is not
    kept alive."""
    ours = BlockEncoder()
    ours.encode(((b"x-a", b"1"),))  # `x-a: 1` is in the table from here on

    def feed() -> None:
        for count in range(500, 628):  # distinct lengths: distinct lists, all indexed
            assert len(ours.encode(((b"x-a", b"1"),) * count)) == count

    assert _kept_after(feed) <= KEPT_BYTES + _SLACK
