"""Kubernetes resource quantities (`2Gi`, `1500Mi`, `1e9`, `500M`) as exact integers of bytes.

Follows the grammar of k8s.io/apimachinery resource.Quantity: a signed decimal number, then either
a binary suffix (Ki Mi Gi Ti Pi Ei), a decimal suffix (n u m k M G T P E), or a decimal exponent
(`e3`, `E6`). Fractions of a byte round up, as Kubernetes rounds a request up to a whole unit.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

_QUANTITY_RE = re.compile(
    r"^(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+))(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$"
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
        try:
            number = Decimal(match["num"])
        except InvalidOperation as e:  # pragma: no cover - the regex admits only decimals
            raise QuantityError(f"{what}: {value!r} has an unreadable number") from e
        suffix = match["suffix"] or ""
        if suffix in _BINARY:
            number *= Decimal(1024) ** _BINARY[suffix]
        elif suffix in _DECIMAL:
            number = number.scaleb(_DECIMAL[suffix])
        elif suffix:
            exponent = int(suffix[1:])
            if abs(exponent) > 30:
                raise QuantityError(f"{what}: {value!r} has an exponent out of range")
            number = number.scaleb(exponent)
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
