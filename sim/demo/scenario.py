"""The demo's cluster and model pods: what `make demo` and the end-to-end test create.

Owns the node pools (labels and the nvidia.com/gpu taint as KServe users set them up), the model
pods (GPU memory, model id, selectors, tolerations and affinity as users write them) and the pod
manifest they share with deploy/example: a storage-initializer-style init container, the loader
with its projected agent-audience token, and the proxy with a readiness probe and preStop; and
the short form of a model pod (a label and two annotations) that tritonshare's webhook completes.
Pure: it builds dicts and starts nothing.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import modelpod
from common.contract import (
    DEFAULT_AGENT_AUDIENCE,
    DEFAULT_PROXY_GRPC_PORT,
    DEFAULT_PROXY_HTTP_PORT,
    DEFAULT_PROXY_METRICS_PORT,
    DEFAULT_SCHEDULER_NAME,
    Keys,
)
from sim.cluster import NodeSpec

KEYS = Keys()
NAMESPACE = "models"
SERVICE_ACCOUNT = "tritonshare-model"
MODELS_DIR = Path(__file__).resolve().parents[2] / "tests" / "models"
ACCELERATOR = "k8s.amazonaws.com/accelerator"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
TOLERATE_GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}

NODES = (
    NodeSpec(
        "t4-node-0",
        "2xT4",
        {ACCELERATOR: "nvidia-tesla-t4", "topology.kubernetes.io/zone": "zone-a"},
        real=True,
    ),
    NodeSpec(
        "l4-node-0", "1xL4", {ACCELERATOR: "nvidia-l4", "topology.kubernetes.io/zone": "zone-b"}
    ),
    NodeSpec(
        "a100-node-0",
        "1xA100-80GB",
        {ACCELERATOR: "nvidia-a100", "pool": "premium", "topology.kubernetes.io/zone": "zone-a"},
        (GPU_TAINT,),
    ),
    NodeSpec(
        "a100-node-1",
        "1xA100-80GB",
        {ACCELERATOR: "nvidia-a100", "pool": "premium", "topology.kubernetes.io/zone": "zone-b"},
        (GPU_TAINT,),
    ),
)

_PREMIUM_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["premium"]}]}
            ]
        }
    }
}


@dataclass(frozen=True)
class ModelPod:
    """One model pod of the scenario and what the demo expects of it."""

    name: str
    model_id: str
    source: str
    """The shipped model (tests/models/<source>) its storage initializer fetches."""
    gpu_mem: str
    story: str
    """One line for the newcomer: what this pod shows."""
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, str], ...] = ()
    affinity: dict[str, Any] = field(default_factory=dict)
    fits: bool = True
    short_form: bool = False
    """Written as a few annotations, completed by tritonshare's webhook (`short_form_manifest`);
    its proxy listens on the webhook's ports, on the pod's own address."""


PODS = (
    ModelPod(
        "add-one", "add_one", "add_one", "2Gi",
        "a T4 model (nodeSelector accelerator=nvidia-tesla-t4): runs for real",
        node_selector={ACCELERATOR: "nvidia-tesla-t4"},
    ),
    ModelPod(
        "identity", "identity", "identity", "3Gi",
        "a second T4 model, in the short form (webhook): packed onto add-one's GPU",
        node_selector={ACCELERATOR: "nvidia-tesla-t4"}, short_form=True,
    ),
    ModelPod(
        "ranker", "ranker", "add_one", "30Gi",
        "a premium model: tolerates the nvidia.com/gpu taint, requires pool=premium",
        tolerations=(TOLERATE_GPU,), affinity=_PREMIUM_AFFINITY,
    ),
    ModelPod(
        "llm-70b", "llm_70b", "identity", "70Gi",
        "a big premium model: only a whole free A100 holds 70Gi",
        tolerations=(TOLERATE_GPU,), affinity=_PREMIUM_AFFINITY,
    ),
    ModelPod(
        "embeddings", "embeddings", "identity", "16Gi",
        "no selector, no toleration: only untainted nodes qualify, and 16Gi is more than a T4 "
        "has: the L4",
    ),
    ModelPod(
        "llm-405b", "llm_405b", "identity", "100Gi",
        "needs 100Gi on one GPU: no GPU in the cluster is that big, so it stays Pending",
        tolerations=(TOLERATE_GPU,), fits=False,
    ),
    ModelPod(
        "h100-only", "h100_only", "add_one", "1Gi",
        "asks for accelerator=nvidia-h100, which no node has: Pending with the reason",
        node_selector={ACCELERATOR: "nvidia-h100"}, fits=False,
    ),
)  # fmt: skip

# Created after the leader binder is crashed: the follower must take over to place it.
# It asks for more than add-one's GPU has free, so it loads alone on the other T4: the agent bills
# a model all of its load's growth only where no other model shares the GPU (docs/agent.md).
GREEDY_POD = ModelPod(
    "greedy", "greedy", "greedy", "13.5Gi",
    "asks for 13.5Gi of GPU memory but its model occupies 14.5Gi once loaded",
    node_selector={ACCELERATOR: "nvidia-tesla-t4"},
)  # fmt: skip

LATE_POD = ModelPod(
    "reranker", "reranker", "add_one", "8Gi",
    "created while the leader binder is down: the follower takes over and places it",
    tolerations=(TOLERATE_GPU,), affinity=_PREMIUM_AFFINITY,
)  # fmt: skip

# The storage initializer: fetch the model into the pod's own volume, named as its model id.
_FETCH = """
import pathlib, shutil, sys
source, target, model_id = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
shutil.copytree(source, target, dirs_exist_ok=True)
config = target / "config.pbtxt"
text = config.read_text()
config.write_text(text.replace('name: "%s"' % source.name, 'name: "%s"' % model_id, 1))
print("fetched", source.name, "as", model_id, "into", target)
"""


@dataclass(frozen=True)
class PodPorts:
    """Where a model pod's proxy listens, on the pod's IP."""

    http: int
    grpc: int
    metrics: int


# Where the proxy of a pod the webhook completes listens (on the pod's own address).
SHORT_FORM_PORTS = PodPorts(
    DEFAULT_PROXY_HTTP_PORT, DEFAULT_PROXY_GRPC_PORT, DEFAULT_PROXY_METRICS_PORT
)


def placement_fields(pod: ModelPod) -> dict[str, Any]:
    """The pod's own placement fields (nodeSelector, tolerations, affinity), those it sets."""
    fields: dict[str, Any] = {}
    if pod.node_selector:
        fields["nodeSelector"] = dict(pod.node_selector)
    if pod.tolerations:
        fields["tolerations"] = [dict(t) for t in pod.tolerations]
    if pod.affinity:
        fields["affinity"] = pod.affinity
    return fields


def short_form_manifest(pod: ModelPod, model_uri: str) -> dict[str, Any]:
    """The pod as a team writes it for tritonshare's webhook: the model's URI and GPU memory as
    annotations (the model id is the URI's last segment), and its own placement fields."""
    spec: dict[str, Any] = {"containers": [], **placement_fields(pod)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name,
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/name": pod.name, "tritonshare.io/role": "model"},
            "annotations": {
                f"{KEYS.prefix}model-uri": model_uri,
                f"{KEYS.prefix}gpu-mem": pod.gpu_mem,
            },
        },
        "spec": spec,
    }


def model_pod_manifest(
    pod: ModelPod,
    ports: PodPorts,
    *,
    agent_port: int,
    gateway_http_port: int,
    gateway_grpc_port: int,
) -> dict[str, Any]:
    """The pod as the platform (or an operator) writes it, for the simulated cluster.

    On a real cluster every node's agent and gateway listen on the same ports (hostPorts); in the
    simulation the node's address is 127.0.0.1 for every node, so the ports are those of the one
    node that runs pods. Each pod has an address of its own (status.podIP): the simulated kubelet
    makes the proxy listen there (0.0.0.0 is the pod's own address in a pod) and its connections
    to the gateway leave from it, which is how the gateway knows the pod (`sim.node.podnetwork`).
    Clients reach the proxy at the pod's IP.
    """
    token_dir = "/var/run/secrets/tritonshare"  # noqa: S105 - a mount path, not a secret
    downward = [
        {
            "name": "MODEL_ID",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{KEYS.model_id}']"}},
        },
        {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
    ]
    small = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}
    spec: dict[str, Any] = {
        "schedulerName": DEFAULT_SCHEDULER_NAME,
        "serviceAccountName": SERVICE_ACCOUNT,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 30,
        "initContainers": [
            {
                "name": "storage-initializer",
                "image": "tritonshare:demo",
                "command": ["python", "-c", _FETCH],
                "args": [str(MODELS_DIR / pod.source), "/mnt/models", "$(MODEL_ID)"],
                "env": downward[:1],
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "resources": small,
                "volumeMounts": [{"name": "model", "mountPath": "/mnt/models"}],
            },
            {
                "name": "loader",
                "image": "tritonshare:demo",
                "command": ["python", "-m", "loader"],
                "args": [
                    "--model-dir=/mnt/models",
                    "--model-id=$(MODEL_ID)",
                    f"--agent-address=$(HOST_IP):{agent_port}",
                    f"--token-file={token_dir}/token",
                    "--termination-log=/dev/termination-log",
                    "--timeout=120",
                ],
                "env": downward,
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "resources": small,
                "volumeMounts": [
                    {"name": "model", "mountPath": "/mnt/models", "readOnly": True},
                    {"name": "agent-token", "mountPath": token_dir, "readOnly": True},
                ],
            },
        ],
        "containers": [
            {
                "name": "proxy",
                "image": "tritonshare:demo",
                "command": ["python", "-m", "proxy"],
                "args": [
                    "--model-id=$(MODEL_ID)",
                    f"--triton-http-url=$(HOST_IP):{gateway_http_port}",
                    f"--triton-grpc-url=$(HOST_IP):{gateway_grpc_port}",
                    f"--listen-http=0.0.0.0:{ports.http}",
                    f"--listen-grpc=0.0.0.0:{ports.grpc}",
                    f"--listen-metrics=0.0.0.0:{ports.metrics}",
                    f"--agent-address=$(HOST_IP):{agent_port}",
                    f"--token-file={token_dir}/token",
                    "--model-dir=/mnt/models",
                    "--drain-seconds=1",
                ],
                "env": downward,
                "ports": [
                    {"name": "http", "containerPort": ports.http},
                    {"name": "grpc", "containerPort": ports.grpc},
                    {"name": "metrics", "containerPort": ports.metrics},
                ],
                "readinessProbe": {
                    "httpGet": {"path": "/v2/health/ready", "port": "http"},
                    "periodSeconds": 1,
                    "failureThreshold": 2,
                },
                "livenessProbe": {
                    "httpGet": {"path": "/healthz", "port": "metrics"},
                    "periodSeconds": 5,
                    "failureThreshold": 3,
                },
                "lifecycle": {"preStop": {"sleep": {"seconds": 1}}},
                "resources": {
                    "requests": {"cpu": "250m", "memory": "128Mi"},
                    "limits": {"memory": "512Mi", KEYS.gpu_mem: pod.gpu_mem},
                },
                "volumeMounts": [
                    {"name": "agent-token", "mountPath": token_dir, "readOnly": True},
                    {"name": "model", "mountPath": "/mnt/models", "readOnly": True},
                ],
            }
        ],
        "volumes": [
            {"name": "model", "emptyDir": {}},
            {
                "name": "agent-token",
                "projected": {
                    "sources": [
                        {
                            "serviceAccountToken": {
                                "audience": DEFAULT_AGENT_AUDIENCE,
                                "expirationSeconds": 3600,
                                "path": "token",
                            }
                        }
                    ]
                },
            },
        ],
    }
    spec.update(placement_fields(pod))
    # As deploy/example writes it: restricted Pod Security (its namespace enforces it), and the
    # toleration of tritonshare's GPU-node taint.
    spec["securityContext"] = copy.deepcopy(modelpod.POD_SECURITY)
    for container in spec["initContainers"] + spec["containers"]:
        container["securityContext"] = copy.deepcopy(modelpod.LOCKED_DOWN)
    spec["tolerations"] = [*spec.get("tolerations", []), KEYS.gpu_node_toleration()]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod.name,
            "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/name": pod.name, "tritonshare.io/role": "model"},
            "annotations": {KEYS.model_id: pod.model_id},
        },
        "spec": spec,
    }
