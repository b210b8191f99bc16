"""What the shapes of a REST inference request declare, checked against what its body can carry.

Triton 2.51 sizes a REST input's buffer from its declared `shape` before it reads the JSON data,
and aborts (SIGABRT) when the allocation fails: `"shape":[1,2305843009213693952]` with one value
of data, 91 bytes, killed it, every tenant's model with it. Every input whose data is in the body
needs at least a byte of it per element (JSON data: a digit or a quote at least; the binary tensor
extension: `binary_data_size` bytes, one or more per element), and shared-memory inputs are not
served to tenants (the relays refuse the region APIs). So the relays refuse an inference body
whose inputs with JSON data declare more elements, together, than its JSON has bytes, or whose
inputs with binary data declare more than their `binary_data_size`, or more of those in all than
the body has after its JSON; and any dimension that is not a JSON integer from 0 to 2**63-1 (no
request's shape has one: Triton's are int64; a negative or fractional one only confuses its
arithmetic).

A body that is all JSON, escape-free and with plain shapes (what tritonclient sends) is read
without a parser (`_plainly_within`); any other JSON part is parsed once, whole, by the stdlib's
JSON decoder, so keys are read as Triton reads them (`"sh\\u0061pe"` is `shape`) and strings and
nesting cannot hide one; every `shape` of every object counts, duplicate keys included (Triton's
parser takes the first, Python's the last), and what a short one declares is cached (a binary
request's JSON repeats). A JSON part over MAX_JSON_BYTES is refused: tensor data that large
belongs in the binary extension (tritonclient's default), and parsing it would hold the event
loop. Pure: it reads the bytes it is given.
"""

from __future__ import annotations

import json
import re
from math import prod
from typing import Any, Final

from proxy.policy.refusals import BodyTooLargeError, MalformedRequestError

MAX_JSON_BYTES: Final = 1024 * 1024
"""The largest JSON part of an inference request the relays check and pass (about 4 ms to parse
here); larger tensors go in the binary tensor extension."""
MAX_DIMENSION: Final = 2**63 - 1
"""The largest dimension Triton's shapes (int64) can hold."""

_found: Final[list[tuple[Any, int]]] = []
"""Each `shape` value of the body being decoded, with its input's binary_data_size (-1: its data
is JSON): one decoder, built once, collects into it; the event loop decodes one body at a time,
and `_declared` empties it first."""


class _Sizes:
    """An object that had `binary_data_size` keys (a `parameters`), as its parent sees it."""

    __slots__ = ("values",)

    def __init__(self, values: list[Any]) -> None:
        self.values = values


def _keep_shapes(pairs: list[tuple[str, Any]]) -> _Sizes | None:
    shapes: list[Any] | None = None
    parameters: list[Any] = []
    sizes: list[Any] | None = None
    for key, value in pairs:
        if key == "shape":
            if shapes is None:
                shapes = []
            shapes.append(value)
        elif key == "parameters":
            parameters.append(value)
        elif key == "binary_data_size":
            if sizes is None:
                sizes = []
            sizes.append(value)
    if shapes is not None:
        size = _binary_size(parameters)
        for shape in shapes:
            _found.append((shape, size))
    # Nothing else of an object is kept: only shapes and binary sizes matter.
    return None if sizes is None else _Sizes(sizes)


def _binary_size(parameters: list[Any]) -> int:
    """The binary_data_size its `parameters` give an input, or -1: none, or not one plain size
    (duplicates that differ): its data then counts as JSON, the stricter bound."""
    sizes: list[Any] = []
    for given in parameters:
        if not isinstance(given, _Sizes):
            return -1
        sizes += given.values
    if not sizes:
        return -1
    first = sizes[0]
    if type(first) is not int or first < 0:
        return -1
    for size in sizes:
        if type(size) is not int or size != first:
            return -1
    return int(first)


# Numbers with a fraction or an exponent become True (a singleton: data of a million floats
# costs no float objects), which no dimension may be; JSON's true is True as well.
_DECODER: Final = json.JSONDecoder(object_pairs_hook=_keep_shapes, parse_float=bool)


def json_too_large(json_bytes: int) -> BodyTooLargeError:
    return BodyTooLargeError(
        f"the inference request's JSON is over {MAX_JSON_BYTES} bytes"
        + (f" ({json_bytes})" if json_bytes > MAX_JSON_BYTES else "")
        + "; send the tensor data with the binary tensor extension (tritonclient's binary_data, "
        "its default), which keeps the JSON to names and shapes"
    )


_SHAPE_LISTS: Final = re.compile(rb'"shape"(?:\s*:\s*\[([0-9 \t\r\n,]{0,64})\])?')
"""A `shape` key spelled plainly, and its value's digits when it is a short list of them (else
empty, as for an empty list: neither is plainly one)."""
_PLAIN_SHAPES: Final[dict[bytes, int]] = {}
"""Elements of the digit lists read plainly lately (-1: not plain): clients send the same shapes
again and again. At most _PLAIN_SHAPES_KEPT of at most 64 bytes each."""
_PLAIN_SHAPES_KEPT: Final = 1024


def _plain_elements(dims: bytes) -> int:
    """The elements of a plain digit list, or -1 when it is not plainly one (an empty list or
    dimension, a dimension over MAX_DIMENSION)."""
    try:
        values = list(map(int, dims.split(b",")))  # int() allows the blanks around digits
        elements = prod(values) if max(values) <= MAX_DIMENSION else -1
    except ValueError:
        elements = -1
    if len(_PLAIN_SHAPES) >= _PLAIN_SHAPES_KEPT:
        _PLAIN_SHAPES.clear()
    _PLAIN_SHAPES[dims] = elements
    return elements


def _plainly_within(json_part: bytes, body_bytes: int) -> bool:
    """Whether `json_part` surely passes, read without a parser: for the JSON of every request
    tritonclient sends, at C speed (a parse costs more than the rest of the relay's work).

    Sound without escapes only: then a string cannot hold a quote, so in JSON every `"shape"`
    followed by a colon is a key (a closing quote is never followed by a letter) and every
    `shape` key is spelled so; each must have a plain list of digits. JSON that is not valid
    Triton refuses whole before it reads any shape. Anything else is left to the parser."""
    # One `find` and one `findall`: each `bytes.find` parses its arguments from a format string
    # (about 1,000 instructions a call, compiled), a match object costs three calls more, and
    # `in` raises and clears a TypeError first (it tries the operand as an integer).
    if json_part.find(b"\\") >= 0:
        return False
    elements = 0
    for dims in _SHAPE_LISTS.findall(json_part):
        plain = _PLAIN_SHAPES.get(dims)
        if plain is None:
            plain = _plain_elements(dims)
        if plain < 0:
            return False
        elements += plain
    return elements <= body_bytes


_DECLARED: Final[dict[bytes, tuple[int, int]]] = {}
"""What the JSON parts parsed lately declare (`_declared`): a binary-extension request's JSON
repeats from request to request (names, shapes, sizes; its data is in the binary part). At most
_DECLARED_KEPT parts of at most _DECLARED_BYTES each."""
_DECLARED_KEPT: Final = 256
_DECLARED_BYTES: Final = 4096


def check_json(json_part: bytes, body_bytes: int) -> None:
    """Refuse (MalformedRequestError) an inference request whose JSON part `json_part` is not
    JSON, or declares a dimension that is not an integer from 0 to MAX_DIMENSION, or inputs with
    JSON data of more elements in all than the JSON part has bytes, or an input of more elements
    than its binary_data_size, or binary_data_size in all more than the `body_bytes` of the whole
    body hold after the JSON part."""
    json_bytes = len(json_part)
    if json_bytes > MAX_JSON_BYTES:
        raise json_too_large(json_bytes)
    if body_bytes == json_bytes and _plainly_within(json_part, body_bytes):
        return
    declared = _DECLARED.get(json_part) if json_bytes <= _DECLARED_BYTES else None
    if declared is None:
        declared = _declared(json_part)
        if json_bytes <= _DECLARED_BYTES:
            if len(_DECLARED) >= _DECLARED_KEPT:
                _DECLARED.clear()
            _DECLARED[json_part] = declared
    json_elements, binary_sizes = declared
    if json_elements > json_bytes:
        raise MalformedRequestError(
            f"the inference request's inputs declare more elements in their shapes than its "
            f"JSON has bytes ({json_bytes}), and each element of JSON data needs at least one; "
            f"declare each input's shape as the data it sends"
        )
    if binary_sizes > body_bytes - json_bytes:
        raise MalformedRequestError(
            f"the inference request's inputs' binary_data_size add up to more than the "
            f"{max(body_bytes - json_bytes, 0)} bytes its body has after its JSON; send each "
            f"input's binary data whole, after the JSON"
        )


def _declared(json_part: bytes) -> tuple[int, int]:
    """What `json_part` declares: the elements of its inputs with JSON data (more than
    MAX_JSON_BYTES: MAX_JSON_BYTES + 1) and the sum of its inputs' binary_data_size; raises
    MalformedRequestError for what is wrong whatever the body's length."""
    _found.clear()
    try:
        _DECODER.decode(str(json_part, "utf-8"))
    except RecursionError:
        raise MalformedRequestError(
            "the inference request's JSON nests too deep to be checked; send each tensor's data "
            "flat (its shape gives the dimensions) or with the binary tensor extension"
        ) from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer too long
        raise MalformedRequestError(
            f"the inference request is not valid UTF-8 JSON ({e}); send the JSON of the KServe v2 "
            f"protocol"
        ) from None
    finally:
        shapes = list(_found)
        _found.clear()
    json_elements = 0
    binary_sizes = 0
    for shape, size in shapes:
        if not isinstance(shape, list):
            continue
        if size < 0:
            json_elements += element_count(shape, MAX_JSON_BYTES)
            json_elements = min(json_elements, MAX_JSON_BYTES + 1)
        else:
            if element_count(shape, size) > size:
                raise MalformedRequestError(
                    f"an input declares more elements in its shape than its binary_data_size "
                    f"({size}) has bytes, and each element needs at least one; declare each "
                    f"input's shape as the data it sends"
                )
            binary_sizes += size
    return json_elements, binary_sizes


def element_count(shape: list[Any], bound: int) -> int:
    """The elements of `shape`, or more than `bound` as soon as it is known to be more (a product
    of many huge dimensions is never computed whole); MalformedRequestError for a dimension that
    is not an integer from 0 to MAX_DIMENSION. The one count of a shape's elements: the REST
    check's and the gRPC check's (`policy.tensors`)."""
    product = 1
    for dim in shape:
        if type(dim) is not int or dim < 0 or dim > MAX_DIMENSION:
            # Fractions, exponents and booleans were all decoded as True (`_DECODER`).
            shown = "a fraction or a boolean" if type(dim) is bool else str(dim)[:40]
            raise MalformedRequestError(
                f"an input's shape has the dimension {shown}, which is not an integer from 0 to "
                f"{MAX_DIMENSION}; declare each dimension as the count of its elements"
            )
    if 0 in shape:
        return 0
    for dim in shape:
        product *= int(dim)
        if product > bound:
            return product
    return product


class Shapes:
    """Collects one body's JSON part as it passes in pieces, for `check` once the body is whole.

    `json_bytes` is how much of the body is JSON (the binary tensor extension's
    Inference-Header-Content-Length), or -1 for all of it. A connection holds at most
    MAX_JSON_BYTES of it: past that, `feed` raises BodyTooLargeError, or, `early` False (a
    compressed body, whose inflation cap is the refusal that names what to change), keeps
    nothing more and leaves the refusal to `check`.
    """

    __slots__ = ("_early", "_left", "_over", "_pieces", "held")

    def __init__(self, json_bytes: int = -1, early: bool = True) -> None:
        self._left = json_bytes
        self._early = early
        self._over = 0  # the JSON part's length once it is over MAX_JSON_BYTES
        self._pieces: list[bytes] = []
        self.held = 0

    def feed(self, data: bytes, start: int = 0, end: int = -1) -> None:
        """Take the JSON part's share of `data[start:end]` (`end` -1: to its end)."""
        if end < 0:
            end = len(data)
        if self._left >= 0:
            end = min(end, start + self._left)
            self._left -= max(end - start, 0)
        if end > start:
            if self._over:
                self._over += end - start
                return
            self.held += end - start
            if self.held > MAX_JSON_BYTES:
                if self._early:
                    raise json_too_large(self.held)
                self._over = self.held
                self._pieces = []
                self.held = 0
                return
            self._pieces.append(data if start == 0 and end == len(data) else data[start:end])

    def check(self, body_bytes: int) -> None:
        """The body (`body_bytes` long) has all passed but its last piece: `check_json`."""
        if self._over:
            raise json_too_large(self._over)
        json_part = b"".join(self._pieces)
        self._pieces = []
        self.held = 0
        check_json(json_part, body_bytes)
