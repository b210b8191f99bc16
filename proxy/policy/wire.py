"""Just enough of the protobuf wire format to route gRPC requests without decoding them.

Reads the top-level fields of a serialized message to find one string field (the model name),
and encodes the few tiny messages the proxy answers itself. It never decodes a whole message and
never allocates a copy of a tensor payload: length-delimited fields are skipped by their length.

Protobuf parsers keep the LAST occurrence of a repeated scalar field, so a request carrying the
name twice could pass a check on the first and reach Triton with the second. The scanner therefore
refuses any message where the field occurs more than once, even with equal values.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

VARINT: Final = 0
FIXED64: Final = 1
LENGTH_DELIMITED: Final = 2
FIXED32: Final = 5


class WireError(ValueError):
    """The bytes are not a well-formed message, or the looked-for field is ambiguous."""


class _TruncatedError(WireError):
    """The bytes end inside a varint: malformed for a whole message, "not yet" for a prefix."""


def varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at `pos` of `data` and the offset past it; WireError when cut or too long."""
    result = 0
    shift = 0
    end = len(data)
    while True:
        if pos >= end:
            raise _TruncatedError("the message ends inside a varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift >= 64:
            raise WireError("a varint is longer than 10 bytes")


def _skip_scalar(data: bytes, pos: int, field: int, wire_type: int) -> int:
    """The offset past a varint or fixed-size value of `field` starting at `pos`."""
    if wire_type == VARINT:
        return varint(data, pos)[1]
    if wire_type == FIXED64:
        return pos + 8
    if wire_type == FIXED32:
        return pos + 4
    raise WireError(f"field {field} has the unsupported wire type {wire_type}")


def walk(
    data: bytes, pos: int = 0, end: int = -1, *, prefix: bool = False
) -> Iterator[tuple[int, int, int, int]]:
    """The fields of `data[pos:end]` (`end` -1: the whole of `data`) in order, as a protobuf
    parser reads them: (number, wire type, start, stop) each, its value `data[start:stop]` but
    a varint's, which is decoded (`start` is the value itself); the next field begins at `stop`.

    WireError when a field runs past `end` or the bytes are not a message. With `prefix` (the
    first bytes of a message, the rest not arrived), a field cut by `end` ends the walk instead:
    given last (its `stop` past `end`) when its key and length were read, else not at all."""
    if end < 0:
        end = len(data)
    try:
        while pos < end:
            key = data[pos]
            pos += 1
            if key > 0x7F:  # one-byte keys and lengths are the rule: no call for them
                key, pos = varint(data, pos - 1)
            number, kind = key >> 3, key & 7
            if kind == LENGTH_DELIMITED:
                if pos < end and data[pos] < 0x80:
                    start = pos + 1
                    pos = start + data[pos]
                else:
                    length, start = varint(data, pos)
                    pos = start + length
            elif kind == VARINT:
                start, pos = varint(data, pos)
            elif kind in (FIXED64, FIXED32):
                start = pos
                pos += 8 if kind == FIXED64 else 4
            else:
                raise WireError(f"field {number} has the unsupported wire type {kind}")
            if pos > end:
                if prefix:
                    yield number, kind, start, pos
                    return
                raise WireError(f"field {number} runs past its end")
            yield number, kind, start, pos
    except _TruncatedError:
        if not prefix:
            raise


def string_fields(data: bytes, numbers: tuple[int, ...]) -> dict[int, bytes]:
    """The raw values of the top-level length-delimited fields `numbers`, each seen at most once.

    Raises WireError when the message is malformed, when one of `numbers` has another wire type,
    or when one of them occurs more than once.
    """
    found: dict[int, bytes] = {}
    pos = 0
    end = len(data)
    while pos < end:
        key = data[pos]
        if key < 0x80:  # one-byte keys and lengths are the rule: no call for them
            pos += 1
        else:
            key, pos = varint(data, pos)
        number = key >> 3
        wire_type = key & 7
        if number == 0:
            raise WireError("the message has a field number 0")
        if wire_type == LENGTH_DELIMITED:
            if pos < end and data[pos] < 0x80:
                length = data[pos]
                pos += 1
            else:
                length, pos = varint(data, pos)
            stop = pos + length
            if stop > end:
                raise WireError(f"field {number} claims {length} bytes past the message's end")
            if number in numbers:
                if number in found:
                    raise WireError(f"field {number} occurs more than once")
                found[number] = data[pos:stop]
            pos = stop
            continue
        if number in numbers:
            raise WireError(f"field {number} has wire type {wire_type}, not a string")
        pos = _skip_scalar(data, pos, number, wire_type)
        if pos > end:
            raise WireError(f"field {number} runs past the message's end")
    return found


def prefix_string(data: bytes, number: int, *, ordered: bool = False) -> bytes | None:
    """The first value of the top-level length-delimited field `number` in `data`, the first bytes
    of a message whose rest has not arrived yet; None while the prefix ends before it is complete.

    With `ordered`, a field numbered higher than `number` seen first means the field is absent
    (b""), since serializers write fields in number order; only use that where a crafted order
    costs nothing. Raises WireError when the prefix is malformed or `number` has another wire type.
    Later occurrences (a duplicate) can only be seen in the whole message, by `string_fields`.
    """
    for field, wire_type, start, stop in walk(data, prefix=True):
        if field == 0:
            raise WireError("the message has a field number 0")
        if field == number and wire_type != LENGTH_DELIMITED:
            raise WireError(f"field {number} has wire type {wire_type}, not a string")
        if ordered and field > number:
            return b""
        if field == number:
            return data[start:stop] if stop <= len(data) else None
    return None


def model_name(data: bytes, number: int = 1) -> bytes:
    """The model name field (empty when absent), refusing a duplicated or malformed one.

    Read on every unary call, so the shape every serializer writes (top-level fields that are all
    length-delimited, with one-byte keys) is walked by a loop of its own; anything else (a scalar
    field, a long key, a duplicate, a field past the end) is handed to `string_fields` from the
    start, so the answer and every error are exactly its own."""
    wanted = number << 3 | LENGTH_DELIMITED
    name = None
    pos = 0
    end = len(data)
    try:
        while pos < end:
            key = data[pos]
            if key & 0x87 != LENGTH_DELIMITED or key == LENGTH_DELIMITED:
                break  # a scalar, a long key or field number 0
            length = data[pos + 1]  # IndexError at the end: the general reader's error
            if length > 0x7F:
                length, pos = varint(data, pos + 1)
            else:
                pos += 2
            if key == wanted:
                if name is not None:
                    break
                name = data[pos : pos + length]
            pos += length
        else:
            if pos == end:
                return b"" if name is None else name
    except (IndexError, WireError):
        pass
    return string_fields(data, (number,)).get(number, b"")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_string(number: int, value: bytes) -> bytes:
    """One length-delimited field."""
    return _encode_varint(number << 3 | LENGTH_DELIMITED) + _encode_varint(len(value)) + value


def encode_bool(number: int, value: bool) -> bytes:
    """One bool field; proto3 omits a false one."""
    return _encode_varint(number << 3 | VARINT) + b"\x01" if value else b""


def without_field(data: bytes, number: int) -> bytes:
    """`data` with every top-level occurrence of field `number` removed (other bytes untouched)."""
    out = bytearray()
    begin = 0
    for field, _, _, stop in walk(data):
        if field != number:
            out += data[begin:stop]
        begin = stop
    return bytes(out)


def with_string_value(data: bytes, number: int, value: bytes) -> bytes:
    """`data` with the value of its one top-level string field `number` (checked by
    `model_name` or `string_fields`: present exactly once) replaced by `value`, in its place;
    every other byte as it was."""
    key = number << 3 | LENGTH_DELIMITED
    if len(data) > 1 and data[0] == key and data[1] < 0x80:  # first, as serializers write it
        return encode_string(number, value) + data[2 + data[1] :]
    begin = 0
    for field, kind, _, stop in walk(data):
        if field == number and kind == LENGTH_DELIMITED:
            return data[:begin] + encode_string(number, value) + data[stop:]
        begin = stop
    return data + encode_string(number, value)


def with_string_field(data: bytes, number: int, value: bytes) -> bytes:
    """`data` with field `number` set to `value` exactly once."""
    return without_field(data, number) + encode_string(number, value)


def fields(data: bytes) -> list[tuple[int, int, bytes | int]]:
    """The top-level fields of `data` in order: (number, wire type, value: the bytes of a
    length-delimited one, the varint of a varint one, 0 for a fixed one). A field cut by the
    end of `data` ends the list (a prefix reads as far as it goes)."""
    out: list[tuple[int, int, bytes | int]] = []
    try:
        for number, kind, start, stop in walk(data, prefix=True):
            if kind == LENGTH_DELIMITED:
                out.append((number, kind, data[start:stop]))  # cut: what there is
            else:
                out.append((number, kind, start if kind == VARINT else 0))
    except WireError:
        pass
    return out


def bool_parameter(entry: bytes, key: bytes) -> bool | None:
    """The bool value of a `map<string, InferParameter>` entry if its key is `key`, else None."""
    name = b""
    value = False
    for number, wire_type, content in fields(entry):
        if number == 1 and wire_type == LENGTH_DELIMITED:
            assert isinstance(content, bytes)
            name = content
        elif number == 2 and wire_type == LENGTH_DELIMITED:
            assert isinstance(content, bytes)
            value = any(
                n == 1 and t == VARINT and bool(v) for n, t, v in fields(content)
            )  # bool_param
    return value if name == key else None


# MessageScan states.
_KEY: Final = 0  # reading a field's key (a varint)
_LENGTH: Final = 1  # reading a length-delimited field's length
_SCALAR: Final = 2  # skipping a varint value
_SKIP: Final = 3  # skipping `_left` bytes (a fixed-size value, or a field nobody looks for)
_VALUE: Final = 4  # keeping `_left` bytes of a field looked for (first CAPTURE of them)
_BROKEN: Final = 5  # malformed: nothing after it can be read
_RAW: Final = 6  # passing `_left` bytes of a raw_input_contents to `raw_feed`

CAPTURE: Final = 64 * 1024
"""The most kept of one looked-for field's value. Model ids are at most 128 bytes, so a longer
value is another model's name whatever its first bytes; it is kept this far for the answer."""


class MessageScan:
    """The top-level fields 1 (model name) and 3 (request id) of a message fed in pieces, for a
    message too large to hold whole: `string_fields(message, (1,))` and `(3,)` with the same
    answers and errors, without keeping more than CAPTURE bytes of it.

    `feed` the message's bytes in order, then `finish`; `fields(number)` then answers what
    `string_fields(message, (number,))` would: the value (or b"" when absent), or raises its
    WireError.

    With `tensors` set (by `policy.tensors.InferScan`, which overrides the hooks below), each
    field 5 (a ModelInferRequest's `inputs`, kept up to CAPTURE bytes) goes to `tensor_input`
    and each field 7 (`raw_input_contents`, never kept) to `raw_begin`, `raw_feed`, `raw_end`.
    """

    __slots__ = (
        "_errors",
        "_field",
        "_left",
        "_length",
        "_shift",
        "_state",
        "_value",
        "_values",
        "_varint",
        "_watch",
        "tensors",
        "watched",
    )

    def __init__(self, watch: bytes = b"") -> None:
        self._state = _KEY
        self._varint = 0
        self._shift = 0
        self._field = 0
        self._length = 0
        self._left = 0
        self._value = bytearray()
        self._values: dict[int, bytes] = {}
        self._errors: dict[int, str] = {}
        """The first error `string_fields` would raise looking for field 1, field 3; a message
        broken for both is keyed 0."""
        self._watch = watch
        self.tensors = False
        self.watched = False
        """With `watch`: the bool value of the last field-4 map entry (a ModelInferRequest's
        `parameters`) keyed `watch`, as a parser keeps it (`bool_parameter`)."""

    def _fail(self, number: int, why: str) -> None:
        if number not in self._errors:
            self._errors[number] = why

    def _break(self, why: str) -> None:
        self._fail(1, why)
        self._fail(3, why)
        self._state = _BROKEN

    def _read_varint(self, data: bytes, pos: int, end: int) -> int:
        """Advance over a varint's bytes; -1 while it is incomplete, else the offset past it."""
        while pos < end:
            byte = data[pos]
            pos += 1
            self._varint |= (byte & 0x7F) << self._shift
            if byte < 0x80:
                return pos
            self._shift += 7
            if self._shift >= 64:
                self._break("a varint is longer than 10 bytes")
                return end
        return -1

    def feed(self, data: bytes) -> None:
        """The next bytes of the message."""
        pos = 0
        end = len(data)
        while pos < end:
            state = self._state
            if state == _SKIP:
                step = min(self._left, end - pos)
                self._left -= step
                pos += step
                if not self._left:
                    self._state = _KEY
                continue
            if state == _VALUE:
                step = min(self._left, end - pos)
                room = CAPTURE - len(self._value)
                if room > 0:
                    self._value += data[pos : pos + min(step, room)]
                self._left -= step
                pos += step
                if not self._left:
                    self._value_done()
                continue
            if state == _RAW:
                step = min(self._left, end - pos)
                self.raw_feed(data, pos, pos + step)
                self._left -= step
                pos += step
                if not self._left:
                    self._state = _KEY
                    self.raw_end(self._length)
                continue
            if state == _BROKEN:
                return
            pos = self._read_varint(data, pos, end)
            if pos < 0:
                return
            if self._state == _BROKEN:
                return
            value = self._varint
            self._varint = self._shift = 0
            if state == _KEY:
                self._key(value)
            elif state == _LENGTH:
                self._length = self._left = value
                field = self._field
                if field in (1, 3) or (field == 4 and self._watch) or (field == 5 and self.tensors):
                    self._value = bytearray()
                    self._state = _VALUE if value else _KEY
                    if not value:
                        self._value_done()
                elif field == 7 and self.tensors:
                    self.raw_begin(value)
                    self._state = _RAW if value else _KEY
                    if not value:
                        self.raw_end(0)
                else:
                    self._state = _SKIP if value else _KEY
            else:  # _SCALAR: a varint value skipped
                self._state = _KEY

    def _key(self, key: int) -> None:
        number = key >> 3
        wire_type = key & 7
        self._field = number
        if number == 0:
            self._break("the message has a field number 0")
            return
        if wire_type == LENGTH_DELIMITED:
            self._state = _LENGTH
            return
        if number in (1, 3):
            self._fail(number, f"field {number} has wire type {wire_type}, not a string")
        if wire_type == VARINT:
            self._state = _SCALAR
        elif wire_type in (FIXED64, FIXED32):
            self._left = 8 if wire_type == FIXED64 else 4
            self._length = 0  # not length-delimited: a cut value "runs past" the end
            self._state = _SKIP
        else:
            self._break(f"field {number} has the unsupported wire type {wire_type}")

    def _value_done(self) -> None:
        number = self._field
        if number == 4:
            value = bool_parameter(bytes(self._value), self._watch)
            if value is not None:
                self.watched = value
        elif number == 5:
            self.tensor_input(bytes(self._value), self._length)
        elif number in self._values:
            self._fail(number, f"field {number} occurs more than once")
        else:
            self._values[number] = bytes(self._value)
        self._value = bytearray()
        self._state = _KEY

    def finish(self) -> None:
        """The message is whole: an unfinished field is the error `string_fields` gives."""
        state = self._state
        if (state == _KEY and self._shift) or state in (_LENGTH, _SCALAR):
            self._break("the message ends inside a varint")
        elif state in (_VALUE, _RAW) or (state == _SKIP and self._length):
            self._break(f"field {self._field} claims {self._length} bytes past the message's end")
        elif state == _SKIP:
            self._break(f"field {self._field} runs past the message's end")

    def tensor_input(self, value: bytes, length: int) -> None:
        """A whole field 5 `length` bytes long, of which `value` was kept (with `tensors`)."""

    def raw_begin(self, length: int) -> None:
        """A field 7 of `length` bytes begins (with `tensors`)."""

    def raw_feed(self, data: bytes, pos: int, end: int) -> None:
        """The next bytes of the field 7 begun, `data[pos:end]` (with `tensors`)."""

    def raw_end(self, length: int) -> None:
        """The field 7 begun, `length` bytes long, is whole (with `tensors`)."""

    def field(self, number: int) -> bytes:
        """Field 1's or 3's value (b"" when absent); raises WireError as `string_fields` would."""
        error = self._errors.get(number)
        if error is not None:
            raise WireError(error)
        return self._values.get(number, b"")
