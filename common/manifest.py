"""The manifest of a model directory and its canonical digest: the loader-agent contract.

protos/agent.proto defines the digest: sha256 over the files sorted by path, each contributing
"path\\0size\\0sha256\\n" (size in decimal, sha256 in lowercase hex). The loader computes it over
what it sends and the agent over what it accepted, so both must use this one definition. This
module also converts to and from the protobuf `Manifest`. It must not read files, validate
paths or decide what a part does with a manifest; the loader and the agent do that at their edges.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

from protos import agent_pb2


@dataclass(frozen=True)
class ManifestEntry:
    """One file: path relative to the model directory (with "/"), size in bytes, sha256 hex."""

    path: str
    size: int
    sha256: str


def manifest_digest(entries: Iterable[ManifestEntry]) -> str:
    """The canonical digest of a set of entries, independent of the order they come in."""
    digest = hashlib.sha256()
    for entry in sorted(entries, key=lambda e: e.path):
        digest.update(f"{entry.path}\0{entry.size}\0{entry.sha256}\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class Manifest:
    """A model directory's files, always kept sorted by path."""

    files: tuple[ManifestEntry, ...]

    def __post_init__(self) -> None:
        # Sorted once here so every holder can rely on path order (the chunk order, too).
        object.__setattr__(self, "files", tuple(sorted(self.files, key=lambda e: e.path)))

    @cached_property
    def digest(self) -> str:
        """The canonical digest (agent.proto), computed once per manifest."""
        return manifest_digest(self.files)

    @property
    def total_bytes(self) -> int:
        """Sum of the files' sizes."""
        return sum(entry.size for entry in self.files)

    def to_proto(self) -> agent_pb2.Manifest:
        """The manifest as the InstallModel header carries it."""
        return agent_pb2.Manifest(
            files=[
                agent_pb2.FileEntry(path=e.path, size=e.size, sha256=e.sha256) for e in self.files
            ]
        )


def entries_from_proto(message: agent_pb2.Manifest) -> list[ManifestEntry]:
    """The entries of a received manifest, in the order sent, not yet validated."""
    return [ManifestEntry(f.path, int(f.size), f.sha256) for f in message.files]
