"""Hashing a checked model directory into its manifest: every file's path, size and sha256.

The manifest type and its canonical digest are the loader-agent contract and live in
`common.manifest`. Owns reading and hashing the files; it must not decide whether a directory is
valid (validate.py does) or talk to the agent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from common.manifest import Manifest, ManifestEntry
from loader.errors import InvalidModelError
from loader.validate import ModelFile

_READ_BYTES = 1024 * 1024


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
    return Manifest(tuple(hash_file(f) for f in files))
