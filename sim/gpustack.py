"""What a simulated GPU node carries as a real one does once the GPU Operator and tritonshare are
installed: GPU feature discovery's labels, the NVIDIA device plugin's `nvidia.com/gpu`, and the
node DaemonSets of deploy/base (one per GPU count) whose pods `sim.cluster` runs as processes.

The labels are those GPU feature discovery writes that tritonshare's node affinity and
`tritonshare preflight` read (`nvidia.com/gpu.present`, `.count`, `.product`, `.memory`). The
DaemonSets are rendered as `kubectl apply -k deploy/base` renders them (`kubectl kustomize`): the
cluster stores them and no controller acts on them. A node's size is its node pod's requests (the
DaemonSet that selects it) plus `MODEL_ROOM` for everything else, so the node pod fits as on a
node sized for it. No Kubernetes client here: `sim.cluster` writes what these functions return.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from common.podresources import CPU, MEMORY, pod_requests
from sim.gpu.spec import SpecError, parse_spec

DEPLOY_BASE = Path(__file__).resolve().parents[1] / "deploy" / "base"
GPU_PRESENT = "nvidia.com/gpu.present"
GPU_COUNT = "nvidia.com/gpu.count"
GPU_PRODUCT = "nvidia.com/gpu.product"
GPU_MEMORY = "nvidia.com/gpu.memory"
NVIDIA_GPU = "nvidia.com/gpu"
MODEL_ROOM = {CPU: 8000, MEMORY: 64 << 30}
"""Millicpus and bytes of a node beside its node pod's requests: the model pods' room."""
_LABEL_VALUE_INVALID = re.compile(r"[^A-Za-z0-9_.-]")


class GpuStackError(RuntimeError):
    """The node DaemonSets could not be rendered, or a node's GPUs could not be read; the message
    says why and what to do."""


@dataclass(frozen=True)
class NodeGpus:
    """A node's GPUs as GPU feature discovery labels them (the first GPU's product, as it does)."""

    count: int
    product: str
    memory: int
    """Bytes of each GPU (the first one's)."""


def mock_gpus(spec: str, node: str) -> NodeGpus:
    """The GPUs of a mock NVML spec (`2xT4`, or a spec file), as the node's mock NVML serves
    them."""
    try:
        gpus = parse_spec(spec, seed=node).gpus
    except SpecError as e:
        raise GpuStackError(f"node {node}'s GPUs: {e}") from e
    if not gpus:
        return NodeGpus(0, "", 0)
    return NodeGpus(len(gpus), gpus[0].product, gpus[0].memory)


def nvml_gpus(node: str, nvml: object | None = None) -> NodeGpus:
    """This machine's own GPUs, read through NVML as the node's agent reads them (`nvml`: a
    stand-in for the `pynvml` module). Where NVML cannot be read the node is labelled as having
    none: its agent, which reads NVML the same way, then fails to start and its log says why."""
    from agent.errors import NvmlUnavailableError
    from agent.gpus.nvml import PYNVML, GpuReader

    reader = GpuReader(nvml=PYNVML if nvml is None else nvml)
    try:
        gpus = reader.read().gpus
    except NvmlUnavailableError:
        return NodeGpus(0, "", 0)
    finally:
        reader.close()
    if not gpus:
        return NodeGpus(0, "", 0)
    first = min(gpus, key=lambda g: g.index)
    return NodeGpus(len(gpus), first.product, first.memory_total)


def feature_labels(gpus: NodeGpus) -> dict[str, str]:
    """GPU feature discovery's labels for these GPUs (none for a node without any): the product
    with its spaces as dashes (`Tesla-T4`), the memory in MiB."""
    if gpus.count <= 0:
        return {}
    product = _LABEL_VALUE_INVALID.sub("-", gpus.product.replace(" ", "-"))[:63].strip("-_.")
    labels = {
        GPU_PRESENT: "true",
        GPU_COUNT: str(gpus.count),
        GPU_MEMORY: str(gpus.memory >> 20),
    }
    if product:
        labels[GPU_PRODUCT] = product
    return labels


def render_node_daemonsets(kubectl: str | None = None) -> list[dict[str, Any]]:
    """The DaemonSets of deploy/base as `kubectl kustomize deploy/base` renders them."""
    kubectl = kubectl or shutil.which("kubectl")
    if kubectl is None:
        raise GpuStackError(
            "kubectl is not installed, and it renders deploy/base's node DaemonSets "
            "(apt-get install kubernetes-client, kubectl 1.21 or newer)"
        )
    try:
        done = subprocess.run(
            [kubectl, "kustomize", str(DEPLOY_BASE)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise GpuStackError(f"`kubectl kustomize {DEPLOY_BASE}` did not run: {e}") from e
    if done.returncode != 0:
        raise GpuStackError(
            f"`kubectl kustomize {DEPLOY_BASE}` failed (kubectl 1.21 or newer renders it): "
            f"{done.stderr.strip()}"
        )
    return [
        doc
        for doc in yaml.safe_load_all(done.stdout)
        if isinstance(doc, dict) and doc.get("kind") == "DaemonSet"
    ]


def selects(daemonset: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether the DaemonSet's node selector and required node affinity admit a node of these
    labels (its taints are those the node DaemonSets tolerate)."""
    spec = ((daemonset.get("spec") or {}).get("template") or {}).get("spec") or {}
    selector = spec.get("nodeSelector") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms")
    if not terms:
        return True
    return any(
        all(_matches(e, labels) for e in term.get("matchExpressions") or []) for term in terms
    )


def _matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, operator = str(expression.get("key")), expression.get("operator")
    values = [str(v) for v in expression.get("values") or []]
    value = labels.get(key)
    if operator == "In":
        return value in values
    if operator == "NotIn":
        return value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and value.isdigit() and values:
        bound = int(values[0])
        return int(value) > bound if operator == "Gt" else int(value) < bound
    return False


def node_size(daemonsets: Sequence[Mapping[str, Any]], labels: Mapping[str, str]) -> dict[str, int]:
    """The CPU (millicpus) and memory (bytes) of a node of these labels: `MODEL_ROOM` plus the
    requests of the node pod of the first DaemonSet that selects it (none: `MODEL_ROOM`)."""
    chosen = next((ds for ds in daemonsets if selects(ds, labels)), None)
    asked = pod_requests(chosen["spec"]["template"]["spec"]) if chosen is not None else {}
    return {r: MODEL_ROOM[r] + asked.get(r, 0) for r in (CPU, MEMORY)}
