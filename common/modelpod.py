"""What a model pod and a model host share: the pieces of their pod spec, as pure functions of
explicit parameters.

The webhook completes a model pod with them (`webhook.mutation`) and the binder builds a model host
with them (`binder.tritonmodels.controller`): a host is a model pod that serves many models, so both
run the same loader and proxy image, reach the node's agent and gateway the same way (the node's IP
from the downward API), carry the same projected token for the agent, probes, restricted
securityContext and GPU-node tolerations. What differs is passed in: the containers' arguments,
mounts and requests. Pure: no I/O, imports no part.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from common.contract import Keys

MODEL_DIR = "/mnt/models"
"""Where a model pod's files are, and under which a host's loader fetches each replica's."""
TOKEN_DIR = "/var/run/secrets/tritonshare"  # noqa: S105  (a directory, not a secret)
"""Where the projected token for the agent is mounted (file `token`)."""
MODEL_DIR_SIZE = "10Gi"
"""The size limit of the emptyDir at MODEL_DIR."""
HOST_DIR = "/var/run/tritonshare/host"
"""A model host's shared emptyDir: the loader writes its ready models there, the proxy reads."""
READY_FILE = f"{HOST_DIR}/ready.json"
"""A model host's table of ready models: the loader's --models-file and the proxy's."""
STORAGE_SECRET_DIR = "/var/secrets/storage"  # noqa: S105  (a directory, not a secret)
"""Where a model host's loader sees each storage Secret of its replicas (`<dir>/<Secret>/`)."""
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
LOCKED_DOWN: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
"""Every container's securityContext (the restricted Pod Security Standard)."""
POD_SECURITY: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "runAsGroup": 10001,
    "fsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"},
}
"""The pod's securityContext: non-root, the runtime's seccomp profile."""
PROXY_PORTS = (("http", 9000), ("grpc", 9001), ("metrics", 9002))
"""The proxy's container ports by name (a model's Service targets http and grpc)."""
LOADER_REQUESTS = {"cpu": "100m", "memory": "128Mi"}
"""A model pod's loader's requests (an init container: it ends before the proxy runs)."""
LOADER_LIMITS = {"cpu": "1", "memory": "512Mi"}
"""A loader's limits, a model pod's or a model host's: one core at most, whatever its storage
lists or sends (hashing and unpacking a big model take one core)."""


@dataclass(frozen=True)
class NodeAccess:
    """How a model pod's containers reach its node: the agent's gRPC and the node gateway's REST
    and gRPC host ports, and the audience of the pod's projected token for the agent."""

    agent_port: int
    triton_http_port: int
    triton_grpc_port: int
    audience: str


def host_ip_env() -> dict[str, Any]:
    """`HOST_IP`, the node's IP (downward API): the agent and the gateway listen there."""
    return {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}


def model_id_env(keys: Keys) -> dict[str, Any]:
    """`MODEL_ID`, a model pod's model id annotation (downward API)."""
    path = f"metadata.annotations['{keys.model_id}']"
    return {"name": "MODEL_ID", "valueFrom": {"fieldRef": {"fieldPath": path}}}


def agent_args(access: NodeAccess) -> list[str]:
    """The loader's and the proxy's way to the node's agent: its address and the pod's token."""
    return [
        f"--agent-address=$(HOST_IP):{access.agent_port}",
        f"--token-file={TOKEN_DIR}/token",
    ]


def gateway_args(access: NodeAccess) -> list[str]:
    """The proxy's way to Triton (the node gateway) and its own listeners."""
    return [
        f"--triton-http-url=$(HOST_IP):{access.triton_http_port}",
        f"--triton-grpc-url=$(HOST_IP):{access.triton_grpc_port}",
        *(f"--listen-{name}=0.0.0.0:{port}" for name, port in PROXY_PORTS),
    ]


def token_volume(audience: str) -> dict[str, Any]:
    """The `agent-token` volume: the pod's projected service-account token for the agent."""
    token = {"audience": audience, "expirationSeconds": 3600, "path": "token"}
    return {"name": "agent-token", "projected": {"sources": [{"serviceAccountToken": token}]}}


def token_mount() -> dict[str, Any]:
    return {"name": "agent-token", "mountPath": TOKEN_DIR, "readOnly": True}


def gpu_tolerations(keys: Keys) -> list[dict[str, Any]]:
    """The tolerations of GPU nodes: `nvidia.com/gpu` and tritonshare's GPU-node taint (which
    only the node pod, model pods and model hosts tolerate)."""
    return [dict(GPU_TOLERATION), keys.gpu_node_toleration()]


def _container(
    name: str,
    image: str,
    args: list[str],
    env: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    requests: dict[str, str],
    limits: dict[str, str],
    **between: Any,
) -> dict[str, Any]:
    """A tritonshare container (`python -m NAME ARGS`), locked down, with `between` (ports,
    probes...) after its environment."""
    return {
        "name": name,
        "image": image,
        "command": ["python", "-m", name],
        "args": args,
        "env": env,
        **between,
        "resources": {"requests": dict(requests), "limits": dict(limits)},
        "securityContext": copy.deepcopy(LOCKED_DOWN),
        "volumeMounts": mounts,
    }


def loader(
    image: str,
    args: list[str],
    *,
    env: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    requests: dict[str, str],
    limits: dict[str, str],
) -> dict[str, Any]:
    """The `loader` container (`python -m loader ARGS`)."""
    return _container(
        "loader",
        image,
        args,
        env,
        mounts,
        requests,
        limits,
        terminationMessagePolicy="FallbackToLogsOnError",
    )


def proxy(
    image: str,
    args: list[str],
    *,
    env: list[dict[str, Any]],
    mounts: list[dict[str, Any]],
    requests: dict[str, str],
    limits: dict[str, str],
) -> dict[str, Any]:
    """The `proxy` container (`python -m proxy ARGS`) with its ports, probes and preStop."""
    between: dict[str, Any] = {
        "ports": [{"name": name, "containerPort": port} for name, port in PROXY_PORTS],
        # Every second only while the proxy starts (its /healthz answers once all its ports
        # listen): the kubelet runs the readiness probe as soon as this one passes, so a new
        # replica is Ready within about a second of its proxy listening, not a readiness period
        # later. 30 failures: a proxy that takes 30 s to start is restarted.
        "startupProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "periodSeconds": 1,
            "failureThreshold": 30,
        },
        "readinessProbe": {
            "httpGet": {"path": "/v2/health/ready", "port": "http"},
            "periodSeconds": 5,
            "failureThreshold": 2,
        },
        # The proxy's own liveness, not Triton's: restarting the proxy cannot bring a lost node
        # pod back, and would cut short the reinstall it runs.
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "lifecycle": {"preStop": {"sleep": {"seconds": 5}}},
    }
    return _container("proxy", image, args, env, mounts, requests, limits, **between)
