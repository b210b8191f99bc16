"""The agent gRPC API (protos/agent.proto) on grpc.aio: authentication, then
`agent.models.nodemodels`.

`agent.api.callgate` has authenticated the caller, taken its call slots and checked each message's
size before a handler reads it. Each RPC takes the caller from the token cache, authorizes it for
the model it names, by its public id (a pod with a proven placement on this node;
`agent.models.nodemodels` then finds the name the pod's model has in Triton and checks the pod owns
it), or as the platform for listings, which name models as Triton does, or as a model host for
ListHosted (its replicas whose proofs verify, each with its status, keeping what its loader reports
it cannot load: `agent.pods.loadfailures`; and the models parked on it); converts the request to
domain values, and converts AgentErrors to gRPC statuses through `agent.errors.grpc_code` only. A
refusal that the pod's owner should see also becomes a Warning Event on the pod. LoadModel answers
FAILED with Triton's reason rather than an RPC error when Triton rejects the model, as the proto
documents.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from agent.api.auth import Authorizer, Caller
from agent.errors import (
    AgentError,
    ConflictError,
    InvalidRequestError,
    PermissionDeniedError,
    grpc_code,
)
from agent.gpus.inventory import GpuSnapshot
from agent.installs.repository import build_manifest
from agent.kube.events import PodEvents
from agent.metrics import AgentMetrics
from agent.models.nodemodels import Chunk, Models
from agent.models.statuses import ModelStatus
from agent.pods.callerkeys import CallerKeys
from agent.pods.loadfailures import LoadFailures
from agent.pods.provenpods import Proven
from common.logs import subject
from common.manifest import entries_from_proto
from protos import agent_pb2, agent_pb2_grpc

log = logging.getLogger(__name__)

_REPLICAS_OWN = (PermissionDeniedError, InvalidRequestError)
"""The failures of one hosted replica's status that are its own (another live pod owns its name,
its id is invalid): ListHosted leaves it out and says why; any other fails the call."""


def status_to_proto(status: ModelStatus) -> Any:
    return agent_pb2.ModelStatus(
        model_id=status.model_id,
        state=status.state.value,
        reason=status.reason,
        manifest_digest=status.manifest_digest,
        gpu_uuid=status.gpu_uuid,
        gpu_index=status.gpu_index,
        pod=status.pod,
        triton_name=status.triton_name,
        residency=status.residency,
        sleeping=status.sleeping,
    )


class AgentService(agent_pb2_grpc.AgentServicer):  # type: ignore[misc]
    """The servicer; one instance per process."""

    def __init__(
        self,
        models: Models,
        authorizer: Authorizer,
        metrics: AgentMetrics,
        gpus: Callable[[], GpuSnapshot | None],
        node_name: str,
        events: PodEvents,
        *,
        on_reinstall: Callable[[Proven], None],
        on_loaded: Callable[[], None],
        on_unloading: Callable[[Proven], None],
        load_failures: LoadFailures,
        on_failures_reported: Callable[[], None],
        caller_keys: CallerKeys | None,
    ) -> None:
        self.models = models
        self.caller_keys = caller_keys
        """Each pod's key for the node gateway; None: the node runs no gateway."""
        self.authorizer = authorizer
        self.events = events
        self.metrics = metrics
        self._gpus = gpus
        self.node_name = node_name
        self.on_reinstall = on_reinstall
        """Called when a Running pod installs its model again (agent.status.conditions says so)."""
        self.on_loaded = on_loaded
        """Called when a LoadModel call has loaded its model (agent.status.conditions says so at
        once)."""
        self.on_unloading = on_unloading
        """Called when a draining host replica's loader unloads its model, before the unload
        (agent.status.conditions says at once that it is no longer served there)."""
        self.load_failures = load_failures
        """Where ListHosted keeps what a host's loader reports it cannot load."""
        self.on_failures_reported = on_failures_reported
        """Called when a host's loader reports other failures than before (agent.status.conditions
        says so at once)."""
        self.node_stopping = False
        """Set when the node pod stops: ListHosted tells the hosts' loaders so."""

    def _fail(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        method: str,
        e: AgentError,
        caller: Caller | None = None,
    ) -> None:
        """End the call with `e`'s status; the handler returns None, which grpc does not send.
        Not context.abort(): grpc keeps its exception on the call, whose traceback holds the
        handler's frames (the messages read, the chunks gathered) in a reference cycle that
        only the cyclic garbage collector frees; refused installs piled up by hundreds of MiB."""
        code = grpc_code(e)
        if e.event_reason and caller is not None:
            self.events.warn(caller.pod_key, caller.pod_uid, e.event_reason, f"{method}: {e}")
        self.metrics.requests.labels(method, code.name).inc()
        log.log(
            logging.INFO if code != grpc.StatusCode.INTERNAL else logging.ERROR,
            "%s was refused with %s: %s",
            method,
            code.name,
            e,
        )
        context.set_code(code)
        context.set_details(str(e))

    def _ok(self, method: str) -> None:
        self.metrics.requests.labels(method, "OK").inc()

    async def _caller(self, context: grpc.aio.ServicerContext[Any, Any]) -> Caller:
        return await self.authorizer.authenticate(context.invocation_metadata())

    async def InstallModel(  # noqa: N802
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        method = "InstallModel"
        caller = None
        try:
            caller = await self._caller(context)
            first = await anext(aiter(request_iterator), None)
            if first is None or first.WhichOneof("part") != "header":
                raise InvalidRequestError(
                    "the first InstallModel message must be the header (model id and manifest)"
                )
            header = first.header
            manifest = build_manifest(header.model_id, entries_from_proto(header.manifest))
            pod = await self.authorizer.authorize_model(caller, header.model_id, _ordinal(header))
            if pod.pod.running:
                # Its loader is long done: its proxy reinstalls a model the node lost.
                self.on_reinstall(pod)
            started = time.monotonic()
            result = await self.models.install(
                header.model_id, manifest, _chunks(request_iterator), pod
            )
        except AgentError as e:
            return self._fail(context, method, e, caller)
        self._ok(method)
        if not result.unchanged:
            seconds = max(time.monotonic() - started, 1e-9)
            log.info(
                "Model %s was received from pod %s: %d bytes in %.2f s (%.1f MB/s).",
                result.model_id,
                pod.key,
                result.bytes_written,
                seconds,
                result.bytes_written / seconds / 1e6,
                extra=subject(pod=pod.key, model=result.model_id),
            )
        return agent_pb2.InstallModelResponse(
            model_id=result.model_id,
            manifest_digest=result.manifest_digest,
            unchanged=result.unchanged,
            bytes_written=result.bytes_written,
        )

    async def InstallKept(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:  # noqa: N802
        method = "InstallKept"
        caller = None
        try:
            caller = await self._caller(context)
            manifest = build_manifest(request.model_id, entries_from_proto(request.manifest))
            pod = await self.authorizer.authorize_model(caller, request.model_id, _ordinal(request))
            if pod.pod.running:
                self.on_reinstall(pod)
            result = await self.models.install_kept(request.model_id, manifest, pod)
        except AgentError as e:
            return self._fail(context, method, e, caller)
        self._ok(method)
        if not result.unchanged:
            log.info(
                "Model %s of pod %s was installed from the node's kept copy: %d bytes.",
                result.model_id,
                pod.key,
                result.bytes_written,
                extra=subject(pod=pod.key, model=result.model_id),
            )
        return agent_pb2.InstallModelResponse(
            model_id=result.model_id,
            manifest_digest=result.manifest_digest,
            unchanged=result.unchanged,
            bytes_written=result.bytes_written,
            kept=not result.unchanged,
        )

    async def LoadModel(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:  # noqa: N802
        caller = None
        try:
            caller = await self._caller(context)
            pod = await self.authorizer.authorize_model(caller, request.model_id, _ordinal(request))
            status = await self.models.load(request.model_id, pod)
        except AgentError as e:
            return self._fail(context, "LoadModel", e, caller)
        self.on_loaded()
        self._ok("LoadModel")
        return status_to_proto(status)

    async def UnloadModel(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:  # noqa: N802
        caller = None
        try:
            caller = await self._caller(context)
            pod = await self.authorizer.authorize_model(caller, request.model_id, _ordinal(request))
            if request.idle:
                # The pod's proxy found its model idle: asleep, not gone (`Models.sleep_for`).
                status = await self.models.sleep_for(pod)
                self._ok("UnloadModel")
                return status_to_proto(status)
            if pod.pod.running and not pod.pod.deleting and pod.pod.host:
                raise ConflictError(
                    f"replica {pod.pod.name} of model host {pod.pod.object_key} is not "
                    f"draining: model {request.model_id!r} stays loaded until the binder marks "
                    f"it draining or takes it off the host"
                )
            if pod.pod.running and not pod.pod.deleting:
                # A proxy restarted by its liveness probe also exits through SIGTERM; the
                # loader does not run again then, so unloading would leave the pod modelless.
                raise ConflictError(
                    f"pod {pod.key} is running and not being deleted: model "
                    f"{request.model_id!r} stays loaded (a container restart must not unload "
                    f"it); delete the pod to unload it"
                )
            if pod.pod.host and pod.pod.draining:
                self.on_unloading(pod)
            status = await self.models.unload_for(pod, reason=f"asked by pod {pod.key}")
        except AgentError as e:
            return self._fail(context, "UnloadModel", e, caller)
        self._ok("UnloadModel")
        return status_to_proto(status)

    async def GetModel(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:  # noqa: N802
        caller = None
        try:
            caller = await self._caller(context)
            if self.authorizer.is_platform(caller):
                # The platform names a model as Triton does (ListModels lists those names).
                status = await self.models.reports.status(request.model_id)
            else:
                owner = await self.authorizer.authorize_model(
                    caller, request.model_id, _ordinal(request)
                )
                status = await self.models.reports.status_for(owner)
        except AgentError as e:
            return self._fail(context, "GetModel", e, caller)
        self._ok("GetModel")
        return status_to_proto(status)

    async def ListModels(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:  # noqa: N802
        try:
            caller = await self._caller(context)
            self.authorizer.require_platform(caller, "list the node's models")
            statuses = await self.models.reports.statuses()
        except AgentError as e:
            return self._fail(context, "ListModels", e)
        self._ok("ListModels")
        return agent_pb2.ListModelsResponse(models=[status_to_proto(s) for s in statuses])

    async def ListHosted(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:  # noqa: N802
        caller = None
        try:
            caller = await self._caller(context)
            host = await self.authorizer.host_of(caller)
            hosted, refused = self.authorizer.hosted(host)
            parked, problem = self.authorizer.parked(host)
            if problem:
                refused.append(problem)
            changed = self.load_failures.report(
                caller.pod_uid,
                hosted,
                ((f.model_id, f.replica, f.reason, f.message) for f in request.failures),
            )
            if changed:
                self.on_failures_reported()
            statuses = await asyncio.gather(
                *(self.models.reports.status_for(proven) for _, proven in hosted),
                return_exceptions=True,
            )
            for status in statuses:
                if isinstance(status, AgentError) and not isinstance(status, _REPLICAS_OWN):
                    # Triton does not answer (it restarts): how the replicas are is unknown,
                    # and one left out would read to the host's loader as one that left it.
                    raise status
        except AgentError as e:
            return self._fail(context, "ListHosted", e, caller)
        replicas = []
        for (entry, _), status in zip(hosted, statuses, strict=True):
            if isinstance(status, AgentError):
                # Another live pod owns the name (said without naming it), or the id is invalid.
                refused.append(f"{entry.replica_name}: {status}")
                continue
            if isinstance(status, BaseException):
                raise status
            replicas.append(
                agent_pb2.HostedReplica(
                    model_id=entry.model_id,
                    replica=entry.replica,
                    storage_uri=entry.storage_uri,
                    residency=entry.residency,
                    draining=entry.draining,
                    max_concurrency=entry.concurrency,
                    idle_seconds=entry.idle_seconds,
                    idempotent=entry.idempotent,
                    status=status_to_proto(status),
                    storage_secret=entry.storage_secret,
                    storage_options=dict(entry.storage_options),
                )
            )
        self._ok("ListHosted")
        return agent_pb2.ListHostedResponse(
            replicas=replicas,
            refused=refused,
            parked=[
                agent_pb2.HostedReplica(model_id=p.model_id, max_concurrency=p.max_concurrency)
                for p in parked
            ],
            node_stopping=self.node_stopping,
        )

    async def CallerKey(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:  # noqa: N802
        caller = None
        try:
            caller = await self._caller(context)
            if not caller.pod_uid:
                raise PermissionDeniedError(
                    f"{caller.username} is not a pod: only a pod's projected token has a caller key"
                )
            if self.caller_keys is None:
                raise ConflictError(
                    "this node's agent keeps no caller table (--gateway-table): its pods reach "
                    "no gateway"
                )
            key = self.caller_keys.key(caller.pod_uid)
        except AgentError as e:
            return self._fail(context, "CallerKey", e, caller)
        self._ok("CallerKey")
        return agent_pb2.CallerKeyResponse(key=key, pod=caller.pod_key)

    async def ListGpus(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:  # noqa: N802
        try:
            caller = await self._caller(context)
            self.authorizer.require_platform(caller, "list the node's GPUs")
        except AgentError as e:
            return self._fail(context, "ListGpus", e)
        self._ok("ListGpus")
        snapshot = self._gpus()
        held = self.models.reports.gpu_bytes()
        return agent_pb2.ListGpusResponse(
            node=self.node_name,
            gpus=[
                agent_pb2.Gpu(
                    uuid=g.uuid,
                    index=g.index,
                    product=g.product,
                    memory_total_bytes=g.memory_total,
                    memory_used_bytes=g.memory_used,
                    healthy=g.healthy,
                    reason=g.reason,
                    loaded_bytes=held.get(g.uuid, (0, 0))[0],
                    sleeping_bytes=held.get(g.uuid, (0, 0))[1],
                )
                for g in (snapshot.gpus if snapshot else ())
            ],
        )


async def _chunks(request_iterator: AsyncIterator[Any]) -> AsyncIterator[Chunk]:
    async for message in request_iterator:
        if message.WhichOneof("part") != "chunk":
            raise InvalidRequestError("only the first InstallModel message may be a header")
        chunk = message.chunk
        part = chunk.path, int(chunk.offset), bytes(chunk.data)
        # The parsed message is a second copy of the data: not kept while the data is written.
        del message, chunk
        yield part


def add_to_server(service: AgentService, server: grpc.aio.Server) -> None:
    agent_pb2_grpc.add_AgentServicer_to_server(service, server)


def _ordinal(request: Any) -> int | None:
    """The replica a model host's request names (None: the host's only one of the model)."""
    return int(request.replica) if request.HasField("replica") else None
