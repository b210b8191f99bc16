"""A proxy's `/autoscaling` answer as the autoscaler may use it: `{model id: [held seconds,
requests answered]}`, both cumulative, finite, non-negative and bounded.

The answer comes from a pod of a tenant's namespace, so it may be anything. It is parsed only
after its nesting is known to be at most two deep (an object of arrays), in C-speed passes over
the bytes, so a deep answer costs its bytes and never the interpreter's recursion; NaN, Infinity
and numbers past `MOST` are dropped entry by entry, as are entries of another shape. What is
left can never make a decider's state non-finite.

Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

Entry = tuple[float, float]
Counts = Mapping[str, Entry]
MOST = 1e15
"""The largest counter taken: a year of 10,000 requests held at once is 3.2e11 seconds."""
MOST_ID_CHARACTERS = 253
"""Longer keys are no model id (ids are at most 128 characters)."""
ENTRY_BYTES = 192
"""What one model's entry takes at most as a proxy writes it (a 128-character id, its held
seconds to the microsecond and its answered count): the bound of an answer grows by this a
model its pod serves."""
BASE_BYTES = 1024

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")
_INNERMOST = re.compile(rb"\[\]|\{\}")
_DEPTH = 2


def answer_bound(models: int, most: int) -> int:
    """The most bytes read of an answer from a pod serving `models` models (never over
    `most`)."""
    return min(most, BASE_BYTES + ENTRY_BYTES * max(1, models))


def shallow(data: bytes) -> bool:
    """Whether `data`'s brackets, outside strings, nest at most two deep and all close."""
    brackets = _NOT_BRACKET.sub(b"", _STRING.sub(b"", data))
    for _ in range(_DEPTH):
        brackets = _INNERMOST.sub(b"", brackets)
    return not brackets


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a count")


def parse_counts(data: bytes) -> dict[str, Entry]:
    """The well-formed entries of an answer; {} for an answer that is not a JSON object of at
    most two levels."""
    if not shallow(data):
        return {}
    try:
        body = json.loads(data, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(body, dict):
        return {}
    counts: dict[str, Entry] = {}
    for model, entry in body.items():
        if (
            len(model) <= MOST_ID_CHARACTERS
            and isinstance(entry, list)
            and len(entry) == 2
            and all(_count(value) for value in entry)
        ):
            counts[model] = (float(entry[0]), float(entry[1]))
    return counts


def _count(value: object) -> bool:
    # NaN compares false and Infinity is past MOST: neither passes.
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= MOST
