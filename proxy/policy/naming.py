"""A model's private name in Triton, mapped back to its public id in Triton's answers.

The agent loads each pod's model into the node's shared Triton under a private name;
clients name the public model id, and the relays map requests to the private name
(`policy.routing`). Triton's answers name the private name: this module puts the public id back,
byte for byte as a Triton serving the model under that id would have written them, so a client
never sees the private name:

- gRPC answers, by the response type of each RPC: `model_name` of ModelInferResponse (and of a
  ModelStreamInferResponse's `infer_response`), the `name` of ModelMetadataResponse, of
  ModelConfigResponse's `config` and of each ModelStatisticsResponse `model_stats`; an in-stream
  `error_message` (and a call's `grpc-message`) with every occurrence of the private name
  replaced. `AnswerNames` does it on a stream's DATA as it comes: a message up to HOLD bytes is
  renamed whole; a larger one (only inference answers are) from its first bytes, where
  serializers write the name, and the rest passes as it came.
- REST JSON answers (`rename_json`): the `"model_name":"..."` and `"name":"..."` members whose
  value is the private name, and any occurrence of it in an error body. The member pattern holds
  raw quotes, which cannot occur inside a JSON string (they are escaped there), so only members
  match, never a tensor's string data.

What it must not do: hold a whole large message (HOLD bounds what one stream keeps), read
compressed answers (the relays ask Triton for uncompressed ones; one that comes compressed
anyway is a NamingError, never passed on with the private name), or do I/O.
"""

from __future__ import annotations

from typing import Final

from proxy.policy.wire import (
    LENGTH_DELIMITED,
    WireError,
    _encode_varint,
    _skip_scalar,
    encode_string,
    varint,
)

HOLD: Final = 64 * 1024
"""Answers up to this size are renamed whole; a larger one must show its name in its first HOLD
bytes (Triton writes it first). Below Triton's 1 MiB stream window, so holding never stalls it."""


class NamingError(ValueError):
    """An answer of Triton's cannot be renamed safely (compressed, or its name not where Triton
    writes it): the relay fails the call rather than pass the private name on."""


class Spec:
    """Where one protobuf message type carries the model's name: `exact` fields hold the name
    alone, `text` fields a message that may quote it, `derived` fields a name Triton derives
    from it (`<name>_<n>`, an instance group's), `nested` fields a message of their own."""

    __slots__ = ("chain", "derived", "exact", "nested", "text")

    def __init__(
        self,
        exact: frozenset[int] = frozenset(),
        text: frozenset[int] = frozenset(),
        nested: dict[int, Spec] | None = None,
        chain: tuple[int, ...] = (),
        derived: frozenset[int] = frozenset(),
    ) -> None:
        self.exact: Final = exact
        self.text: Final = text
        self.derived: Final = derived
        self.nested: Final[dict[int, Spec]] = nested or {}
        self.chain: Final = chain
        """For a message too large to hold: the fields leading to its one name, each the first
        field of its message as serializers write them (empty: it may not be that large)."""


_NAMED: Final = Spec(exact=frozenset({1}), chain=(1,))
ANSWERS: Final[dict[str, Spec]] = {
    "ModelInfer": _NAMED,  # ModelInferResponse.model_name
    "ModelStreamInfer": Spec(text=frozenset({1}), nested={2: _NAMED}, chain=(2, 1)),
    "ModelMetadata": Spec(exact=frozenset({1})),  # ModelMetadataResponse.name
    # .config.name, and .config.instance_group[].name, which Triton derives from it
    "ModelConfig": Spec(
        nested={1: Spec(exact=frozenset({1}), nested={7: Spec(derived=frozenset({1}))})}
    ),
    "ModelStatistics": Spec(nested={1: Spec(exact=frozenset({1}))}),  # .model_stats[].name
}
"""The answers that name the model, by RPC; the others (readiness, server-wide) name none."""


def rename_message(spec: Spec, message: bytes, private: bytes, public: bytes) -> bytes:
    """`message` with the private name put back to the public id where `spec` says; the very
    object when nothing changed. Raises NamingError for a malformed message."""
    if spec.chain:
        # An inference answer names the model once, first, as serializers write it: renamed
        # there without walking the rest (an unusual one is walked whole below).
        try:
            head = _head(spec, spec.chain, message, private, public)
        except (NamingError, WireError):
            head = None
        if head is not None:
            sent, consumed, _grew = head
            return message if sent == message[:consumed] else sent + message[consumed:]
    try:
        return _rename(spec, message, private, public)
    except (WireError, IndexError) as e:
        raise NamingError(f"Triton's answer is not a well-formed message ({e})") from e


def _rename(spec: Spec, data: bytes, private: bytes, public: bytes) -> bytes:
    out: list[bytes] = []
    done = 0  # data[:done] is in `out` already
    pos = 0
    end = len(data)
    while pos < end:
        key, pos = varint(data, pos)
        number = key >> 3
        wire_type = key & 7
        if wire_type != LENGTH_DELIMITED:
            pos = _skip_scalar(data, pos, number, wire_type)
            continue
        start = pos
        length, pos = varint(data, pos)
        stop = pos + length
        if stop > end:
            raise NamingError(f"field {number} runs past the answer's end")
        value = data[pos:stop]
        if number in spec.exact:
            new = public if value == private else value
        elif number in spec.text:
            new = value.replace(private, public)
        elif number in spec.derived:
            derived = private + b"_"
            new = public + value[len(private) :] if value.startswith(derived) else value
        else:
            inner = spec.nested.get(number)
            new = value if inner is None else _rename(inner, value, private, public)
        if new is not value and new != value:
            out.append(data[done:start])
            out.append(_encode_varint(len(new)))
            out.append(new)
            done = stop
        pos = stop
    if pos > end:
        raise NamingError("the answer's last field runs past its end")
    if not out:
        return data
    out.append(data[done:])
    return b"".join(out)


def rename_head(
    spec: Spec, head: bytes, private: bytes, public: bytes
) -> tuple[bytes, int, int] | None:
    """For a message too large to hold, of which `head` are the first bytes: (the bytes to send
    instead of `head[:consumed]`, consumed, how much longer the message gets), or None while
    `head` ends before the name along `spec.chain` is whole. Fields before the chain's first may
    only be `text` fields (renamed). Raises NamingError when `spec` has no chain, when another
    field comes first (the rest passes unread, so a name out of serializers' order could pass),
    or when the message is malformed."""
    if not spec.chain:
        raise NamingError("only an inference answer may be too large to rename whole")
    try:
        return _head(spec, spec.chain, head, private, public)
    except WireError as e:
        raise NamingError(f"Triton's answer is not a well-formed message ({e})") from e


def _head(
    spec: Spec, chain: tuple[int, ...], data: bytes, private: bytes, public: bytes
) -> tuple[bytes, int, int] | None:
    out: list[bytes] = []
    grew = 0
    pos = 0
    end = len(data)
    want = chain[0]
    while True:
        if pos >= end:
            return None
        try:
            key, after = varint(data, pos)
        except WireError:
            return None  # the key itself is cut: wait for more (a bad one is caught whole)
        number = key >> 3
        if number > want or key & 7 != LENGTH_DELIMITED:
            # Absent, or later than serializers write it: what passes unread might name it.
            raise NamingError(f"field {number} comes before the model's name in Triton's answer")
        try:
            length, value_at = varint(data, after)
        except WireError:
            return None
        stop = value_at + length
        if number == want:
            if len(chain) == 1:
                if stop > end:
                    return None
                value = data[value_at:stop]
                field = encode_string(number, public if value == private else value)
                out.append(field)
                return b"".join(out), stop, grew + len(field) - (stop - pos)
            nested = spec.nested[want]
            inner = _head(nested, chain[1:], data[value_at : min(stop, end)], private, public)
            if inner is None:
                return None
            sent, consumed, inner_grew = inner
            new_length = _encode_varint(length + inner_grew)
            out.append(data[pos:after])
            out.append(new_length)
            out.append(sent)
            grew += inner_grew + len(new_length) - (value_at - after)
            return b"".join(out), value_at + consumed, grew
        if number not in spec.text:
            raise NamingError(f"field {number} comes before the model's name in Triton's answer")
        if stop > end:
            return None
        new = data[value_at:stop].replace(private, public)
        out.append(encode_string(number, new))
        grew += len(out[-1]) - (stop - pos)
        pos = stop


def rename_json(body: bytes, json: int, error: bool, private: bytes, public: bytes) -> bytes:
    """A REST answer's `body` with the private name put back to the public id: in its first
    `json` bytes (the JSON header of the binary tensor extension; -1: all of it), the members
    `"model_name"` and `"name"` whose value it is (or, for `"name"`, begins with it and `_`:
    an instance group's name Triton derived from it), and with `error` (an error body) every
    occurrence. The very object when nothing changed."""
    end = len(body) if json < 0 else json
    at = body.find(private, 0, end)
    if at < 0:
        return body
    if error:
        new = body[:end].replace(private, public)
        return new if json < 0 else new + body[json:]
    # Each occurrence is renamed where it is a member's whole value (or an instance group's
    # derived `<name>_<n>`): one search through the body, most often one occurrence.
    out: list[bytes] = []
    done = 0
    size = len(private)
    while at >= 0:
        after = body[at + size : at + size + 1]
        if (body.endswith(_MODEL_NAME, 0, at) and after == b'"') or (
            body.endswith(_NAME, 0, at) and after in (b'"', b"_")
        ):
            out.append(body[done:at])
            out.append(public)
            done = at + size
        at = body.find(private, at + size, end)
    if not out:
        return body
    out.append(body[done:])
    return b"".join(out)


_MODEL_NAME: Final = b'"model_name":"'
_NAME: Final = b'"name":"'


def name_fields(private: bytes, public: bytes) -> tuple[bytes, bytes]:
    """The name field (1) of the private name and of the public id, made once per relay for
    `AnswerNames` (the common answer is spliced at that field)."""
    return encode_string(1, private), encode_string(1, public)


def spliced(spec: Spec, data: bytes, first: bytes, renamed: bytes) -> bytes | None:
    """`data` renamed, when it is one whole uncompressed ModelInferResponse (`spec`) naming the
    model first (`first`, the private name's field; `renamed`, the public id's: `name_fields`),
    as Triton writes its inference answers; else None (`AnswerNames` reads it). What
    `AnswerNames.feed` answers for such `data` at a message boundary, without the object: the
    relay asks this first, so a unary call's one answer makes no `AnswerNames`."""
    if (
        spec is _NAMED
        and len(data) > 5
        and data[0] == 0
        and data[1] << 24 | data[2] << 16 | data[3] << 8 | data[4] == len(data) - 5
        and data[5 : 5 + len(first)] == first
    ):
        # (Its prefix read by index and its name by a slice: compiled (mypyc), `int.from_bytes`
        # and `startswith` with a start are calls by name.)
        size = len(data) - 5 + len(renamed) - len(first)
        return b"\x00" + size.to_bytes(4, "big") + renamed + data[5 + len(first) :]
    return None


class AnswerNames:
    """Renames the answers of one gRPC call as Triton's DATA comes: `feed` each DATA payload,
    send on what it returns (b"" while it holds the start of a message). `owed` counts the
    bytes of Triton's taken since the last non-empty return, for the caller's flow control."""

    __slots__ = (
        "_first",
        "_held",
        "_left",
        "_private",
        "_public",
        "_renamed_first",
        "_spec",
        "owed",
    )

    def __init__(
        self, spec: Spec, private: bytes, public: bytes, first: bytes = b"", renamed: bytes = b""
    ) -> None:
        self._spec = spec
        self._private = private
        self._public = public
        self._held = b""  # the start of a message, not yet renamed
        self._left = 0  # bytes of a large message still to pass as they come
        self.owed = 0
        # For a ModelInferResponse: its first field, the name, before and after (`name_fields`).
        self._first = first if spec is _NAMED else b""
        self._renamed_first = renamed

    def feed(self, data: bytes) -> bytes:
        """The bytes to send the tenant for `data`, the next bytes of Triton's answer."""
        first = self._first
        if first and not self._held and not self._left:
            # One whole inference answer, naming the model first: the common case, spliced.
            whole = spliced(self._spec, data, first, self._renamed_first)
            if whole is not None:
                return whole
        out: list[bytes] = []
        if self._held:
            data = self._held + data
            self._held = b""
        pos = 0
        end = len(data)
        while pos < end:
            left = self._left
            if left:
                step = min(left, end - pos)
                out.append(data[pos : pos + step] if step < end or pos else data)
                self._left = left - step
                pos += step
                continue
            if end - pos < 5:
                break
            if data[pos]:
                raise NamingError(
                    "Triton sent a compressed answer, which cannot be renamed: Triton must be "
                    "left to answer uncompressed (no --grpc-infer-response-compression-level)"
                )
            size = int.from_bytes(data[pos + 1 : pos + 5], "big")
            stop = pos + 5 + size
            if size <= HOLD:
                if stop > end:
                    break
                message = data[pos + 5 : stop]
                new = rename_message(self._spec, message, self._private, self._public)
                if new is message:
                    out.append(data[pos:stop] if pos or stop < end else data)
                else:
                    out.append(b"\x00" + len(new).to_bytes(4, "big"))
                    out.append(new)
                pos = stop
                continue
            head = data[pos + 5 : min(stop, pos + 5 + HOLD)]
            renamed = rename_head(self._spec, head, self._private, self._public)
            if renamed is None:
                if len(head) >= HOLD:
                    raise NamingError("Triton's large answer does not name the model first")
                break
            sent, consumed, grew = renamed
            out.append(b"\x00" + (size + grew).to_bytes(4, "big"))
            out.append(sent)
            pos += 5 + consumed
            self._left = size - consumed
        if pos < end:
            self._held = data[pos:]
        return b"".join(out)

    @property
    def holding(self) -> bool:
        """Part of a message waits here for the rest of it."""
        return bool(self._held)
