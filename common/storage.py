"""How a model's files are reached from its bucket, for both doors: the credentials and S3
settings a model pod's storage initializer and a model host's loader use, parsed in one place.

A tenant names them beside the model URI, on a model pod or a TritonModel (prefix
`tritonshare.io/`, KServe's secret annotations, here on the object itself):

    tritonshare.io/s3-endpoint: minio.data:9000  # s3:// only: s3-endpoint, s3-usehttps,
    tritonshare.io/s3-usehttps: "0"              #   s3-verifyssl and s3-region
    tritonshare.io/s3-region: eu-west-1

and the Secret with the credential (a model pod's `tritonshare.io/storage-secret`, a
TritonModel's `spec.storageSecret`, always of the object's own namespace) holds KServe's keys:
`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`) for s3://,
`gcloud-application-credentials.json` for gs://, `https-host` and `headers` for a TritonModel's
https://. Without a Secret the clouds' own chain applies: the pod's ServiceAccount (IRSA, GKE
Workload Identity) or the node's role.

A storage initializer gets them as KServe's environment variables (`webhook.storage`); a host's
loader gets the options through the agent with each replica and reads the Secret's keys where the
binder mounts them. `S3Settings` is what both make of the options. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from common.contract import SECRET_NAME

GCS_KEY = "gcloud-application-credentials.json"
"""The key of KServe's GCS credential Secrets."""
S3_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
"""The keys of KServe's S3 credential Secrets (the session token optional)."""
HTTPS_KEYS = ("https-host", "headers")
"""The keys of KServe's URI-storage Secrets: the one host the headers go to, and the headers."""
SECRET_KEYS = (*S3_KEYS, GCS_KEY, *HTTPS_KEYS)
"""Every key of a storage Secret a host's loader may read."""
S3_OPTIONS = ("s3-endpoint", "s3-usehttps", "s3-verifyssl", "s3-region")
_FLAG = ("0", "1")
_ENDPOINT = re.compile(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?")
_REGION = re.compile(r"[a-z0-9-]{1,64}")


class StorageAnnotationError(ValueError):
    """A storage annotation is wrong; the message says what to write instead."""


@dataclass(frozen=True)
class StorageAccess:
    """What the annotations ask for, checked against the URI's scheme."""

    scheme: str
    secret: str | None = None
    s3: tuple[tuple[str, str], ...] = ()
    """(option, value) of the s3-* annotations given, in S3_OPTIONS order."""


def read_access(annotations: Mapping[str, Any], prefix: str, scheme: str) -> StorageAccess:
    """The checked storage annotations for a model URI of `scheme`, or StorageAnnotationError."""
    secret_key = prefix + "storage-secret"
    secret: str | None = None
    if secret_key in annotations:
        secret = str(annotations[secret_key]).strip()
        if not SECRET_NAME.fullmatch(secret):
            raise StorageAnnotationError(
                f"annotation {secret_key}={secret!r} is not a Secret name; write the name of a "
                f"Secret in the pod's namespace (lower-case letters, digits, '-' and '.')"
            )
        if scheme == "pvc":
            raise StorageAnnotationError(
                f"annotation {secret_key} is set, but a pvc:// model is read from the claim "
                f"mounted in the pod and needs no storage credential; remove {secret_key} (the "
                f"claim's own access modes and the namespace's RBAC decide who reads it)"
            )
        if scheme == "https":
            raise StorageAnnotationError(
                f"annotation {secret_key} is set, but an https:// model is fetched with no "
                f"credential; use a pre-signed URL, or the bucket's s3:// or gs:// URI with "
                f"{secret_key}"
            )
    return StorageAccess(scheme, secret, read_s3_options(annotations, prefix, scheme))


def read_s3_options(
    annotations: Mapping[str, Any], prefix: str, scheme: str
) -> tuple[tuple[str, str], ...]:
    """The checked s3-* annotations, in S3_OPTIONS order, or StorageAnnotationError."""
    options: list[tuple[str, str]] = []
    for option in S3_OPTIONS:
        key = prefix + option
        if key not in annotations:
            continue
        value = str(annotations[key]).strip()
        if scheme != "s3":
            raise StorageAnnotationError(
                f"annotation {key} applies to s3:// models only, and this one is {scheme}://; "
                f"remove it"
            )
        _check_option(key, option, value)
        options.append((option, value))
    return tuple(options)


SCHEMA_OPTION = "schema-path"
"""The path of a model's schema (KServe's v2 model schema JSON: its inputs and outputs) in the
store its files are in: the bucket of an s3:// or gs:// URI, the host of an https:// one."""
_MAX_SCHEMA_PATH = 1024


def read_storage_options(
    annotations: Mapping[str, Any], prefix: str, scheme: str
) -> tuple[tuple[str, str], ...]:
    """The checked s3-* annotations (`read_s3_options`) and the schema path, or
    StorageAnnotationError."""
    options = read_s3_options(annotations, prefix, scheme)
    key = prefix + SCHEMA_OPTION
    if key not in annotations:
        return options
    value = str(annotations[key]).strip().lstrip("/")
    parts = value.split("/")
    if (
        not value
        or len(value) > _MAX_SCHEMA_PATH
        or any(part in ("", ".", "..") for part in parts)
        or not value.isprintable()
    ):
        raise StorageAnnotationError(
            f"annotation {key}={value!r} is not the path of a file in the model's bucket; write "
            f"one such as onnx/schema.json (no '..', at most {_MAX_SCHEMA_PATH} characters)"
        )
    return (*options, (SCHEMA_OPTION, value))


def schema_uri(storage_uri: str, options: Mapping[str, str]) -> str:
    """The URI of the schema the options name, in the store of `storage_uri` ("" when none)."""
    path = options.get(SCHEMA_OPTION, "")
    if not path:
        return ""
    scheme, _, rest = storage_uri.partition("://")
    return f"{scheme}://{rest.partition('/')[0]}/{path}"


def _check_option(key: str, option: str, value: str) -> None:
    if option in ("s3-usehttps", "s3-verifyssl") and value not in _FLAG:
        raise StorageAnnotationError(
            f'annotation {key}={value!r} must be "1" or "0", as KServe writes it '
            f'(for example {key}: "0" for a MinIO without TLS)'
        )
    if option == "s3-endpoint" and not _ENDPOINT.fullmatch(value):
        raise StorageAnnotationError(
            f"annotation {key}={value!r} is not a host[:port]; write the endpoint without a "
            f"scheme (for example minio.data:9000) and say {key.replace(option, 's3-usehttps')}"
            f' "0" for plain HTTP'
        )
    if option == "s3-region" and not _REGION.fullmatch(value):
        raise StorageAnnotationError(
            f"annotation {key}={value!r} is not an AWS region name; write one such as eu-west-1"
        )


@dataclass(frozen=True)
class S3Settings:
    """An S3 client's endpoint, TLS check and region, as KServe's initializer makes them."""

    endpoint_url: str | None = None
    """None: AWS's own endpoint for the region."""
    verify: bool = True
    region: str | None = None


def s3_settings(options: Mapping[str, str]) -> S3Settings:
    """The client settings of checked s3-* options (`read_s3_options`, as a mapping)."""
    endpoint = options.get("s3-endpoint")
    web = "http" if options.get("s3-usehttps") == "0" else "https"
    return S3Settings(
        endpoint_url=f"{web}://{endpoint}" if endpoint else None,
        verify=options.get("s3-verifyssl") != "0",
        region=options.get("s3-region"),
    )


_ENVIRONMENT = (
    ("s3-endpoint", "S3_ENDPOINT"),
    ("s3-usehttps", "S3_USE_HTTPS"),
    ("s3-verifyssl", "S3_VERIFY_SSL"),
    ("s3-region", "AWS_REGION"),
)


def s3_environment(options: Mapping[str, str]) -> dict[str, str]:
    """KServe's environment variables for checked s3-* options."""
    env = {name: options[option] for option, name in _ENVIRONMENT if option in options}
    settings = s3_settings(options)
    if settings.endpoint_url:
        env["AWS_ENDPOINT_URL"] = settings.endpoint_url
    if settings.region:
        env["AWS_DEFAULT_REGION"] = settings.region
    return env


def s3_options_from_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The s3-* options a storage initializer's environment (`s3_environment`) carries."""
    return {option: env[name] for option, name in _ENVIRONMENT if env.get(name)}
