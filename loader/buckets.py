"""Fetching a model from an S3 or GCS bucket, through the clouds' own client libraries (boto3,
google-cloud-storage): the only module that imports them.

`s3://BUCKET/PATH` and `gs://BUCKET/PATH` name one object or a folder of them, as for KServe's
storage initializer: the object PATH is downloaded into the directory under its own name, and
every object under PATH/ under its path below PATH (folder markers, keys ending in `/`, are
skipped). The bucket is untrusted as an archive is: its listing is checked before anything is
downloaded with the archive rules (loader/archives.py: no name outside the directory, at most
`max_bytes` in all), and each download counts its bytes against what is left.

`BucketAccess` (loader/credentials.py) carries the credential (a Secret's keys) and the S3
settings (`common.storage.S3Settings`); without a credential the cloud's default chain applies
(the pod's ServiceAccount through IRSA or GKE Workload Identity, the environment, the node's
role; `STORAGE_EMULATOR_HOST` points the GCS client at an emulator). Errors become FetchError
with what to do, and never quote a credential. Blocking: call it off the event loop.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

import boto3
import botocore.config
import botocore.exceptions

with warnings.catch_warnings():
    # google.api_core asks for grpcio-status, which only its gRPC clients use (not storage's).
    warnings.simplefilter("ignore", ImportWarning)
    import google.api_core.exceptions
import google.auth.exceptions
from google.cloud import storage as gcs
from google.oauth2 import service_account

from loader.archives import check_members, shown_bytes
from loader.credentials import BucketAccess
from loader.errors import FetchError

_CHUNK = 1 << 20
MAX_OBJECTS = 10_000
"""Objects listed at most: the agent installs no model of more files (agent.repository)."""
_READ_ONLY = ("https://www.googleapis.com/auth/devstorage.read_only",)


@dataclass(frozen=True)
class _Object:
    key: str
    size: int
    relative: str


def fetch_bucket(
    uri: str,
    directory: Path,
    access: BucketAccess,
    *,
    max_bytes: int,
    stop: threading.Event | None = None,
    timeout: float = 60.0,
) -> list[Path]:
    """Download the objects `uri` names into `directory`; the files written. FetchError says
    what is wrong and what to do."""
    scheme, _, rest = uri.partition("://")
    bucket, _, path = rest.partition("/")
    store: _Store = (
        _S3(access, bucket, timeout) if scheme.lower() == "s3" else _Gcs(access, bucket, timeout)
    )
    try:
        objects = _select(uri, store.list(path), path, max_bytes)
        written, left = [], max_bytes
        for item in objects:
            if stop is not None and stop.is_set():
                raise FetchError(f"the download of {uri} was stopped")
            target = directory / item.relative
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("wb") as out:
                for chunk in store.read(item.key):
                    if stop is not None and stop.is_set():
                        raise FetchError(f"the download of {uri} was stopped")
                    left -= len(chunk)
                    if left < 0:
                        raise FetchError(
                            f"{uri} is over {shown_bytes(max_bytes)}; slim the model or raise "
                            f"--max-model-bytes"
                        )
                    out.write(chunk)
            written.append(target)
        return written
    except FetchError:
        raise
    except Exception as e:
        raise FetchError(store.explain(uri, e)) from e


def _select(
    uri: str, listed: Iterator[tuple[str, int]], path: str, max_bytes: int
) -> list[_Object]:
    """The objects under `path` with their paths in the directory, checked as archive members."""
    base = path.rstrip("/")
    found: list[_Object] = []
    total = 0
    for key, size in listed:
        if key.endswith("/"):
            continue  # a folder marker
        if key == path:
            relative = PurePosixPath(key).name
        elif not base or key.startswith(base + "/"):
            relative = key[len(base) + 1 :] if base else key
        else:
            continue  # models/add matches models/add_one/... as a prefix only
        if len(found) == MAX_OBJECTS:
            raise FetchError(
                f"{uri} holds more than {MAX_OBJECTS} objects; a model has at most {MAX_OBJECTS} "
                f"files: point storageUri at the model's own folder"
            )
        found.append(_Object(key, size, relative))
        total += size
        if total > max_bytes:
            break  # check_members says so, without listing the rest of the bucket
    check_members(uri, ((o.relative, "file", o.size) for o in found), max_bytes)
    if not found:
        raise FetchError(
            f"{uri} holds no object; check the bucket and the path (a model folder holds "
            f"config.pbtxt and its version folders, or name one archive such as model.tar.gz)"
        )
    return found


class _Store:
    def list(self, prefix: str) -> Iterator[tuple[str, int]]:
        raise NotImplementedError

    def read(self, key: str) -> Iterator[bytes]:
        raise NotImplementedError

    def explain(self, uri: str, error: Exception) -> str:
        raise NotImplementedError


def _credential(access: BucketAccess) -> str:
    return f"the credential of {access.source}" if access.source else "the pod's own identity"


class _S3(_Store):
    def __init__(self, access: BucketAccess, bucket: str, timeout: float) -> None:
        keys = access.s3_keys
        session = boto3.session.Session(
            aws_access_key_id=keys.access_key_id if keys else None,
            aws_secret_access_key=keys.secret_access_key if keys else None,
            aws_session_token=keys.session_token if keys else None,
            region_name=access.s3.region,
        )
        config = botocore.config.Config(
            connect_timeout=timeout, read_timeout=timeout, retries={"max_attempts": 3}
        )
        self._client: Any = session.client(
            "s3", endpoint_url=access.s3.endpoint_url, verify=access.s3.verify, config=config
        )
        self._access = access
        self._bucket = bucket

    def list(self, prefix: str) -> Iterator[tuple[str, int]]:
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self._bucket, Prefix=prefix
        )
        for page in pages:
            for item in page.get("Contents") or ():
                yield str(item["Key"]), int(item["Size"])

    def read(self, key: str) -> Iterator[bytes]:
        body = self._client.get_object(Bucket=self._bucket, Key=key)["Body"]
        try:
            yield from body.iter_chunks(_CHUNK)
        finally:
            body.close()

    def explain(self, uri: str, error: Exception) -> str:
        who = _credential(self._access)
        if isinstance(error, botocore.exceptions.NoCredentialsError):
            return (
                f"{uri}: no AWS credential; name a Secret with keys AWS_ACCESS_KEY_ID and "
                f"AWS_SECRET_ACCESS_KEY in storageSecret, or give the pod's ServiceAccount an "
                f"IAM role (IRSA)"
            )
        if isinstance(error, botocore.exceptions.ClientError):
            code = str(error.response.get("Error", {}).get("Code", ""))
            if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403"):
                return (
                    f"{uri}: S3 refused {who} ({code}); check the Secret's AWS_ACCESS_KEY_ID "
                    f"and AWS_SECRET_ACCESS_KEY, and that they may read the bucket"
                )
            if code in ("NoSuchBucket", "404"):
                return f"{uri}: bucket {self._bucket} does not exist ({code})"
            return f"{uri}: S3 answered {code or 'an error'}: {error}"
        if isinstance(error, botocore.exceptions.BotoCoreError):
            return f"{uri} could not be downloaded: {error}"
        return f"{uri} could not be downloaded: {type(error).__name__}: {error}"


class _Gcs(_Store):
    def __init__(self, access: BucketAccess, bucket: str, timeout: float) -> None:
        self._access = access
        self._bucket_name = bucket
        self._timeout = timeout
        self._client: Any = None

    def _bucket(self) -> Any:
        if self._client is None:
            key = self._access.gcs_key_file
            if key is None:
                self._client = gcs.Client()
            else:
                try:
                    credentials = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
                        str(key), scopes=_READ_ONLY
                    )
                except (ValueError, KeyError, OSError) as e:
                    raise FetchError(
                        f"{self._access.source or key}: key {key.name} is not a Google service "
                        f"account key ({type(e).__name__}); write the JSON key file of a "
                        f"service account that may read the bucket"
                    ) from None
                self._client = gcs.Client(credentials=credentials, project=credentials.project_id)
        return self._client.bucket(self._bucket_name)

    def list(self, prefix: str) -> Iterator[tuple[str, int]]:
        for blob in self._bucket().list_blobs(prefix=prefix, timeout=self._timeout):
            yield str(blob.name), int(blob.size or 0)

    def read(self, key: str) -> Iterator[bytes]:
        reader: IO[bytes] = self._bucket().blob(key).open("rb", chunk_size=_CHUNK)
        with reader:
            while chunk := reader.read(_CHUNK):
                yield chunk

    def explain(self, uri: str, error: Exception) -> str:
        who = _credential(self._access)
        if isinstance(error, google.auth.exceptions.DefaultCredentialsError):
            return (
                f"{uri}: no Google credential; name a Secret with key "
                f"gcloud-application-credentials.json in storageSecret, or give the pod's "
                f"ServiceAccount a Google service account (Workload Identity)"
            )
        if isinstance(error, google.auth.exceptions.GoogleAuthError):
            return f"{uri}: {who} could not sign in to Google Cloud Storage: {error}"
        if isinstance(
            error, google.api_core.exceptions.Forbidden | google.api_core.exceptions.Unauthorized
        ):
            return f"{uri}: Google Cloud Storage refused {who}; let it read the bucket"
        if isinstance(error, google.api_core.exceptions.NotFound):
            return f"{uri}: bucket {self._bucket_name} does not exist"
        return f"{uri} could not be downloaded: {type(error).__name__}: {error}"
