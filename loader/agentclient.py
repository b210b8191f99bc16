"""The loader's one adapter to the node's agent: the calls it needs, made by common.agentrpc (the
channel, the bearer token re-read for each call, deadlines, one error for a failed call).

Agent answers are converted to the dataclasses below where they enter; failed calls are converted
once, by errors.classify, into a permanent LoaderError or a TransientError, and a token file that
gives no token into a SettingsError. Must not retry or decide what to do next (loading.py does).
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TypeVar

import grpc

from common.agentrpc import AgentCallError, AgentRpc, BearerToken, TokenFileError, agent_channel
from common.manifest import Manifest
from loader.errors import (
    INSTALL,
    LIST,
    LOAD,
    QUERY,
    UNLOAD,
    InvalidModelError,
    LoaderError,
    SettingsError,
    TransientError,
    classify,
)
from loader.manifest import hash_file
from loader.validate import ModelDirectory
from protos import agent_pb2

log = logging.getLogger(__name__)

T = TypeVar("T")


class ModelState(Enum):
    """A model's state on the node, as the agent reports it."""

    UNSPECIFIED = agent_pb2.MODEL_STATE_UNSPECIFIED
    ABSENT = agent_pb2.MODEL_STATE_ABSENT
    INSTALLED = agent_pb2.MODEL_STATE_INSTALLED
    LOADING = agent_pb2.MODEL_STATE_LOADING
    READY = agent_pb2.MODEL_STATE_READY
    UNLOADING = agent_pb2.MODEL_STATE_UNLOADING
    FAILED = agent_pb2.MODEL_STATE_FAILED


@dataclass(frozen=True)
class ModelStatus:
    """One model on the node."""

    model_id: str
    state: ModelState
    reason: str = ""
    manifest_digest: str = ""
    gpu_uuid: str = ""
    gpu_index: int = -1
    sleeping: bool = False
    """An on-demand model unloaded while idle, its files kept (state INSTALLED): its proxy
    wakes it on the next request."""

    @classmethod
    def from_proto(cls, status: agent_pb2.ModelStatus) -> ModelStatus:
        """Convert the agent's answer; an unknown future state reads as UNSPECIFIED."""
        try:
            state = ModelState(status.state)
        except ValueError:
            state = ModelState.UNSPECIFIED
        return cls(
            model_id=status.model_id,
            state=state,
            reason=status.reason,
            manifest_digest=status.manifest_digest,
            gpu_uuid=status.gpu_uuid,
            gpu_index=status.gpu_index,
            sleeping=status.sleeping,
        )

    def describe_placement(self) -> str:
        """'GPU <uuid> (index i)' or 'the CPU', for log sentences."""
        if self.gpu_uuid:
            return f"GPU {self.gpu_uuid} (index {self.gpu_index})"
        return "the CPU"


@dataclass(frozen=True)
class InstallResult:
    """What the agent did with an install stream."""

    manifest_digest: str
    unchanged: bool
    bytes_written: int
    bytes_sent: int


@dataclass(frozen=True)
class Hosted:
    """One replica the calling model host serves, as the agent sees it now."""

    model_id: str
    replica: int
    storage_uri: str
    residency: str
    draining: bool
    max_concurrency: int
    """Requests in flight for the host's proxy; 0: its default."""
    idle_seconds: int
    """On-demand idle time for the host's proxy; 0: its default."""
    status: ModelStatus
    storage_secret: str = ""
    """The Secret whose credential the files are fetched with ("": none)."""
    storage_options: tuple[tuple[str, str], ...] = ()
    """The s3-* settings of an s3:// storage URI (`common.storage.S3_OPTIONS`)."""
    idempotent: bool | None = None
    """Its calls may run twice (true), never (false), or as its config in Triton says (None):
    the host's proxy sends again one lost with the node gateway."""

    @classmethod
    def from_proto(cls, replica: agent_pb2.HostedReplica) -> Hosted:
        status = ModelStatus.from_proto(replica.status)
        return cls(
            model_id=replica.model_id,
            replica=replica.replica,
            storage_uri=replica.storage_uri,
            residency=replica.residency,
            draining=replica.draining,
            max_concurrency=replica.max_concurrency,
            idle_seconds=replica.idle_seconds,
            storage_secret=replica.storage_secret,
            storage_options=tuple(sorted(replica.storage_options.items())),
            idempotent=replica.idempotent if replica.HasField("idempotent") else None,
            status=ModelStatus(
                model_id=status.model_id or replica.model_id,
                state=status.state,
                reason=status.reason,
                manifest_digest=status.manifest_digest,
                gpu_uuid=status.gpu_uuid,
                gpu_index=status.gpu_index,
                sleeping=status.sleeping,
            ),
        )


@dataclass(frozen=True)
class LoadFailure:
    """Why the host's loader cannot load one of its replicas (sent with ListHosted)."""

    model_id: str
    reason: str
    message: str
    replica: int = 0
    """The replica's ordinal."""


@dataclass(frozen=True)
class HostedList:
    """The agent's answer to ListHosted: the replicas it serves for the host, and the entries of
    the host's annotation it refused, each "model/replica: why"."""

    replicas: tuple[Hosted, ...]
    refused: tuple[str, ...]
    parked: tuple[tuple[str, int], ...] = ()
    """The models parked on the host at zero replicas, each with its maxConcurrency: listed,
    their requests held."""
    node_stopping: bool = False
    """The node pod stops: every model here is listed leaving (still loaded and answered)."""


class AgentClient:
    """One channel to the agent for the whole run."""

    def __init__(
        self, address: str, token_file: Path, *, chunk_bytes: int, reconnect_max_seconds: float
    ) -> None:
        self.address = address
        self._chunk_bytes = chunk_bytes
        # Reconnect within the loader's own retry delays (common.agentrpc.agent_channel).
        self._channel = agent_channel(address, reconnect_max_seconds)
        self._rpc = AgentRpc(self._channel, BearerToken(token_file))
        self.replica: int | None = None
        """For a model host: the replica (ordinal) every model call names; None: a model pod's
        own model, or a host's only replica of it."""

    def for_replica(self, ordinal: int) -> AgentClient:
        """This client (the same channel) acting for the host's replica `ordinal`."""
        view = copy.copy(self)
        view.replica = ordinal
        return view

    async def close(self) -> None:
        """Close the channel; pending calls are cancelled."""
        await self._channel.close(grace=None)

    async def get_model(self, model_id: str, time_limit: float) -> ModelStatus:
        """The agent's view of `model_id`; NOT_FOUND reads as ABSENT."""
        try:
            reply = await _settled(self._rpc.get_model(model_id, time_limit, replica=self.replica))
        except AgentCallError as e:
            if e.code == grpc.StatusCode.NOT_FOUND:
                return ModelStatus(model_id=model_id, state=ModelState.ABSENT)
            raise _failure(e, QUERY) from e
        return ModelStatus.from_proto(reply)

    async def load(self, model_id: str, time_limit: float) -> ModelStatus:
        """Ask the agent to load an installed model; it answers once READY or FAILED."""
        try:
            reply = await _settled(self._rpc.load_model(model_id, time_limit, replica=self.replica))
        except AgentCallError as e:
            raise _failure(e, LOAD) from e
        return ModelStatus.from_proto(reply)

    async def unload(self, model_id: str, time_limit: float) -> ModelStatus:
        """Ask the agent to unload the model and remove its files; it answers once they are gone."""
        try:
            reply = await _settled(
                self._rpc.unload_model(model_id, time_limit, replica=self.replica)
            )
        except AgentCallError as e:
            raise _failure(e, UNLOAD) from e
        return ModelStatus.from_proto(reply)

    async def list_hosted(
        self, time_limit: float, failures: tuple[LoadFailure, ...] = ()
    ) -> HostedList:
        """The replicas of the calling model host (its token says which host calls); tells the
        agent the replicas it fails to load now (`failures`)."""
        told = [
            agent_pb2.LoadFailure(
                model_id=f.model_id, reason=f.reason, message=f.message, replica=f.replica
            )
            for f in failures
        ]
        try:
            reply = await _settled(self._rpc.list_hosted(told, time_limit))
        except AgentCallError as e:
            raise _failure(e, LIST) from e
        return HostedList(
            replicas=tuple(Hosted.from_proto(r) for r in reply.replicas),
            refused=tuple(reply.refused),
            parked=tuple((r.model_id, r.max_concurrency) for r in reply.parked),
            node_stopping=reply.node_stopping,
        )

    async def install(
        self, model: ModelDirectory, manifest: Manifest, time_limit: float
    ) -> InstallResult:
        """Stream the header (model id and manifest), then every file in chunks, in path order.

        An empty file gets no chunk: the manifest alone tells the agent to create it.
        """
        counter = _StreamTally()
        header = agent_pb2.InstallHeader(
            model_id=model.model_id, manifest=manifest.to_proto(), replica=self.replica
        )
        requests = self._install_requests(header, model, manifest, counter)
        try:
            reply = await _settled(self._rpc.install_model(requests, time_limit))
        except AgentCallError as e:
            if counter.failure is not None:
                # The stream was cut because a local file changed; that, not the cancellation
                # the agent saw, is the reason to report.
                raise counter.failure from e
            if e.code == grpc.StatusCode.DATA_LOSS:
                # The agent saw other bytes than the manifest promised. Resending helps only if
                # they were damaged on the way, not if a file changed on disk after hashing.
                changed = await asyncio.to_thread(_changed_since, model, manifest)
                if changed:
                    raise InvalidModelError(
                        f"{', '.join(changed[:3])} in the model directory changed while being "
                        f"sent; finish writing the model before the loader starts"
                    ) from e
            raise _failure(e, INSTALL) from e
        if counter.failure is not None:
            raise counter.failure
        return InstallResult(
            manifest_digest=reply.manifest_digest,
            unchanged=reply.unchanged,
            bytes_written=reply.bytes_written,
            bytes_sent=counter.sent,
        )

    async def install_kept(
        self, model_id: str, manifest: Manifest, time_limit: float
    ) -> InstallResult | None:
        """Ask the agent to install the model from files the node kept for this namespace;
        None when it keeps none (or predates kept files): then the files are sent."""
        header = agent_pb2.InstallHeader(
            model_id=model_id, manifest=manifest.to_proto(), replica=self.replica
        )
        try:
            reply = await _settled(self._rpc.install_kept(header, time_limit))
        except AgentCallError as e:
            if e.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNIMPLEMENTED):
                return None
            raise _failure(e, INSTALL) from e
        return InstallResult(
            manifest_digest=reply.manifest_digest,
            unchanged=reply.unchanged,
            bytes_written=reply.bytes_written,
            bytes_sent=0,
        )

    async def _install_requests(
        self,
        header: agent_pb2.InstallHeader,
        model: ModelDirectory,
        manifest: Manifest,
        counter: _StreamTally,
    ) -> AsyncIterator[agent_pb2.InstallModelRequest]:
        yield agent_pb2.InstallModelRequest(header=header)
        sources = {f.path: f.source for f in model.files}
        for entry in manifest.files:
            source = sources[entry.path]
            offset = 0
            try:
                with source.open("rb") as stream:
                    while offset < entry.size:
                        data = stream.read(min(self._chunk_bytes, entry.size - offset))
                        if not data:
                            break
                        yield _chunk(entry.path, offset, data)
                        offset += len(data)
                        counter.sent += len(data)
            except OSError as e:
                counter.failure = InvalidModelError(
                    f"{entry.path} in the model directory cannot be read ({e.strerror}); "
                    f"fix its permissions"
                )
                return
            if offset != entry.size or _size_now(source) != entry.size:
                counter.failure = InvalidModelError(
                    f"{entry.path} in the model directory changed size while being sent; finish "
                    f"writing the model before the loader starts"
                )
                return


async def _settled(call: Awaitable[T]) -> T:
    """The call's answer; a token file that gives no token is a settings error."""
    try:
        return await call
    except TokenFileError as e:
        raise SettingsError(str(e)) from e


def _failure(e: AgentCallError, phase: str) -> LoaderError | TransientError:
    return classify(e.code, e.details, phase, connected=e.connected)


def _changed_since(model: ModelDirectory, manifest: Manifest) -> list[str]:
    """Paths whose size or sha256 on disk is no longer what the manifest says."""
    expected = {entry.path: entry for entry in manifest.files}
    changed = []
    for file in model.files:
        try:
            now = hash_file(file)
        except InvalidModelError:
            changed.append(file.path)
            continue
        if now != expected.get(file.path):
            changed.append(file.path)
    return changed


def _chunk(path: str, offset: int, data: bytes) -> agent_pb2.InstallModelRequest:
    return agent_pb2.InstallModelRequest(
        chunk=agent_pb2.FileChunk(path=path, offset=offset, data=data)
    )


def _size_now(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


class _StreamTally:
    """Mutable tally shared with the request generator: bytes sent, and a local failure."""

    def __init__(self) -> None:
        self.sent = 0
        self.failure: InvalidModelError | None = None
