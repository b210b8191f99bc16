"""Counting what a compressed body or message inflates to, piece by piece, in bounded slices."""

from __future__ import annotations

import tracemalloc
import zlib

import pytest

from proxy.policy import inflation
from proxy.policy.inflation import Inflation
from proxy.policy.refusals import ProxyError, grpc_code, http_status

TEXT = b"model name and tensor bytes " * 40


def _compress(data: bytes, wbits: int) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
    return compressor.compress(data) + compressor.flush()


def _bomb(size: int, wbits: int = inflation.GZIP) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
    zeros = bytes(1024 * 1024)
    return b"".join(compressor.compress(zeros) for _ in range(size // len(zeros))) + (
        compressor.flush()
    )


class Collect:
    def __init__(self) -> None:
        self.pieces: list[int] = []
        self.data = bytearray()

    def feed(self, data: bytes) -> None:
        self.pieces.append(len(data))
        self.data += data


@pytest.mark.parametrize("wbits", [inflation.GZIP, inflation.DEFLATE])
def test_pieces_cut_anywhere_inflate_to_the_original(wbits: int) -> None:
    packed = _compress(TEXT, wbits)
    for cut in range(len(packed) + 1):
        counting = Inflation(wbits, len(TEXT), "the body", "--max-inflated")
        sink = Collect()
        assert counting.feed(packed[:cut], inflation.BUDGET, sink) == cut
        assert counting.feed(packed[cut:], inflation.BUDGET, sink) == len(packed) - cut
        counting.finish()
        assert bytes(sink.data) == TEXT
        assert counting.size == len(TEXT)


def test_exactly_the_limit_passes_and_one_byte_more_is_refused() -> None:
    packed = _compress(TEXT, inflation.GZIP)
    Inflation(inflation.GZIP, len(TEXT), "the body", "--max-inflated").feed(packed, 1 << 30)
    counting = Inflation(inflation.GZIP, len(TEXT) - 1, "the body", "--max-inflated")
    with pytest.raises(ProxyError, match="the body inflates to more than the limit of") as caught:
        counting.feed(packed, 1 << 30)
    assert "--max-inflated" in str(caught.value)
    assert http_status(caught.value) == 413
    assert grpc_code(caught.value).name == "RESOURCE_EXHAUSTED"


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"not compressed at all", "cannot be decompressed"),
        (_compress(TEXT, 15), "cannot be decompressed"),  # deflate sent as gzip
    ],
)
def test_corrupt_data_is_refused(data: bytes, why: str) -> None:
    with pytest.raises(ProxyError, match=why) as caught:
        Inflation(inflation.GZIP, 1 << 20, "the body", "--max-inflated").feed(data, 1 << 20)
    assert http_status(caught.value) == 400


def test_a_truncated_body_and_bytes_after_the_end_are_refused() -> None:
    packed = _compress(TEXT, inflation.GZIP)
    cut = Inflation(inflation.GZIP, 1 << 20, "the body", "--max-inflated")
    cut.feed(packed[:-3], 1 << 20)
    with pytest.raises(ProxyError, match="truncated"):
        cut.finish()
    after = Inflation(inflation.GZIP, 1 << 20, "the body", "--max-inflated")
    with pytest.raises(ProxyError, match="data after its end"):
        after.feed(packed + b"x", 1 << 20)
    later = Inflation(inflation.GZIP, 1 << 20, "the body", "--max-inflated")
    later.feed(packed, 1 << 20)
    with pytest.raises(ProxyError, match="data after its end"):
        later.feed(b"x", 1 << 20)


def test_a_bomb_is_inflated_in_slices_within_the_budget_and_never_held() -> None:
    """256 MiB of zeros in about 250 KiB: each call stops near the budget and says how much
    input it took, no slice is over SLICE, and memory stays near one slice."""
    bomb = _bomb(256 * 1024 * 1024)
    counting = Inflation(inflation.GZIP, 1 << 30, "the message", "--max-inflated")
    sink = Collect()
    taken = counting.feed(bomb, inflation.BUDGET, sink)
    assert 0 < taken < len(bomb)
    assert inflation.BUDGET <= counting.size < inflation.BUDGET + inflation.SLICE
    assert max(sink.pieces) <= inflation.SLICE
    tracemalloc.start()
    try:
        with pytest.raises(ProxyError, match="limit of 67108864 bytes"):
            capped = Inflation(inflation.GZIP, 64 * 1024 * 1024, "the message", "--max-inflated")
            pos = 0
            while True:
                pos += capped.feed(bomb[pos:], inflation.BUDGET)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert capped.size <= 64 * 1024 * 1024 + inflation.SLICE
    assert peak < 2 * 1024 * 1024
