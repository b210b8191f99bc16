"""How a completed model pod's storage initializer reaches the model's bucket: pure functions.

A tenant names the credentials on the pod, beside the model URI: `tritonshare.io/storage-secret` (a
Secret of the pod's own namespace) and KServe's s3-* annotations, read by `common.storage` (one
parser for model pods and TritonModels). The storage initializer gets what KServe's credential
builder gives it for the same Secret: for `s3://`, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY from
the Secret's keys of those names (required: a Secret without them fails the pod at start with the
kubelet's message), AWS_SESSION_TOKEN when the Secret has it, and S3_ENDPOINT, AWS_ENDPOINT_URL,
S3_USE_HTTPS, S3_VERIFY_SSL, AWS_REGION and AWS_DEFAULT_REGION from the annotations; for `gs://`,
the Secret mounted read-only in the storage initializer alone, with GOOGLE_APPLICATION_CREDENTIALS
at its key `gcloud-application-credentials.json`. Only the storage initializer sees the Secret: the
loader and the proxy, which talk to the shared node, never hold a storage credential.

Nothing here reads the Secret or the ServiceAccount: the webhook has no API access, so it cannot
follow KServe's ServiceAccount -> Secret chain; the pod names the Secret itself, and the kubelet
resolves the name in the pod's own namespace, so a pod can use only its namespace's Secrets. IRSA
and GKE Workload Identity need no annotation: the pod's ServiceAccount carries the role
(docs/deploy.md, "Storage credentials").
"""

from __future__ import annotations

from typing import Any

from common.storage import GCS_KEY, StorageAccess, s3_environment

SECRET_DIR = "/var/secrets/storage"  # noqa: S105  (a directory, not a secret)


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
    # KServe's order: the endpoint (and its URL), then TLS, then the region.
    s3 = s3_environment(dict(access.s3))
    names = ("S3_ENDPOINT", "AWS_ENDPOINT_URL", "S3_USE_HTTPS", "S3_VERIFY_SSL", "AWS_REGION")
    env += [
        {"name": name, "value": s3[name]} for name in (*names, "AWS_DEFAULT_REGION") if name in s3
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
