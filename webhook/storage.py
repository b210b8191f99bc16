"""How a completed model pod's storage initializer reaches the model's bucket: pure functions.

A tenant names the credentials on the pod, beside the model URI (prefix `tritonshare.io/`):

    tritonshare.io/storage-secret: s3-creds      # a Secret in the pod's own namespace
    tritonshare.io/s3-endpoint: minio.data:9000  # s3:// only, KServe's secret annotations
    tritonshare.io/s3-usehttps: "0"              #   s3-endpoint, s3-usehttps, s3-verifyssl
    tritonshare.io/s3-region: eu-west-1          #   and s3-region, here on the pod

and the storage initializer gets what KServe's credential builder gives it for the same Secret:
for `s3://`, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY from the Secret's keys of those names
(required: a Secret without them fails the pod at start with the kubelet's message),
AWS_SESSION_TOKEN when the Secret has it, and S3_ENDPOINT, AWS_ENDPOINT_URL, S3_USE_HTTPS,
S3_VERIFY_SSL, AWS_REGION and AWS_DEFAULT_REGION from the annotations; for `gs://`, the Secret
mounted read-only in the storage initializer alone, with GOOGLE_APPLICATION_CREDENTIALS at its
key `gcloud-application-credentials.json`. Only the storage initializer sees the Secret: the
loader and the proxy, which talk to the shared node, never hold a storage credential.

Nothing here reads the Secret or the ServiceAccount: the webhook has no API access, so it cannot
follow KServe's ServiceAccount -> Secret chain; the pod names the Secret itself, and the kubelet
resolves the name in the pod's own namespace, so a pod can use only its namespace's Secrets. IRSA
and GKE Workload Identity need no annotation: the pod's ServiceAccount carries the role
(docs/deploy.md, "Storage credentials").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from common.contract import SECRET_NAME

SECRET_DIR = "/var/secrets/storage"  # noqa: S105  (a directory, not a secret)
GCS_KEY = "gcloud-application-credentials.json"
"""The key of KServe's GCS credential Secrets."""
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


def read_access(annotations: dict[str, Any], prefix: str, scheme: str) -> StorageAccess:
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
    return StorageAccess(scheme, secret, tuple(options))


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


def _from_secret(name: str, secret: str, *, optional: bool) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": secret, "key": name}
    if optional:
        ref["optional"] = True
    return {"name": name, "valueFrom": {"secretKeyRef": ref}}


def environment(access: StorageAccess) -> list[dict[str, Any]]:
    """The storage initializer's environment variables for `access` (KServe's names)."""
    env: list[dict[str, Any]] = []
    if access.secret and access.scheme == "s3":
        env += [
            _from_secret("AWS_ACCESS_KEY_ID", access.secret, optional=False),
            _from_secret("AWS_SECRET_ACCESS_KEY", access.secret, optional=False),
            _from_secret("AWS_SESSION_TOKEN", access.secret, optional=True),
        ]
    if access.secret and access.scheme == "gs":
        env.append({"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": f"{SECRET_DIR}/{GCS_KEY}"})
    options = dict(access.s3)
    if "s3-endpoint" in options:
        web = "http" if options.get("s3-usehttps") == "0" else "https"
        env += [
            {"name": "S3_ENDPOINT", "value": options["s3-endpoint"]},
            {"name": "AWS_ENDPOINT_URL", "value": f"{web}://{options['s3-endpoint']}"},
        ]
    if "s3-usehttps" in options:
        env.append({"name": "S3_USE_HTTPS", "value": options["s3-usehttps"]})
    if "s3-verifyssl" in options:
        env.append({"name": "S3_VERIFY_SSL", "value": options["s3-verifyssl"]})
    if "s3-region" in options:
        env += [
            {"name": "AWS_REGION", "value": options["s3-region"]},
            {"name": "AWS_DEFAULT_REGION", "value": options["s3-region"]},
        ]
    return env


def volume(access: StorageAccess) -> dict[str, Any] | None:
    """The Secret as a volume (gs:// with a Secret: the key file), or None."""
    if not (access.secret and access.scheme == "gs"):
        return None
    return {"name": "storage-secret", "secret": {"secretName": access.secret}}


def mount(access: StorageAccess) -> dict[str, Any] | None:
    """Where the storage initializer sees `volume(access)`, or None."""
    if volume(access) is None:
        return None
    return {"name": "storage-secret", "mountPath": SECRET_DIR, "readOnly": True}
