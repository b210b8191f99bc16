"""Fetching a model from an S3 or GCS bucket, through the clouds' own client libraries (boto3,
google-cloud-storage): the only module that imports them.

`s3://BUCKET/PATH` and `gs://BUCKET/PATH` name one object or a folder of them, as for KServe's
storage initializer: the object PATH is downloaded into the directory under its own name, and
every object under PATH/ under its path below PATH (folder markers, keys ending in `/`, are
skipped). The bucket is untrusted as an archive is: its listing is checked before anything is
downloaded with the archive rules (loader/archives.py: no name outside the directory, at most
`max_bytes` in all), and each download counts the bytes that arrive against what is left. A
listing is bounded by every key it returns, skipped or not (`MAX_LISTED`), and by its pages
(`MAX_PAGES`, empty ones too); the whole fetch by its deadline (loader/deadline.py), checked at
every page, key and read, each socket waiting no longer than what is left of it.

`BucketAccess` (loader/credentials.py) carries the credential (a Secret's keys) and the S3
settings (`common.storage.S3Settings`); without a credential the cloud's default chain applies
(the pod's ServiceAccount through IRSA or GKE Workload Identity, the environment, the node's
role; `STORAGE_EMULATOR_HOST` points the GCS client at an emulator). Errors become FetchError
with what to do, and never quote a credential. Blocking: call it off the event loop.
"""

from __future__ import annotations

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
from loader.deadline import Deadline
from loader.errors import FetchError

_CHUNK = 1 << 20
MAX_OBJECTS = 10_000
"""Objects fetched at most: the agent installs no model of more files
(agent.installs.repository)."""
MAX_LISTED = 100_000
"""Keys a listing may return in all: files, folder markers and keys beside the folder that only
share its prefix (`models/add` lists `models/add_one/...` too), ten times a model's files."""
MAX_PAGES = 1_000
"""Pages a listing may take, empty ones too (S3 and GCS give up to 1,000 keys a page, so
`MAX_LISTED` keys take 100)."""
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
    deadline: Deadline,
    timeout: float = 60.0,
) -> list[Path]:
    """Download the objects `uri` names into `directory` by `deadline`; the files written.
    `timeout` bounds one wait on a socket. FetchError says what is wrong and what to do."""
    scheme, _, rest = uri.partition("://")
    bucket, _, path = rest.partition("/")
    store: _Store = (
        _S3(access, bucket, deadline, timeout)
        if scheme.lower() == "s3"
        else _Gcs(access, bucket, deadline, timeout)
    )
    try:
        objects = _select(uri, store.pages(path), path, max_bytes, deadline)
        written, left = [], max_bytes
        for item in objects:
            deadline.check()
            target = directory / item.relative
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("wb") as out:
                for chunk in store.read(item.key):
                    deadline.check()
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


def _listed(
    uri: str, pages: Iterator[list[tuple[str, int]]], deadline: Deadline
) -> Iterator[tuple[str, int]]:
    """Every key of the listing's `pages`, within MAX_PAGES, MAX_LISTED and `deadline`."""
    seen = 0
    for number, page in enumerate(pages, 1):
        deadline.check()
        if number > MAX_PAGES:
            raise FetchError(
                f"{uri} lists more than {MAX_PAGES} pages; point storageUri at the model's own "
                f"folder, and check that the storage is S3 or GCS (a listing page holds up to "
                f"1,000 keys)"
            )
        for key, size in page:
            seen += 1
            if seen > MAX_LISTED:
                raise FetchError(
                    f"{uri} lists more than {MAX_LISTED} keys (files, folder markers and names "
                    f"beside the folder that share its prefix); point storageUri at the model's "
                    f"own folder"
                )
            deadline.check()
            yield key, size


def _select(
    uri: str,
    pages: Iterator[list[tuple[str, int]]],
    path: str,
    max_bytes: int,
    deadline: Deadline,
) -> list[_Object]:
    """The objects under `path` with their paths in the directory, checked as archive members."""
    base = path.rstrip("/")
    found: list[_Object] = []
    total = 0
    for key, size in _listed(uri, pages, deadline):
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
    def pages(self, prefix: str) -> Iterator[list[tuple[str, int]]]:
        """The listing of `prefix`, a page of (key, size) at a time."""
        raise NotImplementedError

    def read(self, key: str) -> Iterator[bytes]:
        raise NotImplementedError

    def explain(self, uri: str, error: Exception) -> str:
        raise NotImplementedError


def _credential(access: BucketAccess) -> str:
    return f"the credential of {access.source}" if access.source else "the pod's own identity"


class _S3(_Store):
    def __init__(
        self, access: BucketAccess, bucket: str, deadline: Deadline, timeout: float
    ) -> None:
        keys = access.s3_keys
        session = boto3.session.Session(
            aws_access_key_id=keys.access_key_id if keys else None,
            aws_secret_access_key=keys.secret_access_key if keys else None,
            aws_session_token=keys.session_token if keys else None,
            region_name=access.s3.region,
        )
        wait = deadline.left(timeout)
        config = botocore.config.Config(
            connect_timeout=wait, read_timeout=wait, retries={"max_attempts": 3}
        )
        self._client: Any = session.client(
            "s3", endpoint_url=access.s3.endpoint_url, verify=access.s3.verify, config=config
        )
        self._access = access
        self._bucket = bucket

    def pages(self, prefix: str) -> Iterator[list[tuple[str, int]]]:
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self._bucket, Prefix=prefix
        )
        for page in pages:
            yield [(str(item["Key"]), int(item["Size"])) for item in page.get("Contents") or ()]

    def read(self, key: str) -> Iterator[bytes]:
        body = self._client.get_object(Bucket=self._bucket, Key=key)["Body"]
        # The response itself (urllib3's): read1 returns what one read of the socket brings, so
        # the caller's deadline holds against a trickle; the body's own reads wait for a whole
        # chunk. urllib3 checks the length the headers promised.
        raw = body._raw_stream
        try:
            while chunk := raw.read1(_CHUNK):
                yield chunk
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
    def __init__(
        self, access: BucketAccess, bucket: str, deadline: Deadline, timeout: float
    ) -> None:
        self._access = access
        self._bucket_name = bucket
        self._deadline = deadline
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

    def pages(self, prefix: str) -> Iterator[list[tuple[str, int]]]:
        listing = self._bucket().list_blobs(
            prefix=prefix, timeout=self._deadline.left(self._timeout)
        )
        for page in listing.pages:
            yield [(str(blob.name), int(blob.size or 0)) for blob in page]

    def read(self, key: str) -> Iterator[bytes]:
        reader: IO[bytes] = (
            self._bucket()
            .blob(key)
            .open("rb", chunk_size=_CHUNK, timeout=self._deadline.left(self._timeout))
        )
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
