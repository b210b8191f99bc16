"""The files an ONNX model makes its runtime open: the external-data locations in its protobuf.

An ONNX tensor may keep its bytes outside the model file: `data_location: EXTERNAL` and an
`external_data` entry `location`, a path relative to the model file's directory. onnxruntime
opened that path as given, absolute or through `..`, until it learned to refuse them in December
2025 (microsoft/onnxruntime#26776, after the onnxruntime of Triton 2.51), so a model that is "only
data" can read any file Triton can read: another tenant's weights in the shared repository, a
token, `/proc/self/environ`. `ModelPolicy.check_external_data` allows only files of
the model itself; this module finds every location a model names.

The walk reads the protobuf wire format directly (no `onnx` package): it enters only the messages
that can hold tensors (graphs, nodes, attributes, sparse tensors, functions, training graphs) and
steps over every other field by its length, so a 2 GiB file is walked without being copied. Pure:
it is given the bytes (a memoryview over an mmap) and returns strings.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from mmap import mmap

MAX_DEPTH = 100
"""protobuf's own parsers stop at this nesting; onnxruntime reads nothing deeper."""
MAX_BYTES = 2**31 - 1
"""protobuf's limit on one message: a larger file is no ONNX model onnxruntime can parse."""
MAX_PATH_BYTES = 4096
"""PATH_MAX: no location longer than this names a file."""
MAX_FIELDS = 5_000_000
"""Fields walked at most (about 1.5 us each): a real graph has far fewer outside its tensors'
data, which is stepped over whole; a file crafted of tiny fields costs seconds, not minutes."""

# The messages worth entering, and which of their fields hold such messages.
_MODEL, _GRAPH, _NODE, _ATTRIBUTE, _TENSOR, _SPARSE, _FUNCTION, _TRAINING, _ENTRY = range(9)
_CHILDREN: dict[int, dict[int, int]] = {
    _MODEL: {7: _GRAPH, 20: _TRAINING, 25: _FUNCTION},
    _GRAPH: {1: _NODE, 5: _TENSOR, 15: _SPARSE},
    _NODE: {5: _ATTRIBUTE},
    _ATTRIBUTE: {5: _TENSOR, 6: _GRAPH, 10: _TENSOR, 11: _GRAPH, 22: _SPARSE, 23: _SPARSE},
    _SPARSE: {1: _TENSOR, 2: _TENSOR},
    _FUNCTION: {7: _NODE, 11: _ATTRIBUTE},
    _TRAINING: {1: _GRAPH, 2: _GRAPH},
    _TENSOR: {13: _ENTRY},  # external_data: StringStringEntryProto
    _ENTRY: {},
}
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


class OnnxFormatError(ValueError):
    """The bytes are not an ONNX protobuf."""


def external_locations(data: bytes | mmap | memoryview) -> Generator[str, None, None]:
    """Every external-data `location` the model names, as it is found (duplicates kept): the
    caller may stop at the first it refuses. Memory stays O(nesting): one field iterator per
    open message, one location at a time."""
    with memoryview(data) as view:
        yield from _walk(view)


def _walk(view: memoryview) -> Generator[str, None, None]:
    if len(view) > MAX_BYTES:
        raise OnnxFormatError(
            f"it is {len(view)} bytes, over protobuf's 2 GiB; keep the weights as external data"
        )
    stack = [(_MODEL, _fields(view, 0, len(view)))]
    walked = 0
    while stack:
        kind, fields = stack[-1]
        step = next(fields, None)
        if step is None:
            stack.pop()
            continue
        walked += 1
        if walked > MAX_FIELDS:
            raise OnnxFormatError(
                f"its graph has more than {MAX_FIELDS} fields outside tensor data, more than "
                f"the agent reads"
            )
        number, wire, first, last = step
        child = _CHILDREN[kind].get(number)
        if child is None or wire != _LENGTH:
            continue
        if child == _ENTRY:
            location = _location(view, first, last)
            if location is not None:
                yield location
        elif len(stack) >= MAX_DEPTH:
            raise OnnxFormatError(f"messages nest deeper than {MAX_DEPTH} levels")
        else:
            stack.append((child, _fields(view, first, last)))


def _location(view: memoryview, start: int, end: int) -> str | None:
    """The value of an external_data entry whose key is `location` (None for other keys)."""
    is_location, value = False, (0, 0)
    for number, wire, first, last in _fields(view, start, end):
        if wire != _LENGTH:
            continue
        if number == 1:
            is_location = last - first == 8 and bytes(view[first:last]) == b"location"
        elif number == 2:
            value = (first, last)
    if not is_location:
        return None
    if value[1] - value[0] > MAX_PATH_BYTES:
        raise OnnxFormatError(
            f"an external-data location is {value[1] - value[0]} bytes, longer than any path"
        )
    return bytes(view[value[0] : value[1]]).decode("utf-8", errors="replace")


def _fields(view: memoryview, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, payload start, payload end) of each field in view[start:end]."""
    at = start
    while at < end:
        tag, at = _varint(view, at, end)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise OnnxFormatError(f"field number 0 at byte {at}")
        if wire == _VARINT:
            _, following = _varint(view, at, end)
            yield number, wire, at, following
            at = following
        elif wire == _LENGTH:
            size, first = _varint(view, at, end)
            if first + size > end:
                raise OnnxFormatError(f"a field at byte {at} runs past its message")
            yield number, wire, first, first + size
            at = first + size
        elif wire in (_FIXED64, _FIXED32):
            size = 8 if wire == _FIXED64 else 4
            if at + size > end:
                raise OnnxFormatError(f"a field at byte {at} runs past its message")
            yield number, wire, at, at + size
            at += size
        else:
            raise OnnxFormatError(f"wire type {wire} at byte {at} is not used by ONNX")


def _varint(view: memoryview, at: int, end: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= end or shift > 63:
            raise OnnxFormatError(f"a truncated number at byte {at}")
        byte = view[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
