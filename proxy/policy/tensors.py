"""What the inputs of a gRPC inference request declare, checked against the data it carries.

Triton 2.51 checks a gRPC input's data against its shape as elements times the datatype's size in
int64 arithmetic: `shape: [1, 2**62]` FP32 is 2**64 bytes, which wraps to 0, the size of an empty
`raw_input_contents`, so the request reached the Python backend and killed the model's stub (Triton
answered "Stub process 'add_one_0_0' is not healthy"). The relays therefore refuse a
ModelInferRequest (a unary call's, and each ModelStreamInfer message) unless, for every input:

- each dimension is an integer from 0 to 2**63-1 (an int64 varint past that is negative);
- its datatype is one Triton knows;
- with `raw_input_contents` (one per input, in the inputs' order, or none at all): a fixed-size
  datatype's elements times its size are exactly the raw bytes; BYTES elements are exactly the
  strings the raw bytes hold, each a 4-byte little-endian length and that many bytes, the last
  ending where the data ends;
- without: its typed `contents` hold exactly its elements (an input without any data has none).

Elements are counted by `shapes.element_count`, the REST check's arithmetic, bounded by the data
(a product of huge dimensions is never computed whole). The fields are read as a protobuf parser
reads them: repeated fields in all their occurrences, packed or not, the last `datatype`, fields
of another wire type ignored. Inputs must come before `raw_input_contents`, as serializers write
them, so that a message read in pieces (`InferScan`) knows which raw data are BYTES to walk.

Pure: it reads the bytes it is given. What it must not do: hold a tensor's data.
"""

from __future__ import annotations

import struct
from typing import Final

from proxy.policy import wire
from proxy.policy.refusals import MalformedRequestError
from proxy.policy.shapes import element_count
from proxy.policy.wire import FIXED32, FIXED64, LENGTH_DELIMITED, VARINT, WireError, varint, walk

DATATYPE_BYTES: Final = {
    b"BOOL": 1, b"UINT8": 1, b"INT8": 1, b"UINT16": 2, b"INT16": 2, b"FP16": 2, b"BF16": 2,
    b"UINT32": 4, b"INT32": 4, b"FP32": 4, b"UINT64": 8, b"INT64": 8, b"FP64": 8, b"BYTES": 0,
}  # fmt: skip
"""Each datatype Triton 2.51 knows, with its element's size in bytes (0: BYTES, variable)."""
INPUTS_HELD: Final = 64 * 1024
"""The most a message read in pieces may carry in its `inputs` (names, shapes and typed
contents), which are held until the message is whole; tensors that large go in
`raw_input_contents` (tritonclient's way), which is never held."""
_INT64: Final = 1 << 64
_ELEMENTS_BOUND: Final = 1 << 63
"""More elements than any message can carry data for: counted no further."""
_U32: Final = struct.Struct("<I").unpack_from
"""A BYTES element's length prefix."""
_INPUTS: Final = 5 << 3 | LENGTH_DELIMITED
_RAW: Final = 7 << 3 | LENGTH_DELIMITED
_AFTER_RAW: Final = (
    "the inference request has an input after its raw_input_contents; send the inputs first, as "
    "protobuf serializers write them"
)
_ENDING: Final = bytes(range(0x80))
"""The bytes that end a varint: deleted from packed varints, what is left are the others."""
_INPUTS_KEPT: Final = 256
_INPUT_BYTES: Final = 4096
_PARSED: Final[dict[bytes, Input]] = {}
"""The inputs read lately (`_input`): a client's requests repeat their names, datatypes and
shapes. At most _INPUTS_KEPT inputs of at most _INPUT_BYTES each."""


class Input:
    """One InferInputTensor as Triton reads it: name, datatype, shape, count of typed elements;
    with what they give, read once (an input is kept, `_PARSED`): its element's size (-1: a
    datatype Triton does not know) and its elements (-1: a dimension out of range; past
    _ELEMENTS_BOUND, a number past it)."""

    __slots__ = ("contents", "datatype", "dims", "elements", "name", "size", "typed")

    def __init__(
        self, name: bytes, datatype: bytes, dims: list[int], typed: int, contents: bool
    ) -> None:
        self.name = name
        self.datatype = datatype
        self.dims = dims
        self.typed = typed
        self.contents = contents
        self.size = DATATYPE_BYTES.get(datatype, -1)
        try:
            self.elements = element_count(dims, _ELEMENTS_BOUND)
        except MalformedRequestError:
            self.elements = -1


def _input(value: bytes) -> Input:
    """An InferInputTensor's fields; MalformedRequestError when they cannot be read."""
    kept = _PARSED.get(value)
    if kept is not None:
        return kept
    name = b""
    datatype = b""
    dims: list[int] = []
    typed = 0
    contents = False
    try:
        for number, kind, start, stop in walk(value):
            if kind == LENGTH_DELIMITED:
                if number == 1:
                    name = value[start:stop]
                elif number == 2:
                    datatype = value[start:stop]
                elif number == 3:  # packed int64 dimensions
                    while start < stop:
                        dim, start = varint(value, start)
                        dims.append(dim)
                    if start != stop:
                        raise WireError("the packed shape ends inside a dimension")
                elif number == 5:
                    contents = True
                    typed += _typed(value, start, stop)
            elif kind == VARINT and number == 3:
                dims.append(start)
    except WireError as e:
        raise MalformedRequestError(
            f"the inference request has an input that cannot be read ({e}); send inputs as "
            f"protobuf serializers write them"
        ) from None
    # int64 dimensions: a varint past 2**63-1 is a negative one, which `element_count` refuses.
    for at, dim in enumerate(dims):
        dim &= _INT64 - 1
        dims[at] = dim - _INT64 if dim >> 63 else dim
    parsed = Input(name, datatype, dims, typed, contents)
    if len(value) <= _INPUT_BYTES:
        if len(_PARSED) >= _INPUTS_KEPT:
            _PARSED.clear()
        _PARSED[value] = parsed
    return parsed


def _typed(value: bytes, pos: int, end: int) -> int:
    """The elements an InferTensorContents (`value[pos:end]`) holds, in all its fields."""
    count = 0
    for number, kind, start, stop in walk(value, pos, end):
        if kind == LENGTH_DELIMITED:
            length = stop - start
            if number == 8:  # bytes_contents: one element each
                count += 1
            elif number == 6 or number == 7:  # packed fp32, fp64
                size = 4 if number == 6 else 8
                if length % size:
                    raise WireError(f"packed contents field {number} is not whole values")
                count += length // size
            elif 1 <= number <= 5:  # packed varints: one per byte that ends one
                count += length - len(value[start:stop].translate(None, _ENDING))
        elif kind == VARINT:
            count += 1 <= number <= 5
        elif kind == FIXED32:
            count += number == 6
        else:
            count += number == 7
    return count


class StringWalk:
    """BYTES data fed in pieces: how many strings it holds (a 4-byte little-endian length, then
    that many bytes, each), or -1 from `finish` when the last one runs past the data's end."""

    __slots__ = ("_left", "_prefix", "count")

    def __init__(self) -> None:
        self.count = 0
        self._left = 0  # bytes of the current string still to come
        self._prefix = b""  # the first bytes of a length cut by the end of a piece

    def feed(self, data: bytes, pos: int, end: int) -> None:
        """The next bytes of the data, `data[pos:end]`."""
        if pos >= end:
            return
        left = self._left
        if left:  # the rest of a string begun in an earlier piece
            step = min(left, end - pos)
            pos += step
            self._left = left = left - step
            if left:
                return
        prefix = self._prefix
        if prefix:  # the rest of a length cut by the end of an earlier piece
            step = min(4 - len(prefix), end - pos)
            prefix += data[pos : pos + step]
            pos += step
            if len(prefix) < 4:
                self._prefix = prefix
                return
            self._prefix = b""
            self.count += 1
            left = _U32(prefix, 0)[0]
            step = min(left, end - pos)
            pos += step
            self._left = left = left - step
            if left:
                return
        count = self.count
        while pos + 4 <= end:
            pos += 4 + _U32(data, pos)[0]
            count += 1
        self.count = count
        if pos > end:
            self._left = pos - end
        elif pos < end:
            self._prefix = data[pos:end]

    def finish(self) -> int:
        return -1 if self._left or self._prefix else self.count


class InferScan(wire.MessageScan):
    """A ModelInferRequest read in pieces (`wire.MessageScan` calls `tensor_input` and `raw_*`
    as its fields pass), for `check` once it is whole: its inputs' fields are held (at most
    `held` bytes of them), raw data never (BYTES data is walked as it passes). It answers as
    `check_request` answers for the whole message."""

    __slots__ = ("_error", "_held", "_inputs", "_limit", "_raws", "_walk")

    def __init__(self, watch: bytes = b"", held: int = INPUTS_HELD) -> None:
        super().__init__(watch)
        self.tensors = True
        self._limit = held
        self._held = 0
        self._inputs: list[Input] = []
        self._raws: list[tuple[int, int]] = []
        """(bytes, strings: -1 when they run past the end, -2 when not walked) of each raw."""
        self._walk: StringWalk | None = None
        self._error = ""
        """Why the request is refused, once known: the first reason found."""

    def _refuse(self, why: str) -> None:
        if not self._error:
            self._error = why

    def tensor_input(self, value: bytes, length: int) -> None:
        """A whole `inputs` field `length` bytes long, of which `value` was kept."""
        if self._error:
            return
        self._held += length
        if self._held > self._limit or len(value) < length:
            self._refuse(
                f"the inference request's inputs carry more than {self._limit} bytes (names, "
                f"shapes and typed contents) in a message too large to hold; send large tensors "
                f"in raw_input_contents (tritonclient's way)"
            )
        elif self._raws:
            self._refuse(_AFTER_RAW)
        else:
            try:
                self._inputs.append(_input(value))
            except MalformedRequestError as e:
                self._refuse(str(e))

    def raw_begin(self, length: int) -> None:
        """A `raw_input_contents` field of `length` bytes begins."""
        index = len(self._raws)
        inputs = self._inputs
        if index < len(inputs) and inputs[index].datatype == b"BYTES" and not self._error:
            self._walk = StringWalk()

    def raw_feed(self, data: bytes, pos: int, end: int) -> None:
        walk = self._walk
        if walk is not None:
            walk.feed(data, pos, end)

    def raw_end(self, length: int) -> None:
        walk = self._walk
        self._raws.append((length, -2 if walk is None else walk.finish()))
        self._walk = None

    def check(self) -> None:
        """Refuse (MalformedRequestError) what the module docstring lists."""
        if self._error:
            raise MalformedRequestError(self._error)
        _check(self._inputs, self._raws)


def _check(inputs: list[Input], raws: list[tuple[int, int]]) -> None:
    """The rules of the module docstring, for the `inputs` of a request and its `raws`: (bytes,
    strings: -1 when they run past the end, -2 when not walked) of each raw_input_contents."""
    if raws and len(raws) != len(inputs):
        raise MalformedRequestError(
            f"the inference request's raw_input_contents number {len(raws)}, but it has "
            f"{len(inputs)} inputs; send one for each input, in the inputs' order, or none"
        )
    for index, tensor in enumerate(inputs):
        size = tensor.size
        if size < 0:
            known = ", ".join(_text(datatype) for datatype in DATATYPE_BYTES)
            raise _refusal(
                tensor,
                f"has the datatype '{_text(tensor.datatype)}', which Triton does not know",
                f"send one of {known}",
            )
        if raws:
            if tensor.contents:
                raise _refusal(
                    tensor,
                    "has typed contents beside raw_input_contents",
                    "send each input's data in one of them",
                )
            data, strings = raws[index]
            if size:
                elements = _elements(tensor, data // size)
                if elements * size != data:
                    raise _refusal(
                        tensor,
                        f"declares {_shown(tensor, elements, data // size)} of {size} "
                        f"bytes each, but its raw_input_contents has {data} bytes",
                        "declare the shape of the data it sends",
                    )
            else:
                elements = _elements(tensor, data // 4)
                if elements != strings:
                    raise _refusal(
                        tensor,
                        f"declares {_shown(tensor, elements, data // 4)}, but its "
                        f"raw_input_contents of {data} bytes "
                        + ("is not whole strings" if strings < 0 else f"holds {strings} strings"),
                        "send each BYTES element as its 4-byte little-endian length and "
                        "that many bytes",
                    )
        else:
            elements = _elements(tensor, tensor.typed)
            if elements != tensor.typed:
                raise _refusal(
                    tensor,
                    f"declares {_shown(tensor, elements, tensor.typed)}, but its contents "
                    f"hold {tensor.typed}",
                    "declare the shape of the data it sends",
                )


def check_request(message: bytes) -> None:
    """Refuse (MalformedRequestError) the whole ModelInferRequest `message` for what the module
    docstring lists; `message` is well-formed at its top level (`routing` read its name)."""
    inputs: list[Input] = []
    raws: list[tuple[int, int]] = []
    pos = 0
    end = len(message)
    try:
        while pos < end:
            key = message[pos]
            if key < 0x80:  # one-byte keys are the rule: no call for them
                pos += 1
            else:
                key, pos = varint(message, pos)
            kind = key & 7
            if kind == LENGTH_DELIMITED:
                length = message[pos] if pos < end else 0x80  # cut: the general reader's error
                if length < 0x80:
                    pos += 1
                else:
                    length, pos = varint(message, pos)
                stop = pos + length
                if key == _INPUTS:
                    if raws:
                        raise MalformedRequestError(_AFTER_RAW)
                    inputs.append(_input(message[pos:stop]))
                elif key == _RAW:
                    strings = -2
                    index = len(raws)
                    if index < len(inputs) and inputs[index].datatype == b"BYTES":
                        walk = StringWalk()
                        walk.feed(message, pos, min(stop, end))
                        strings = walk.finish()
                    raws.append((length, strings))
                pos = stop
            elif kind == VARINT:
                pos = varint(message, pos)[1]
            elif kind in (FIXED64, FIXED32):
                pos += 8 if kind == FIXED64 else 4
            else:
                raise WireError(f"field {key >> 3} has the unsupported wire type {kind}")
    except WireError as e:
        raise MalformedRequestError(
            f"the inference request cannot be read ({e}); send a serialized ModelInferRequest"
        ) from None
    if inputs or raws:
        _check(inputs, raws)


def _elements(tensor: Input, bound: int) -> int:
    """The input's elements (more than `bound` when they are), or `element_count`'s refusal of
    its shape, naming the input."""
    if tensor.elements >= 0:
        return tensor.elements
    try:
        return element_count(tensor.dims, bound)
    except MalformedRequestError as e:
        raise MalformedRequestError(
            f"the inference request's input '{_text(tensor.name)}': {e}"
        ) from None


def _refusal(tensor: Input, what: str, advice: str) -> MalformedRequestError:
    """The error naming `tensor`: "the inference request's input 'X' <what>; <advice>"."""
    return MalformedRequestError(
        f"the inference request's input '{_text(tensor.name)}' {what}; {advice}"
    )


def _shown(tensor: Input, elements: int, bound: int) -> str:
    """What the shape declares, for a refusal: its elements, or more than the data allows."""
    shape = ",".join(map(str, tensor.dims))[:80]
    counted = f"more than {bound}" if elements > bound else str(elements)
    return f"the shape [{shape}] ({counted} elements)"


def _text(value: bytes) -> str:
    return value[:128].decode("utf-8", "replace")
