"""How deep the JSON of a REST request body nests, bounded as the body passes a relay.

Triton 2.51 parses a REST body's JSON recursively and dies of one nested deep enough (SIGSEGV:
objects 200,000 levels deep, a 1 MB body, killed it), every tenant's model with it. The relays
forward bodies as they come, so they bound the nesting on the way: past MAX_NESTING levels, far
beyond any tensor's (a few) and far below what breaks Triton, the request is refused before its
last byte reaches Triton.

A body that arrives whole is settled by counting its openings (`[`, `{`; its depth is at most
that) at C speed, and followed exactly only when they are more than the bound. A body relayed in
pieces is followed exactly piece by piece: strings skipped (their brackets are data, and closing
ones could otherwise hide real depth), one linear match per string, and the running depth of the
brackets between them. Pure: it reads the bytes it is given.
"""

from __future__ import annotations

import re
from itertools import accumulate
from typing import Final

from proxy.policy.refusals import MalformedRequestError

MAX_NESTING: Final = 10_000
"""Levels of JSON nesting a request body may reach."""

_STEP: Final = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1
_NOT_BRACKETS: Final = bytes(c for c in range(256) if c not in b"[]{}")
_STRING_REST: Final = re.compile(rb'(?:[^"\\]|\\.)*"', re.S)
"""The rest of a string, through its closing quote."""


def deep_json_error() -> MalformedRequestError:
    return MalformedRequestError(
        f"the request's JSON nests deeper than {MAX_NESTING} levels, which no tensor needs and "
        f"which would crash the server; send each tensor's data flat (its shape gives the "
        f"dimensions) or with the binary tensor extension"
    )


def check_whole(data: bytes, start: int, end: int) -> None:
    """Refuse `data[start:end]`, a whole body's JSON, if it nests past the bound."""
    if data.count(b"[", start, end) + data.count(b"{", start, end) > MAX_NESTING:
        Nesting().feed(data, start, end)


def _odd_backslashes_at_end(data: bytes, start: int, end: int) -> bool:
    stripped = len(data[start:end].rstrip(b"\\"))
    return (end - start - stripped) % 2 == 1


class Nesting:
    """Follows one body's JSON in pieces; `feed` raises `MalformedRequestError` past the bound.

    `json_bytes` is how much of the body is JSON (the binary tensor extension's
    Inference-Header-Content-Length), or -1 for all of it.
    """

    __slots__ = ("_depth", "_escaped", "_in_string", "_left", "_opened")

    def __init__(self, json_bytes: int = -1) -> None:
        self._left = json_bytes
        self._depth = 0
        self._in_string = False
        self._escaped = False  # the previous piece ended in a string on a lone backslash
        self._opened = 0

    def count(self, data: bytes, start: int, end: int) -> None:
        """Bound `data[start:end]` by its openings alone, wherever they stand: for bytes that are
        not only JSON (a chunked body's framing), where following strings could be misled."""
        self._opened += data.count(b"[", start, end) + data.count(b"{", start, end)
        if self._opened > MAX_NESTING:
            raise deep_json_error()

    def feed(self, data: bytes, start: int = 0, end: int = -1) -> None:
        """Follow `data[start:end]` (`end` -1: to its end)."""
        if end < 0:
            end = len(data)
        if self._left >= 0:
            end = min(end, start + self._left)
            self._left -= max(end - start, 0)
        pos = start
        while pos < end:
            if self._in_string:
                if self._escaped:
                    pos += 1
                    self._escaped = False
                    continue
                # One linear match per string: a regex over the whole piece would try again
                # at every quote of an unterminated string (quadratic in escaped quotes).
                match = _STRING_REST.match(data, pos, end)
                if match is None:  # the string goes on past this piece
                    self._escaped = _odd_backslashes_at_end(data, pos, end)
                    return
                pos = match.end()
                self._in_string = False
                continue
            quote = data.find(b'"', pos, end)
            stop = end if quote < 0 else quote
            if stop > pos:
                self._brackets(data[pos:stop].translate(None, _NOT_BRACKETS))
            if quote < 0:
                return
            pos = quote + 1
            self._in_string = True

    def _brackets(self, brackets: bytes) -> None:
        if brackets:
            steps = list(accumulate(map(_STEP.__getitem__, brackets), initial=self._depth))
            if max(steps) > MAX_NESTING:
                raise deep_json_error()
            self._depth = max(steps[-1], 0)
