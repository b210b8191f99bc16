"""What a call to the agent must pass before grpc reads a message of it: a valid token, room at
the agent, in its namespace and in its pod, and its method's message limit.

grpc reads a unary request whole before its handler runs, so a handler that authenticates has
already paid for the message: eight 60 MiB calls without a token once grew the agent by a GiB.
This interceptor runs when a call's headers arrive, before any message is read. It authenticates
the token (`agent.api.auth`: cached, a bounded number of TokenReviews in flight, and at most
`max_calls` callers waiting for one), and refuses a caller without a valid one with a handler
that never asks grpc for a message. Every method is served as a
request stream, so the gate, not grpc, decides when the first message is read: after the call has
taken a slot at the agent (`max_calls`), in its namespace and in its pod (a model host, which
loads and polls for its namespace's models on the node, may hold as many as its namespace). Each
message is then checked against its method's limit; grpc itself reads no message over
MAX_MESSAGE_BYTES.

The slots are shared out by namespace (`namespace_bound`): the last `reserve` of them (an eighth,
at least one) are kept for namespaces with no call in progress, so a team calling for the first
time is served however many calls others hold; and while several namespaces have calls, each
takes a new one only below its even share of the rest, so the ones holding more give slots back
to the others as their calls end.

What it must not do: authorize a model (that needs the message; `agent.api.service` does it) or keep
any state beyond the calls in progress.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeAlias

import grpc

from agent.api.auth import Authorizer, Caller
from agent.errors import (
    AgentBusyError,
    AgentError,
    InvalidRequestError,
    ResourceExhaustedError,
    grpc_code,
)
from agent.metrics import AgentMetrics

log = logging.getLogger(__name__)

KIB = 1024
MIB = 1024 * KIB
MAX_MESSAGE_BYTES = 4 * MIB
"""The largest message grpc reads at all: an install's header or one file chunk (loaders send
chunks of at most 3Mi, their --chunk-bytes; the rest is room for the path and the framing)."""
SMALL_MESSAGE_BYTES = 64 * KIB
"""The largest message of the calls that carry only a model id."""
# InstallKept's one message is an install's header, manifest and all.
METHOD_MESSAGE_BYTES = {"InstallModel": MAX_MESSAGE_BYTES, "InstallKept": MAX_MESSAGE_BYTES}
UNAUTHENTICATED_CALL_BYTES = 1 * MIB
"""The most memory one call without a valid token makes the agent hold: its call state and the
HTTP/2 stream window (64 KiB; BDP probing, which grows windows, is off) that grpc fills before
the call is refused. No message of it is read. Measured by
tests/agent/api/test_starvation.py::test_callers_without_a_valid_token_cannot_grow_the_agents_memory."""

# The stubs make these generic; at run time they are not subscriptable.
EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # in grpc.aio, not in its stubs
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
Continuation: TypeAlias = "Callable[[grpc.HandlerCallDetails], Awaitable[Handler]]"


class Gate(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """The agent server's only interceptor; one per process."""

    def __init__(
        self,
        authorizer: Authorizer,
        metrics: AgentMetrics,
        *,
        max_calls: int = 32,
        max_calls_per_namespace: int = 16,
        max_calls_per_pod: int = 8,
        is_host: Callable[[str], bool] = lambda pod: False,
    ) -> None:
        """`is_host(namespace/name)`: whether the pod is a model host of this node, which
        stands for its namespace's models here and may hold as many calls as its namespace."""
        self.authorizer = authorizer
        self.metrics = metrics
        self.max_calls = max_calls
        self.max_calls_per_namespace = max_calls_per_namespace
        self.max_calls_per_pod = max_calls_per_pod
        self._is_host = is_host
        self._counts: dict[str, int] = {}
        """Calls "in progress" and calls "waiting for a TokenReview" now."""
        self._in_progress: dict[str, int] = {}
        """Calls in progress per pod uid and per "namespace/<name>"."""
        self.reserve = max(1, max_calls // 8)
        """Slots only a namespace with no call in progress may take."""

    def namespace_bound(self, namespace: str) -> tuple[int, str]:
        """How many calls `namespace` may have in progress for it to take one more now, and the
        flag an operator would raise."""
        if not self._in_progress.get(f"namespace/{namespace}"):
            # A newcomer: any slot, the reserve included (the global bound still applies).
            return self.max_calls_per_namespace, " (--max-calls-per-namespace)"
        calling = sum(1 for key in self._in_progress if key.startswith("namespace/"))
        total = self._counts.get("in progress", 0)  # this call's place is already counted
        shared = self.max_calls - self.reserve
        if total > shared:
            return 0, (
                f" (--max-calls: the last {self.reserve} of {self.max_calls} are kept for "
                "namespaces with no call in progress)"
            )
        share = max(1, shared // calling)
        if share < self.max_calls_per_namespace:
            return share, f" (its share of --max-calls with {calling} namespaces calling)"
        return self.max_calls_per_namespace, " (--max-calls-per-namespace)"

    async def intercept_service(
        self, continuation: Continuation, details: grpc.HandlerCallDetails
    ) -> Handler:
        handler: Handler | None = await continuation(details)
        if handler is None or handler.response_streaming:
            # grpc answers UNIMPLEMENTED to None; no method of the agent streams its replies.
            return handler  # type: ignore[return-value]
        method = details.method.rpartition("/")[2]
        try:
            caller = self.authorizer.known(details.invocation_metadata)
            if caller is None:
                # Callers waiting for a TokenReview have a bound of their own: a flood of new
                # tokens cannot take the places of callers the agent already knows.
                with self._counted("waiting for a TokenReview"):
                    caller = await self.authorizer.authenticate(details.invocation_metadata)
        except AgentError as e:
            return self._refusal(method, e)
        return self._guarded(method, handler, caller)

    @contextlib.contextmanager
    def _counted(self, what: str) -> Iterator[None]:
        """One of `max_calls` places among the calls being served, or being authenticated."""
        count = self._counts.get(what, 0)
        if count >= self.max_calls:
            raise AgentBusyError(
                f"this agent has as many calls {what} as it allows ({self.max_calls}, "
                f"--max-calls); retry in a moment"
            )
        self._counts[what] = count + 1
        try:
            yield
        finally:
            self._counts[what] -= 1

    @contextlib.contextmanager
    def _slots(self, caller: Caller) -> Iterator[None]:
        """A pod that opens streams and leaves them waiting, or a namespace that does it from
        many pods, cannot take the agent's capacity from the others."""
        pod = caller.pod_key or caller.username
        # A pod over its own bound made its calls itself: RESOURCE_EXHAUSTED. A pod whose
        # namespace is busy may be an honest loader beside a noisy one: UNAVAILABLE, which
        # loaders retry.
        namespace_bound, namespace_flag = self.namespace_bound(caller.namespace)
        # A model host loads and polls for every model of its namespace on the node.
        host = self._is_host(caller.pod_key)
        bounds: tuple[tuple[str, int, str, str, type[AgentError]], ...] = (
            (
                caller.pod_uid or caller.username,
                self.max_calls_per_namespace if host else self.max_calls_per_pod,
                f"{'model host' if host else 'pod'} {pod}",
                " (--max-calls-per-namespace)" if host else "",
                ResourceExhaustedError,
            ),
            (
                f"namespace/{caller.namespace}",
                namespace_bound,
                f"namespace {caller.namespace}",
                namespace_flag,
                AgentBusyError,
            ),
        )
        taken: list[str] = []
        try:
            for key, bound, who, flag, error in bounds:
                held = self._in_progress.get(key, 0)
                if held >= bound:
                    raise error(
                        f"{who} already has {held} calls in progress at this agent, as many as "
                        f"it may have now{flag}; wait for them to finish"
                    )
                self._in_progress[key] = self._in_progress.get(key, 0) + 1
                taken.append(key)
            yield
        finally:
            for key in taken:
                left = self._in_progress.pop(key) - 1
                if left:
                    self._in_progress[key] = left

    def _refusal(self, method: str, error: AgentError) -> Handler:
        """A handler that refuses the call without reading a message of it."""

        async def refuse(_: object, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            self._refuse(context, method, error)

        return grpc.stream_unary_rpc_method_handler(refuse)

    def _guarded(self, method: str, handler: Handler, caller: Caller) -> Handler:
        """The method's handler, served as a request stream whose first message is read only
        once the call holds its slots, each message checked against the method's limit."""
        limit = METHOD_MESSAGE_BYTES.get(method, SMALL_MESSAGE_BYTES)
        deserialize = handler.request_deserializer or (lambda raw: raw)
        # Typed for grpc's synchronous server; grpc.aio calls the same fields with its own types.
        stream_unary: Any = handler.stream_unary
        unary_unary: Any = handler.unary_unary

        async def read(context: grpc.aio.ServicerContext[Any, Any]) -> list[Any]:
            """The next message parsed, in a list (empty at the end of the stream); its raw
            bytes are released on return."""
            message = await context.read()
            if message is EOF:
                return []
            if len(message) > limit:
                raise ResourceExhaustedError(
                    f"a {method} message of {len(message)} bytes is over the {limit} bytes "
                    f"this agent accepts for it; send file chunks of at most 3Mi"
                )
            return [deserialize(message)]

        async def messages(context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
            # context.read(), not grpc's request iterator: an iterator left before its end (any
            # refusal) keeps the call and its last message alive until the cyclic garbage
            # collector runs, and refused 4 MiB messages piled up by hundreds of MiB. Popped
            # from a list, so this frame does not hold a message while the handler works on it.
            while box := await read(context):
                yield box.pop()

        async def behavior(_: object, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            try:
                with self._counted("in progress"), self._slots(caller):
                    if handler.request_streaming:
                        return await stream_unary(messages(context), context)
                    request = await anext(messages(context), None)
                    if request is None:
                        raise InvalidRequestError(f"the {method} call carried no request")
                    return await unary_unary(request, context)
            except AgentError as e:
                self._refuse(context, method, e)
            return None

        return grpc.stream_unary_rpc_method_handler(
            behavior, response_serializer=handler.response_serializer
        )

    def _refuse(
        self, context: grpc.aio.ServicerContext[Any, Any], method: str, error: AgentError
    ) -> None:
        """End the call with `error`'s status. Not context.abort(): its exception ties the call
        into reference cycles that only the cyclic garbage collector frees."""
        code = grpc_code(error)
        self.metrics.requests.labels(method, code.name).inc()
        log.info("%s was refused with %s: %s", method, code.name, error)
        context.set_code(code)
        context.set_details(str(error))
