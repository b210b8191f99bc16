"""Unpacking a model archive that came from the network: untrusted.

`.tar`, `.tar.gz`, `.tgz` and `.zip` are unpacked into their directory and removed. A member that
escapes the directory (absolute, `..`, a backslash), a link, a device or a FIFO is refused, and
the files may sum to at most `max_bytes`: what the headers declare is what extraction writes.
The same rules check the names and sizes of a bucket's objects before they are downloaded
(loader/buckets.py). Owns these rules only; it must not download (fetch.py, buckets.py).
"""

from __future__ import annotations

import stat
import tarfile
import zipfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from common.quantity import format_bytes
from loader.errors import FetchError

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
ARCHIVE_SUFFIXES = (*TAR_SUFFIXES, ".zip")


def is_archive(path: Path) -> bool:
    return path.name.endswith(ARCHIVE_SUFFIXES)


def shown_bytes(count: int) -> str:
    return f"{count} bytes" if count < 1024 else format_bytes(count)


def unpack(archive: Path, directory: Path, max_bytes: int) -> None:
    """Unpack `archive` into `directory` after checking every member, then remove it."""
    try:
        if archive.name.endswith(TAR_SUFFIXES):
            with tarfile.open(archive) as tar:
                members = tar.getmembers()
                check_members(
                    archive.name,
                    ((m.name, _tar_kind(m), m.size) for m in members),
                    max_bytes,
                )
                # The "data" filter checks again: no member outside, no link, no device.
                tar.extractall(directory, members=members, filter="data")
        else:
            with zipfile.ZipFile(archive) as zipped:
                infos = zipped.infolist()
                check_members(
                    archive.name,
                    ((i.filename, _zip_kind(i), i.file_size) for i in infos),
                    max_bytes,
                )
                zipped.extractall(directory, members=infos)  # noqa: S202 - every member checked
    except (tarfile.TarError, zipfile.BadZipFile, EOFError) as e:
        raise FetchError(f"{archive.name} is no readable archive: {e}") from e
    except OSError as e:
        raise FetchError(f"{archive.name} could not be unpacked: {e}") from e
    archive.unlink()


def _tar_kind(member: tarfile.TarInfo) -> str:
    if member.isfile():
        return "file"
    if member.isdir():
        return "directory"
    return "link" if member.issym() or member.islnk() else "special file"


def _zip_kind(info: zipfile.ZipInfo) -> str:
    # Unix archivers keep the file type in the high bits; others leave it 0 (a plain file).
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_IFMT(mode) and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return "special file"
    return "directory" if info.is_dir() else "file"


def check_members(archive: str, members: Iterable[tuple[str, str, int]], max_bytes: int) -> None:
    """Refuse the archive unless every member is a file or directory inside it, and the files
    sum to at most `max_bytes` (what the headers declare is what extraction writes)."""
    total = 0
    for name, kind, size in members:
        path = PurePosixPath(name)
        if path.is_absolute() or ".." in path.parts or "\\" in name:
            raise FetchError(
                f"{archive} holds {name!r}, outside the model directory; pack the model with "
                f"paths relative to its root"
            )
        if kind not in ("file", "directory"):
            raise FetchError(
                f"{archive} holds {name!r}, a {kind}; a model archive holds only files and "
                f"directories"
            )
        total += size
        if total > max_bytes:
            raise FetchError(
                f"{archive} unpacks to more than {shown_bytes(max_bytes)}; slim the model or "
                f"raise --max-model-bytes"
            )
