"""The model host's pod spec: a model pod that serves many models.

The binder creates one per (namespace, node) with TritonModel replicas placed there
(`binder.tritonmodels.controller`), from the pieces the webhook builds model pods from
(`common.modelpod`): the same image, loader and proxy, token for the agent, probes, securityContext
and tolerations. Its `loader` (`--host`) follows the host's replicas through the agent: each
replica's files fetched under /mnt/models, installed and loaded, the ready ones written to the
shared ready file; its `proxy` serves the models of that file (`--models-file`). The storage Secrets
its replicas name are one projected volume in the loader alone, each at <Secret>/, read-only and
optional (one that does not exist fails only its replicas' fetch, in the loader's words).
`template_hash` names what the spec is made from (image, ports, arguments, pod settings), so a host
made by another binder is told apart. Pure: no I/O.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Collection

from common import modelpod
from common.contract import Keys
from common.kubeapi.session import JsonObject
from common.modelpod import HOST_DIR, MODEL_DIR, READY_FILE, STORAGE_SECRET_DIR, NodeAccess
from common.podresources import CPU, MEMORY, MODEL_HOST_BASE, MODEL_HOST_PER_MODEL
from common.storage import SECRET_KEYS

PROXY_METRICS_PORT = dict(modelpod.PROXY_PORTS)["metrics"]

HOST_LOADER_SHARE = {CPU: 50, MEMORY: 32 << 20}
"""The part of a host's requests (`MODEL_HOST_BASE` and `MODEL_HOST_PER_MODEL` per replica, what
the binder charges its node) that its loader asks for; the proxy asks for the rest."""
HOST_READINESS = {"periodSeconds": 1, "failureThreshold": 10}
"""A host's readiness probe, over a model pod's (every 5 s, 2 failures). A host's proxy starts
before its first replica is loaded, so its first probe fails: probed every second, the host is
Ready (and in its Services) within a second of that replica loading, not a period later; ten
failures, so a host still leaves its Services after about ten seconds of failing, as a model pod
does. One probe costs one call to the node's Triton, whatever the host serves, and none while
every model it serves is parked or asleep (its proxy answers ready itself, so that the host stays
in their Services however long they are at zero)."""
HOST_PROXY_LIMIT_EXTRA = 384 << 20
"""A host proxy's memory limit above its request (a model pod's proxy: 128Mi, limit 512Mi)."""


MESH_PORTS = (("mesh-grpc", 8033), ("mesh-http", 8008))
"""The host proxy's ports for its namespace's `modelmesh-serving` Service (ModelMesh's port
numbers): every model of the namespace, served here or relayed (`tritonmodels.meshwriter`)."""
ROUTES_CONFIG_MAP = "tritonshare-mesh-routes"
"""The namespace's routes (`routes.json`), mounted in the host's proxy, optional (absent outside
ModelMesh namespaces: the mesh ports serve the host's own models only)."""
ROUTES_VOLUME = "mesh-routes"
ROUTES_DIR = "/etc/tritonshare/routes"
ROUTES_KEY = "routes.json"

STORAGE_VOLUME = "storage-secrets"
"""The projected volume of a host's storage Secrets."""
STORAGE_KEYS = SECRET_KEYS
"""The keys of a storage Secret the loader reads (KServe's: common.storage)."""


def host_spec(
    node: str,
    scheduler_name: str,
    image: str,
    access: NodeAccess,
    keys: Keys,
    replicas: int,
    secrets: Collection[str] = (),
) -> JsonObject:
    """The spec of the host on `node` serving `replicas` at creation, with the storage Secrets
    `secrets` mounted in its loader at STORAGE_SECRET_DIR/<Secret>/. Its requests are what the
    binder charges the node for it: `MODEL_HOST_BASE` plus `MODEL_HOST_PER_MODEL` per replica
    (a pod's requests cannot change: later replicas add to the charge alone)."""
    cpu = MODEL_HOST_BASE[CPU] + MODEL_HOST_PER_MODEL[CPU] * replicas
    memory = MODEL_HOST_BASE[MEMORY] + MODEL_HOST_PER_MODEL[MEMORY] * replicas
    proxy_cpu, proxy_memory = cpu - HOST_LOADER_SHARE[CPU], memory - HOST_LOADER_SHARE[MEMORY]
    env = [modelpod.host_ip_env()]
    pod_ip = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    host_mount = {"name": "host", "mountPath": HOST_DIR}
    sources = [
        {
            "secret": {
                "name": secret,
                "optional": True,
                "items": [{"key": key, "path": f"{secret}/{key}"} for key in STORAGE_KEYS],
            }
        }
        for secret in sorted(set(secrets))
    ]
    projected = {"name": STORAGE_VOLUME, "projected": {"sources": sources}}
    secret_volumes = [projected] if sources else []
    secret_mounts = [
        {"name": STORAGE_VOLUME, "mountPath": STORAGE_SECRET_DIR, "readOnly": True}
        for _ in secret_volumes
    ]
    loader = modelpod.loader(
        image,
        [
            "--host",
            f"--models-file={READY_FILE}",
            f"--model-root={MODEL_DIR}",
            # A leaving replica is unloaded once the proxy beside it has drained it.
            f"--proxy-metrics-url=http://$(POD_IP):{PROXY_METRICS_PORT}/metrics",
            *modelpod.agent_args(access),
            *([f"--storage-secret-dir={STORAGE_SECRET_DIR}"] if secrets else []),
        ],
        env=[*env, pod_ip],
        mounts=[
            {"name": "model", "mountPath": MODEL_DIR},
            {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108  (the pod's own emptyDir)
            host_mount,
            modelpod.token_mount(),
            *secret_mounts,
        ],
        requests={"cpu": f"{HOST_LOADER_SHARE[CPU]}m", "memory": str(HOST_LOADER_SHARE[MEMORY])},
        limits=modelpod.LOADER_LIMITS,
    )
    proxy = modelpod.proxy(
        image,
        [
            f"--models-file={READY_FILE}",
            *modelpod.gateway_args(access),
            *modelpod.agent_args(access),
            f"--listen-mesh-grpc=0.0.0.0:{MESH_PORTS[0][1]}",
            f"--listen-mesh-http=0.0.0.0:{MESH_PORTS[1][1]}",
            f"--routes-file={ROUTES_DIR}/{ROUTES_KEY}",
        ],
        env=env,
        mounts=[
            {**host_mount, "readOnly": True},
            modelpod.token_mount(),
            {"name": ROUTES_VOLUME, "mountPath": ROUTES_DIR, "readOnly": True},
        ],
        requests={"cpu": f"{proxy_cpu}m", "memory": str(proxy_memory)},
        limits={"memory": str(memory + HOST_PROXY_LIMIT_EXTRA)},
    )
    proxy["readinessProbe"] = {**proxy["readinessProbe"], **HOST_READINESS}
    proxy["ports"] = [*proxy["ports"], *({"name": n, "containerPort": p} for n, p in MESH_PORTS)]
    return {
        "nodeName": node,
        "schedulerName": scheduler_name,
        "automountServiceAccountToken": False,
        "securityContext": copy.deepcopy(modelpod.POD_SECURITY),
        "tolerations": modelpod.gpu_tolerations(keys),
        "volumes": [
            {"name": "model", "emptyDir": {"sizeLimit": modelpod.MODEL_DIR_SIZE}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
            {"name": "host", "emptyDir": {"sizeLimit": "16Mi"}},
            modelpod.token_volume(access.audience),
            {"name": ROUTES_VOLUME, "configMap": {"name": ROUTES_CONFIG_MAP, "optional": True}},
            *secret_volumes,
        ],
        "containers": [loader, proxy],
    }


def mounted_secrets(spec: JsonObject) -> frozenset[str]:
    """The storage Secrets a host's spec mounts."""
    return frozenset(
        str(source["secret"].get("name"))
        for volume in spec.get("volumes") or []
        if isinstance(volume, dict) and volume.get("name") == STORAGE_VOLUME
        for source in (volume.get("projected") or {}).get("sources") or []
        if isinstance(source, dict) and isinstance(source.get("secret"), dict)
    )


def template_hash(
    node: str, scheduler_name: str, image: str, access: NodeAccess, keys: Keys
) -> str:
    """A hash of the host spec on `node` as this binder builds it, less what its replicas
    change (requests, storage Secrets): equal for hosts made from the same template."""
    spec = host_spec(node, scheduler_name, image, access, keys, 0)
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def host_image(spec: JsonObject) -> str:
    """The image a host spec runs (its loader's)."""
    containers = spec.get("containers") or [{}]
    return str(containers[0].get("image", "")) if isinstance(containers[0], dict) else ""
