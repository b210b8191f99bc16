"""Node shapes and model pods as the placement benchmarks give them to the binder's core.

A node shape is written `GPUSxMODEL:CPUS:PODS` (`8xA100-80GB:96:110`): the GPUs and their
model, the node's allocatable CPUs and pods (kubelet's `maxPods`). Its allocatable memory is
the memory of the cloud instances that carry that GPU (per CPU: `GPU_MODELS`) minus what EKS's
kubelet reserves (255Mi, 11Mi per pod, 100Mi eviction threshold). The named shapes:

- `8xA100-80GB:96:110`: p4de.24xlarge (1152 GiB), kubelet's default `maxPods`;
- `8xL4:192:110`: g6.48xlarge (768 GiB);
- `1xT4:4:29`: g4dn.xlarge (16 GiB), the 29 pods EKS's VPC CNI allows it.

Every node runs the node pod first, and its requests (`NodeShape.node_pod`: the agent's and the
gateway's, and Triton's as docs/deploy.md sizes it for the node's memory) are counted against the
node's allocatable, with its pod slot, before any model.

A model pod asks what the webhook writes (`webhook.mutation.complete`: the proxy, the loader
and storage-initializer init containers), counted as Kubernetes counts a pod's effective
request; a TritonModel replica asks its share of its namespace's model host instead
(`binder.cluster.modelviews.as_replica`).

No I/O, no clock: it builds domain objects for `binder.framework.placement.place`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache

from binder.cluster.objects import Gpu, NodeInfo, pod_from_api
from common.contract import Keys
from common.podresources import CPU, MEMORY, PODS
from webhook.mutation import complete
from webhook.settings import Settings

GI = 1 << 30
MI = 1 << 20


@dataclass(frozen=True)
class GpuModel:
    memory: int
    """Bytes of GPU memory."""
    memory_per_cpu: int
    """Bytes of host memory per CPU of the instances that carry it."""


GPU_MODELS = {
    "A100-80GB": GpuModel(80 * GI, 12 * GI),  # p4de.24xlarge: 96 vCPUs, 1152 GiB
    "A100-40GB": GpuModel(40 * GI, 12 * GI),  # p4d.24xlarge: 96 vCPUs, 1152 GiB
    "H100-80GB": GpuModel(80 * GI, 2048 * GI // 192),  # p5.48xlarge: 192 vCPUs, 2 TiB
    "L4": GpuModel(24 * GI, 4 * GI),  # g6.48xlarge: 192 vCPUs, 768 GiB
    "A10G": GpuModel(24 * GI, 4 * GI),  # g5.48xlarge: 192 vCPUs, 768 GiB
    "T4": GpuModel(16 * GI, 4 * GI),  # g4dn.xlarge: 4 vCPUs, 16 GiB
}
NAMED_SHAPES = ("8xA100-80GB:96:110", "8xL4:192:110", "1xT4:4:29")
# The node pod's requests (deploy/base/node/node-daemonset.yaml): the agent and the gateway, then
# Triton's for nodes of SMALL_NODE_MEMORY allocatable and more (the base, the chart's
# triton.resources) and for smaller ones (deploy/overlays/small-nodes, a pool's tritonResources).
NODE_POD_SIDECARS = {CPU: 100 + 500, MEMORY: 128 * MI + 128 * MI}
TRITON = {CPU: 2000, MEMORY: 32 * GI}
TRITON_SMALL = {CPU: 1000, MEMORY: 8 * GI}
SMALL_NODE_MEMORY = 64 * GI
_SHAPE = re.compile(r"(?P<gpus>\d+)x(?P<model>[A-Za-z0-9-]+):(?P<cpus>\d+):(?P<pods>\d+)")


class ShapeError(ValueError):
    """A node shape that cannot be read; the message says what to write."""


@dataclass(frozen=True)
class NodeShape:
    gpus: int
    model: str
    cpus: int
    pods: int

    def __str__(self) -> str:
        return f"{self.gpus}x{self.model}:{self.cpus}:{self.pods}"

    @property
    def gpu_memory(self) -> int:
        return GPU_MODELS[self.model].memory

    @property
    def memory(self) -> int:
        """Allocatable memory: the instance's, less kubelet's reservations (EKS's formula)."""
        capacity = self.cpus * GPU_MODELS[self.model].memory_per_cpu
        return capacity - (255 + 11 * self.pods + 100) * MI

    @property
    def allocatable(self) -> dict[str, int]:
        return {CPU: self.cpus * 1000, MEMORY: self.memory, PODS: self.pods}

    @property
    def node_pod(self) -> dict[str, int]:
        """The node pod's requests on such a node: Triton's sized for its memory, one pod."""
        triton = TRITON if self.memory >= SMALL_NODE_MEMORY else TRITON_SMALL
        sidecars = NODE_POD_SIDECARS
        return {
            CPU: sidecars[CPU] + triton[CPU],
            MEMORY: sidecars[MEMORY] + triton[MEMORY],
            PODS: 1,
        }

    @property
    def room(self) -> dict[str, int]:
        """What the node's allocatable leaves for models once its node pod runs."""
        node_pod = self.node_pod
        return {
            resource: count - node_pod[resource] for resource, count in self.allocatable.items()
        }

    def describe(self) -> str:
        node_pod = self.node_pod
        return (
            f"{self.gpus} x {self.gpu_memory // GI} GiB {self.model}, {self.cpus} CPUs, "
            f"{self.memory / GI:.0f} GiB, {self.pods} pods allocatable, less the node pod's "
            f"{node_pod[CPU]}m CPU, {node_pod[MEMORY] / GI:.2f} GiB and 1 pod"
        )

    def node(
        self, name: str, *, overcommit: float = 1.0, labels: Mapping[str, str] | None = None
    ) -> NodeInfo:
        gpus = tuple(
            Gpu(f"GPU-{name}-{i}", i, self.model, self.gpu_memory, True) for i in range(self.gpus)
        )
        labelled = {"kubernetes.io/hostname": name, **(labels or {})}
        return NodeInfo(name, labelled, gpus=gpus, allocatable=self.room, overcommit=overcommit)


def parse_shape(text: str) -> NodeShape:
    """`GPUSxMODEL:CPUS:PODS`, each count positive and the model one of `GPU_MODELS`."""
    example = f"write GPUSxMODEL:CPUS:PODS, such as {', '.join(NAMED_SHAPES)}"
    match = _SHAPE.fullmatch(text.strip())
    if match is None:
        raise ShapeError(f"node shape {text!r} is not GPUSxMODEL:CPUS:PODS; {example}")
    model = match["model"]
    if model not in GPU_MODELS:
        raise ShapeError(
            f"node shape {text!r}: unknown GPU model {model!r}; use one of {', '.join(GPU_MODELS)}"
        )
    gpus, cpus, pods = int(match["gpus"]), int(match["cpus"]), int(match["pods"])
    if min(gpus, cpus, pods) < 1:
        raise ShapeError(f"node shape {text!r}: GPUs, CPUs and pods must each be at least 1")
    shape = NodeShape(gpus, model, cpus, pods)
    if shape.memory <= 0 or min(shape.room.values()) < 0:
        raise ShapeError(
            f"node shape {text!r}: {cpus} CPUs of such an instance leave no room for the node "
            f"pod after kubelet's reservations for {pods} pods; give it more CPUs or fewer pods"
        )
    return shape


@cache
def model_pod_requests() -> Mapping[str, int]:
    """A model pod's effective requests beside its GPU memory, as the webhook completes it."""
    keys = Keys()
    annotations = {f"{keys.prefix}model-uri": "gs://models/m", keys.gpu_mem: "1Gi"}
    pod = {
        "metadata": {"name": "m", "namespace": "models", "annotations": annotations},
        "spec": {"containers": []},
    }
    return dict(pod_from_api(complete(pod, Settings()), keys).resources)


RESOURCE_OF_REASON = (
    ("Too many pods", "pods"),
    ("Insufficient cpu", "CPU"),
    ("Insufficient memory", "memory"),
    ("Insufficient GPU memory", "GPU memory"),
    ("Insufficient over-committed GPU memory", "GPU memory"),
)


def resources_refused(reasons: Mapping[str, int]) -> set[str]:
    """The resources among the binder's reasons for one pod or replica that fit no node."""
    out = set()
    for reason in reasons:
        for prefix, resource in RESOURCE_OF_REASON:
            if reason.startswith(prefix):
                out.add(resource)
                break
        else:
            out.add(reason)
    return out


def binding(refused: Counter[str]) -> str:
    """The resource that refused the most placements, ties joined with "and"; "nothing" when
    every one fitted the first node."""
    if not refused:
        return "nothing"
    top = max(refused.values())
    return " and ".join(sorted(r for r, count in refused.items() if count == top))
