"""The node's GPUs as values: a snapshot, the Node annotations it implies, what changed, and
whether the GPU a pod was placed on is one of them (`gpu_for`).

Pure: no I/O, no clock. `agent.gpus.nvml` builds snapshots from NVML; `agent.status.node` writes
what this module computes. The annotation format is DESIGN.md's contract; keep it byte-stable
(sorted keys, no spaces) so an unchanged inventory never causes a write.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from agent.errors import ConflictError, InvalidRequestError
from common.contract import Keys


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as last read. When it stops answering, identity and memory are the last known."""

    index: int
    uuid: str
    product: str
    memory_total: int
    memory_used: int
    healthy: bool
    reason: str = ""

    @property
    def memory_free(self) -> int:
        return max(self.memory_total - self.memory_used, 0)


@dataclass(frozen=True)
class GpuSnapshot:
    """Every GPU of the node, in index order."""

    gpus: tuple[GpuInfo, ...] = ()

    @property
    def healthy_memory_total(self) -> int:
        return sum(g.memory_total for g in self.gpus if g.healthy)

    def by_uuid(self, uuid: str) -> GpuInfo | None:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu
        return None


GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource NVIDIA's device plugin advertises on a node, one per GPU."""


def advertised_gpus(node: Mapping[str, object]) -> int | None:
    """How many GPUs the node's device plugin advertises (`status.allocatable`, else
    `status.capacity`, `nvidia.com/gpu`); None where no device plugin advertises them (DRA, or
    the environment-variable mode) or the value is not a whole number."""
    status = node.get("status")
    if not isinstance(status, Mapping):
        return None
    for field in ("allocatable", "capacity"):
        resources = status.get(field)
        if isinstance(resources, Mapping) and GPU_RESOURCE in resources:
            try:
                return int(str(resources[GPU_RESOURCE]))
            except ValueError:
                return None
    return None


def gpu_for(
    snapshot: GpuSnapshot | None, model_id: str, gpu_uuid: str, cpu_only: bool
) -> tuple[str, int]:
    """The UUID and index of the GPU a model's pod was placed on (the binder's annotation),
    checked against the snapshot; index -1 loads on the CPU. ConflictError when that GPU is not
    on the node or unhealthy, InvalidRequestError when the pod names none on a GPU node."""
    if not gpu_uuid:
        if cpu_only:
            return "", -1
        raise InvalidRequestError(
            f"the pod of model {model_id!r} has no GPU annotation; it must be scheduled by "
            f"tritonshare (the binder writes the GPU before binding)"
        )
    gpu = snapshot.by_uuid(gpu_uuid) if snapshot is not None else None
    if gpu is None:
        if cpu_only:
            # Without a GPU read (CPU machines) the assignment is kept for accounting only.
            return gpu_uuid, -1
        raise ConflictError(
            f"GPU {gpu_uuid} chosen for model {model_id!r} is not on this node; "
            f"delete the pod so the binder places it again"
        )
    if not gpu.healthy and not cpu_only:
        raise ConflictError(
            f"GPU {gpu.index} ({gpu_uuid}) chosen for model {model_id!r} is unhealthy "
            f"({gpu.reason}); delete the pod so the binder places it on a healthy GPU"
        )
    return gpu.uuid, gpu.index


def node_annotations(snapshot: GpuSnapshot, keys: Keys) -> dict[str, str]:
    """The `gpu-mem-total` and `gpus` annotations for this snapshot."""
    gpus = [
        {
            "uuid": g.uuid,
            "index": g.index,
            "product": g.product,
            "memory": g.memory_total,
            "healthy": g.healthy,
        }
        for g in sorted(snapshot.gpus, key=lambda g: g.index)
    ]
    return {
        keys.gpu_mem_total: str(snapshot.healthy_memory_total),
        keys.gpus: json.dumps(gpus, sort_keys=True, separators=(",", ":")),
    }


def annotations_patch(current: Mapping[str, str], desired: Mapping[str, str]) -> dict[str, str]:
    """The annotations whose values differ from the Node's; empty when nothing must be written."""
    return {key: value for key, value in desired.items() if current.get(key) != value}


def capacity_patch(
    snapshot: GpuSnapshot, keys: Keys, current: Mapping[str, str]
) -> dict[str, str] | None:
    """The extended resource `<prefix>gpu-mem` for status capacity/allocatable, if it changed."""
    value = str(snapshot.healthy_memory_total)
    if current.get(keys.gpu_mem) == value:
        return None
    return {keys.gpu_mem: value}


def health_changes(previous: GpuSnapshot | None, current: GpuSnapshot) -> list[str]:
    """Sentences for GPUs whose health changed, for the log."""
    before = {g.index: g for g in previous.gpus} if previous else {}
    messages = []
    for gpu in current.gpus:
        old = before.get(gpu.index)
        if old is not None and old.healthy == gpu.healthy:
            continue
        if not gpu.healthy:
            messages.append(
                f"GPU {gpu.index} ({gpu.uuid or 'unknown UUID'}) is unhealthy ({gpu.reason}): "
                f"removing it from the node's GPU memory"
            )
        elif old is not None:
            messages.append(
                f"GPU {gpu.index} ({gpu.uuid}) answers again: "
                f"adding it back to the node's GPU memory"
            )
    if previous is not None and len(current.gpus) < len(previous.gpus):
        messages.append(
            f"The node reports {len(current.gpus)} GPUs where it reported {len(previous.gpus)}"
        )
    return messages
