"""Kubernetes resource quantities (`2Gi`, `1500Mi`, `1e9`, `500M`) as exact integers of bytes.

Follows the grammar of k8s.io/apimachinery resource.Quantity: a signed decimal number of ASCII
digits, then either a binary suffix (Ki Mi Gi Ti Pi Ei), a decimal suffix (n u m k M G T P E), or
a decimal exponent (`e3`, `E6`). `quantity_decimal` is that grammar's exact value, the one reading
of the product, the simulated API server (sim/apiserver/validation.py) and, checked by a test, the
chart's values.schema pattern. `parse_quantity` reads bytes: blanks around are dropped (a flag's
value), negatives and exponents past 30 are refused, and fractions of a byte round up, as
Kubernetes rounds a request up to a whole unit.

Why not the kubernetes client's `kubernetes.utils.quantity.parse_quantity`: it is exact too
(Decimal), but reads Python's Decimal syntax, not the API server's grammar, so it returns a value
for what kube-apiserver refuses (`NaN`, `inf`, `1K`, `1_000`, `1e3Gi`, Arabic-Indic digits, a
leading blank; tests/common/test_quantity.py), which the API server would refuse later in a pod
(and `NaN` or `inf` is no count of bytes at all); its errors (`Invalid number format: 2GB`) name
neither the field nor what to write; it accepts negatives and returns fractions, where memory
wants whole, non-negative bytes; and it keeps no cache, where the binder reads the same few
quantities in every pod event.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

_QUANTITY_RE = re.compile(
    r"^(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+))(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?\Z",
    # kube-apiserver reads 0-9 only (\d alone admits other scripts' digits) and nothing after
    # the quantity (`$` alone admits a final newline).
    re.ASCII,
)
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


_PARSED: dict[str, int] = {}
"""Strings already read, and their bytes: a cluster repeats a few quantities ("4Gi") in every pod
the binder reads (three watch events per bound pod), and Decimal arithmetic costs microseconds."""
_PARSED_MAX = 4096


class QuantityError(ValueError):
    """A quantity string that Kubernetes would not accept, with what to write instead."""


def parse_quantity(value: str | int, *, what: str = "quantity") -> int:
    """Parse a Kubernetes quantity into a whole number of bytes, rounding fractions up.

    `what` names the field in the error message (for example "tritonshare.io/gpu-mem limit").
    Negative values are refused: memory cannot be negative.
    """
    if type(value) is str:
        known = _PARSED.get(value)
        if known is not None:
            return known
        parsed = _parse(value, what)
        if len(_PARSED) < _PARSED_MAX:
            _PARSED[value] = parsed
        return parsed
    return _parse(value, what)


def quantity_decimal(text: str) -> Decimal | None:
    """The exact value of `text` as kube-apiserver decodes a quantity (signed, fractions kept,
    nothing around it), or None where the API server refuses it."""
    match = _QUANTITY_RE.match(text)
    return None if match is None else _value(match)


def _value(match: re.Match[str]) -> Decimal:
    number = Decimal(match["num"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * Decimal(1024) ** _BINARY[suffix]
    if suffix in _DECIMAL:
        return number.scaleb(_DECIMAL[suffix])
    if suffix:
        return number.scaleb(int(suffix[1:]))
    return number


def _parse(value: str | int, what: str) -> int:
    if isinstance(value, bool):
        raise QuantityError(f"{what}: {value!r} is not a quantity; write bytes such as '2Gi'")
    if isinstance(value, int):
        number = Decimal(value)
    else:
        text = str(value).strip()
        match = _QUANTITY_RE.match(text)
        if not match:
            raise QuantityError(
                f"{what}: {value!r} is not a Kubernetes quantity; write a number with an optional "
                f"suffix such as '2Gi', '1500Mi', '500M' or '1e9'"
            )
        suffix = match["suffix"] or ""
        exponent = suffix if suffix and suffix not in _BINARY and suffix not in _DECIMAL else ""
        if exponent and abs(int(exponent[1:])) > 30:
            raise QuantityError(f"{what}: {value!r} has an exponent out of range")
        number = _value(match)
    if number < 0:
        raise QuantityError(f"{what}: {value!r} is negative; memory must be zero or more")
    return math.ceil(number)


def format_bytes(value: int) -> str:
    """Render bytes the way people read GPU memory: `80Gi`, `1.5Gi`, `512Mi`, `700`."""
    if value < 0:
        return "-" + format_bytes(-value)
    for suffix, power in (("Ti", 4), ("Gi", 3), ("Mi", 2), ("Ki", 1)):
        unit = 1024**power
        if value >= unit:
            scaled = value / unit
            text = f"{scaled:.1f}".rstrip("0").rstrip(".")
            return f"{text}{suffix}"
    return str(value)


BINARY_SI, DECIMAL_SI, DECIMAL_EXPONENT = "BinarySI", "DecimalSI", "DecimalExponent"
"""The three formats a Kubernetes quantity keeps from the text it was read from."""
_DECIMAL_SUFFIXES = {exponent: suffix for suffix, exponent in _DECIMAL.items()} | {0: ""}


def quantity_format(text: str) -> str:
    """The format Kubernetes keeps for a quantity read from `text`: BinarySI for `Ki`..`Ei`,
    DecimalExponent for `e3`, else DecimalSI (an unreadable text counts as DecimalSI)."""
    match = _QUANTITY_RE.match(text.strip())
    suffix = (match["suffix"] or "") if match else ""
    if suffix in _BINARY:
        return BINARY_SI
    if suffix and suffix not in _DECIMAL:
        return DECIMAL_EXPONENT
    return DECIMAL_SI


def format_quantity(value: Decimal | int, form: str = BINARY_SI) -> str:
    """`value` as Kubernetes writes a quantity of that format (resource.Quantity.String):
    BinarySI as a whole multiple of the largest power of 1024 (`3Gi`, `1536Mi`; under 1024 or a
    fraction falls back to DecimalSI), DecimalSI with the largest SI suffix that keeps an integer
    (`2G`, `500m`, `1500M`), DecimalExponent as `e3`, `e6`; zero is `0`."""
    value = Decimal(value)
    if value == 0:
        return "0"
    if value < 0:
        return "-" + format_quantity(-value, form)
    if form == BINARY_SI and value >= 1024 and value == value.to_integral_value():
        number, power = int(value), 0
        while number % 1024 == 0 and power < len(_BINARY):
            number, power = number // 1024, power + 1
        return f"{number}{next((s for s, p in _BINARY.items() if p == power), '')}"
    _, digits, exponent = value.normalize().as_tuple()
    number, exponent = int("".join(map(str, digits))), int(exponent)
    shift = exponent % 3
    number, exponent = number * 10**shift, exponent - shift
    if form == DECIMAL_EXPONENT:
        return f"{number}e{exponent}" if exponent else str(number)
    suffix = _DECIMAL_SUFFIXES.get(exponent)
    return f"{number}{suffix}" if suffix is not None else f"{number}e{exponent}"
