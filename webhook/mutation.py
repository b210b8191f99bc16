"""From a pod with a few annotations to a complete model pod: pure functions, no I/O.

A tenant writes, on a pod (or a Deployment's pod template) labelled `tritonshare.io/role: model`:

    tritonshare.io/model-uri: gs://bucket/triton/add_one   # or s3://, https://, pvc://CLAIM/PATH
    tritonshare.io/gpu-mem: 1Gi
    tritonshare.io/model-id: add_one                       # the id clients call; a bare pod may
                                                           # leave it to the URI's last segment
                                                           # (without .tar.gz, .tgz, .tar, .zip),
                                                           # a controller's pod may not
    tritonshare.io/concurrency: "4"                        # optional: the proxy's in-flight limit
    tritonshare.io/storage-secret: s3-creds                # optional: common.storage
    tritonshare.io/residency: on-demand                    # optional: `always` (the default)
    tritonshare.io/idle-seconds: "600"                     # optional, on-demand: idle time
    tritonshare.io/idempotent: "false"                     # optional: as its config says

and `complete()` adds what deploy/example writes by hand: the scheduler name, the storage
initializer, the loader, the proxy with its probes and GPU-memory limit, the projected token for
the agent, the tolerations of GPU nodes (`nvidia.com/gpu` and tritonshare's GPU-node taint) and
a restricted securityContext. What the pod already has is kept (a container, volume or toleration
of the same name, the pod's own non-empty securityContext), so completing a complete pod changes
nothing; a container named `proxy`, or KServe's `kserve-container`, is the proxy's placeholder.
`patch()` turns the difference into a JSON patch.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from common import modelpod
from common.contract import (
    RESIDENCY_ALWAYS,
    RESIDENCY_ON_DEMAND,
    ContractError,
    validate_model_id,
    validate_residency,
)
from common.modelpod import LOCKED_DOWN, MODEL_DIR, NodeAccess
from common.quantity import QuantityError, parse_quantity
from common.storage import StorageAccess, StorageAnnotationError, read_access
from webhook import storage
from webhook.settings import Settings

ROLE_LABEL = "tritonshare.io/role"
PVC_DIR = "/mnt/pvc"
_SCHEMES = ("s3", "gs", "https", "pvc")
# An https:// URI names one file, so a model directory comes as an archive, which KServe's storage
# initializer unpacks: the model id is the archive's name without its extension.
_ARCHIVES = (".tar.gz", ".tgz", ".tar", ".zip")
# Containers the proxy fills in rather than joins: the user's own placeholder, and the runtime
# container KServe makes from a ServingRuntime (deploy/example/kserve), whose Service sends
# requests to it.
PROXY_PLACEHOLDERS = ("proxy", "kserve-container")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

Pod = dict[str, Any]


class AnnotationError(ValueError):
    """An annotation is missing or malformed; the message says what to write instead."""


@dataclass(frozen=True)
class ModelRequest:
    """What the annotations ask for, checked."""

    uri: str
    scheme: str
    gpu_mem: str
    model_id: str
    concurrency: int | None
    access: StorageAccess
    """The storage initializer's credentials and S3 settings (webhook.storage)."""
    residency: str = RESIDENCY_ALWAYS
    idle_seconds: float = 0.0
    """With residency on-demand: the proxy's --idle-seconds, the floor applied."""
    idempotent: bool | None = None
    """The proxy's --idempotent: a call lost with the gateway's or Triton's exit is sent again
    (true) or not (false); None: as the model's config in Triton says."""


def wants_completion(pod: Pod, settings: Settings) -> bool:
    """True when the pod names a model URI: the webhook leaves every other pod alone."""
    annotations = pod.get("metadata", {}).get("annotations") or {}
    return settings.keys.prefix + "model-uri" in annotations


def check_residency(pod: Pod, settings: Settings) -> None:
    """AnnotationError for a residency annotation that names no class, on any pod (the short
    form and a complete model pod alike): refused at admission, not left for the binder."""
    annotations = pod.get("metadata", {}).get("annotations") or {}
    key = settings.keys.residency
    if key in annotations:
        try:
            validate_residency(str(annotations[key]), key)
        except ContractError as e:
            raise AnnotationError(str(e)) from e


def check_unfinished(pod: Pod, settings: Settings) -> None:
    """AnnotationError for a pod labelled as a model pod that asks to be completed (a GPU-memory
    annotation, or no container at all) but names no model URI: without this refusal it would go
    through unchanged, and the API server would answer only `spec.containers: Required value`.
    A complete model pod written by hand (containers, the GPU-memory resource limit) passes."""
    metadata = pod.get("metadata", {})
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    uri_key, mem_key = settings.keys.prefix + "model-uri", settings.keys.prefix + "gpu-mem"
    if labels.get(ROLE_LABEL) != "model" or uri_key in annotations:
        return
    containers = (pod.get("spec") or {}).get("containers") or []
    if mem_key not in annotations and containers:
        return
    name = metadata.get("name") or metadata.get("generateName") or "(unnamed)"
    asks = f"annotation {mem_key}" if mem_key in annotations else "no container"
    raise AnnotationError(
        f"pod {name} is labelled {ROLE_LABEL}=model with {asks}, so tritonshare's webhook would "
        f"complete it, but it names no model: add the annotation {uri_key} (gs://BUCKET/PATH, "
        f"s3://BUCKET/PATH, https://HOST/PATH or pvc://CLAIM/PATH), or write the complete model "
        f"pod (loader and proxy containers, the {mem_key} resource limit) as deploy/example does"
    )


def _last_segment(path: str) -> str:
    """The path's last segment, without an archive extension."""
    name = path.rstrip("/").rpartition("/")[2]
    suffix = next((s for s in _ARCHIVES if name.endswith(s) and len(name) > len(s)), "")
    return name.removesuffix(suffix)


def _controller(pod: Pod) -> str:
    """`Kind/name` of the pod's controller (its ReplicaSet, StatefulSet, Job...), "" for none."""
    for ref in pod.get("metadata", {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller"):
            return f"{ref.get('kind', '')} {ref.get('name', '')}"
    return ""


def read_request(pod: Pod, settings: Settings) -> ModelRequest:
    """The checked annotations, or AnnotationError saying what to write."""
    prefix = settings.keys.prefix
    annotations = pod.get("metadata", {}).get("annotations") or {}
    uri_key, mem_key = prefix + "model-uri", prefix + "gpu-mem"
    id_key, concurrency_key = prefix + "model-id", prefix + "concurrency"
    uri = str(annotations.get(uri_key, "")).strip()
    parts = urlsplit(uri)
    example = "gs://BUCKET/PATH, s3://BUCKET/PATH, https://HOST/PATH or pvc://CLAIM/PATH"
    if parts.scheme not in _SCHEMES or not parts.netloc:
        raise AnnotationError(
            f"annotation {uri_key}={uri!r} is not a model URI; write {example} "
            f"(a Triton model directory: config.pbtxt and numbered version directories)"
        )
    if parts.scheme == "pvc" and not _DNS_LABEL.fullmatch(parts.netloc):
        raise AnnotationError(
            f"annotation {uri_key}={uri!r} names PVC {parts.netloc!r}, which is not a valid claim "
            f"name; write pvc://CLAIM/PATH with the PersistentVolumeClaim's name"
        )
    if mem_key not in annotations:
        raise AnnotationError(
            f"annotation {mem_key} is missing; write the model's GPU memory as a quantity, "
            f"for example {mem_key}: 1500Mi"
        )
    try:
        if parse_quantity(str(annotations[mem_key]), what=mem_key) <= 0:
            raise QuantityError(f"{mem_key} must be more than 0")
    except QuantityError as e:
        raise AnnotationError(
            f"annotation {mem_key}={annotations[mem_key]!r} is not a GPU memory size ({e}); "
            f"write a Kubernetes quantity such as 1500Mi or 2Gi"
        ) from e
    model_id = str(annotations.get(id_key) or _last_segment(parts.path))
    owner = _controller(pod)
    if not annotations.get(id_key) and owner:
        raise AnnotationError(
            f"pod of {owner} sets no {id_key}, so its model id would be the last segment of "
            f"{uri_key} ({model_id!r} now), and a rollout to a file of another name would "
            f"change the id its clients call; set {id_key} (such as {model_id!r}) in the pod "
            f"template's annotations, and keep it across rollouts"
        )
    try:
        validate_model_id(model_id)
    except ContractError as e:
        where = f"annotation {id_key}" if id_key in annotations else f"the last segment of {uri}"
        raise AnnotationError(
            f"{where} is not a usable model id ({e}); set {id_key} to the model's name, the one "
            f"its clients send"
        ) from e
    concurrency: int | None = None
    if concurrency_key in annotations:
        text = str(annotations[concurrency_key]).strip()
        if not text.isdigit():
            raise AnnotationError(
                f"annotation {concurrency_key}={text!r} is not a whole number; write the most "
                f'in-flight requests one pod serves, for example {concurrency_key}: "4" '
                f'("0" for no limit)'
            )
        concurrency = int(text)
    try:
        access = read_access(annotations, prefix, parts.scheme)
    except StorageAnnotationError as e:
        raise AnnotationError(str(e)) from e
    residency = str(annotations.get(settings.keys.residency, RESIDENCY_ALWAYS))
    return ModelRequest(
        uri,
        parts.scheme,
        str(annotations[mem_key]),
        model_id,
        concurrency,
        access,
        residency,
        read_idle_seconds(annotations, settings) if residency == RESIDENCY_ON_DEMAND else 0.0,
        read_idempotent(annotations, settings),
    )


def read_idempotent(annotations: dict[str, Any], settings: Settings) -> bool | None:
    """The pod's `<prefix>idempotent` ("true" or "false"; None without one: as the model's
    config says); AnnotationError for any other value."""
    key = settings.keys.idempotent
    if key not in annotations:
        return None
    text = str(annotations[key]).strip().lower()
    if text not in ("true", "false"):
        raise AnnotationError(
            f"annotation {key}={text[:64]!r} is neither true nor false; write {key}: "
            f'"false" when a call of the model must never run twice (side effects), "true" '
            f"when it may though its config has a sequence batcher or is decoupled, else "
            f"leave it out"
        )
    return text == "true"


def read_idle_seconds(annotations: dict[str, Any], settings: Settings) -> float:
    """The pod's idle time (`<prefix>idle-seconds`), --default-idle-seconds without one, never
    below --min-idle-seconds; AnnotationError for a value that is not a number of seconds."""
    key = settings.keys.prefix + "idle-seconds"
    if key not in annotations:
        return max(settings.default_idle_seconds, settings.min_idle_seconds)
    text = str(annotations[key]).strip()
    try:
        wanted = float(text)
    except ValueError:
        wanted = math.nan
    if not math.isfinite(wanted) or wanted <= 0:
        raise AnnotationError(
            f"annotation {key}={text[:64]!r} is not a number of seconds; write how long the "
            f'on-demand model may idle before it is unloaded, for example {key}: "600" '
            f"(at least {settings.min_idle_seconds:g})"
        )
    return max(wanted, settings.min_idle_seconds)


def _by_name(items: list[dict[str, Any]], name: str) -> bool:
    return any(item.get("name") == name for item in items)


def _downward_env(settings: Settings) -> list[dict[str, Any]]:
    return [modelpod.model_id_env(settings.keys), modelpod.host_ip_env()]


def _access(settings: Settings) -> NodeAccess:
    return NodeAccess(
        settings.agent_port, settings.triton_http_port, settings.triton_grpc_port, settings.audience
    )


def _storage_initializer(request: ModelRequest, settings: Settings) -> dict[str, Any]:
    mounts: list[dict[str, Any]] = [
        {"name": "model", "mountPath": MODEL_DIR},
        {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108  (the container's own emptyDir)
    ]
    source = request.uri
    if request.scheme == "pvc":
        parts = urlsplit(request.uri)
        source = PVC_DIR + (parts.path or "/")
        mounts.append({"name": "model-pvc", "mountPath": PVC_DIR, "readOnly": True})
    secret_mount = storage.mount(request.access)
    if secret_mount is not None:
        mounts.append(secret_mount)
    container: dict[str, Any] = {
        "name": "storage-initializer",
        "image": settings.storage_initializer_image,
        "args": [source, MODEL_DIR],
        # Why it failed (a 404, a typo in the URI) is the last of its log: the container's
        # termination message, as `kubectl describe pod` shows it.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "resources": {
            "requests": {"cpu": "100m", "memory": "256Mi"},
            "limits": {"memory": "1Gi"},
        },
        "securityContext": copy.deepcopy(LOCKED_DOWN),
        "volumeMounts": mounts,
    }
    env = storage.environment(request.access)
    if env:
        container["env"] = env
    return container


def _loader(settings: Settings) -> dict[str, Any]:
    return modelpod.loader(
        settings.image,
        [
            f"--model-dir={MODEL_DIR}",
            "--model-id=$(MODEL_ID)",
            *modelpod.agent_args(_access(settings)),
        ],
        env=_downward_env(settings),
        mounts=[
            {"name": "model", "mountPath": MODEL_DIR, "readOnly": True},
            modelpod.token_mount(),
        ],
        requests=modelpod.LOADER_REQUESTS,
        limits=modelpod.LOADER_LIMITS,
    )


def _proxy(request: ModelRequest, settings: Settings) -> dict[str, Any]:
    access = _access(settings)
    args = [
        "--model-id=$(MODEL_ID)",
        *modelpod.gateway_args(access),
        *modelpod.agent_args(access),
        # The pod's copy of its model: reinstalled from there if the node loses it.
        f"--model-dir={MODEL_DIR}",
    ]
    if request.concurrency is not None:
        args.append(f"--container-concurrency={request.concurrency}")
    if request.residency == RESIDENCY_ON_DEMAND:
        args += [f"--residency={RESIDENCY_ON_DEMAND}", f"--idle-seconds={request.idle_seconds:g}"]
    if request.idempotent is not None:
        args.append(f"--idempotent={str(request.idempotent).lower()}")
    return modelpod.proxy(
        settings.image,
        args,
        env=_downward_env(settings),
        mounts=[
            modelpod.token_mount(),
            {"name": "model", "mountPath": MODEL_DIR, "readOnly": True},
        ],
        requests={"cpu": "250m", "memory": "128Mi"},
        limits={"memory": "512Mi", settings.keys.gpu_mem: request.gpu_mem},
    )


def _fill(mine: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """`mine` with what it lacks taken from `ours`: missing fields whole; env entries, volume
    mounts and ports by name; resource requests and limits by key."""
    filled = copy.deepcopy(mine)
    for key, value in ours.items():
        if key not in filled:
            filled[key] = copy.deepcopy(value)
        elif key in ("env", "volumeMounts", "ports"):
            filled[key] = list(filled[key]) + [
                copy.deepcopy(v) for v in value if not _by_name(filled[key], v["name"])
            ]
        elif key == "resources":
            for part in ("requests", "limits"):
                filled[key][part] = {**value.get(part, {}), **(filled[key].get(part) or {})}
    return filled


def complete(pod: Pod, settings: Settings) -> Pod:
    """The complete model pod `pod` asks for (a new dict), or AnnotationError."""
    request = read_request(pod, settings)
    done = copy.deepcopy(pod)
    metadata = done.setdefault("metadata", {})
    labels = metadata.get("labels") or {}
    metadata["labels"] = {**labels, ROLE_LABEL: "model"}
    annotations = metadata.get("annotations") or {}
    metadata["annotations"] = {settings.keys.model_id: request.model_id, **annotations}
    spec = done.setdefault("spec", {})
    # The API server has already defaulted schedulerName to default-scheduler: overwrite it.
    spec["schedulerName"] = settings.scheduler_name
    spec.setdefault("automountServiceAccountToken", False)
    if not spec.get("securityContext"):
        # The API server defaults it to {} before any webhook sees the pod: empty is unset, and
        # a restricted namespace refuses a pod without runAsNonRoot and a seccomp profile.
        spec["securityContext"] = copy.deepcopy(modelpod.POD_SECURITY)
    # The GPU-node taint is tolerated by the node pod and model pods alone (the GPU-node policy).
    for toleration in modelpod.gpu_tolerations(settings.keys):
        tolerations = spec.get("tolerations") or []
        if not any(t.get("key") == toleration["key"] for t in tolerations):
            spec["tolerations"] = [*tolerations, dict(toleration)]
    volumes = list(spec.get("volumes") or [])
    wanted_volumes: list[dict[str, Any]] = [
        {"name": "model", "emptyDir": {"sizeLimit": modelpod.MODEL_DIR_SIZE}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
        modelpod.token_volume(settings.audience),
    ]
    if request.scheme == "pvc":
        claim = urlsplit(request.uri).netloc
        wanted_volumes.append(
            {"name": "model-pvc", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        )
    secret_volume = storage.volume(request.access)
    if secret_volume is not None:
        wanted_volumes.append(secret_volume)
    volumes += [v for v in wanted_volumes if not _by_name(volumes, v["name"])]
    spec["volumes"] = volumes
    init = list(spec.get("initContainers") or [])
    for container in (_storage_initializer(request, settings), _loader(settings)):
        if not _by_name(init, container["name"]):
            init.append(container)
    spec["initContainers"] = init
    containers = list(spec.get("containers") or [])
    proxy = _proxy(request, settings)
    placeholder = next((n for n in PROXY_PLACEHOLDERS if _by_name(containers, n)), None)
    if placeholder is not None:
        # A Deployment's template must name a container (and KServe names its runtime's): that
        # placeholder is filled in where it is silent and kept where it speaks.
        containers = [_fill(c, proxy) if c.get("name") == placeholder else c for c in containers]
    else:
        containers.insert(0, proxy)
    spec["containers"] = containers
    return done


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def patch(before: Pod, after: Pod) -> list[dict[str, Any]]:
    """A JSON patch (RFC 6902) taking `before` to `after`, one operation per changed field of
    metadata and spec; empty when they are equal."""
    ops: list[dict[str, Any]] = []
    for section in ("metadata", "spec"):
        old, new = before.get(section), after.get(section) or {}
        if old == new:
            continue
        if old is None:
            ops.append({"op": "add", "path": f"/{section}", "value": new})
            continue
        for key in sorted(set(old) | set(new)):
            path = f"/{section}/{_escape(key)}"
            if key not in new:
                ops.append({"op": "remove", "path": path})
            elif key not in old:
                ops.append({"op": "add", "path": path, "value": new[key]})
            elif old[key] != new[key]:
                ops.append({"op": "replace", "path": path, "value": new[key]})
    return ops
