"""Kubernetes quantities parse to exact bytes; bad ones say what to write instead."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils.quantity import parse_quantity as client_parse_quantity

from common.quantity import QuantityError, format_bytes, parse_quantity, quantity_decimal

ROOT = Path(__file__).resolve().parents[2]


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


# The kubernetes client's parser (kubernetes.utils.quantity) reads Python's Decimal syntax, not
# kube-apiserver's grammar: these it returns a value for, and the API server refuses.
THE_CLIENT_ACCEPTS_THE_API_SERVER_REFUSES = ["NaN", "inf", "1K", "1_000", "1e3Gi", "\u0661\u0662Gi"]


@pytest.mark.parametrize("text", THE_CLIENT_ACCEPTS_THE_API_SERVER_REFUSES)
def test_ours_refuses_what_the_kubernetes_client_accepts_and_the_api_server_refuses(
    text: str,
) -> None:
    client_parse_quantity(text)  # type: ignore[no-untyped-call]  # no error: why ours
    assert quantity_decimal(text) is None
    with pytest.raises(QuantityError):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("-1Gi", Decimal(-(1024**3))),
        ("1500m", Decimal("1.5")),
        ("1e40", Decimal("1e40")),
        (".5", Decimal("0.5")),
        ("1.", Decimal(1)),
        (" 1Gi", None),
        ("1Gi ", None),
        ("1Gi\n", None),
        ("1ki", None),
        ("1e", None),
        ("\u0663", None),
    ],
)
def test_the_exact_value_is_what_kube_apiserver_decodes(
    text: str, expected: Decimal | None
) -> None:
    """Signed, fractions kept, nothing around, ASCII digits only (the simulated API server's
    reading, sim/apiserver/validation.py)."""
    assert quantity_decimal(text) == expected


CHART_CASES = [
    *["0", "1", "512Mi", "2Gi", "1.5Gi", "500M", "1e9", "1e30", "1k", "1Ki", "8Ti", "1Ei", "1m"],
    *["1K", "1ki", "2GB", "1.2.3", "-1Gi", "+1Gi", ".5Gi", "1.", "1e+3", "1E3", "1n", "1u", "Gi"],
    *["1e99", "1e31", "\u0661Gi"],
]


@pytest.mark.parametrize("text", CHART_CASES)
def test_the_charts_quantity_pattern_admits_only_what_the_parts_and_the_api_server_read(
    text: str,
) -> None:
    """The chart's values.schema checks quantities before Helm renders them; what it lets
    through must start the parts (common.quantity) and pass kube-apiserver (sizeLimit)."""
    schema = json.loads((ROOT / "charts/tritonshare/values.schema.json").read_text())
    patterns = set(_patterns_of_quantities(schema))
    assert len(patterns) >= 2, patterns  # the parts' quantities and the model pod's gpuMem
    for pattern in patterns:
        if re.search(pattern, text):
            assert quantity_decimal(text) is not None, f"{pattern} admits {text!r}"
            assert parse_quantity(text) >= 0
        if text in ("512Mi", "2Gi", "1.5Gi", "500M", "0"):
            assert re.search(pattern, text), f"{pattern} refuses {text!r}"


def _patterns_of_quantities(node: object) -> list[str]:
    if isinstance(node, dict):
        found = []
        for key, value in node.items():
            if key in ("gpuMemReserve", "repositorySizeLimit", "shmSizeLimit", "gpuMem"):
                found.append(value["pattern"])
            found += _patterns_of_quantities(value)
        return found
    if isinstance(node, list):
        return [p for item in node for p in _patterns_of_quantities(item)]
    return []
