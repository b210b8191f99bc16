"""Kubernetes quantities parse to exact bytes; bad ones say what to write instead."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.quantity import QuantityError, format_bytes, parse_quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2Gi", 2 * 1024**3),
        ("1500Mi", 1500 * 1024**2),
        ("1e9", 10**9),
        ("1E9", 10**9),
        ("500M", 500 * 10**6),
        ("0", 0),
        ("1", 1),
        ("1.5Gi", 3 * 1024**3 // 2),
        ("0.5Ki", 512),
        ("1k", 1000),
        ("+3Ti", 3 * 1024**4),
        (".5G", 500_000_000),
        ("1500m", 2),  # 1.5 bytes round up, as Kubernetes rounds requests up
        ("1e-3", 1),
        (" 4Gi ", 4 * 1024**3),
        (7, 7),
    ],
)
def test_parses_quantities_as_kubernetes_does(text: str | int, expected: int) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    "text", ["", "Gi", "2 Gi", "2GB", "2gi", "1.2.3", "0x10", "-1Gi", "1e99", "abc", "2Gi2"]
)
def test_refuses_what_kubernetes_refuses_with_a_clear_message(text: str) -> None:
    with pytest.raises(QuantityError) as info:
        parse_quantity(text, what="tritonshare.io/gpu-mem limit")
    message = str(info.value)
    assert "tritonshare.io/gpu-mem limit" in message
    assert repr(text) in message


def test_a_boolean_is_not_a_quantity() -> None:
    with pytest.raises(QuantityError):
        parse_quantity(True)


@given(st.integers(min_value=0, max_value=2**50), st.sampled_from(["Ki", "Mi", "Gi", ""]))
def test_binary_suffixes_multiply_exactly(n: int, suffix: str) -> None:
    power = {"": 0, "Ki": 1, "Mi": 2, "Gi": 3}[suffix]
    assert parse_quantity(f"{n}{suffix}") == n * 1024**power


@pytest.mark.parametrize(
    ("value", "text"),
    [(0, "0"), (700, "700"), (1024, "1Ki"), (1536 * 1024**2, "1.5Gi"), (80 * 1024**3, "80Gi")],
)
def test_format_bytes_reads_as_people_write_gpu_memory(value: int, text: str) -> None:
    assert format_bytes(value) == text


@given(st.integers(min_value=0, max_value=2**45))
def test_format_then_parse_is_close(value: int) -> None:
    # format_bytes keeps one decimal, so the round trip is within 5% of the unit.
    back = parse_quantity(format_bytes(value))
    assert abs(back - value) <= max(1, value // 20)
