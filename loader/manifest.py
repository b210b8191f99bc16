"""The manifest of a model directory: every file's path, size and sha256, and the canonical digest.

The digest is the one protos/agent.proto defines, so the loader and the agent agree on it: sha256
over the files sorted by path, each contributing "path\\0size\\0sha256\\n" (size in decimal,
sha256 in lowercase hex). Owns hashing; it must not decide whether a directory is valid
(validate.py does) or talk to the agent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from loader.errors import InvalidModelError
from loader.validate import ModelFile

_READ_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ManifestEntry:
    """One file as the agent sees it."""

    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """The files of a model, sorted by path, and their canonical digest."""

    entries: tuple[ManifestEntry, ...]
    digest: str

    @property
    def total_bytes(self) -> int:
        """Sum of the files' sizes."""
        return sum(entry.size for entry in self.entries)


def manifest_digest(entries: Iterable[ManifestEntry]) -> str:
    """The canonical digest of a set of entries, independent of their order."""
    digest = hashlib.sha256()
    for entry in sorted(entries, key=lambda e: e.path):
        digest.update(f"{entry.path}\0{entry.size}\0{entry.sha256}\n".encode())
    return digest.hexdigest()


def hash_file(file: ModelFile) -> ManifestEntry:
    """Hash one file, refusing it if its size changed since the directory was checked."""
    digest = hashlib.sha256()
    size = 0
    try:
        with file.source.open("rb") as stream:
            while block := stream.read(_READ_BYTES):
                digest.update(block)
                size += len(block)
    except OSError as e:
        raise InvalidModelError(
            f"{file.path} in the model directory cannot be read ({e.strerror}); fix its permissions"
        ) from e
    if size != file.size:
        raise InvalidModelError(
            f"{file.path} in the model directory changed size while being read ({file.size} then "
            f"{size} bytes); finish writing the model before the loader starts"
        )
    return ManifestEntry(path=file.path, size=size, sha256=digest.hexdigest())


def build_manifest(files: Iterable[ModelFile]) -> Manifest:
    """Hash every file and compute the canonical digest."""
    entries = tuple(sorted((hash_file(f) for f in files), key=lambda e: e.path))
    return Manifest(entries=entries, digest=manifest_digest(entries))
