"""Fetching a model's files from its storage URI into a directory, as KServe's storage initializer
puts them into /mnt/models.

`https://` and `http://`: the file the URI names is downloaded; an archive (`.tar`, `.tar.gz`,
`.tgz`, `.zip`) is unpacked into the directory and removed, so `add_one.tar.gz` holding
config.pbtxt and 1/ at its root becomes DIRECTORY/config.pbtxt and DIRECTORY/1/. TLS trusts the
process's default CA store (`SSL_CERT_FILE` adds a private CA). What comes from the network is
untrusted: an archive member that escapes the directory, a link, a device or a FIFO is refused, a
redirect may not leave HTTP(S) nor downgrade HTTPS, and the download and the unpacked files are
each bounded by `max_bytes`. `headers` (a storage credential, loader/credentials.py) go to the
URI's host over HTTPS only, never to where it redirects. `s3://`, `gs://` and `pvc://` are refused
with the way out.

Owns the download and the unpacking only: it must not parse models (validate.py checks what was
fetched) or talk to the agent. Blocking: call it off the event loop. The simulated cluster's
storage initializer runs this same code for the URIs it shares with the loader.
"""

from __future__ import annotations

import http.client
import stat
import tarfile
import threading
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import IO
from urllib.parse import urlsplit

from common.quantity import format_bytes
from loader.errors import FetchError

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
ARCHIVE_SUFFIXES = (*TAR_SUFFIXES, ".zip")
NETWORK_SCHEMES = ("http", "https")
_CHUNK = 1 << 20
_ELSEWHERE = {
    "s3": "S3",
    "gs": "Google Cloud Storage",
    "pvc": "a PersistentVolumeClaim",
}


def check_uri(uri: str) -> str:
    """The URI's scheme when the loader can fetch it; FetchError saying what to do otherwise."""
    scheme = urlsplit(uri).scheme.lower()
    if scheme in NETWORK_SCHEMES:
        return scheme
    if scheme in _ELSEWHERE:
        raise FetchError(
            f"{uri}: a model host cannot fetch from {_ELSEWHERE[scheme]} ({scheme}://) yet; serve "
            f"this model as a model pod (the webhook's storage initializer fetches it) or publish "
            f"it over https://"
        )
    raise FetchError(
        f"{uri!r} is no URI a model host can fetch; use https:// (or http://) naming the model's "
        f"archive (.tar.gz, .tgz, .tar, .zip)"
    )


def fetch(
    uri: str,
    directory: Path,
    *,
    max_bytes: int,
    timeout: float = 60.0,
    stop: threading.Event | None = None,
    headers: Mapping[str, str] | None = None,
) -> str:
    """Put the model `uri` names into `directory` (created if missing); a sentence saying what
    was done. FetchError says what is wrong; `stop`, once set, ends a download between chunks;
    `headers` go with the request to `uri` itself, HTTPS only."""
    if check_uri(uri) != "https" and headers:
        raise FetchError(f"{uri}: a credential is sent over https:// only")
    directory.mkdir(parents=True, exist_ok=True)
    downloaded = _download(uri, directory, max_bytes, timeout, stop, headers or {})
    if downloaded.name.endswith(ARCHIVE_SUFFIXES):
        _unpack(downloaded, directory, max_bytes)
        return f"downloaded {uri} and unpacked it into {directory}"
    return f"downloaded {uri} into {directory}"


class _SameOrSafer(urllib.request.HTTPRedirectHandler):
    """Follows redirects only to HTTPS, or to HTTP from HTTP: never to ftp:// or file://, and an
    HTTPS source never lands on plain HTTP."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        allowed = ("https",) if req.full_url.lower().startswith("https:") else NETWORK_SCHEMES
        if urlsplit(newurl).scheme.lower() not in allowed:
            raise FetchError(
                f"{req.full_url} redirects to {newurl}, which the loader does not follow "
                f"(only to https://, or http:// from http://)"
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _download(
    uri: str,
    directory: Path,
    max_bytes: int,
    timeout: float,
    stop: threading.Event | None,
    headers: Mapping[str, str],
) -> Path:
    name = urlsplit(uri).path.rpartition("/")[2]
    if not name or name in (".", ".."):
        raise FetchError(f"{uri} names no file; point it at the model's archive (model.tar.gz)")
    target = directory / name
    opener = urllib.request.build_opener(_SameOrSafer)
    request = urllib.request.Request(uri)  # noqa: S310 - check_uri allowed http(s) only
    for name, value in headers.items():
        # Unredirected: a redirect (a pre-signed URL elsewhere) never carries the credential.
        request.add_unredirected_header(name, value)
    size = 0
    try:
        with opener.open(request, timeout=timeout) as answer, target.open("wb") as out:
            length = answer.headers.get("Content-Length")
            if length and length.isdigit() and int(length) > max_bytes:
                raise _too_big(uri, int(length), max_bytes)
            while chunk := answer.read(_CHUNK):
                if stop is not None and stop.is_set():
                    raise FetchError(f"the download of {uri} was stopped")
                size += len(chunk)
                if size > max_bytes:
                    raise _too_big(uri, size, max_bytes)
                out.write(chunk)
    except urllib.error.HTTPError as e:
        e.close()  # its connection, at once rather than when collected
        raise FetchError(f"{uri} answered HTTP {e.code} {e.reason}") from e
    except (urllib.error.URLError, OSError) as e:
        reason = e.reason if isinstance(e, urllib.error.URLError) else e
        raise FetchError(f"{uri} could not be downloaded: {reason}") from e
    return target


def _too_big(uri: str, size: int, max_bytes: int) -> FetchError:
    return FetchError(
        f"{uri} is over {_bytes(max_bytes)} (at least {_bytes(size)}); slim the model "
        f"or raise --max-model-bytes"
    )


def _bytes(count: int) -> str:
    return f"{count} bytes" if count < 1024 else format_bytes(count)


def _unpack(archive: Path, directory: Path, max_bytes: int) -> None:
    """Unpack `archive` into `directory` after checking every member, then remove it."""
    try:
        if archive.name.endswith(TAR_SUFFIXES):
            with tarfile.open(archive) as tar:
                members = tar.getmembers()
                _check_members(
                    archive.name,
                    ((m.name, _tar_kind(m), m.size) for m in members),
                    max_bytes,
                )
                # The "data" filter checks again: no member outside, no link, no device.
                tar.extractall(directory, members=members, filter="data")
        else:
            with zipfile.ZipFile(archive) as zipped:
                infos = zipped.infolist()
                _check_members(
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


def _check_members(archive: str, members: Iterable[tuple[str, str, int]], max_bytes: int) -> None:
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
                f"{archive} unpacks to more than {_bytes(max_bytes)}; slim the model or "
                f"raise --max-model-bytes"
            )
