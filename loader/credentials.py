"""A model host's storage credentials: what a replica's Secret gives its download.

A TritonModel names a Secret of its own namespace in `spec.storageSecret`; the binder mounts its
keys (`common.storage.SECRET_KEYS`), read-only and optional, in its namespace's host's loader
alone at DIR/<Secret>/ (a Secret that does not exist leaves no directory), and the agent passes
the name, and the TritonModel's s3-* settings, with the replica. A host serves one namespace, so
the Secrets it sees are its own namespace's. The Secret has KServe's keys:

- s3://: `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`);
- gs://: `gcloud-application-credentials.json`, a service account key;
- https://: `https-host`, the one host the credential is for, and `headers`, a JSON object of
  header names and values (`{"Authorization": "Bearer ..."}`). The headers go to that host only,
  over HTTPS only, and never follow a redirect (`loader.fetch`).

Without a Secret, s3:// and gs:// use the cloud's default chain (loader/buckets.py). Owns reading
and checking the mounted Secret; it must not download (fetch.py, buckets.py) nor name a value of
the Secret in an error.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlsplit

from common.contract import SECRET_NAME
from common.storage import GCS_KEY, S3_KEYS, S3Settings, s3_options_from_environment, s3_settings
from loader.errors import FetchError

BUCKET_SCHEMES = ("s3", "gs")

HOST_KEY = "https-host"
HEADERS_KEY = "headers"
_MAX_BYTES = 1 << 20  # a Secret holds at most 1 MiB
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")
_HOW = (
    f"keys {HOST_KEY} (the storage host, for example models.example.com) and {HEADERS_KEY} (a "
    f'JSON object such as {{"Authorization": "Bearer TOKEN"}})'
)


@dataclass(frozen=True)
class S3Keys:
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def __repr__(self) -> str:
        return "S3Keys(...)"  # never printed


@dataclass(frozen=True)
class BucketAccess:
    """How to reach a bucket (loader/buckets.py): its credential (none: the cloud's default
    chain) and S3 settings."""

    s3: S3Settings = field(default_factory=S3Settings)
    s3_keys: S3Keys | None = None
    gcs_key_file: Path | None = None
    """A service account key (KServe's gcloud-application-credentials.json)."""
    source: str = ""
    """Where the credential comes from, named in errors ("Secret creds"; "": none)."""


@dataclass(frozen=True)
class StorageCredential:
    """What a replica's download is given: https:// headers, or a bucket's access."""

    headers: Mapping[str, str] = field(default_factory=dict)
    bucket: BucketAccess = field(default_factory=BucketAccess)


_S3_HOW = "keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), as KServe's"
_GCS_HOW = f"key {GCS_KEY}, a Google service account's JSON key, as KServe's"


def storage_credential(
    directory: Path, secret: str, uri: str, options: Mapping[str, str]
) -> StorageCredential:
    """The credential Secret `secret` (mounted under `directory`) and the s3-* `options` give
    the download of `uri`. FetchError says what is wrong and what to do."""
    scheme = urlsplit(uri).scheme.lower()
    if scheme not in BUCKET_SCHEMES:
        return StorageCredential(headers=storage_headers(directory, secret, uri))
    access = BucketAccess(s3=s3_settings(options), source=f"Secret {secret}" if secret else "")
    if not secret:
        return StorageCredential(bucket=access)
    folder = _folder(directory, secret, _S3_HOW if scheme == "s3" else _GCS_HOW)
    if scheme == "gs":
        if not (folder / GCS_KEY).is_file():
            raise FetchError(f"Secret {secret} has no key {GCS_KEY}; give it {_GCS_HOW}")
        return StorageCredential(bucket=replace(access, gcs_key_file=folder / GCS_KEY))
    key_id, secret_key, token = S3_KEYS
    keys = S3Keys(
        _read(folder, key_id, secret, _S3_HOW).strip(),
        _read(folder, secret_key, secret, _S3_HOW).strip(),
        _read(folder, token, secret, _S3_HOW).strip() if (folder / token).is_file() else None,
    )
    return StorageCredential(bucket=replace(access, s3_keys=keys))


def environment_access(env: Mapping[str, str]) -> BucketAccess:
    """What a storage initializer's environment (KServe's variables, `webhook.storage`) gives a
    bucket's download: the S3 settings and the GCS key file; boto3 reads the AWS keys from the
    environment itself."""
    key_file = env.get("GOOGLE_APPLICATION_CREDENTIALS")
    return BucketAccess(
        s3=s3_settings(s3_options_from_environment(env)),
        gcs_key_file=Path(key_file) if key_file else None,
        source="the pod's storage Secret" if key_file or env.get("AWS_ACCESS_KEY_ID") else "",
    )


def _folder(directory: Path, secret: str, how: str) -> Path:
    if not SECRET_NAME.fullmatch(secret):
        raise FetchError(f"storageSecret {secret!r} is not a Secret name")
    folder = directory / secret
    if not folder.is_dir():
        raise FetchError(
            f"Secret {secret} is not in this model host: it does not exist in the model's "
            f"namespace (create it there with {how}), or the host was made before the model "
            f"named it (the binder replaces such a host)"
        )
    return folder


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
    folder = _folder(directory, secret, _HOW)
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


def _read(folder: Path, key: str, secret: str, how: str = _HOW) -> str:
    path = folder / key
    try:
        with path.open("rb") as file:
            data = file.read(_MAX_BYTES + 1)
        if len(data) > _MAX_BYTES:
            raise FetchError(f"Secret {secret}: key {key} is over 1 MiB")
        return data.decode()
    except FileNotFoundError:
        raise FetchError(f"Secret {secret} has no key {key}; give it {how}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise FetchError(
            f"Secret {secret}: key {key} cannot be read ({e.__class__.__name__})"
        ) from None
