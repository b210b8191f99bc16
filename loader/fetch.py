"""Fetching a model's files from its storage URI into a directory, as KServe's storage initializer
puts them into /mnt/models: one implementation for a model host's loader and, in the simulated
cluster, the model pods' storage initializer.

- `s3://BUCKET/PATH` and `gs://BUCKET/PATH`: the objects under PATH, through the clouds' own
  client libraries (loader/buckets.py), with the credential `bucket` gives.
- `https://` and `http://`: the file the URI names is downloaded. TLS trusts the process's default
  CA store (`SSL_CERT_FILE` adds a private CA); a redirect may not leave HTTP(S) nor downgrade
  HTTPS; `headers` (a storage credential, loader/credentials.py) go to the URI's host over HTTPS
  only, never to where it redirects.

Either way, the whole fetch has a deadline (loader/deadline.py: `deadline_seconds`), checked
between listing pages, keys and reads, each socket waiting no longer than what is left of it, and
when what was fetched is one archive (`.tar`, `.tar.gz`, `.tgz`, `.zip`) it is
unpacked into the directory and removed (loader/archives.py, whose rules for untrusted files
apply), so `add_one.tar.gz` holding config.pbtxt and 1/ at its root becomes
DIRECTORY/config.pbtxt and DIRECTORY/1/; what is fetched and what is unpacked are each bounded by
`max_bytes`. `pvc://` is refused with the way out: a running model host cannot mount a claim.

Owns the choice of door and the HTTP download; it must not parse models (validate.py checks what
was fetched) or talk to the agent. Blocking: call it off the event loop.
"""

from __future__ import annotations

import http.client
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

from loader.archives import is_archive, shown_bytes, unpack
from loader.credentials import BUCKET_SCHEMES, BucketAccess
from loader.deadline import DEFAULT_FETCH_SECONDS, Deadline
from loader.errors import FetchError, StoreUnavailableError

NETWORK_SCHEMES = ("http", "https")
SCHEMES = (*BUCKET_SCHEMES, *NETWORK_SCHEMES)
_CHUNK = 1 << 20


def check_uri(uri: str) -> str:
    """The URI's scheme when the loader can fetch it; FetchError saying what to do otherwise."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "pvc":
        raise FetchError(
            f"{uri}: a model host cannot read a PersistentVolumeClaim (a running pod cannot "
            f"mount a new one); serve this model as a model pod, whose storage initializer "
            f"mounts the claim, or copy its files to s3://, gs:// or https://"
        )
    if scheme not in SCHEMES or not parts.netloc:
        raise FetchError(
            f"{uri!r} is no URI a model host can fetch; use s3://BUCKET/PATH, gs://BUCKET/PATH "
            f"or https://HOST/FILE naming the model's archive (.tar.gz, .tgz, .tar, .zip)"
        )
    return scheme


def fetch(
    uri: str,
    directory: Path,
    *,
    max_bytes: int,
    timeout: float = 60.0,
    stop: threading.Event | None = None,
    headers: Mapping[str, str] | None = None,
    bucket: BucketAccess | None = None,
    deadline_seconds: float = DEFAULT_FETCH_SECONDS,
) -> str:
    """Put the model `uri` names into `directory` (created if missing); a sentence saying what
    was done. FetchError says what is wrong; `stop`, once set, ends a download between chunks;
    `timeout` bounds one wait on a socket; `deadline_seconds` the whole fetch; `headers` go with
    the request to an https:// `uri` itself; `bucket` is the credential and settings of an s3://
    or gs:// one (None: the cloud's default chain)."""
    scheme = check_uri(uri)
    deadline = Deadline(uri, deadline_seconds, stop)
    if scheme != "https" and headers:
        raise FetchError(f"{uri}: a credential is sent over https:// only")
    directory.mkdir(parents=True, exist_ok=True)
    if scheme in BUCKET_SCHEMES:
        # Imported here: the clouds' libraries cost a process that never reads a bucket ~1 s.
        from loader.buckets import fetch_bucket

        files = fetch_bucket(
            uri,
            directory,
            bucket or BucketAccess(),
            max_bytes=max_bytes,
            deadline=deadline,
            timeout=timeout,
        )
        said = f"downloaded {len(files)} file{'s' if len(files) != 1 else ''} of {uri}"
    else:
        files = [_download(uri, directory, max_bytes, timeout, deadline, headers or {})]
        said = f"downloaded {uri}"
    if len(files) == 1 and is_archive(files[0]):
        deadline.check()
        unpack(files[0], directory, max_bytes)
        return f"{said} and unpacked it into {directory}"
    return f"{said} into {directory}"


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
    deadline: Deadline,
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
        with (
            opener.open(request, timeout=deadline.left(timeout)) as answer,
            target.open("wb") as out,
        ):
            length = answer.headers.get("Content-Length")
            if length and length.isdigit() and int(length) > max_bytes:
                raise _too_big(uri, int(length), max_bytes)
            # read1: what one read of the socket brings, so a trickle meets the deadline too.
            while chunk := answer.read1(_CHUNK):
                deadline.check()
                size += len(chunk)
                if size > max_bytes:
                    raise _too_big(uri, size, max_bytes)
                out.write(chunk)
    except urllib.error.HTTPError as e:
        e.close()  # its connection, at once rather than when collected
        kind = StoreUnavailableError if e.code == 429 or e.code >= 500 else FetchError
        raise kind(f"{uri} answered HTTP {e.code} {e.reason}") from e
    except (urllib.error.URLError, OSError) as e:
        reason = e.reason if isinstance(e, urllib.error.URLError) else e
        # Not reached, reset or too slow: the store; any other OSError is this pod's disk.
        unreachable = isinstance(e, urllib.error.URLError | ConnectionError | TimeoutError)
        kind = StoreUnavailableError if unreachable else FetchError
        raise kind(f"{uri} could not be downloaded: {reason}") from e
    return target


def _too_big(uri: str, size: int, max_bytes: int) -> FetchError:
    return FetchError(
        f"{uri} is over {shown_bytes(max_bytes)} (at least {shown_bytes(size)}); slim the model "
        f"or raise --max-model-bytes"
    )
