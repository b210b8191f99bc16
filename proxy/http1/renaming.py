"""A tenant connection to the REST relay for a model Triton knows by a private name.

Triton's answers name the model's private name; the tenant gets them naming the public model
id, with their lengths to match (`answers.AnswerNames`, one per exchange). An answer that cannot
be renamed is answered 502 (or, once part of it went out, the connection is cut): the private
name never reaches the tenant. A subclass of `relay.ClientConnection`, chosen by the listener
only where the names differ, so a connection that renames nothing costs nothing.

What it must not do: let a byte of an answer reach the tenant before it was renamed.
"""

from __future__ import annotations

import logging

from proxy.http1.answers import AnswerNames
from proxy.http1.connection import CLOSED, Listener
from proxy.http1.relay import ClientConnection
from proxy.http1.upstream import Upstream
from proxy.policy.naming import NamingError
from proxy.policy.routing import error_body
from proxy.table import Served

log = logging.getLogger(__name__)


class RenamingConnection(ClientConnection):
    """One tenant connection whose answers are renamed (see the module docstring): from
    `private` to `public`, or, with `per_model` (the node gateway's table of a model host), from
    the private name of the model each exchange names (`table.Served`) to its id; an exchange
    naming no model, or one Triton knows by its id, passes as it is."""

    def __init__(
        self, relay: Listener, private: bytes, public: bytes, *, per_model: bool = False
    ) -> None:
        super().__init__(relay)
        self._private = private
        self._public = public
        self._per_model = per_model
        self._names = None if per_model else AnswerNames(private, public, False)
        self._names_of: Served | None = None  # whose names `_names` maps, with `per_model`
        self._named = False  # part of this exchange's answer went to the tenant

    def _send(self, upstream: Upstream, buffer: bytes, start: int, verbatim: bool = False) -> None:
        head = self._head
        assert head is not None
        if self._per_model:
            served = self._served
            if served is None or not served.private:
                self._names = None
            elif served is not self._names_of or self._names is None:
                self._private, self._public = served.private, served.public
                self._names = AnswerNames(served.private, served.public, False)
                self._names_of = served
        if self._names is not None:
            self._names.reset(head.method == "HEAD")
        self._named = False
        super()._send(upstream, buffer, start, verbatim)

    def relay_response(self, data: bytes) -> None:
        if self._names is None:
            super().relay_response(data)
            return
        try:
            out = self._names.feed(data)
        except NamingError as e:
            upstream = self._upstream
            if upstream is not None:
                upstream.abort()
            self._unrenamable(e)
            return
        if out:
            self._named = True
            super().relay_response(out)

    def response_complete(self, upstream: Upstream, data: bytes, reusable: bool) -> None:
        if self._names is None:
            super().response_complete(upstream, data, reusable)
            return
        try:
            out = self._names.feed(data) if data else b""
        except NamingError as e:
            if upstream.transport is not None:
                upstream.transport.abort()
            self._unrenamable(e)
            return
        super().response_complete(upstream, out, reusable)

    def _unrenamable(self, error: NamingError) -> None:
        log.warning(
            "An answer of Triton's for model %s cannot be renamed to its public id (%s): "
            "answering 502.",
            self._public.decode(),
            error,
        )
        self._upstream = None
        self._sink = None
        if self._state == CLOSED:
            return
        self._response_done = True
        self._finish("502")
        if self._named:  # the tenant must not mistake a cut answer for a whole one
            if self.transport is not None:
                self.transport.abort()
            return
        self._keep_alive = False
        message = f"Triton's answer could not be passed on ({error}); retry, or report it"
        self._write_answer(502, "application/json", error_body(message))
