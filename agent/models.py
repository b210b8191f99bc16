"""The models on this node: install, load, unload and status, serialized per model.

This is where the repository (files) and Triton (loaded instances) meet. Every operation on one
model holds that model's lock, so concurrent requests for the same model run one after another
while different models proceed in parallel. File work (writing, hashing, fsync, rename) runs on
the agent's own small thread pool so the event loop keeps answering health checks and other
models. It decides nothing about who may call (`agent.auth`) or which models are wanted
(`agent.reconcile`).
"""

from __future__ import annotations

import asyncio
import enum
import errno
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TypeVar

from agent.errors import (
    AgentError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    ResourceExhaustedError,
    TritonError,
    TritonUnreachableError,
)
from agent.inventory import GpuSnapshot
from agent.metrics import AgentMetrics
from agent.modelconfig import override_json, parse_config, pinned_config
from agent.repository import Repository, Staging
from agent.triton import LOADING, READY, UNLOADING, IndexEntry, TritonClient
from common.manifest import Manifest
from protos import agent_pb2

log = logging.getLogger(__name__)

T = TypeVar("T")


class ModelState(enum.Enum):
    """agent.proto's ModelState: the proto is the one source of the names and numbers."""

    ABSENT = agent_pb2.MODEL_STATE_ABSENT
    INSTALLED = agent_pb2.MODEL_STATE_INSTALLED
    LOADING = agent_pb2.MODEL_STATE_LOADING
    READY = agent_pb2.MODEL_STATE_READY
    UNLOADING = agent_pb2.MODEL_STATE_UNLOADING
    FAILED = agent_pb2.MODEL_STATE_FAILED


@dataclass(frozen=True)
class ModelStatus:
    """What the agent reports about one model."""

    model_id: str
    state: ModelState
    reason: str = ""
    manifest_digest: str = ""
    gpu_uuid: str = ""
    gpu_index: int = -1
    pod: str = ""


@dataclass(frozen=True)
class InstallResult:
    model_id: str
    manifest_digest: str
    unchanged: bool
    bytes_written: int


@dataclass
class _Record:
    """What the agent remembers about a model beyond the disk and Triton."""

    busy: ModelState | None = None  # LOADING or UNLOADING while an operation runs
    failure: str = ""
    failed_at: float = 0.0
    gpu_uuid: str = ""
    gpu_index: int = -1
    pod: str = ""
    want_loaded: bool = False
    last_activity: float = 0.0


Chunk = tuple[str, int, bytes]


def _disk_error(model_id: str, error: OSError) -> AgentError:
    """A file error while installing, as an AgentError the caller can act on."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return ResourceExhaustedError(
            f"the node's disk filled up while installing model {model_id!r} ({error}); "
            f"nothing was kept, free space on the repository volume"
        )
    return AgentError(f"writing model {model_id!r} failed on the node ({error}); nothing was kept")


class Models:
    """Owns every model operation on the node."""

    def __init__(
        self,
        repository: Repository,
        triton: TritonClient,
        metrics: AgentMetrics,
        gpus: Callable[[], GpuSnapshot | None],
        *,
        cpu_only: bool,
        unload_timeout: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.repository = repository
        self.triton = triton
        self.metrics = metrics
        self._gpus = gpus
        self.cpu_only = cpu_only
        self.unload_timeout = unload_timeout
        self.clock = clock
        self._locks: dict[str, asyncio.Lock] = {}
        self._records: dict[str, _Record] = {}
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="agent-files")

    async def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    async def _in_thread(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def lock(self, model_id: str) -> asyncio.Lock:
        return self._locks.setdefault(model_id, asyncio.Lock())

    def is_busy(self, model_id: str) -> bool:
        return self.lock(model_id).locked()

    def record(self, model_id: str) -> _Record:
        record = self._records.get(model_id)
        if record is None:
            record = self._records[model_id] = _Record(last_activity=self.clock())
        return record

    def known_records(self) -> dict[str, _Record]:
        return dict(self._records)

    def _touch(self, model_id: str) -> _Record:
        record = self.record(model_id)
        record.last_activity = self.clock()
        return record

    # Install.
    async def install(
        self, model_id: str, manifest: Manifest, chunks: AsyncIterator[Chunk], pod: str = ""
    ) -> InstallResult:
        """Write the streamed files to staging, verify, fsync and rename into the repository.

        A manifest identical to the installed one returns at once (`unchanged`), reading no
        chunk: a restarted pod does not resend gigabytes.
        """
        started = self.clock()
        async with self.lock(model_id):
            record = self._touch(model_id)
            if pod:
                record.pod = pod
            installed = self.repository.installed_manifest(model_id)
            if installed is not None and installed.digest == manifest.digest:
                intact = await self._in_thread(self.repository.is_intact, model_id, installed)
                if intact:
                    log.info("Model %s is already installed with this manifest.", model_id)
                    self.metrics.installs.labels("unchanged").inc()
                    return InstallResult(model_id, manifest.digest, True, 0)
                log.warning(
                    "Model %s on disk no longer matches its manifest: reinstalling it.", model_id
                )
            if installed is not None or self.repository.model_dir(model_id).exists():
                entry = await self.triton.state(model_id)
                if entry is not None and entry.state in (READY, LOADING):
                    raise ConflictError(
                        f"model {model_id!r} is loaded with other files (manifest "
                        f"{installed.digest[:12] if installed else 'unknown'}); unload it before "
                        f"installing a different version"
                    )
            staging = await self._in_thread(self.repository.begin, model_id, manifest)
            try:
                await self._receive(staging, chunks)
                await self._in_thread(staging.finish)
                config_text = (staging.directory / "config.pbtxt").read_text(errors="replace")
                parse_config(config_text, model_id)
                await self._in_thread(self.repository.commit, staging)
            except BaseException as e:
                await self._in_thread(staging.abort)
                self.metrics.installs.labels("failed").inc()
                if isinstance(e, OSError):
                    raise _disk_error(model_id, e) from e
                raise
            record.failure = ""
            self.metrics.installs.labels("installed").inc()
            self.metrics.install_bytes.inc(staging.bytes_written)
            self.metrics.install_seconds.observe(self.clock() - started)
            return InstallResult(model_id, manifest.digest, False, staging.bytes_written)

    async def _receive(self, staging: Staging, chunks: AsyncIterator[Chunk]) -> None:
        async for path, offset, data in chunks:
            await self._in_thread(staging.write, path, offset, data)

    # Load.
    def _gpu_for(self, model_id: str, gpu_uuid: str) -> tuple[str, int]:
        if not gpu_uuid:
            if self.cpu_only:
                return "", -1
            raise InvalidRequestError(
                f"the pod of model {model_id!r} has no GPU annotation; it must be scheduled by "
                f"tritonshare (the binder writes the GPU before binding)"
            )
        snapshot = self._gpus()
        gpu = snapshot.by_uuid(gpu_uuid) if snapshot is not None else None
        if gpu is None:
            if self.cpu_only:
                # Without a GPU read (CPU machines) the assignment is kept for accounting only.
                return gpu_uuid, -1
            raise ConflictError(
                f"GPU {gpu_uuid} chosen for model {model_id!r} is not on this node; "
                f"delete the pod so the binder places it again"
            )
        if not gpu.healthy and not self.cpu_only:
            raise ConflictError(
                f"GPU {gpu.index} ({gpu_uuid}) chosen for model {model_id!r} is unhealthy "
                f"({gpu.reason}); delete the pod so the binder places it on a healthy GPU"
            )
        return gpu.uuid, gpu.index

    async def load(self, model_id: str, gpu_uuid: str = "", pod: str = "") -> ModelStatus:
        """Load an installed model pinned to its GPU (or the CPU); READY or FAILED with reason."""
        async with self.lock(model_id):
            return await self._load_locked(model_id, gpu_uuid, pod)

    async def _load_locked(self, model_id: str, gpu_uuid: str, pod: str) -> ModelStatus:
        record = self._touch(model_id)
        if pod:
            record.pod = pod
        manifest = self.repository.installed_manifest(model_id)
        if manifest is None:
            raise NotFoundError(
                f"model {model_id!r} is not installed on this node; install it (InstallModel) "
                f"before loading"
            )
        uuid, index = self._gpu_for(model_id, gpu_uuid)
        config_path = self.repository.model_dir(model_id) / "config.pbtxt"
        config = parse_config(config_path.read_text(errors="replace"), model_id)
        pin = None if self.cpu_only or index < 0 else index
        override = override_json(pinned_config(config, model_id, pin))
        entry = await self.triton.state(model_id)
        if (
            entry is not None
            and entry.state == READY
            and record.want_loaded
            and (record.gpu_uuid, record.gpu_index) == (uuid, index)
        ):
            return self._status(model_id, entry, manifest)
        record.busy = ModelState.LOADING
        record.gpu_uuid, record.gpu_index = uuid, index
        record.want_loaded = True
        started = self.clock()
        try:
            await self.triton.load(model_id, override)
        except TritonUnreachableError:
            self.metrics.load_failures.labels("triton_unreachable").inc()
            raise
        except TritonError as e:
            record.failure, record.failed_at = str(e), self.clock()
            self.metrics.load_failures.labels("triton_rejected").inc()
            log.warning("Model %s failed to load: %s", model_id, e)
        else:
            record.failure = ""
            self.metrics.load_seconds.observe(self.clock() - started)
            log.info(
                "Model %s is loaded in Triton on %s.",
                model_id,
                f"GPU {index} ({uuid})" if pin is not None else "the CPU",
            )
        finally:
            record.busy = None
        return self._status(model_id, await self.triton.state(model_id), manifest)

    # Unload.
    async def unload(self, model_id: str, *, reason: str = "requested") -> ModelStatus:
        """Unload from Triton, wait until UNAVAILABLE, then remove the files."""
        async with self.lock(model_id):
            return await self._unload_locked(model_id, reason)

    async def _unload_locked(self, model_id: str, reason: str) -> ModelStatus:
        record = self._touch(model_id)
        record.want_loaded = False
        record.busy = ModelState.UNLOADING
        started = self.clock()
        try:
            entry = await self.triton.state(model_id)
            if entry is not None and entry.state in (READY, LOADING, UNLOADING):
                await self.triton.unload(model_id)
                await self.triton.wait_unloaded(model_id, self.unload_timeout)
            if self.repository.model_dir(model_id).exists():
                await self._in_thread(self.repository.remove, model_id)
        except AgentError as e:
            self.metrics.unload_failures.labels(e.reason).inc()
            raise
        finally:
            record.busy = None
        self.metrics.unload_seconds.observe(self.clock() - started)
        log.info("Model %s is unloaded and its files removed (%s).", model_id, reason)
        self._records.pop(model_id, None)
        return ModelStatus(model_id, ModelState.ABSENT)

    # Status.
    def _status(
        self, model_id: str, entry: IndexEntry | None, manifest: Manifest | None
    ) -> ModelStatus:
        record = self._records.get(model_id) or _Record()
        base = ModelStatus(
            model_id=model_id,
            state=ModelState.ABSENT,
            manifest_digest=manifest.digest if manifest else "",
            gpu_uuid=record.gpu_uuid,
            gpu_index=record.gpu_index,
            pod=record.pod,
        )
        if record.busy is not None:
            return replace(base, state=record.busy)
        triton_state = entry.state if entry else ""
        if triton_state == READY:
            return replace(base, state=ModelState.READY)
        if triton_state == LOADING:
            return replace(base, state=ModelState.LOADING)
        if triton_state == UNLOADING:
            return replace(base, state=ModelState.UNLOADING)
        if record.failure:
            return replace(base, state=ModelState.FAILED, reason=record.failure)
        if manifest is not None:
            return replace(base, state=ModelState.INSTALLED)
        return base

    async def status(self, model_id: str) -> ModelStatus:
        entry = await self.triton.state(model_id)
        return self._status(model_id, entry, self.repository.installed_manifest(model_id))

    async def statuses(self) -> list[ModelStatus]:
        """Every model on disk, in Triton, or remembered (a failure), sorted by id."""
        index = await self.triton.index()
        names = set(self.repository.installed_models()) | set(self._records)
        names |= {name for name, entry in index.items() if entry.state in (READY, LOADING)}
        return [
            self._status(name, index.get(name), self.repository.installed_manifest(name))
            for name in sorted(names)
        ]

    def loaded_per_gpu(self) -> dict[str, int]:
        """Models the agent holds loaded, by GPU UUID ("" for the CPU), for metrics."""
        counts: dict[str, int] = {}
        for record in self._records.values():
            if record.want_loaded and not record.failure:
                counts[record.gpu_uuid] = counts.get(record.gpu_uuid, 0) + 1
        return counts

    def adopt(self, model_id: str, gpu_uuid: str, pod: str) -> None:
        """Take over a model Triton already runs for a live pod (after an agent restart)."""
        record = self.record(model_id)
        record.want_loaded = True
        record.pod = pod
        record.gpu_uuid = gpu_uuid
        snapshot = self._gpus()
        gpu = snapshot.by_uuid(gpu_uuid) if snapshot and gpu_uuid else None
        record.gpu_index = gpu.index if gpu else -1
