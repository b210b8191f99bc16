"""The node's Triton model repository on disk: manifests, staging, atomic install, removal.

Triton lists every subdirectory of the repository root as a model (hidden ones too), so files are
written into a staging directory OUTSIDE the root on the same filesystem, checked against the
manifest (paths, sizes, sha256), fsynced, and only then renamed into `<root>/<name>`, where the
name is the model's name in Triton (`agent.models.nodemodels` decides it: the pod's private name, or
a legacy model's public id); messages to tenants name the public model id. The
accepted manifest is stored inside the model directory (`.tritonshare-manifest.json`) so that it
moves with the files in the same rename; Triton ignores files that are not version directories.

Disk is held by what installs write, never by what they declare: a stream that sends only a header
holds nothing. Each write is admitted first: the installs in progress of one namespace may have
written at most `namespace_bytes` in all, and a write that would leave less than
DISK_HEADROOM_BYTES free is refused. Refusals never say how much of the disk is free.

This module never talks to Triton or Kubernetes; `agent.models.nodemodels` decides when installing
or removing is safe (never while Triton has the model loaded). The manifest type and its digest are
the loader-agent contract and live in `common.manifest`; this module validates and stores them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from agent.errors import (
    DigestMismatchError,
    InvalidRequestError,
    NotFoundError,
    ResourceExhaustedError,
)
from common.contract import ContractError, is_valid_model_id, validate_model_id
from common.manifest import Manifest, ManifestEntry

log = logging.getLogger(__name__)

MANIFEST_FILE = ".tritonshare-manifest.json"
MAX_FILES = 10_000
MAX_PATH_LENGTH = 1024
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
# Room an install always leaves free on the filesystem, so installs never fill the disk; concurrent
# writes may each pass the check before either lands, by at most one write (4 MiB) per install.
DISK_HEADROOM_BYTES = 64 * 1024 * 1024
# A refusal mid-stream often reaches the loader as grpc's "Internal error from Core" (its client
# drops the server's status when a write is pending), so it is also an Event on the pod.
NO_ROOM_EVENT = "ModelInstallNoRoom"


def manifest_to_json(manifest: Manifest) -> str:
    """The manifest as stored beside the model's files (the agent's own format, not the proto)."""
    return json.dumps(
        {"files": [[e.path, e.size, e.sha256] for e in manifest.files]}, separators=(",", ":")
    )


def manifest_from_json(text: str) -> Manifest:
    """The inverse of manifest_to_json; raises ValueError, KeyError or TypeError when malformed."""
    data = json.loads(text)
    return Manifest(tuple(ManifestEntry(str(p), int(s), str(h)) for p, s, h in data["files"]))


def check_relative_path(path: str) -> PurePosixPath:
    """The path as a PurePosixPath, or InvalidRequestError saying why it is refused."""
    if not path:
        raise InvalidRequestError(
            "a manifest entry has an empty path; send paths like '1/model.py'"
        )
    if len(path) > MAX_PATH_LENGTH:
        raise InvalidRequestError(f"path {path[:60]!r}... is longer than {MAX_PATH_LENGTH}")
    if "\0" in path or "\\" in path:
        raise InvalidRequestError(
            f"path {path!r} contains a NUL or backslash; use '/' between directories"
        )
    if path.startswith("/"):
        raise InvalidRequestError(
            f"path {path!r} is absolute; send it relative to the model directory"
        )
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise InvalidRequestError(
            f"path {path!r} has an empty, '.' or '..' component and could escape the model "
            f"directory; send a plain relative path such as '1/model.py'"
        )
    if parts[0] == MANIFEST_FILE:
        raise InvalidRequestError(f"path {path!r} is reserved for the agent's own manifest")
    return PurePosixPath(path)


def build_manifest(model_id: str, entries: list[ManifestEntry]) -> Manifest:
    """Validate a received manifest and sort it; raise InvalidRequestError on the first problem."""
    try:
        validate_model_id(model_id)
    except ContractError as e:
        raise InvalidRequestError(str(e)) from e
    if not entries:
        raise InvalidRequestError(f"the manifest for model {model_id!r} lists no files")
    if len(entries) > MAX_FILES:
        raise InvalidRequestError(f"the manifest lists {len(entries)} files; at most {MAX_FILES}")
    seen: set[str] = set()
    directories: set[str] = set()
    for entry in entries:
        pure = check_relative_path(entry.path)
        if entry.path in seen:
            raise InvalidRequestError(f"path {entry.path!r} is listed twice in the manifest")
        seen.add(entry.path)
        directories.update(str(parent) for parent in pure.parents if str(parent) != ".")
        if not _SHA256_RE.fullmatch(entry.sha256):
            raise InvalidRequestError(
                f"file {entry.path!r} has sha256 {entry.sha256!r}; send 64 lowercase hex digits"
            )
        if entry.size < 0:
            raise InvalidRequestError(f"file {entry.path!r} has a negative size")
    clashes = seen & directories
    if clashes:
        raise InvalidRequestError(
            f"{sorted(clashes)[0]!r} is listed both as a file and as a directory of other files"
        )
    if "config.pbtxt" not in seen:
        raise InvalidRequestError(
            f"the manifest for model {model_id!r} has no 'config.pbtxt' at the top of the model "
            f"directory; Triton needs it to load the model"
        )
    return Manifest(tuple(entries))


@dataclass
class _FileProgress:
    entry: ManifestEntry
    received: int = 0
    hasher: hashlib._Hash = field(default_factory=hashlib.sha256)
    handle: BinaryIO | None = None


class Staging:
    """One install in progress: a private directory outside the repository root."""

    def __init__(
        self,
        directory: Path,
        model_id: str,
        manifest: Manifest,
        namespace: str = "",
        *,
        name: str = "",
        admit: Callable[[Staging, int], None] = lambda _, __: None,
        on_done: Callable[[Staging], None] = lambda _: None,
    ) -> None:
        self.directory = directory
        self.model_id = model_id
        """The public id, for messages."""
        self.name = name or model_id
        """The model's name in Triton: the directory it is committed to."""
        self.manifest = manifest
        self.namespace = namespace
        self.bytes_written = 0
        self.admitted = 0
        """Bytes admitted to be written: what this install holds of its namespace's bound."""
        self._files = {e.path: _FileProgress(e) for e in manifest.files}
        self._admit = admit
        self._on_done = on_done

    def done(self) -> None:
        """The install is over (committed or aborted): it no longer counts for its namespace."""
        self._on_done(self)

    def write(self, path: str, offset: int, data: bytes) -> None:
        """Append a chunk; chunks of one file must come in order of offset."""
        progress = self._files.get(path)
        if progress is None:
            raise InvalidRequestError(
                f"a chunk names {path!r}, which is not in the manifest of {self.model_id!r}"
            )
        if offset != progress.received:
            raise InvalidRequestError(
                f"chunk of {path!r} starts at offset {offset} but {progress.received} bytes "
                f"were received; send each file's chunks in order"
            )
        if progress.received + len(data) > progress.entry.size:
            raise DigestMismatchError(
                f"file {path!r} is larger than the {progress.entry.size} bytes in the manifest"
            )
        self._admit(self, len(data))
        if progress.handle is None:
            target = self.directory / path
            target.parent.mkdir(parents=True, exist_ok=True)
            # O_EXCL|O_NOFOLLOW: never write through a link, never over another file.
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            progress.handle = os.fdopen(fd, "wb")
        progress.handle.write(data)
        progress.hasher.update(data)
        progress.received += len(data)
        self.bytes_written += len(data)
        if progress.received == progress.entry.size:
            self._close(progress)

    @staticmethod
    def _close(progress: _FileProgress) -> None:
        if progress.handle is not None:
            progress.handle.flush()
            os.fsync(progress.handle.fileno())
            progress.handle.close()
            progress.handle = None

    def finish(self) -> None:
        """Check every file against the manifest, write the manifest, fsync everything."""
        for progress in self._files.values():
            entry = progress.entry
            if progress.received != entry.size:
                raise DigestMismatchError(
                    f"file {entry.path!r} arrived with {progress.received} bytes but the manifest "
                    f"says {entry.size}; resend the model"
                )
            if entry.size == 0 and progress.handle is None:
                target = self.directory / entry.path
                target.parent.mkdir(parents=True, exist_ok=True)
                os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW))
            self._close(progress)
            if progress.hasher.hexdigest() != entry.sha256:
                raise DigestMismatchError(
                    f"file {entry.path!r} has sha256 {progress.hasher.hexdigest()} but the "
                    f"manifest says {entry.sha256}; the upload was corrupted, resend the model"
                )
        manifest_path = self.directory / MANIFEST_FILE
        with manifest_path.open("w") as f:
            f.write(manifest_to_json(self.manifest))
            f.flush()
            os.fsync(f.fileno())
        for dirpath, _, _ in os.walk(self.directory):
            _fsync_directory(Path(dirpath))

    def abort(self) -> None:
        """Close and delete everything written so far."""
        for progress in self._files.values():
            if progress.handle is not None:
                progress.handle.close()
                progress.handle = None
        shutil.rmtree(self.directory, ignore_errors=True)
        self.done()


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _disk_free(path: Path) -> int:
    return shutil.disk_usage(path).free


def check_apart(root: Path, other: Path, what: str, flag: str) -> None:
    """Refuse `other` when it is the repository root, inside it, or contains it: Triton would
    list it as a model, or wiping it would wipe the repository."""
    root, other = root.resolve(), other.resolve()
    if other == root or root in other.parents:
        raise InvalidRequestError(
            f"the {what} {other} is inside the model repository {root}, where Triton would list "
            f"it as a model; set {flag} to a directory beside the repository"
        )
    if other in root.parents:
        raise InvalidRequestError(
            f"the {what} {other} contains the model repository {root}; the agent empties it at "
            f"start and would delete every model; set {flag} to a directory beside the repository"
        )


class Repository:
    """The repository root and its staging directory (same filesystem, outside the root)."""

    def __init__(
        self,
        root: Path,
        staging_root: Path | None = None,
        *,
        namespace_bytes: int = 64 * 1024**3,
        disk_free: Callable[[Path], int] = _disk_free,
    ) -> None:
        self.root = root.resolve()
        self.staging_root = (staging_root or self.root.parent / ".tritonshare-staging").resolve()
        self.namespace_bytes = namespace_bytes
        """Bytes the installs in progress of one namespace may have written, in all."""
        self.disk_free = disk_free
        """Free bytes on the filesystem of a path (a setting so tests can shrink the disk)."""
        self._staged: dict[str, int] = {}
        """Namespace -> bytes its installs in progress were admitted to write."""
        self._lock = threading.Lock()

    def prepare(self) -> None:
        """Check where the directories are, create them, check that a rename between them is
        atomic, and drop what interrupted installs left."""
        check_apart(self.root, self.staging_root, "staging directory", "--staging-dir")
        self.root.mkdir(parents=True, exist_ok=True)
        self.staging_root.mkdir(parents=True, exist_ok=True)
        if self.root.stat().st_dev != self.staging_root.stat().st_dev:
            raise InvalidRequestError(
                f"the staging directory {self.staging_root} is on another filesystem than the "
                f"model repository {self.root}; rename() would not be atomic, put both on one"
            )
        # Leftovers of installs interrupted by a crash are never valid: drop them.
        for leftover in self.staging_root.iterdir():
            shutil.rmtree(leftover, ignore_errors=True)

    def model_dir(self, model_id: str) -> Path:
        if not is_valid_model_id(model_id):
            raise InvalidRequestError(f"{model_id!r} is not a valid model id")
        return self.root / model_id

    def installed_manifest(self, model_id: str) -> Manifest | None:
        """The manifest of the installed model, or None if absent or not installed by us."""
        directory = self.model_dir(model_id)
        if directory.is_symlink() or not directory.is_dir():
            return None
        try:
            return manifest_from_json((directory / MANIFEST_FILE).read_text())
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def is_intact(self, model_id: str, manifest: Manifest) -> bool:
        """True when every manifest file is a regular file (not through a link) of its size.

        Digests were verified at install; sizes and the absence of links catch tampering and
        partial deletes cheaply without rereading gigabytes on every pod restart. Extra files
        are allowed: the Python backend writes `__pycache__` next to `model.py`.
        """
        directory = self.model_dir(model_id)
        for entry in manifest.files:
            path = directory
            for part in entry.path.split("/"):
                path = path / part
                if path.is_symlink():
                    return False
            try:
                info = path.lstat()
            except OSError:
                return False
            if not stat.S_ISREG(info.st_mode) or info.st_size != entry.size:
                return False
        return True

    def installed_models(self) -> list[str]:
        """Model ids present in the repository root (real directories with a valid id)."""
        if not self.root.is_dir():
            return []
        return sorted(
            p.name
            for p in self.root.iterdir()
            if p.is_dir() and not p.is_symlink() and is_valid_model_id(p.name)
        )

    def begin(
        self, name: str, manifest: Manifest, namespace: str = "", model_id: str = ""
    ) -> Staging:
        """Start an install of the model named `name` in Triton (public id `model_id`, the same
        when not given) into a fresh private staging directory. It holds no disk until its
        bytes arrive (`_admit`), so the only check here is one of settings, not of the disk."""
        model_id = model_id or name
        if manifest.total_bytes > self.namespace_bytes:
            raise ResourceExhaustedError(
                f"model {model_id!r} is {manifest.total_bytes} bytes, over the "
                f"{self.namespace_bytes} bytes one namespace's installs in progress may write on "
                f"this node (--max-install-bytes-per-namespace); make it smaller or ask the "
                f"operator to raise the limit"
            )
        directory = Path(tempfile.mkdtemp(prefix=f"{name}.", dir=self.staging_root))
        return Staging(
            directory,
            model_id,
            manifest,
            namespace,
            name=name,
            admit=self._admit,
            on_done=self._release,
        )

    def staged_bytes(self, namespace: str) -> int:
        """Bytes the installs in progress of `namespace` were admitted to write."""
        with self._lock:
            return self._staged.get(namespace, 0)

    def _admit(self, staging: Staging, size: int) -> None:
        """Count `size` bytes of `staging` against its namespace and the disk, or refuse them."""
        namespace = staging.namespace
        with self._lock:
            staged = self._staged.get(namespace, 0)
            if staged + size > self.namespace_bytes:
                raise ResourceExhaustedError(
                    f"the installs in progress of namespace {namespace} on this node have "
                    f"written {staged} bytes; {size} more for model {staging.model_id!r} would "
                    f"pass the {self.namespace_bytes} bytes a namespace may have in progress "
                    f"(--max-install-bytes-per-namespace); nothing was kept, install fewer "
                    f"models at once",
                    event_reason=NO_ROOM_EVENT,
                )
            if self.disk_free(self.staging_root) - size < DISK_HEADROOM_BYTES:
                raise ResourceExhaustedError(
                    f"the node's disk has no room for model {staging.model_id!r} now; nothing "
                    f"was kept, try again later (the operator can free space on the repository "
                    f"volume or give it a larger one)",
                    event_reason=NO_ROOM_EVENT,
                )
            self._staged[namespace] = staged + size
            staging.admitted += size

    def _release(self, staging: Staging) -> None:
        with self._lock:
            left = self._staged.get(staging.namespace, 0) - staging.admitted
            staging.admitted = 0
            if left > 0:
                self._staged[staging.namespace] = left
            else:
                self._staged.pop(staging.namespace, None)

    def commit(self, staging: Staging) -> None:
        """Rename the finished staging directory into place, replacing an older install."""
        target = self.model_dir(staging.name)
        old: Path | None = None
        if target.exists() or target.is_symlink():
            old = Path(tempfile.mkdtemp(prefix=f"{staging.name}.old.", dir=self.staging_root))
            target.rename(old / "model")
        staging.directory.rename(target)
        staging.done()
        _fsync_directory(self.root)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        log.info(
            "Model %s is installed in %s (%d files, %d bytes).",
            staging.model_id,
            target,
            len(staging.manifest.files),
            staging.manifest.total_bytes,
        )

    def remove(self, model_id: str) -> None:
        """Move the model directory out of the root, then delete it, so Triton never sees a
        half-deleted model."""
        target = self.model_dir(model_id)
        if not (target.exists() or target.is_symlink()):
            raise NotFoundError(f"model {model_id!r} is not installed on this node")
        trash = Path(tempfile.mkdtemp(prefix=f"{model_id}.removed.", dir=self.staging_root))
        target.rename(trash / "model")
        _fsync_directory(self.root)
        with contextlib.suppress(OSError):
            shutil.rmtree(trash)
        log.info("Model %s was removed from the repository.", model_id)
