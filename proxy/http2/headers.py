"""HPACK for the gRPC relay: decoding that remembers the header blocks a peer sends again and again,
and encoding for Triton that indexes as a peer's own encoder would.

A gRPC client sends nearly the same headers on every call, and once its encoder has them in its
dynamic table the header block is the same few bytes each time; Triton's response heads and
trailers repeat the same way. Decoding with `hpack` costs tens of microseconds a block in pure
Python, the largest share of the relay's own work per call, so `BlockDecoder` keeps what each
block decoded to, and reuses it while that stays true.

Why reuse is exact: a block's fields are a function of its bytes and the dynamic table. A block
that leaves the table as it found it (indexed fields and literals without indexing only) is kept;
a block that changes the table (an insertion, an eviction, a size update) is decoded every time
and makes everything kept before it stale, since indices now point at other entries. Every block
still goes through here, so the table never falls out of step with the peer's encoder.

`BlockEncoder` encodes the request headers the relay sends Triton with a dynamic table of its own
(Triton's decoder is in step with it because every block it encodes is sent, in order), so a
repeated call costs Triton a few indexed bytes to decode instead of a few hundred bytes of
literals, as when a client talks to Triton directly; the same reuse rule keeps it cheap for us.

What is kept is bounded by what it holds, not by the blocks' own bytes: a 1 KiB block of one-byte
indexed fields decodes to 1,024 fields, so each entry is counted by its decoded fields
(`fields_size`), and a memory keeps at most `KEPT_ENTRY_BYTES` an entry and `KEPT_BYTES` in all.

What it must not do: skip a block, reuse a result across a change of a table, encode a block
that is then not sent, or keep more than `KEPT_BYTES` for a peer, whatever it sends.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, TypeVar

from hpack import Decoder, Encoder
from hpack.table import HeaderTable

K = TypeVar("K")
V = TypeVar("V")

Fields = tuple[tuple[bytes, bytes], ...]

KEPT_ENTRIES: Final = 128
"""Distinct blocks (or header lists) one memory keeps; past that it starts again."""
KEPT_BYTES: Final = 32 * 1024
"""What one memory may hold, counted as `fields_size` counts (a peer's repeated blocks are a few:
a grpcio request head counts about 2 KiB, so 16 distinct ones are kept); past that it starts
again. A tenant connection has two (its decoder's and the relay's plans), which
`gateway.budget` counts."""
KEPT_ENTRY_BYTES: Final = 8 * 1024
"""Larger entries (many fields, long literal values) are decoded every time: they rarely repeat,
and a 1 KiB block of one-byte indexed fields decodes to 1,024 fields (about 72 KiB)."""
FIELD_BYTES: Final = 168
"""What one decoded field holds past its name's and value's lengths, at most: its tuple (72 bytes
with its GC header), its name and value when they are literals (two bytes objects, 33 bytes and
the allocator's rounding each), its place in the list (8). Indexed fields share the table's bytes,
so this counts them high."""
ENTRY_BYTES: Final = 160
"""An entry's own cost: the list's tuple, the key's bytes object and its slot in the dict."""


def fields_size(fields: Fields) -> int:
    """What `fields` decoded hold in memory, at most (`FIELD_BYTES` each, and their bytes)."""
    size = FIELD_BYTES * len(fields)
    for name, value in fields:
        size += len(name) + len(value)
    return size


def _changed(table: HeaderTable, before: tuple[object, int, int]) -> bool:
    """Whether `table` differs from the `_state` taken before: a new newest entry (by identity:
    an equal entry inserted again still shifts every index), another length, another size."""
    newest, count, size = before
    now = _state(table)
    return now[0] is not newest or now[1] != count or now[2] != size


def _state(table: HeaderTable) -> tuple[object, int, int]:
    # Entries as plain objects: compiled (mypyc), a `tuple[bytes, bytes]` read from the deque is
    # unpacked and packed again into a new tuple, and `_changed` compares by identity.
    entries: Sequence[object] = table.dynamic_entries
    return (entries[0] if entries else None, len(entries), table.maxsize)


def keep(kept: dict[K, V], key: K, value: V, size: int, held: int) -> int:
    """Remember `value` under `key` unless its `size` (counted as `fields_size` counts) is over
    `KEPT_ENTRY_BYTES`; past `KEPT_ENTRIES` or `KEPT_BYTES` the memory starts again. `held` is
    what `kept` holds now, counted so; returns what it holds after."""
    if size > KEPT_ENTRY_BYTES:
        return held
    if len(kept) >= KEPT_ENTRIES or held + size > KEPT_BYTES:
        kept.clear()
        held = 0
    kept[key] = value
    return held + size


class BlockDecoder:
    """One peer's HPACK decoder (a connection direction) with a memory of repeated blocks."""

    __slots__ = ("_decoder", "_kept", "_table", "kept_bytes")

    def __init__(self) -> None:
        self._decoder = Decoder()
        self._table = self._decoder.header_table
        self._kept: dict[bytes, Fields] = {}
        self.kept_bytes = 0
        """What the kept blocks hold, counted as `fields_size` counts (at most `KEPT_BYTES`)."""

    @property
    def max_allowed_table_size(self) -> int:
        """The largest table the peer may ask for (our SETTINGS_HEADER_TABLE_SIZE)."""
        return self._decoder.max_allowed_table_size

    @max_allowed_table_size.setter
    def max_allowed_table_size(self, size: int) -> None:
        self._decoder.max_allowed_table_size = size
        self._forget()  # a block's validity may depend on the bound: decode afresh

    def _forget(self) -> None:
        self._kept.clear()
        self.kept_bytes = 0

    def decode(self, block: bytes) -> Fields:
        """The (name, value) fields of `block`; raises `hpack.HPACKError` when it is malformed."""
        fields = self._kept.get(block)
        if fields is not None:
            return fields
        before = _state(self._table)
        try:
            # hpack's own field tuples: a never-indexed one stays marked, for the encoder of
            # the next hop (RFC 7541 6.2.3: an intermediary keeps that representation).
            fields = tuple(self._decoder.decode(block, raw=True))
        except Exception:
            self._forget()  # it may have changed the table before it failed
            raise
        if _changed(self._table, before):
            self._forget()  # the table changed: indices in kept blocks may mean other fields
        elif len(block) <= KEPT_ENTRY_BYTES:  # by what it decodes to, not by its own few bytes
            size = ENTRY_BYTES + len(block) + fields_size(fields)
            self.kept_bytes = keep(self._kept, block, fields, size, self.kept_bytes)
        return fields


class BlockEncoder:
    """The HPACK encoder for one connection to Triton, with a memory of repeated header lists.

    Every block `encode` returns must be sent, in order: Triton's decoder follows this table.
    """

    __slots__ = (
        "_encoder",
        "_kept",
        "_kept_bytes",
        "_last",
        "_last_block",
        "_previous",
        "_previous_block",
    )

    def __init__(self) -> None:
        self._encoder = Encoder()
        self._kept: dict[Fields, bytes] = {}
        self._kept_bytes = 0  # as `BlockDecoder.kept_bytes`: the lists are the keys here
        # The last two lists found in `_kept`, by identity: a decoded list the peer repeats is the
        # very object `BlockDecoder` kept, and hashing it (a tuple of tuples: CPython does not
        # cache the hash) costs more than the rest of the lookup. Two, because a tenant's
        # encoder takes a response head and trailers in turn on every call. Forgotten whenever
        # `_kept` is.
        self._last: Fields | None = None
        self._last_block = b""
        self._previous: Fields | None = None
        self._previous_block = b""

    def limit_table(self, size: int) -> None:
        """Triton's SETTINGS_HEADER_TABLE_SIZE: never use a larger table than it allows."""
        if size < self._encoder.header_table_size:
            self._encoder.header_table_size = size  # the next block starts with a size update
            self._forget()

    def _forget(self) -> None:
        self._kept.clear()
        self._kept_bytes = 0
        self._last = self._previous = None

    def encode(self, fields: Fields) -> bytes:
        """The header block for `fields`, given the table Triton's decoder holds now."""
        if fields is self._last:
            return self._last_block
        if fields is self._previous:
            return self._previous_block
        block = self._kept.get(fields)
        if block is not None:
            self._previous, self._previous_block = self._last, self._last_block
            self._last, self._last_block = fields, block
            return block
        table = self._encoder.header_table
        pending = table.resized
        before = _state(table)
        block = self._encoder.encode(list(fields))
        if pending or _changed(table, before):
            self._forget()  # the table changed: kept blocks may point at other entries
        elif len(block) <= KEPT_ENTRY_BYTES:
            size = ENTRY_BYTES + len(block) + fields_size(fields)
            self._kept_bytes = keep(self._kept, fields, block, size, self._kept_bytes)
        return block


_REQUEST_PSEUDO: Final = frozenset((b":method", b":scheme", b":path", b":authority"))
_CONNECTION_SPECIFIC: Final = frozenset(
    (b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade")
)


def request_problem(fields: Fields) -> str | None:
    """What makes request header `fields` malformed (RFC 9113 8.2, 8.3), or None.

    Names must be lowercase; pseudo-header fields are the request's four, each once, before every
    other field, with :method, :scheme and a non-empty :path present; no connection-specific
    fields, and TE only as `trailers`. A malformed request is a stream error (PROTOCOL_ERROR).
    """
    seen: set[bytes] = set()
    regular = False
    for name, value in fields:
        if name != name.lower():
            return f"the field name {name[:40]!r} is not lowercase"
        if name.startswith(b":"):
            if regular:
                return f"the pseudo-header {name[:40]!r} follows a regular field"
            if name not in _REQUEST_PSEUDO:
                return f"{name[:40]!r} is not a request pseudo-header"
            if name in seen:
                return f"the pseudo-header {name!r} is there twice"
            seen.add(name)
            if name == b":path" and not value:
                return "the :path is empty"
        else:
            regular = True
            if name in _CONNECTION_SPECIFIC:
                return f"the connection-specific field {name!r}"
            if name == b"te" and value != b"trailers":
                return "TE other than `trailers`"
    missing = _REQUEST_PSEUDO - seen - {b":authority"}
    if missing:
        return "no " + " or ".join(sorted(n.decode() for n in missing))
    return None


def trailers_problem(fields: Fields) -> str | None:
    """What makes request trailer `fields` malformed (pseudo-headers, uppercase), or None."""
    for name, _ in fields:
        if name.startswith(b":"):
            return f"the pseudo-header {name[:40]!r} in trailers"
        if name != name.lower():
            return f"the field name {name[:40]!r} is not lowercase"
    return None
