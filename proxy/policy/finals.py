"""When a request sent on a ModelStreamInfer stream is done at Triton, read from its answers.

A stream carries any number of requests, so the relays count each request message against the
pod's in-flight limit (`policy.limiter`), from when it goes to Triton until its last answer
comes back. What Triton 2.51 answers on a stream (seen with the real Triton,
tests/proxy/policy/test_finals.py and tests/proxy/gateway/test_stream_flood.py):

- every answer is a ModelStreamInferResponse: an `error_message` (field 1), or an
  `infer_response` (field 2) whose `parameters` (its field 4, written before the outputs) say
  `triton_final_response`: true on the answer that ends its request;
- a model that is not decoupled answers each request exactly once, final true;
- a decoupled model may answer many times, final false, and marks the end only for a request
  that asked for it (`triton_enable_empty_final_response`: true): an extra answer with no
  outputs and final true. A request that did not ask gets no end marker at all;
- a request refused before it runs (a bad shape, an unknown model) gets one `error_message` and
  nothing more, even when it asked.

So the relays append `ASK` (the parameter, true) to every request message: a map entry written
last is the one a parser keeps, so whatever the tenant wrote, Triton marks each request's end,
decoupled or not, without the relays knowing the model's config. An empty final answer that ends
a request whose tenant did not ask is dropped (`Finals.feed`), matched by request id, so clients
see what Triton would have sent them. A request ends at its final answer or at an error answer.

What it must not do: hold more than `HOLD` of an answer (a larger one is decided from its first
`HOLD` bytes, where Triton writes the parameters, and passes as it comes), or do I/O.
"""

from __future__ import annotations

from typing import Final

from proxy.policy.naming import HOLD
from proxy.policy.wire import LENGTH_DELIMITED, bool_parameter, encode_bool, encode_string, fields

ASK_KEY: Final = b"triton_enable_empty_final_response"
FINAL_KEY: Final = b"triton_final_response"
ASK: Final = encode_string(4, encode_string(1, ASK_KEY) + encode_string(2, encode_bool(1, True)))
"""ModelInferRequest.parameters["triton_enable_empty_final_response"] = true, as wire bytes."""


def request_facts(message: bytes) -> tuple[bytes, bool]:
    """A ModelInferRequest's id (field 3) and whether it asks for the empty final answer itself
    (the last `triton_enable_empty_final_response` entry, as Triton's parser keeps it)."""
    request_id = b""
    asked = False
    for number, wire_type, content in fields(message):
        if wire_type != LENGTH_DELIMITED:
            continue
        assert isinstance(content, bytes)
        if number == 3:
            request_id = content
        elif number == 4:
            value = bool_parameter(content, ASK_KEY)
            if value is not None:
                asked = value
    return request_id, asked


def answer_facts(answer: bytes) -> tuple[bool, bool, bytes | None]:
    """Of a ModelStreamInferResponse (or its first bytes): whether it ends its request (an error,
    or final true), whether it is an empty final answer (no outputs), and its request id (None
    for an error, which names none). An answer whose parameters are not within `answer` does
    not end its request."""
    ends = False
    outputs = False
    request_id = b""
    for number, wire_type, content in fields(answer):
        if wire_type != LENGTH_DELIMITED:
            continue
        assert isinstance(content, bytes)
        if number == 1 and content:
            return True, False, None  # error_message: the request is over
        if number != 2:
            continue
        for inner, inner_type, value in fields(content):
            if inner in (5, 6):
                outputs = True
            elif inner == 3 and inner_type == LENGTH_DELIMITED:
                assert isinstance(value, bytes)
                request_id = value
            elif inner == 4 and inner_type == LENGTH_DELIMITED:
                assert isinstance(value, bytes)
                final = bool_parameter(value, FINAL_KEY)
                if final is not None:
                    ends = final
    return ends, ends and not outputs, request_id


class Finals:
    """The requests of one stream at Triton, and its answers as they come (see the module
    docstring): `sent` each request message as it goes to Triton, `feed` each DATA payload of
    Triton's; `feed` returns what to pass on to the tenant and how many requests ended."""

    __slots__ = ("_asked", "_asked_total", "_held", "_left", "pending")

    def __init__(self) -> None:
        self._asked: dict[bytes, int] = {}  # request id -> requests at Triton that asked
        self._asked_total = 0
        self._held = b""  # the start of an answer, not yet decided
        self._left = 0  # bytes of a large answer still to pass as they come
        self.pending = 0
        """Requests sent and not yet ended."""

    @property
    def quiet(self) -> bool:
        """Every byte of Triton's answers so far is decided and passed on: no answer's start
        held, no large answer's rest still to come."""
        return not self._left and not self._held

    def sent(self, request_id: bytes, asked: bool) -> None:
        """A request message went to Triton; `asked`: its tenant asked for the empty final."""
        self.pending += 1
        self.note(request_id, asked)

    def note(self, request_id: bytes, asked: bool) -> None:
        """What a request counted in `pending` before it was read whole (a large message, which
        holds its slot from its first byte) turned out to be."""
        if asked:
            self._asked[request_id] = self._asked.get(request_id, 0) + 1
            self._asked_total += 1

    def _ended(self, request_id: bytes | None) -> bool:
        """A request ended (`request_id` None: by an error, which names no id); True when its
        tenant asked for the empty final answer."""
        if self.pending:
            self.pending -= 1
        asked = self._asked
        if request_id is None:
            # An error answer names no id: if more asked than can still be at Triton, the
            # oldest asking entry was the one that ended.
            if self._asked_total > self.pending and asked:
                request_id = next(iter(asked))
            else:
                return False
        count = asked.get(request_id, 0)
        if not count:
            return False
        self._asked_total -= 1
        if count == 1:
            del asked[request_id]
        else:
            asked[request_id] = count - 1
        return True

    def _decide(self, answer: bytes, whole: bool) -> tuple[bool, bool]:
        """Whether `answer` (whole, or its first bytes) ends a request, and whether to pass it."""
        ends, empty, request_id = answer_facts(answer)
        if not ends:
            return False, True
        asked = self._ended(request_id)
        return True, not (whole and empty and not asked)

    def feed(self, data: bytes) -> tuple[bytes, int, int]:
        """What to send the tenant for `data`, the next bytes of Triton's answers on the stream
        (what it held of an answer's start, then what is decided of `data`), how many requests
        they ended, and how many bytes were dropped."""
        ended = 0
        dropped = 0
        if (
            not self._held
            and not self._left
            and len(data) > 5
            and data[0] == 0
            and int.from_bytes(data[1:5], "big") == len(data) - 5 <= HOLD
        ):
            # One whole answer: the common case.
            ends, passes = self._decide(data[5:], True)
            return (data, int(ends), 0) if passes else (b"", int(ends), len(data))
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
                out.append(data[pos : pos + step])
                self._left = left - step
                pos += step
                continue
            if end - pos < 5:
                break
            size = int.from_bytes(data[pos + 1 : pos + 5], "big")
            stop = pos + 5 + size
            if size <= HOLD:
                if stop > end:
                    break
                ends, passes = self._decide(data[pos + 5 : stop], True)
                ended += ends
                if passes:
                    out.append(data[pos:stop])
                else:
                    dropped += stop - pos
                pos = stop
                continue
            if end - pos < 5 + HOLD:
                break  # a large answer: decided from its first HOLD bytes
            ends, _ = self._decide(data[pos + 5 : pos + 5 + HOLD], False)
            ended += ends
            self._left = size
            out.append(data[pos : pos + 5])
            pos += 5
        if pos < end:
            self._held = data[pos:]
        return b"".join(out), ended, dropped
