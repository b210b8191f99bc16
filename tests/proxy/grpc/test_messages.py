"""The relay's bounded inline inflate of small compressed gRPC messages (grpc's gzip and deflate),
and of a large one's prefix."""

from __future__ import annotations

import tracemalloc
import zlib

import pytest

from proxy.grpc.messages import inflate_prefix, inflate_small
from proxy.policy.refusals import ProxyError, grpc_code

TEXT = b"model name and tensor bytes " * 40


def _compress(data: bytes, wbits: int) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
    return compressor.compress(data) + compressor.flush()


@pytest.mark.parametrize(("encoding", "wbits"), [(b"gzip", 31), (b"deflate", 15)])
def test_grpc_encodings_inflate_to_the_original(encoding: bytes, wbits: int) -> None:
    assert inflate_small(encoding, _compress(TEXT, wbits), len(TEXT)) == TEXT


@pytest.mark.parametrize("encoding", [None, b"identity"])
def test_a_compressed_flag_without_a_compression_is_refused(encoding: bytes | None) -> None:
    with pytest.raises(ProxyError, match="names no compression") as caught:
        inflate_small(encoding, _compress(TEXT, 31), len(TEXT))
    assert grpc_code(caught.value).name == "INVALID_ARGUMENT"


def test_an_unknown_encoding_is_refused_saying_what_works() -> None:
    with pytest.raises(ProxyError, match="'snappy'; use gzip or deflate") as caught:
        inflate_small(b"snappy", TEXT, len(TEXT))
    assert grpc_code(caught.value).name == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"not compressed at all", "cannot be decompressed"),
        (_compress(TEXT, 31)[:-9], "truncated"),
        (_compress(TEXT, 31) + b"more", "data after its end"),
        (_compress(TEXT, 15), "cannot be decompressed"),  # deflate sent as gzip
    ],
)
def test_corrupt_data_is_refused(data: bytes, why: str) -> None:
    with pytest.raises(ProxyError, match=why) as caught:
        inflate_small(b"gzip", data, len(TEXT))
    assert grpc_code(caught.value).name == "INVALID_ARGUMENT"


def test_exactly_the_limit_is_inflated_inline_and_one_byte_more_is_left_to_the_pieces() -> None:
    packed = _compress(TEXT, 31)
    assert inflate_small(b"gzip", packed, len(TEXT)) == TEXT
    assert inflate_small(b"gzip", packed, len(TEXT) - 1) is None


def test_a_bomb_is_not_inflated_past_the_small_bound() -> None:
    """256 MiB of zeros gzip to about 250 KiB; inflating with a 64 KiB bound must stay near it."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1024 * 1024)
    bomb = b"".join(compressor.compress(zeros) for _ in range(256)) + compressor.flush()
    assert len(bomb) < 1024 * 1024
    tracemalloc.start()
    try:
        assert inflate_small(b"gzip", bomb, 64 * 1024) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024


@pytest.mark.parametrize(("encoding", "wbits"), [(b"gzip", 31), (b"deflate", 15)])
def test_a_prefix_inflates_to_the_start_of_the_message(encoding: bytes, wbits: int) -> None:
    packed = _compress(TEXT * 50, wbits)
    start = inflate_prefix(encoding, packed[: len(packed) // 2], 100)
    assert start == TEXT[:100]
    assert inflate_prefix(encoding, packed[:3], 100) == b""  # not enough yet: no error


def test_a_prefix_of_corrupt_data_or_an_unknown_encoding_is_refused() -> None:
    with pytest.raises(ProxyError, match="cannot be decompressed"):
        inflate_prefix(b"gzip", b"plainly not gzip", 100)
    with pytest.raises(ProxyError, match="names no compression"):
        inflate_prefix(None, _compress(TEXT, 31), 100)
