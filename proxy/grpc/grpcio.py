"""The tenant-facing gRPC endpoint (grpc.aio): Triton's GRPCInferenceService, forwarded as bytes.

A generic handler takes every method without decoding its messages; `policy.routing` reads only the
model-name field from the raw bytes and the request goes on, unchanged, over one channel to
Triton. Errors from Triton come back with their code, details and trailing metadata. A client's
cancellation or deadline reaches Triton: the upstream call carries the remaining time and is
cancelled with the handler. ModelStreamInfer is relayed in both directions at once, and every
message the client sends is checked on its own.

What it must not do: decide isolation itself, decode messages on the hot path, or open a channel
per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import grpc.aio

from common.lifecycle import spawn
from proxy.grpc import framing
from proxy.metrics import ProxyMetrics
from proxy.policy import admission, refusals
from proxy.policy.limiter import Limiter
from proxy.policy.routing import GRPC_SERVICE, GrpcAnswer, GrpcRouter, grpc_kind
from proxy.processflags import ProxyState
from proxy.settings import Settings

log = logging.getLogger(__name__)

_NOT_FORWARDED = ("user-agent", "content-type", "te", "grpc-")
_STREAM_BUFFER = 64
_DONE = object()
MAX_GRPC_MESSAGE = 2**31 - 1


def _forwarded_metadata(context: grpc.aio.ServicerContext[Any, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(
        (key, value)
        for key, value in (context.invocation_metadata() or ())
        if not key.startswith(":") and not key.startswith(_NOT_FORWARDED)
    )


class GrpcProxy:
    """Serves the tenant gRPC port and forwards allowed calls to Triton."""

    def __init__(
        self, settings: Settings, limiter: Limiter, metrics: ProxyMetrics, state: ProxyState
    ) -> None:
        self._settings = settings
        self._router = GrpcRouter(settings.model_id)
        self._limiter = limiter
        self._metrics = metrics
        self._state = state
        size = min(settings.max_body_bytes, MAX_GRPC_MESSAGE)
        self._options = [
            ("grpc.max_receive_message_length", size),
            ("grpc.max_send_message_length", size),
        ]
        self._server_options = list(self._options)
        if settings.idle_timeout_seconds > 0:
            idle_ms = max(1, int(settings.idle_timeout_seconds * 1000))
            self._server_options.append(("grpc.max_connection_idle_ms", idle_ms))
        self._channel: grpc.aio.Channel | None = None
        self._server: grpc.aio.Server | None = None
        self._unary: dict[str, grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]] = {}
        self._handlers: dict[str, grpc.RpcMethodHandler[Any, Any] | None] = {}
        self.port = 0

    async def start(self) -> None:
        """Open the upstream channel and start listening."""
        self._channel = grpc.aio.insecure_channel(
            self._settings.triton_grpc_url, options=self._options
        )
        self._server = grpc.aio.server(options=self._server_options)
        self._server.add_generic_rpc_handlers((_Handler(self),))
        host, port = self._settings.listen_grpc
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        await self._server.start()
        log.info("Serving Triton gRPC for model %s on port %d.", self._settings.model_id, self.port)

    async def stop(self, grace: float | None = None) -> None:
        """Stop listening, let calls finish for up to `grace` seconds, close the channel."""
        if self._server is not None:
            await self._server.stop(
                self._settings.finish_timeout_seconds if grace is None else grace
            )
            self._server = None
        if self._channel is not None:
            await self._channel.close(None)
            self._channel = None

    def handler_for(self, full_method: str) -> grpc.RpcMethodHandler[Any, Any] | None:
        """The (cached) method handler for `full_method`; None lets grpc answer UNIMPLEMENTED."""
        if full_method in self._handlers:
            return self._handlers[full_method]
        kind = grpc_kind(full_method)
        handler: grpc.RpcMethodHandler[Any, Any] | None
        if not kind:
            handler = None
        elif self._router.is_stream(kind):
            handler = grpc.stream_stream_rpc_method_handler(self._stream)
        else:
            handler = grpc.unary_unary_rpc_method_handler(functools.partial(self._call, kind))
        if len(self._handlers) < 256:  # unknown names are attacker-chosen: do not grow forever
            self._handlers[full_method] = handler
        return handler

    def _upstream(self, method: str) -> grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]:
        callable_ = self._unary.get(method)
        if callable_ is None:
            assert self._channel is not None
            callable_ = self._channel.unary_unary(f"/{GRPC_SERVICE}/{method}", None, None)
            self._unary[method] = callable_
        return callable_

    async def _call(
        self, kind: str, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> bytes:
        started = time.perf_counter()
        decision = self._router.decide(kind, request)
        code = "OK"
        try:
            if isinstance(decision, GrpcAnswer):
                code = decision.code
                if code != "OK":
                    await context.abort(grpc.StatusCode[code], decision.details)
                return decision.response
            limiter = self._limiter
            verdict = admission.admit(
                decision.readiness,
                decision.route == "ModelReady",
                decision.limited,
                False,  # a model pod's proxy: parking is the node gateway's
                limiter,
                self._state,
            )
            if verdict == admission.QUARANTINED:
                assert limiter.refusal is not None
                code = refusals.grpc_code(limiter.refusal).name
                await _refuse(context, limiter.refusal)
            if verdict == admission.ASLEEP:
                return framing.READY  # the next call wakes the model
            if verdict > admission.SLOT_FIRST:
                return b""  # ready: false (the pod drains)
            limited = verdict == admission.SLOT_FIRST
            call_metadata = _forwarded_metadata(context)
            timeout = context.time_remaining()
            if limited:
                try:
                    await self._limiter.acquire()
                except refusals.ProxyError as e:
                    self._metrics.rejected(type(e).__name__)
                    code = refusals.grpc_code(e).name
                    await _refuse(context, e)
            try:
                call = self._upstream(decision.method)(
                    decision.request, metadata=call_metadata, timeout=timeout
                )
                try:
                    return await call
                except asyncio.CancelledError:
                    call.cancel()
                    code = "CANCELLED"
                    raise
                except grpc.aio.AioRpcError as e:
                    code = e.code().name
                    trailing = e.trailing_metadata()
                    if trailing:
                        context.set_trailing_metadata([(m.key, m.value) for m in trailing])
                    await context.abort(e.code(), e.details() or "")
            finally:
                if limited:
                    self._limiter.release()
        finally:
            self._metrics.observe("grpc", decision.route, code, time.perf_counter() - started)
        raise AssertionError("unreachable: abort raises")  # pragma: no cover

    async def _stream(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        started = time.perf_counter()
        code = "OK"
        limiter = self._limiter
        # The stream is one inference call (one slot for its life): a slot first, unless the
        # pod is quarantined (`admission`'s first rule).
        verdict = admission.admit(False, False, True, False, limiter, self._state)
        try:
            if verdict == admission.QUARANTINED:
                assert limiter.refusal is not None
                raise limiter.refusal
            await limiter.acquire()
        except refusals.ProxyError as e:
            self._metrics.rejected(type(e).__name__)
            self._metrics.observe("grpc", "ModelStreamInfer", refusals.grpc_code(e).name, 0.0)
            await _refuse(context, e)
        assert self._channel is not None
        call = self._channel.stream_stream(f"/{GRPC_SERVICE}/ModelStreamInfer", None, None)(
            None, metadata=_forwarded_metadata(context), timeout=context.time_remaining()
        )
        out: asyncio.Queue[object] = asyncio.Queue(_STREAM_BUFFER)
        pumps = [
            spawn("A gRPC stream's request pump", self._pump_requests(requests, call, out)),
            spawn("A gRPC stream's response pump", self._pump_responses(call, out)),
        ]
        try:
            while True:
                item = await out.get()
                if item is _DONE:
                    break
                if isinstance(item, grpc.aio.AioRpcError):
                    code = item.code().name
                    await context.abort(item.code(), item.details() or "")
                assert isinstance(item, bytes)
                yield item
        except asyncio.CancelledError:
            code = "CANCELLED"
            raise
        finally:
            for pump in pumps:
                pump.cancel()
            call.cancel()
            for pump in pumps:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pump
            self._limiter.release()
            self._metrics.observe("grpc", "ModelStreamInfer", code, time.perf_counter() - started)

    async def _pump_requests(
        self,
        requests: AsyncIterator[bytes],
        call: grpc.aio.StreamStreamCall[bytes, bytes],
        out: asyncio.Queue[object],
    ) -> None:
        async for message in requests:
            refusal = self._router.decide_stream_message(message)
            if refusal is None:
                await call.write(message)
            else:
                await out.put(refusal)
        await call.done_writing()

    async def _pump_responses(
        self, call: grpc.aio.StreamStreamCall[bytes, bytes], out: asyncio.Queue[object]
    ) -> None:
        try:
            async for response in call:
                await out.put(response)
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                await out.put(e)
                return
        await out.put(_DONE)


class _Handler(grpc.GenericRpcHandler):  # type: ignore[type-arg]  # generic only in stubs
    def __init__(self, proxy: GrpcProxy) -> None:
        self._proxy = proxy

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        return self._proxy.handler_for(handler_call_details.method)


__all__: Sequence[str] = ("GrpcProxy",)


async def _refuse(context: grpc.aio.ServicerContext[Any, Any], error: refusals.ProxyError) -> None:
    """Abort the call with one of the proxy's refusals: its code, and the trailers that say
    when to retry (`framing.retry_fields`), as the relay answers it."""
    retry = framing.retry_fields(refusals.retry_after(error))
    if retry:
        context.set_trailing_metadata([(k.decode(), v.decode()) for k, v in retry])
    await context.abort(refusals.grpc_code(error), str(error))
