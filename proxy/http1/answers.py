"""Triton's REST answers changed on their way to the tenant: renamed to the public model id for
a model Triton knows by a private name, and given the protocol's JSON body on health calls.

`with_health_body` gives Triton's whole answer to a health or readiness call (which has no body)
the Open Inference Protocol's, its status kept.

The renaming is used by the REST relay only where the model's name in Triton is not its id (the
node gateway).
`AnswerNames` follows one response as Triton's bytes come (the upstream connection
finds where it ends) and returns what the tenant gets: the same response with the private name
put back to the public id in its JSON (`policy.naming.rename_json`), and the lengths that count
it (`Content-Length`, `Inference-Header-Content-Length` of the binary tensor extension, chunk
sizes) set to match. A response up to `naming.HOLD` bytes is renamed whole; a larger one (a large
inference answer) from its first bytes, where Triton writes the model's name, the rest passing as
it comes; a chunked one (generate_stream's server-sent events) event by event, each
re-chunked whole, however Triton cut it.

What it must not do: hold more than HOLD of a response, or let a response it cannot rename reach
the tenant with the private name (NamingError: the relay answers 502 instead). Pure, no I/O.
"""

from __future__ import annotations

from typing import Final

from proxy.http1.framing import MAX_HEAD_BYTES, answer_bytes, parse_response_head
from proxy.policy.naming import HOLD, NamingError, rename_json
from proxy.policy.refusals import ProxyError
from proxy.policy.routing import JSON

_HEAD: Final = 0  # reading the response head
_WHOLE: Final = 1  # holding a body of known length up to HOLD
_LARGE: Final = 2  # holding the start of a larger body until its name is seen
_PASS: Final = 3  # passing the rest of a body as it comes
_CHUNKS: Final = 4  # renaming a chunked body event by event
_DONE: Final = 5  # the rest (a trailer, or a body that names nothing) passes as it comes

_KNOWN_HEAD: Final = 4096
"""The largest response head kept as the last one."""
_LENGTH: Final = b"content-length"
_JSON_LENGTH: Final = b"inference-header-content-length"


class AnswerNames:
    """One response's renaming (see the module docstring): `feed` Triton's bytes in order and
    send on what it returns."""

    __slots__ = (
        "_error",
        "_events",
        "_grew",
        "_head",
        "_head_only",
        "_held",
        "_json",
        "_known",
        "_known_error",
        "_known_framing",
        "_known_json",
        "_known_left",
        "_known_lines",
        "_known_whole",
        "_left",
        "_lines",
        "_opening",
        "_private",
        "_public",
        "_renamed",
        "_renamed_opening",
        "_shift",
        "_state",
    )

    def __init__(self, private: bytes, public: bytes, head_only: bool) -> None:
        self._private = private
        self._public = public
        # Triton repeats its response heads: the last one read, what it set, and its renamed
        # form (for `_grew` bytes more), are kept across `reset`.
        self._known = b""
        self._known_framing = (0, 0, 0, False)
        # ... and, for the common answer, whether it is held whole, its length, JSON header and
        # error, as plain attributes (compiled, a tuple attribute is packed anew on each read).
        self._known_whole = False
        self._known_left = 0
        self._known_json = -1
        self._known_error = False
        # An inference answer's opening and its renamed form, and by how much it shifts.
        self._opening = b'{"model_name":"' + private + b'"'
        self._renamed_opening = b'{"model_name":"' + public + b'"'
        self._shift = len(public) - len(private)
        self._known_lines: list[bytes] = []
        self._renamed = b""
        self._grew = 0
        self._lines: list[bytes] = []  # the response head's lines, while it is held
        self._head = b""
        self.reset(head_only)

    def reset(self, head_only: bool) -> None:
        """Follow a new response (of a HEAD request: `head_only`)."""
        self._head_only = head_only
        self._state = _HEAD
        self._held = b""
        self._left = 0  # body bytes still due
        self._json = -1  # Inference-Header-Content-Length, -1 without
        self._error = False
        self._events = b""  # a chunked answer's data not yet sent: the start of an event

    def feed(self, data: bytes) -> bytes:
        """What the tenant gets for `data`, the next bytes of Triton's response."""
        known = self._known
        if (
            self._state == _HEAD
            and not self._held
            and known
            and self._known_whole
            and len(data) == len(known) + self._known_left
            and data.startswith(known)
        ):
            # The whole answer under the last head again: the common case, without the loop.
            self._head = known
            self._state = _DONE
            start = len(known)
            opening = self._opening
            if (
                data.startswith(opening, start)
                and data.find(self._private, start + len(opening)) < 0
            ):
                # An inference answer that begins with its name, and names it nowhere else.
                rest = data[start + len(opening) :]
                return self._renamed_head(self._shift) + self._renamed_opening + rest
            body = data[start:]
            new = rename_json(
                body, self._known_json, self._known_error, self._private, self._public
            )
            return self._renamed_head(len(new) - len(body)) + new
        if self._held:
            data = self._held + data
            self._held = b""
        out: list[bytes] = []
        pos = 0
        end = len(data)
        while pos < end:
            state = self._state
            if state in (_PASS, _DONE):
                step = end - pos if state == _DONE else min(self._left, end - pos)
                out.append(data[pos : pos + step])
                pos += step
                if state == _PASS:
                    self._left -= step
                    if not self._left:
                        self._state = _DONE
                continue
            if state == _HEAD:
                stop = data.find(b"\r\n\r\n", pos)
                if stop < 0:
                    if end - pos > MAX_HEAD_BYTES:
                        raise NamingError("Triton's response head is too large")
                    break
                self._read_head(data[pos : stop + 4], out)
                pos = stop + 4
                continue
            if state == _CHUNKS:
                taken = self._chunks(data, pos, out)
                if taken < 0:
                    break
                pos = taken
                continue
            # _WHOLE or _LARGE: hold until the body is whole, or its name seen.
            want = self._left
            if state == _WHOLE:
                if end - pos < want:
                    break
                body = data[pos : pos + want]
                new = rename_json(body, self._json, self._error, self._private, self._public)
                out.append(self._renamed_head(len(new) - len(body)))
                out.append(new)
                pos += want
                self._state = _DONE
                continue
            beginning = data[pos : pos + min(want, HOLD)]
            found = self._large(beginning)
            if found < 0:
                if len(beginning) >= HOLD or len(beginning) == want:
                    raise NamingError("Triton's large answer does not name the model first")
                break
            new = rename_json(beginning[:found], -1, False, self._private, self._public)
            grew = len(new) - found
            out.append(self._renamed_head(grew))
            out.append(new)
            pos += found
            self._left = want - found
            self._state = _PASS if self._left else _DONE
        if pos < end:
            self._held = data[pos:]
        return b"".join(out)

    def _read_head(self, head: bytes, out: list[bytes]) -> None:
        if head == self._known:  # the last head again: as then
            state, self._left, self._json, self._error = self._known_framing
            self._state = state
            self._lines = self._known_lines
            self._head = self._known  # the very object: its renamed form is kept with it
            if state != _WHOLE and state != _LARGE:
                out.append(head)
            return
        lines = head[:-4].split(b"\r\n")
        status = int(lines[0][9:12]) if len(lines[0]) >= 12 else 0
        if 100 <= status < 200:
            out.append(head)  # interim: the final head follows
            return
        length = -1
        chunked = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == _LENGTH:
                length = int(value.strip())
            elif name == _JSON_LENGTH:
                self._json = int(value.strip())
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"content-encoding" and value.strip().lower() != b"identity":
                raise NamingError("Triton sent a compressed answer, which cannot be renamed")
        self._error = status >= 400
        if self._head_only or status in (204, 304) or length == 0:
            out.append(head)
            self._state = _DONE
        elif chunked:
            out.append(head)
            self._state = _CHUNKS
        elif length < 0:
            raise NamingError("Triton's answer has no length, so it cannot be renamed")
        else:
            self._lines = lines
            self._head = head
            self._left = length
            self._state = _WHOLE if length <= HOLD else _LARGE
        if not self._head_only and len(head) <= _KNOWN_HEAD:
            self._known = head
            self._known_framing = (self._state, self._left, self._json, self._error)
            self._known_whole = self._state == _WHOLE
            self._known_left = self._left
            self._known_json = self._json
            self._known_error = self._error
            self._known_lines = lines
            self._renamed = b""

    def _renamed_head(self, grew: int) -> bytes:
        """The held response head with its lengths `grew` bytes longer."""
        if not grew:
            return self._head
        if self._renamed and grew == self._grew and self._head is self._known:
            return self._renamed
        lines = [self._lines[0]]
        for line in self._lines[1:]:
            name, _, value = line.partition(b":")
            key = name.strip().lower()
            if key == _LENGTH or (key == _JSON_LENGTH and self._json >= 0):
                line = name + b": " + str(int(value.strip()) + grew).encode()
            lines.append(line)
        renamed = b"\r\n".join(lines) + b"\r\n\r\n"
        if self._head is self._known:
            self._renamed = renamed
            self._grew = grew
        return renamed

    def _large(self, start: bytes) -> int:
        """Where the part of a large body's start to rename ends (past its name), or -1."""
        limit = self._json if 0 <= self._json < len(start) else len(start)
        for key in (b'"model_name":"', b'"name":"'):
            at = start.find(key + self._private + b'"', 0, limit)
            if at >= 0:
                return at + len(key) + len(self._private) + 1
        return -1

    def _chunks(self, data: bytes, pos: int, out: list[bytes]) -> int:
        """Take whole chunks from `pos`, and send on the whole events (server-sent events end
        with a blank line) they complete, renamed, as one chunk: an event Triton split across
        chunks is renamed whole. The offset past the last chunk taken, -1 for none."""
        end = len(data)
        taken = -1
        while pos < end:
            line_end = data.find(b"\r\n", pos)
            if line_end < 0:
                break
            size = int(data[pos:line_end].split(b";", 1)[0].strip(), 16)
            if size == 0:  # the last chunk: what is left, then it and the trailers as they are
                self._send_events(len(self._events), out)
                self._state = _DONE
                return pos
            stop = line_end + 2 + size
            if stop + 2 > end:
                break
            self._events += data[line_end + 2 : stop]
            pos = taken = stop + 2
            self._send_events(self._events.rfind(b"\n\n") + 2, out)
            if len(self._events) > HOLD:
                raise NamingError("an event of Triton's answer is too large to rename")
        return taken

    def _send_events(self, stop: int, out: list[bytes]) -> None:
        """Send the first `stop` bytes of the events held, renamed, as one chunk."""
        if stop <= 1:
            return
        events = self._events[:stop]
        self._events = self._events[stop:]
        error = self._error or b'"error":' in events  # an event reporting a failure
        new = rename_json(events, -1, error, self._private, self._public)
        out.append(b"%x\r\n" % len(new) + new + b"\r\n")


def with_health_body(response: bytes, ready: bytes, not_ready: bytes) -> bytes:
    """`response`, Triton's whole answer to a health or readiness GET, with the protocol's JSON
    body: `ready` on a success, `not_ready` on a failure that came without a body; its status
    and whether the connection stays open kept. An error with a body (Triton's `{"error":...}`,
    as for a model that is not ready) and anything unreadable pass unchanged."""
    end = response.find(b"\r\n\r\n")
    if end < 0:
        return response
    try:
        head = parse_response_head(response[:end])
    except ProxyError:
        return response
    if 200 <= head.status < 300:
        body = ready
    elif head.status >= 400 and len(response) == end + 4:
        body = not_ready
    else:
        return response
    return answer_bytes(head.status, JSON, body, not head.keep_alive)
