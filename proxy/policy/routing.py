"""The allow/deny decision, as pure functions of what the tenant sent and the pod's model id.

REST: a method and the raw, undecoded request path (Triton matches the raw path with RE2 and never
percent-decodes, so neither does this). gRPC: a method name and the raw request bytes, of which
only the model-name field is read, and an inference request's inputs against the data it carries
(`tensors`). The decision is one of: forward (possibly to a rewritten path or message), answer
exactly as Triton answers for an unknown model (so tenants cannot probe which
models exist), refuse a platform-only API, or answer as Triton does for an unknown route.

No I/O, no clock, no aiohttp or grpc objects here; `docs/proxy.md` is the table of these rules.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Final

from proxy.policy import tensors, wire
from proxy.policy.refusals import MalformedRequestError

# Triton 2.51's own grammar for per-model routes (http_server.cc, `model_regex_`), matched whole.
_MODEL_ROUTE: Final = re.compile(
    r"/v2/models/([^/]+)(?:/versions/([0-9]+))?"
    r"(?:/(infer|generate|generate_stream|ready|config|stats|trace/setting))?",
    re.DOTALL,
)
# Server-wide administrative APIs: Triton restricts them too, the proxy never forwards them.
_REFUSED_PREFIXES: Final = (
    "/v2/repository",
    "/v2/systemsharedmemory",
    "/v2/cudasharedmemory",
    "/v2/trace",
    "/v2/logging",
)
_INFERENCE_KINDS: Final = frozenset({"infer", "generate", "generate_stream"})
_POST_KINDS: Final = _INFERENCE_KINDS
JSON: Final = "application/json"
TEXT: Final = "text/plain"


@dataclass(frozen=True, slots=True)
class Forward:
    """Send the request on to Triton at `path` (raw path plus the original query)."""

    route: str
    path: str
    limited: bool = False
    """Counts against the concurrency limit (inference only, never health or metadata)."""
    readiness: bool = False
    """Answers the pod's readiness: the proxy reports not ready while draining."""
    model: str = ""
    """The model of the table the request names; empty for a server-wide route."""
    health: bool = False
    """A health or readiness call: its answer carries the protocol's JSON body (`health_body`)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """Answer locally with this status, content type and body; nothing reaches Triton."""

    route: str
    status: int
    content_type: str
    body: bytes
    close: bool = False
    """Close the connection after it: a host's answer for a model it does not serve (the
    client's keep-alive connection outlived the model's replica here: its next connection goes
    through the model's Service, to a host that serves it)."""
    retry_after: int = 0
    """Seconds for a `Retry-After` header (0: none)."""


def error_body(message: str) -> bytes:
    """Triton's JSON error body: `{"error":"..."}`."""
    return b'{"error":' + json.dumps(message, ensure_ascii=False).encode() + b"}"


NOT_FOUND: Final = Answer("unknown", 404, TEXT, error_body("Not Found"))
_METHOD_NOT_ALLOWED: Final = error_body("Method Not Allowed")


def left_model_message(name: str) -> str:
    """What a host answers for a model that left it moments ago (`table.LEFT_SECONDS`)."""
    return (
        f"model '{name}' is no longer served on this host (it moved to another, or the host is "
        "being replaced): retry, through the model's Service"
    )


def unknown_model_message(name: str, served: str = "") -> str:
    """Triton's message when a request names a model it does not have, and what this pod or
    host serves instead (`served_words`)."""
    return f"Request for unknown model: '{name}' is not found{served}"


SERVED_SHOWN: Final = 5
"""The most model ids a 404 of a host names."""


def served_words(model_id: str, names: Collection[str]) -> str:
    """What a 404 adds to Triton's words: the id this pod serves (`model_id`), or a host's
    (`names`, the first few in order): a client that sent the wrong name sees the right one.
    Only its own pod's or host's names: never another tenant's. Built on the error path only."""
    if model_id:
        return f"; this pod serves '{model_id}'"
    if not names:
        return "; this host serves no model yet"
    ids = sorted(names)
    shown = ", ".join(f"'{i}'" for i in ids[:SERVED_SHOWN])
    more = f" and {len(ids) - SERVED_SHOWN} more" if len(ids) > SERVED_SHOWN else ""
    return f"; this host serves {shown}{more}"


def health_body(route: str, model: str, ready: bool) -> bytes:
    """The Open Inference Protocol's REST body of a health or readiness answer (Triton sends
    none): `{"live": ...}`, `{"ready": ...}`, or for a model's readiness `{"name": ...,
    "ready": ...}`, naming `model`."""
    value = b"true" if ready else b"false"
    if route == "server_live":
        return b'{"live":' + value + b"}"
    if route == "ready":
        return b'{"name":' + json.dumps(model).encode() + b',"ready":' + value + b"}"
    return b'{"ready":' + value + b"}"


NODE_STOPPING: Final = "nodeStopping"
"""The field of the node gateway's not-ready answer to a model pod it takes out of its Service
while the node pod stops (`stopping_body`): the pod's proxy closes its clients' connections
after their answers, so that their next requests go through the Service to another replica."""


def stopping_body(message: str) -> bytes:
    """The REST body of that answer: Triton's error body (`error_body`), and
    `"nodeStopping": true`."""
    return error_body(message)[:-1] + b',"' + NODE_STOPPING.encode() + b'":true}'


def parked_message(model_id: str) -> str:
    """The answer to a readiness call for a model parked at zero replicas (`proxy.parking`):
    not ready, as the KServe v2 protocol has a model that cannot infer now; asking wakes
    nothing, its other calls do."""
    return (
        f"model {model_id} is scaled to zero and not ready; its next request (inference, "
        f"metadata, config or statistics) starts a replica and waits for it"
    )


def unavailable_model_message(name: str) -> str:
    """Triton's message when statistics are asked for a model it does not have."""
    return f"requested model '{name}' is not available"


def _refused(route: str, what: str) -> Answer:
    return Answer(
        route,
        403,
        JSON,
        error_body(
            f"{what} is not available through the model proxy: the model repository, shared "
            f"memory, trace and logging APIs are reserved for the platform"
        ),
    )


def _other_model(method: str, name: str, kind: str, served: str) -> Answer:
    """What Triton answers for a model it does not know (checked by the tests), its 404 naming
    what is `served` instead."""
    route = kind or "metadata"
    wanted = "POST" if kind in _POST_KINDS else "GET"
    if method != wanted:
        content_type = TEXT if kind in ("ready", "infer") else JSON
        return Answer(route, 405, content_type, _METHOD_NOT_ALLOWED)
    if kind == "ready":
        return Answer(route, 400, TEXT, error_body("Model version not ready"))
    if kind == "stats":
        return Answer(route, 400, JSON, error_body(unavailable_model_message(name)))
    content_type = TEXT if kind == "infer" else JSON
    return Answer(route, 404, content_type, error_body(unknown_model_message(name, served)))


MODELS: Final = "/v2/models/"


def _table_stats() -> Answer:
    return Answer(
        "stats",
        400,
        JSON,
        error_body(
            "statistics of every model are not available from a host of several models: "
            "name one, GET /v2/models/<model>/stats"
        ),
    )


class HttpRouter:
    """Decides REST requests for one model, whose name in Triton is `triton_name` when that is
    not empty (the model's private name: forwarded paths name it instead of `model_id`), or for
    the models of a host's table: `model_id` empty and `names` the table's model ids (the
    table's own set, read on every decision, so the router follows it as it changes); in the
    node gateway, `private` is the table's map of each model's private name (paths name it)."""

    def __init__(
        self,
        model_id: str,
        triton_name: str = "",
        names: set[str] | None = None,
        private: dict[str, str] | None = None,
        left: set[str] | None = None,
    ) -> None:
        self.model_id = model_id
        self.names: set[str] = {model_id} if names is None else names
        self.left: set[str] = set() if left is None else left
        """A host's models that left its table moments ago (`table.ModelTable.left`): their
        inference requests are answered 503 with `Retry-After`, the connection closed."""
        self.triton_name = triton_name or model_id
        self.renames = self.triton_name != model_id
        """Triton knows the model by another name: paths, and Triton's answers, are mapped."""
        self.private = private
        self.per_model = private is not None
        """Each model of the table may have a private name of its own: mapped per request."""
        self._cut = len(MODELS) + len(model_id)
        self._own_ready = f"{MODELS}{self.triton_name}/ready"
        self._own_stats = f"{MODELS}{self.triton_name}/stats"

    def decide(self, method: str, raw_path: str) -> Forward | Answer:
        """The decision for `method` on `raw_path` (path and query exactly as received)."""
        path, sep, query = raw_path.partition("?")
        suffix = sep + query
        match = _MODEL_ROUTE.fullmatch(path)
        if match is not None and path != "/v2/models/stats":
            name, _version, kind = match.groups()
            kind = kind or ""
            if kind == "trace/setting":
                return _refused("trace", "per-model trace settings")
            if name not in self.names:
                answer = _other_model(method, name, kind, served_words(self.model_id, self.names))
                if self.model_id:
                    return answer
                if answer.status == 404 and kind in _INFERENCE_KINDS and name in self.left:
                    body = error_body(left_model_message(name))
                    return Answer(answer.route, 503, answer.content_type, body, True, 1)
                return Answer(answer.route, answer.status, answer.content_type, answer.body, True)
            if self.renames:  # the path begins with MODELS and the model id, matched above
                raw_path = MODELS + self.triton_name + raw_path[self._cut :]
            elif self.private is not None:
                private = self.private.get(name)
                if private is not None:
                    raw_path = MODELS + private + raw_path[len(MODELS) + len(name) :]
            return Forward(
                kind or "metadata",
                raw_path,
                limited=kind in _INFERENCE_KINDS,
                model=name,
                health=kind == "ready",
            )
        if path == "/v2/health/ready":
            # A host: Triton's own readiness, not one model's (answered here while every
            # model of its table is asleep or parked: `admission.ASLEEP`).
            if not self.model_id:
                return Forward("server_ready", raw_path, readiness=True, health=True)
            return Forward("server_ready", self._own_ready + suffix, readiness=True, health=True)
        if path == "/v2/health/live":
            return Forward("server_live", raw_path, health=True)
        if path == "/v2":
            return Forward("server_metadata", raw_path)
        if path == "/v2/models/stats":
            # Statistics of every model would reveal the node's other tenants: narrow to ours.
            if not self.model_id:
                return _table_stats()
            return Forward("stats", self._own_stats + suffix)
        for prefix in _REFUSED_PREFIXES:
            if path.startswith(prefix):
                return _refused(prefix.removeprefix("/v2/"), path)
        return NOT_FOUND


GRPC_SERVICE: Final = "inference.GRPCInferenceService"
_PASS_THROUGH: Final = frozenset({"ServerLive", "ServerMetadata"})
_PER_MODEL: Final = frozenset({"ModelReady", "ModelMetadata", "ModelConfig", "ModelInfer"})
_REFUSED_RPCS: Final = frozenset(
    {
        "RepositoryIndex",
        "RepositoryModelLoad",
        "RepositoryModelUnload",
        "SystemSharedMemoryStatus",
        "SystemSharedMemoryRegister",
        "SystemSharedMemoryUnregister",
        "CudaSharedMemoryStatus",
        "CudaSharedMemoryRegister",
        "CudaSharedMemoryUnregister",
        "TraceSetting",
        "LogSettings",
    }
)


class GrpcForward:
    """Send `request` (the original bytes unless narrowed) to Triton's `method`.

    A plain class with `Final` fields rather than a frozen dataclass like the other decisions:
    one is made for every unary call, and a frozen dataclass sets each field through
    `object.__setattr__` (about 1 us for these five fields pure, 0.5 us compiled). Immutable to
    the type checker (mypy refuses any assignment to a field, and CI runs it on every module);
    compiled (mypyc), it is built in 25 ns, against 115 ns for the named tuple it was."""

    __slots__ = ("limited", "method", "model", "readiness", "request", "route")

    def __init__(
        self,
        route: str,
        method: str,
        request: bytes,
        limited: bool = False,
        readiness: bool = False,
        model: bytes = b"",
    ) -> None:
        self.route: Final = route
        self.method: Final = method
        self.request: Final = request
        self.limited: Final = limited
        self.readiness: Final = readiness
        self.model: Final = model
        """The model of the table the call names; empty for a server-wide call."""

    def __repr__(self) -> str:
        return (
            f"GrpcForward({self.route!r}, {self.method!r}, {len(self.request)} bytes, "
            f"limited={self.limited}, readiness={self.readiness})"
        )


@dataclass(frozen=True, slots=True)
class GrpcAnswer:
    """Answer locally: OK with `response` bytes, or the status `code` (a grpc.StatusCode name)."""

    route: str
    code: str
    details: str = ""
    response: bytes = b""


def grpc_kind(full_method: str) -> str:
    """`ModelInfer` for `/inference.GRPCInferenceService/ModelInfer`, "" for other services."""
    service, _, name = full_method.lstrip("/").partition("/")
    return name if service == GRPC_SERVICE else ""


class GrpcRouter:
    """Decides gRPC calls for one model, whose name in Triton is `triton_name` when that is not
    empty (the model's private name: messages forwarded name it instead of `model_id`), or for
    the models of a host's table (`model_id` empty, `names` the table's live set of encoded
    model ids, as `HttpRouter`'s)."""

    def __init__(
        self,
        model_id: str,
        triton_name: str = "",
        names: set[bytes] | None = None,
        private: dict[bytes, bytes] | None = None,
        left: set[bytes] | None = None,
    ) -> None:
        self.model_id = model_id
        self._name = model_id.encode()
        self.names: set[bytes] = {self._name} if names is None else names
        self.left: set[bytes] = set() if left is None else left
        """A host's models that left its table moments ago (`table.ModelTable.left_encoded`):
        their inference calls and streams are answered UNAVAILABLE, with GOAWAY."""
        self.triton_name = (triton_name or model_id).encode()
        self.renames = self.triton_name != self._name
        """Triton knows the model by another name: messages, and Triton's answers, are mapped."""
        self.private = private
        self.per_model = private is not None
        """Each model of the table may have a private name of its own (the node gateway's
        table of a model host): mapped per call, and a stream serves the model it first names."""
        self._ready_request = wire.encode_string(1, self.triton_name)
        self._public_field = wire.encode_string(1, self._name)
        self._private_field = self._ready_request

    def model_names(self) -> list[str]:
        """The model ids calls may name, as text."""
        return [name.decode() for name in self.names]

    def unknown(self, kind: str, name: bytes) -> GrpcAnswer:
        """The answer to a call naming `name`, a model not served here."""
        if kind == "ModelReady":
            return GrpcAnswer(kind, "OK")  # ready: false, Triton's answer for an unknown model
        if kind == "ModelStatistics":
            return GrpcAnswer(kind, "INVALID_ARGUMENT", unavailable_model_message(_text(name)))
        if kind == "ModelInfer" and name in self.left:
            return GrpcAnswer(kind, "UNAVAILABLE", left_model_message(_text(name)))
        return GrpcAnswer(kind, "NOT_FOUND", self.unknown_message(name))

    def unknown_message(self, name: bytes) -> str:
        """Triton's words for a model not served here, and what is served instead."""
        return unknown_model_message(_text(name), served_words(self.model_id, self.model_names()))

    def renamed(self, request: bytes) -> bytes:
        """`request`, whose model name field (checked: exactly once) is the model id, naming the
        model's name in Triton instead; every other byte as it was."""
        public = self._public_field
        if request.startswith(public):  # first, as serializers write it
            return self._private_field + request[len(public) :]
        return wire.with_string_value(request, 1, self.triton_name)

    def renamed_as(self, request: bytes, name: bytes) -> bytes:
        """`request`, whose model name field (checked: exactly once) is `name`, naming that
        model's private name instead when the table gives it one."""
        if self.private is None:
            return self.renamed(request) if self.renames else request
        private = self.private.get(name)
        if private is None:
            return request
        return self.renamed_to(request, name, private)

    def renamed_to(self, request: bytes, name: bytes, private: bytes) -> bytes:
        """`request`, whose model name field (checked: exactly once) is `name`, naming
        `private` instead (empty: as it is)."""
        if not private:
            return request
        public = wire.encode_string(1, name)
        if request.startswith(public):
            return wire.encode_string(1, private) + request[len(public) :]
        return wire.with_string_value(request, 1, private)

    def is_stream(self, kind: str) -> bool:
        """True for the bidirectional streaming RPC, checked message by message."""
        return kind == "ModelStreamInfer"

    def decide(self, kind: str, request: bytes) -> GrpcForward | GrpcAnswer:
        """The decision for one unary call of `kind` with the raw `request` bytes."""
        return self._decide(kind, request, self.renames or self.per_model)

    def _decide(self, kind: str, request: bytes, rename: bool) -> GrpcForward | GrpcAnswer:
        if kind in _PER_MODEL:
            try:
                name = wire.model_name(request)
            except wire.WireError as e:
                return _malformed(kind, e)
            if name not in self.names:
                return self.unknown(kind, name)
            if kind == "ModelInfer":
                try:
                    tensors.check_request(request)
                except MalformedRequestError as refused:
                    # Its own name: compiled (mypyc), `e` is typed by the first `except` above.
                    return GrpcAnswer(kind, "INVALID_ARGUMENT", str(refused))
            if rename:
                request = (
                    self.renamed(request)
                    if self.private is None
                    else self.renamed_as(request, name)
                )
            return GrpcForward(kind, kind, request, kind == "ModelInfer", model=name)
        if kind in _PASS_THROUGH:
            return GrpcForward(kind, kind, request)
        if kind == "ServerReady":
            # A host: Triton's own readiness, not one model's (answered here while every
            # model of its table is asleep or parked: `admission.ASLEEP`).
            if not self.model_id:
                return GrpcForward(kind, kind, request, readiness=True)
            return GrpcForward(kind, "ModelReady", self._ready_request, readiness=True)
        if kind == "ModelStatistics":
            try:
                name = wire.model_name(request)
            except wire.WireError as e:
                return _malformed(kind, e)
            if name == b"":
                if not self.model_id:
                    return GrpcAnswer(
                        kind,
                        "INVALID_ARGUMENT",
                        "statistics of every model are not available from a host of several "
                        "models: name one",
                    )
                # Statistics of every model would reveal the node's other tenants: narrow to ours.
                narrowed = wire.with_string_field(request, 1, self.triton_name)
                return GrpcForward(kind, kind, narrowed)
            if name not in self.names:
                return self.unknown(kind, name)
            renamed = self.renamed_as(request, name) if rename else request
            return GrpcForward(kind, kind, renamed, model=name)
        if kind in _REFUSED_RPCS:
            return GrpcAnswer(
                kind,
                "PERMISSION_DENIED",
                f"{kind} is not available through the model proxy: the model repository, shared "
                f"memory, trace and logging APIs are reserved for the platform",
            )
        return GrpcAnswer("unknown", "UNIMPLEMENTED")

    def decide_stream_message(self, request: bytes) -> bytes | None:
        """None when a ModelStreamInfer message may pass; else the stream response to send back.

        Triton answers a bad message in a stream with a response carrying `error_message` and the
        request's id, and keeps the stream open; the proxy does the same.
        """
        try:
            fields = wire.string_fields(request, (1,))
        except wire.WireError as e:
            return _stream_error(_malformed_message(e), request)
        name = fields.get(1, b"")
        if name not in self.names:
            return _stream_error(self.unknown_message(name), request)
        try:
            tensors.check_request(request)
        except MalformedRequestError as refused:
            return _stream_error(str(refused), request)
        return None

    def decide_scanned(self, kind: str, scan: wire.MessageScan) -> GrpcForward | GrpcAnswer:
        """`decide` for a message too large to hold, read in pieces by `scan` (finished): the
        same answer, except that a message `decide` would narrow is refused (what reached
        Triton of it cannot be rewritten). Its name was renamed for Triton as it went on, from
        its first bytes (`grpc.intake`). The forward's request is empty: the bytes went on."""
        if kind in _PER_MODEL or kind == "ModelStatistics":
            try:
                skeleton = wire.encode_string(1, scan.field(1))
            except wire.WireError as e:
                return _malformed(kind, e)
            decision = self._decide(kind, skeleton, False)
            if isinstance(decision, GrpcForward) and decision.request is not skeleton:
                return GrpcAnswer(
                    kind, "INVALID_ARGUMENT", "the request is too large to be narrowed"
                )
            if isinstance(decision, GrpcForward) and isinstance(scan, tensors.InferScan):
                try:
                    scan.check()
                except MalformedRequestError as refused:
                    return GrpcAnswer(kind, "INVALID_ARGUMENT", str(refused))
            return decision
        decision = self.decide(kind, b"")
        if isinstance(decision, GrpcForward) and decision.request != b"":
            return GrpcAnswer(kind, "INVALID_ARGUMENT", "the request is too large to be narrowed")
        return decision

    def decide_stream_scanned(self, scan: wire.MessageScan) -> bytes | None:
        """`decide_stream_message` for a stream message too large to hold, read by `scan`."""
        try:
            request_id = scan.field(3)
        except wire.WireError:
            request_id = b""
        echo = wire.encode_string(3, request_id) if request_id else b""
        try:
            name = scan.field(1)
        except wire.WireError as e:
            return _stream_error(_malformed_message(e), echo)
        if name not in self.names:
            return _stream_error(self.unknown_message(name), echo)
        if isinstance(scan, tensors.InferScan):
            try:
                scan.check()
            except MalformedRequestError as refused:
                return _stream_error(str(refused), echo)
        return None


def _text(name: bytes) -> str:
    return name.decode("utf-8", "replace")


def _malformed_message(error: wire.WireError) -> str:
    return f"the request cannot be routed safely ({error}); send the model name field exactly once"


def _malformed(kind: str, error: wire.WireError) -> GrpcAnswer:
    return GrpcAnswer(kind, "INVALID_ARGUMENT", _malformed_message(error))


def stream_refusal(error: str, request: bytes) -> bytes:
    """The in-stream response refusing one ModelStreamInfer message (`request`, or b"" when it
    is not at hand) with `error`, as Triton refuses one: the stream goes on."""
    return _stream_error(error, request)


def _stream_error(message: str, request: bytes) -> bytes:
    """A ModelStreamInferResponse: error_message (1) and infer_response (2) with the request id."""
    try:
        request_id = wire.string_fields(request, (3,)).get(3, b"")
    except wire.WireError:
        request_id = b""
    inner = wire.encode_string(3, request_id) if request_id else b""
    return wire.encode_string(1, message.encode()) + wire.encode_string(2, inner)
