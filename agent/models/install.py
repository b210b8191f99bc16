"""Putting a model's files on the node: receiving a stream into staging, checking it, committing
it by rename, and the disk each namespace may hold meanwhile.

An install is bounded: a size limit per model, a total deadline, a deadline for the first chunk
and between chunks, and disk admitted per namespace before the first byte is written
(`agent.installs.filecache.NamespaceDisk`: installed, kept and being installed count; that
namespace's kept copies are evicted first, any namespace's when the volume itself is short). Each
install writes through a thread of its own with consecutive chunks gathered, so one tenant's slow or
chatty stream never holds another's. Files are written to staging outside the repository
(`agent.installs.repository`: sizes and sha256 checked as they arrive), the model's configuration
and ONNX external data are checked against the namespace's policy (`agent.installs.modelconfig`),
and only then renamed into place: a failed install keeps nothing. A model's files leaving the
repository are kept for its namespace when the agent installed them (`agent.installs.filecache`),
else deleted.

It decides nothing about who owns a model or what phase it is in: `agent.models.nodemodels` calls it
under the model's lock, after the ownership check (`agent.pods.owners`), and steps the model's life
around it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import mmap
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from agent.errors import (
    AgentError,
    DeadlineExceededError,
    InvalidRequestError,
    NotFoundError,
    ResourceExhaustedError,
)
from agent.installs.filecache import FileCache, NamespaceDisk
from agent.installs.limits import ModelLimits
from agent.installs.modelconfig import (
    backend_of,
    external_data_problem,
    onnx_files,
    parse_config,
    top_directories,
)
from agent.installs.onnxmodel import OnnxFormatError, external_locations
from agent.installs.repository import DISK_HEADROOM_BYTES, Repository, Staging
from agent.installs.runtimefit import onnx_file_problem
from agent.metrics import AgentMetrics
from agent.pods.ownership import OwnerRecord, OwnerStore
from agent.pods.provenpods import Proven
from common.manifest import Manifest

log = logging.getLogger(__name__)

T = TypeVar("T")

Chunk = tuple[str, int, bytes]
"""(path in the model, offset, data): one piece of a streamed file."""

GATHER_BYTES = 1024 * 1024
"""Consecutive chunks of one file are written together up to this size: a stream of tiny chunks
costs one thread hop per MiB, not one per message (larger gathers measured slower: copies)."""


@dataclass(frozen=True)
class InstallResult:
    model_id: str
    manifest_digest: str
    unchanged: bool
    bytes_written: int


def disk_error(model_id: str, error: OSError) -> AgentError:
    """A file error while installing, as an AgentError the caller can act on."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return ResourceExhaustedError(
            f"the node's disk filled up while installing model {model_id!r} ({error}); "
            f"nothing was kept, free space on the repository volume"
        )
    return AgentError(f"writing model {model_id!r} failed on the node ({error}); nothing was kept")


def onnx_problem(
    model_id: str, path: Path, name: str, files: set[str], onnxruntime: bool = True
) -> str:
    """Why the ONNX file `name` of the model (at `path`) may not be installed ("" when it may):
    a tensor of it names external data that is not a file of the model, it is no ONNX model, or
    (for the `onnxruntime` backend) its IR version or opset is newer than the node's ONNX Runtime
    reads. Read through a read-only mapping, one location at a time."""
    with path.open("rb") as file:
        if os.fstat(file.fileno()).st_size == 0:
            return ""
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            locations = external_locations(mapped)
            try:
                for location in locations:
                    problem = external_data_problem(model_id, name, location, files)
                    if problem:
                        return problem
            except OnnxFormatError as e:
                why = str(e)  # returned below: the traceback must not pin the mapping open
            else:
                return onnx_file_problem(model_id, name, file) if onnxruntime else ""
            finally:
                locations.close()
    return (
        f"{name} of model {model_id!r} is not an ONNX model ({why}); install the file "
        f"onnxruntime loads"
    )


def not_kept(model_id: str) -> NotFoundError:
    return NotFoundError(
        f"this node keeps no copy of model {model_id!r} with these files; send them (InstallModel)"
    )


async def _in(writer: Executor, fn: Callable[..., T], *args: object) -> T:
    return await asyncio.get_running_loop().run_in_executor(writer, fn, *args)


@dataclass
class Installer:
    """Receives, checks and commits model files, within the disk bounds of one node."""

    repository: Repository
    owners: OwnerStore
    limits: ModelLimits
    metrics: AgentMetrics
    cache: FileCache
    """Files kept after their last pod left (`agent.installs.filecache`; of 0 bytes, none)."""
    namespace_disk: NamespaceDisk
    clock: Callable[[], float] = time.monotonic
    _reserved: dict[str, int] = field(default_factory=dict, init=False)
    """Namespace -> bytes its installs in progress may yet commit (admitted, not on disk)."""
    _disk_lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def admit(self, model_id: str, manifest: Manifest, namespace: str) -> None:
        """Refuse, before anything is read, a manifest over the size limit or naming files the
        namespace's policy forbids."""
        if manifest.total_bytes > self.limits.max_model_bytes:
            raise ResourceExhaustedError(
                f"model {model_id!r} is {manifest.total_bytes} bytes, over this node's limit of "
                f"{self.limits.max_model_bytes} bytes per model (--max-model-bytes); make it "
                f"smaller or ask the operator to raise the limit"
            )
        self.limits.policy.check_files(model_id, [e.path for e in manifest.files], namespace)

    def unchanged(self, name: str, manifest: Manifest, owned: OwnerRecord) -> bool:
        """Whether the files installed as `name` are intact and those of `manifest`, which the
        agent installed for their owner `owned` (nothing to write then). In a file thread."""
        installed = self.repository.installed_manifest(name)
        if installed is None or installed.digest != owned.digest:
            return False
        if installed.digest == manifest.digest and self.repository.is_intact(name, installed):
            log.info(
                "Model %s of pod %s is already installed with this manifest.",
                owned.model_id,
                owned.pod,
            )
            self.metrics.installs.labels("unchanged").inc()
            return True
        log.warning(
            "Model %s of pod %s on disk no longer matches its manifest: reinstalling it.",
            owned.model_id,
            owned.pod,
        )
        return False

    def files_problem(self, name: str, uid: str) -> str:
        """Why the files installed as `name` are not those the agent installed for the pod with
        this uid, intact ("" when they are). Reads every file: in a file thread."""
        owned = self.owners.get(name)
        if owned is None or owned.uid != uid:
            return "the agent never installed it for this pod"
        manifest = self.repository.installed_manifest(name)
        if manifest is None or manifest.digest != owned.digest:
            return "the files on disk are not the ones the agent installed"
        if not self.repository.is_intact(name, manifest):
            return "the files on disk were changed after the agent installed them"
        return ""

    # Disk room per namespace.
    def remove_or_keep(self, name: str) -> bool:
        """Move the files of a model leaving the repository into the cache when the agent
        installed them for their owner and they are intact, else delete them; True when kept.
        In a file thread."""
        owned = self.owners.get(name)
        manifest = self.repository.installed_manifest(name)
        if (
            owned is not None
            and manifest is not None
            and not self.files_problem(name, owned.uid)
            and self.cache.keep(owned.namespace, self.repository.model_dir(name), manifest)
        ):
            return True
        self.repository.remove(name)
        return False

    def namespace_bytes(self, namespace: str, except_name: str) -> int:
        """Bytes the namespace holds on the disk: its installed models (but `except_name`, which
        an install replaces), its kept copies, and what its installs in progress may commit."""
        held = self._reserved.get(namespace, 0)
        for name, owned in self.owners.all().items():
            if owned.namespace == namespace and name != except_name:
                manifest = self.repository.installed_manifest(name)
                held += manifest.total_bytes if manifest else 0
        return held + self.cache.bytes_of(namespace)

    def make_room(self, name: str, model_id: str, manifest: Manifest, namespace: str) -> None:
        """Reserve the model's bytes in its namespace's disk bound, evicting that namespace's
        kept copies first, and any namespace's when the disk itself is short; refuse with the
        namespace's own figures only. In a file thread."""
        with self._disk_lock:
            self._make_room_locked(name, model_id, manifest, namespace)

    def _make_room_locked(
        self, name: str, model_id: str, manifest: Manifest, namespace: str
    ) -> None:
        needed = manifest.total_bytes
        over = self.namespace_bytes(namespace, name) + needed - self.namespace_disk.limit
        if self.namespace_disk.limit and over > 0:
            self.cache.evict(namespace, over)
        short = DISK_HEADROOM_BYTES + needed - self.repository.disk_free(self.repository.root)
        if short > 0:
            self.cache.evict(None, short)
        problem = self.namespace_disk.problem(
            namespace, model_id, self.namespace_bytes(namespace, name), needed
        )
        if problem:
            raise ResourceExhaustedError(problem, event_reason="ModelInstallNoRoom")
        self._reserved[namespace] = self._reserved.get(namespace, 0) + needed

    def unreserve(self, namespace: str, size: int) -> None:
        with self._disk_lock:
            left = self._reserved.get(namespace, 0) - size
            if left > 0:
                self._reserved[namespace] = left
            else:
                self._reserved.pop(namespace, None)

    # Receiving.
    async def write(
        self,
        name: str,
        manifest: Manifest,
        chunks: AsyncIterator[Chunk],
        owner: Proven,
        started: float,
    ) -> InstallResult:
        """Write the streamed files of a model whose room `make_room` reserved, check and commit
        them as `name`; the reservation is released whatever happens."""
        # Its own thread: one tenant's slow disk writes never queue another's.
        writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-install")
        try:
            return await self._write(name, manifest, chunks, owner, writer, started)
        finally:
            self.unreserve(owner.namespace, manifest.total_bytes)
            # Every write was awaited, so the thread is idle: joining it takes a moment, and no
            # install leaves a thread behind.
            writer.shutdown(wait=True)

    async def _write(
        self,
        name: str,
        manifest: Manifest,
        chunks: AsyncIterator[Chunk],
        owner: Proven,
        writer: Executor,
        started: float,
    ) -> InstallResult:
        model_id = owner.model_id
        staging = await _in(
            writer, self.repository.begin, name, manifest, owner.namespace, model_id
        )
        try:
            try:
                async with asyncio.timeout(self.limits.install_deadline):
                    await self._receive(staging, chunks, writer)
            except TimeoutError as e:
                raise DeadlineExceededError(
                    f"installing model {model_id!r} took longer than this node allows "
                    f"({self.limits.install_deadline:.0f} s, --install-deadline-seconds); nothing "
                    f"was kept, send it again on a faster link"
                ) from e
            await _in(writer, staging.finish)
            # The config names the public id (or nothing); loads override it with the name in
            # Triton, which Triton requires to be the directory's.
            config_text = (staging.directory / "config.pbtxt").read_text(errors="replace")
            config = parse_config(config_text, model_id)
            paths = [e.path for e in manifest.files]
            versions = self.limits.policy.versions(model_id, top_directories(paths))
            self.limits.policy.check_config(config, model_id, owner.namespace, versions)
            sizes = {e.path: e.size for e in manifest.files}
            self.limits.policy.check_load_data_files(config, model_id, sizes)
            for path in onnx_files(config, paths):
                # Off the event loop: a model file may be gigabytes (mapped, never copied).
                problem = await _in(
                    writer,
                    onnx_problem,
                    model_id,
                    staging.directory / path,
                    path,
                    set(paths),
                    backend_of(config) == "onnxruntime",
                )
                if problem:
                    raise InvalidRequestError(problem)
            await _in(writer, self.repository.commit, staging)
        except BaseException as e:
            await _in(writer, staging.abort)
            self.metrics.installs.labels("failed").inc()
            if isinstance(e, OSError) and not isinstance(e, TimeoutError):
                raise disk_error(model_id, e) from e
            raise
        self.metrics.installs.labels("installed").inc()
        self.metrics.install_bytes.inc(staging.bytes_written)
        self.metrics.install_seconds.observe(self.clock() - started)
        return InstallResult(model_id, manifest.digest, False, staging.bytes_written)

    async def _receive(
        self,
        staging: Staging,
        chunks: AsyncIterator[Chunk],
        writer: Executor,
    ) -> None:
        """Write the chunks in order, gathering consecutive ones of a file; a gap longer than
        the idle limit between two chunks ends the install."""
        parts: list[bytes] = []
        path, offset, size = "", 0, 0

        async def flush() -> None:
            nonlocal parts, offset, size
            if parts:
                data = parts[0] if len(parts) == 1 else b"".join(parts)
                await _in(writer, staging.write, path, offset, data)
                parts, offset, size = [], offset + size, 0

        iterator = aiter(chunks)
        # A loader streams its first chunk right behind the header; a stream that sends only a
        # header gives up its pod's and namespace's call slots within seconds.
        limit, flag = self.limits.install_first_chunk, "--install-first-chunk-seconds"
        while True:
            try:
                chunk = await asyncio.wait_for(anext(iterator, None), limit)
            except TimeoutError as e:
                raise DeadlineExceededError(
                    f"the install of model {staging.model_id!r} sent nothing for "
                    f"{limit:g} s ({flag}); nothing was kept, send it again"
                ) from e
            limit, flag = self.limits.install_idle, "--install-idle-seconds"
            if chunk is None:
                break
            if parts and (chunk[0] != path or chunk[1] != offset + size):
                await flush()
            if not parts:
                path, offset = chunk[0], chunk[1]
            parts.append(chunk[2])
            size += len(chunk[2])
            if size >= GATHER_BYTES:
                await flush()
        await flush()
