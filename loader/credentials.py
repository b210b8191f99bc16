"""A model host's storage credentials: the HTTP headers a replica's Secret adds to its download.

A TritonModel names a Secret of its own namespace in `spec.storageSecret`; the binder mounts its
keys, read-only and optional, in its namespace's host's loader alone at DIR/<Secret>/ (a Secret
that does not exist leaves no directory), and the agent passes the name with the replica. The
Secret has KServe's keys for URI storage: `https-host`, the one host the credential is for, and
`headers`, a JSON object of header names and values (`{"Authorization": "Bearer ..."}`). The
headers go to that host only, over HTTPS only, and never follow a redirect (`loader.fetch`).

Owns reading and checking the mounted Secret; it must not download (fetch.py) nor name a value
of the Secret in an error.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlsplit

from common.contract import SECRET_NAME
from loader.errors import FetchError

HOST_KEY = "https-host"
HEADERS_KEY = "headers"
_MAX_BYTES = 1 << 20  # a Secret holds at most 1 MiB
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")
_HOW = (
    f"keys {HOST_KEY} (the storage host, for example models.example.com) and {HEADERS_KEY} (a "
    f'JSON object such as {{"Authorization": "Bearer TOKEN"}})'
)


def storage_headers(directory: Path, secret: str, uri: str) -> dict[str, str]:
    """The headers Secret `secret` (mounted under `directory`) gives the download of `uri`;
    none without a Secret. FetchError says what is wrong and what to do."""
    if not secret:
        return {}
    if not SECRET_NAME.fullmatch(secret):
        raise FetchError(f"storageSecret {secret!r} is not a Secret name")
    parts = urlsplit(uri)
    if parts.scheme.lower() != "https":
        raise FetchError(
            f"storageSecret {secret} is set, but {uri} is not https://: the credential is never "
            f"sent in clear; publish the model over https://"
        )
    folder = directory / secret
    if not folder.is_dir():
        raise FetchError(
            f"Secret {secret} is not in this model host: it does not exist in the model's "
            f"namespace (create it there with {_HOW}), or the host was made before the model "
            f"named it (the binder replaces such a host)"
        )
    host = _read(folder, HOST_KEY, secret).strip()
    wanted = (parts.hostname or "").lower()
    if host.lower() not in (wanted, parts.netloc.lower()):
        raise FetchError(
            f"Secret {secret} is for host {host!r}, but storageUri {uri} is on {wanted!r}: "
            f"its credential goes to its {HOST_KEY} only; set {HOST_KEY} to the storage host"
        )
    try:
        headers = json.loads(_read(folder, HEADERS_KEY, secret))
    except ValueError as e:
        # `from None` here and below: a parser's error may quote the Secret's bytes.
        raise FetchError(
            f"Secret {secret}: key {HEADERS_KEY} is not JSON ({e.__class__.__name__}); write "
            f"a JSON object of header names and values"
        ) from None
    if not isinstance(headers, dict) or not headers:
        raise FetchError(
            f"Secret {secret}: key {HEADERS_KEY} is not a JSON object of header names and values"
        )
    for name, value in headers.items():
        if not _HEADER_NAME.fullmatch(name) or not isinstance(value, str):
            raise FetchError(
                f"Secret {secret}: header {name[:64]!r} of key {HEADERS_KEY} is no header name "
                f"with a string value"
            )
        if any(c in value for c in "\r\n\0"):
            raise FetchError(
                f"Secret {secret}: the value of header {name} holds a line break or NUL"
            )
    return headers


def _read(folder: Path, key: str, secret: str) -> str:
    path = folder / key
    try:
        with path.open("rb") as file:
            data = file.read(_MAX_BYTES + 1)
        if len(data) > _MAX_BYTES:
            raise FetchError(f"Secret {secret}: key {key} is over 1 MiB")
        return data.decode()
    except FileNotFoundError:
        raise FetchError(f"Secret {secret} has no key {key}; give it {_HOW}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise FetchError(
            f"Secret {secret}: key {key} cannot be read ({e.__class__.__name__})"
        ) from None
