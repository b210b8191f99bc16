"""Model files a node keeps after their last pod leaves, so that the next replica of the same
revision in the same namespace starts without sending them; and the disk bound per namespace.

A kept copy is keyed by its namespace and the digest of its manifest and lives in
`<cache>/<namespace>/<digest>/`, beside the repository (same filesystem, outside its root: keeping
is a rename, and Triton never lists a kept copy). Only files the agent installed itself are kept
(`agent.models.nodemodels` checks the owner record's digest and the files on disk first), and a copy
handed to a new pod goes through the install path as if the pod had streamed it, so every file is
hashed again against the manifest on its way: a copy changed on disk is dropped, never served. A
copy is looked up only under the caller's own namespace: another namespace holding the same digest
reads exactly as a miss.

Kept copies are bounded by `capacity` bytes over all namespaces and evicted least recently used
(last kept or handed out). They count in their namespace's disk bound (`NamespaceDisk`), which
evicts that namespace's copies first when an install needs room.

Each copy has a life in `agent.phases`'s table, stepped here under the cache's lock: files
at rest (INSTALLED) that are kept raise FILES_KEPT (CACHED); handing them to a new pod reads
them, so the copy stays CACHED (the new pod's model walks its own install); evicting or dropping
the copy raises REMOVED (ABSENT) and forgets it. What the agent reports of kept copies
(`kept`, the metrics) reads those lives.

This module never talks to Triton or Kubernetes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from agent.errors import DigestMismatchError
from agent.installs.repository import MANIFEST_FILE, manifest_from_json
from agent.phases import Event, Life, Phase, step
from common.manifest import Manifest

log = logging.getLogger(__name__)

_NAMESPACE_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
READ_BYTES = 1024 * 1024
"""A kept file is read back in pieces of this size: the install path gathers 1 MiB writes."""


@dataclass
class _Kept:
    bytes: int
    last_used: float
    life: Life


@dataclass(frozen=True)
class KeptCopy:
    """One kept copy as the agent reports it."""

    namespace: str
    digest: str
    bytes: int
    phase: Phase


class FileCache:
    """The kept copies on one node, by (namespace, manifest digest)."""

    def __init__(
        self, root: Path, capacity: int, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.root = root
        self.capacity = capacity
        """Bytes every kept copy together may hold; 0 keeps nothing."""
        self._clock = clock
        self._kept: dict[tuple[str, str], _Kept] = {}
        self._lock = threading.Lock()

    def prepare(self) -> None:
        """Create the directory and take up what an earlier agent kept (the manifest it wrote
        tells the size; anything else there is dropped)."""
        self.root.mkdir(parents=True, exist_ok=True)
        for namespace_dir in self.root.iterdir():
            if not namespace_dir.is_dir() or not is_valid_namespace(namespace_dir.name):
                _drop_path(namespace_dir)
                continue
            for copy in namespace_dir.iterdir():
                try:
                    manifest = manifest_from_json((copy / MANIFEST_FILE).read_text())
                    valid = manifest.digest == copy.name and not copy.is_symlink()
                except (OSError, ValueError, KeyError, TypeError):
                    valid = False
                if not valid:
                    _drop_path(copy)
                    continue
                self._kept[(namespace_dir.name, copy.name)] = _Kept(
                    manifest.total_bytes, copy.stat().st_mtime, self._kept_life()
                )
        self._evict_over(self.capacity)

    def _kept_life(self) -> Life:
        """The life of files at rest that the node keeps from now on."""
        return step(Life(Phase.INSTALLED), Event.FILES_KEPT, self._clock())

    def _path(self, namespace: str, digest: str) -> Path:
        return self.root / namespace / digest

    def holds(self, namespace: str, digest: str) -> bool:
        with self._lock:
            return (namespace, digest) in self._kept

    def bytes_of(self, namespace: str) -> int:
        """Bytes the kept copies of `namespace` hold."""
        with self._lock:
            return sum(k.bytes for (ns, _), k in self._kept.items() if ns == namespace)

    def total_bytes(self) -> int:
        with self._lock:
            return sum(k.bytes for k in self._kept.values())

    def kept(self) -> list[KeptCopy]:
        """Every kept copy with its phase, sorted by namespace and digest."""
        with self._lock:
            return [
                KeptCopy(namespace, digest, k.bytes, k.life.phase)
                for (namespace, digest), k in sorted(self._kept.items())
            ]

    def keep(self, namespace: str, directory: Path, manifest: Manifest) -> bool:
        """Move a model directory the agent installed and verified into the cache; False (the
        directory untouched, the caller removes it) when the cache keeps nothing this large or
        already holds that copy."""
        key = (namespace, manifest.digest)
        if manifest.total_bytes > self.capacity or not is_valid_namespace(namespace):
            return False
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                kept.last_used = self._clock()
                return False
            target = self._path(*key)
            target.parent.mkdir(parents=True, exist_ok=True)
            directory.rename(target)
            self._kept[key] = _Kept(manifest.total_bytes, self._clock(), self._kept_life())
        log.info(
            "The files of a model of namespace %s (digest %s, %d bytes) are kept on the node "
            "for its next replica.",
            namespace,
            manifest.digest[:12],
            manifest.total_bytes,
        )
        self._evict_over(self.capacity)
        return True

    async def chunks(
        self, namespace: str, manifest: Manifest
    ) -> AsyncIterator[tuple[str, int, bytes]]:
        """The kept copy's files as install chunks, in manifest order, read off the event loop.
        A file missing, shortened or
        reached through a link ends the stream with DigestMismatchError; a changed one fails the
        install's own hash check."""
        directory = self._path(namespace, manifest.digest)
        with self._lock:
            kept = self._kept.get((namespace, manifest.digest))
            if kept is not None:
                kept.last_used = self._clock()
        for entry in manifest.files:
            path = directory / entry.path
            try:
                fd = await asyncio.to_thread(os.open, path, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError as e:
                raise DigestMismatchError(f"the node's copy of {entry.path!r} is gone") from e
            try:
                offset = 0
                while offset < entry.size:
                    size = min(READ_BYTES, entry.size - offset)
                    data = await asyncio.to_thread(os.pread, fd, size, offset)
                    if not data:
                        raise DigestMismatchError(f"the node's copy of {entry.path!r} is short")
                    yield entry.path, offset, data
                    offset += len(data)
            finally:
                os.close(fd)

    def drop(self, namespace: str, digest: str) -> Life | None:
        """Forget and delete one kept copy (it failed its check, or makes room); its life after
        REMOVED, None when it was not kept."""
        with self._lock:
            kept = self._kept.pop((namespace, digest), None)
            if kept is not None:
                kept.life = step(kept.life, Event.REMOVED, self._clock())
        _drop_path(self._path(namespace, digest))
        return kept.life if kept is not None else None

    def evict(self, namespace: str | None, needed: int) -> int:
        """Delete kept copies, least recently used first, of `namespace` (None: of any) until
        `needed` bytes are freed or none is left; the bytes freed."""
        freed = 0
        while freed < needed:
            with self._lock:
                candidates = [
                    (k.last_used, key, k.bytes)
                    for key, k in self._kept.items()
                    if namespace is None or key[0] == namespace
                ]
            if not candidates:
                break
            _, key, size = min(candidates)
            self.drop(*key)
            freed += size
            log.info(
                "The node's copy of a model of namespace %s (digest %s) is evicted to make room.",
                key[0],
                key[1][:12],
            )
        return freed

    def _evict_over(self, capacity: int) -> None:
        over = self.total_bytes() - capacity
        if over > 0:
            self.evict(None, over)


def is_valid_namespace(namespace: str) -> bool:
    """A Kubernetes namespace name (a DNS label): safe as a directory name."""
    return _NAMESPACE_RE.fullmatch(namespace) is not None


def _drop_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@dataclass(frozen=True)
class NamespaceDisk:
    """The bound on the bytes one namespace's models hold on the node's disk: installed,
    kept, and being installed."""

    limit: int
    """Bytes; 0 means no bound."""

    def problem(self, namespace: str, model_id: str, held: int, needed: int) -> str:
        """Why an install of `needed` bytes may not start while the namespace holds `held`
        ("" when it may). Names only the namespace's own figures: never the disk's free space,
        never another namespace's."""
        if not self.limit or held + needed <= self.limit:
            return ""
        return (
            f"the models of namespace {namespace} hold {held} bytes of this node's disk; model "
            f"{model_id!r} ({needed} bytes) would pass the {self.limit} bytes a namespace may "
            f"hold on a node (--max-installed-bytes-per-namespace); delete model pods of this "
            f"namespace that are not needed on this node, or ask the operator to raise the limit"
        )
