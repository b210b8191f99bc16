"""Where a TritonModel's files are, from an InferenceService's storage: a `storageUri` as it
is, or a key of the namespace's `storage-config` Secret (ModelMesh's format: each key a JSON
object with `type` s3/gcs/http(s), `bucket` or `default_bucket`, `endpoint_url`, `region`,
`access_key_id`, `secret_access_key`, `url`, `headers`) and a path in it.

What ModelMesh's entry says becomes what a TritonModel takes: the URI (s3://BUCKET/PATH,
gs://BUCKET/PATH, https://HOST/PATH), its S3 settings (the TritonModel's `s3-*` annotations)
and, when the entry holds a credential, KServe's keys for a Secret of the same namespace the
TritonModel names in `spec.storageSecret` (`credential`): a credential is never copied out of
its namespace. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from binder.inferenceservices.predictor import InvalidSpecError, Storage

STORAGE_CONFIG = "storage-config"
"""ModelMesh's Secret of storage keys, one per namespace."""
DEFAULT_KEY = "default"
"""The storage key used when the InferenceService names none (ModelMesh's default)."""
_NAME_PART = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class Files:
    """What the TritonModel is given: its storageUri, its S3 settings (s3-endpoint,
    s3-usehttps, s3-region) and a credential in KServe's keys (empty: none)."""

    uri: str
    s3: tuple[tuple[str, str], ...] = ()
    credential: Mapping[str, str] = field(default_factory=dict)
    key: str = ""
    """The storage key the credential comes from ("" when none)."""
    schema_path: str = ""
    """The path of the model's schema in the store of `uri` (its bucket, or its host for
    https://): `storage.schemaPath` (or the annotation), under the entry's `url` path for
    https ("" when none)."""

    def secret_name(self) -> str:
        """The name of the Secret holding `credential`: the storage key and a digest of the
        credential, so a new credential is a new Secret and the models move to it."""
        digest = hashlib.sha256(
            json.dumps([self.key, dict(self.credential)], sort_keys=True).encode()
        ).hexdigest()[:10]
        part = _NAME_PART.sub("-", self.key.lower()).strip("-")[:40].strip("-") or "key"
        return f"modelmesh-storage-{part}-{digest}"


def entry_of(data: Mapping[str, str] | None, key: str | None) -> Mapping[str, Any] | None:
    """The storage-config entry of `key` (DEFAULT_KEY when None) from the Secret's decoded
    `data`, or None when there is no such key (or no Secret). InvalidSpecError when the named key
    is not a JSON object."""
    name = key or DEFAULT_KEY
    if data is None or name not in data:
        if key is not None:
            raise InvalidSpecError(
                f"storage key {key} is not in the namespace's {STORAGE_CONFIG} Secret: add it "
                "(a JSON object with type, bucket, endpoint_url and the credential), or fix "
                "storage.key"
            )
        return None
    try:
        entry = json.loads(data[name])
    except json.JSONDecodeError as e:
        raise InvalidSpecError(
            f"storage key {name} of the {STORAGE_CONFIG} Secret is not JSON: {e.msg}"
        ) from e
    if not isinstance(entry, dict):
        raise InvalidSpecError(
            f"storage key {name} of the {STORAGE_CONFIG} Secret is not an object"
        )
    return entry


def files_of(
    storage: Storage,
    entry: Mapping[str, Any] | None,
    key: str | None,
    *,
    credential: bool = True,
) -> Files:
    """The TritonModel's files for the predictor's storage and its storage-config entry (None:
    no key and no `default` one), or InvalidSpecError saying what is missing; without
    `credential` (the InferenceService names its own Secret) the entry's is not read."""
    files = _files_of(storage, entry, key, credential)
    if not storage.schema_path:
        return files
    schema = storage.schema_path.lstrip("/")
    base = str((entry or {}).get("url") or "") if files.uri.startswith("https://") else ""
    if base and storage.uri is None:
        schema = f"{urlsplit(base).path.strip('/')}/{schema}".lstrip("/")
    return replace(files, schema_path=schema)


def _files_of(
    storage: Storage, entry: Mapping[str, Any] | None, key: str | None, credential: bool
) -> Files:
    name = key or DEFAULT_KEY
    if storage.uri is not None:
        if entry is None:
            return Files(storage.uri)
        return _with_entry(storage.uri, entry, name, credential)
    path = (storage.path or "").lstrip("/")
    if entry is None:
        raise InvalidSpecError(
            "storage.path needs a storage key: write storage.key, naming a key of the "
            f"namespace's {STORAGE_CONFIG} Secret (or give that Secret a key named default)"
        )
    kind = str(entry.get("type") or "").lower()
    parameters = dict(storage.parameters)
    if kind in ("s3", "gcs"):
        bucket = parameters.get("bucket") or entry.get("bucket") or entry.get("default_bucket")
        if not bucket:
            raise InvalidSpecError(
                f"storage key {name} names no bucket: write storage.parameters.bucket, or "
                f"bucket (or default_bucket) in the {STORAGE_CONFIG} entry"
            )
        scheme = "s3" if kind == "s3" else "gs"
        return _with_entry(f"{scheme}://{bucket}/{path}", entry, name, credential)
    if kind in ("http", "https"):
        base = str(entry.get("url") or "")
        if not base.startswith("https://"):
            raise InvalidSpecError(
                f"storage key {name} (type {kind}) needs url https://HOST[/PATH]: files are "
                "fetched over HTTPS only"
            )
        return _with_entry(f"{base.rstrip('/')}/{path}", entry, name, credential)
    raise InvalidSpecError(
        f"storage key {name} has type {kind or '(none)'}, which tritonshare does not fetch: "
        "copy the files to S3 (type s3), GCS (type gcs) or HTTPS (type https)"
    )


def _with_entry(uri: str, entry: Mapping[str, Any], key: str, credential: bool) -> Files:
    scheme = uri.partition("://")[0]
    if scheme == "s3":
        keys = _s3_credential(entry, key) if credential else {}
        return Files(uri, _s3_options(entry, key), keys, key if keys else "")
    if not credential:
        return Files(uri)
    if scheme == "gs":
        if any(k in entry for k in ("private_key", "json_key", "client_email")):
            raise InvalidSpecError(
                f"storage key {key} holds a GCS credential, which tritonshare does not read "
                "from storage-config: create a Secret with the service account key as "
                "gcloud-application-credentials.json and name it in the InferenceService's "
                "tritonshare.io/storage-secret annotation, or use Workload Identity"
            )
        return Files(uri)
    headers = entry.get("headers")
    if not headers:
        return Files(uri)
    if not isinstance(headers, dict):
        raise InvalidSpecError(f"storage key {key}: headers must be an object of header values")
    host = urlsplit(uri).hostname or ""
    secret = {"https-host": host, "headers": json.dumps(headers, sort_keys=True)}
    return Files(uri, (), secret, key)


def _s3_options(entry: Mapping[str, Any], key: str) -> tuple[tuple[str, str], ...]:
    options: list[tuple[str, str]] = []
    endpoint = str(entry.get("endpoint_url") or entry.get("endpoint") or "")
    if endpoint:
        parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.path not in ("", "/"):
            raise InvalidSpecError(
                f"storage key {key}: endpoint_url {endpoint!r} is not http(s)://HOST[:PORT]"
            )
        options.append(("s3-endpoint", parts.netloc))
        if parts.scheme == "http":
            options.append(("s3-usehttps", "0"))
    region = str(entry.get("region") or "")
    if region:
        options.append(("s3-region", region))
    return tuple(options)


def _s3_credential(entry: Mapping[str, Any], key: str) -> dict[str, str]:
    access, secret = entry.get("access_key_id"), entry.get("secret_access_key")
    if not access and not secret:
        return {}  # the cloud's own chain: the host's ServiceAccount, the node's role
    if not access or not secret:
        raise InvalidSpecError(
            f"storage key {key} has only one of access_key_id and secret_access_key: give both"
        )
    return {"AWS_ACCESS_KEY_ID": str(access), "AWS_SECRET_ACCESS_KEY": str(secret)}
