"""The contract between the parts (DESIGN.md, "Contract"): every key, name and default.

The key prefix is configurable. With the prefix `seldon.io/trtis-` every key becomes the proof of
concept's own name (`seldon.io/trtis-gpu-mem`, `seldon.io/trtis-model-id`, ...).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

DEFAULT_PREFIX = "tritonshare.io/"
POC_PREFIX = "seldon.io/trtis-"
DEFAULT_SCHEDULER_NAME = "tritonshare"
DEFAULT_SYSTEM_NAMESPACE = "tritonshare-system"
DEFAULT_AGENT_AUDIENCE = "tritonshare-agent"
AGENT_LEASE_PREFIX = "tritonshare-agent-"
BINDER_LEADER_LEASE = "tritonshare-binder"
TENANT_CODE_NODE = "true"
"""The value of the tenant-code node label (`Keys.tenant_code`) on a node dedicated to it."""
GPU_NODE_TAINT_VALUE = "true"
GPU_NODE_TAINT_EFFECT = "NoExecute"
"""The GPU-node taint's effect: NoExecute, because the kubelet refuses a pod created with
spec.nodeName that does not tolerate it, where it admits one past a NoSchedule taint."""

# Default ports. Triton's own ports are never exposed to tenants. The agent's gRPC port is a
# hostPort on every GPU node, so it stays clear of node daemons that run with hostNetwork
# (node-exporter listens on 9100 in kube-prometheus-stack, dcgm-exporter on 9400); the node pod's
# ports are one block beside Triton's 8000-8002.
DEFAULT_AGENT_GRPC_PORT = 8100
DEFAULT_AGENT_HTTP_PORT = 8102
DEFAULT_GATEWAY_HTTP_PORT = 8010
DEFAULT_GATEWAY_GRPC_PORT = 8011
DEFAULT_GATEWAY_METRICS_PORT = 8012
DEFAULT_BINDER_HTTP_PORT = 9200
DEFAULT_PROXY_HTTP_PORT = 9000
DEFAULT_PROXY_GRPC_PORT = 9001
DEFAULT_PROXY_METRICS_PORT = 9002
PROXY_AUTOSCALING_PATH = "/autoscaling"
"""On the proxy's metrics port: JSON {model: [held request-seconds, inference requests answered]},
cumulative, of every model it serves; the binder's autoscaler reads it once a second."""

_PREFIX_RE = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9_.-]*$"
)
_MODEL_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_TRITON_RELEASE_RE = re.compile(r"[0-9]{2}\.[0-9]{2}")
SECRET_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
"""A Secret's name (a DNS subdomain): what a model names its storage credential by, resolved
in its own namespace only (no `/`, so no other namespace can be named)."""

RESIDENCY_ALWAYS = "always"
"""Residency class (the default): loaded while the pod lives, charged its request, never unloaded
to make room for another model."""
RESIDENCY_ON_DEMAND = "on-demand"
"""Residency class: may be unloaded from the GPU when idle and is loaded again by its next
request; placed against the GPU's memory times its pool's over-commit factor."""
RESIDENCIES = (RESIDENCY_ALWAYS, RESIDENCY_ON_DEMAND)
SPREAD_GPU = "GPU"
"""Replica spread: a model's replicas prefer other nodes, then other GPUs of a node."""
SPREAD_NODE = "Node"
"""Replica spread: a model's replicas prefer other nodes; on a node they pack."""
SPREAD_NONE = "None"
"""Replica spread: a model's replicas pack as any other model's pods."""
REPLICA_SPREADS = (SPREAD_GPU, SPREAD_NODE, SPREAD_NONE)
DEFAULT_MIN_GPU_MEM = "64Mi"
MIN_GPU_MEM = 64 << 20
"""The least GPU memory a model pod or a TritonModel replica may ask (the binder's
`--min-gpu-mem`): every model takes at least a CUDA context's part and host memory in Triton, so
a request of a byte would let a GPU-memory quota bound nothing."""
MAX_OVERCOMMIT = 100.0
"""The largest over-commit factor a node label may set: beyond it a GPU would be promised to more
models than its agent could ever cycle through."""


class ContractError(ValueError):
    """A value does not follow the contract; the message says what is wrong and what to do."""


@dataclass(frozen=True)
class Keys:
    """The annotation, resource and label keys, all derived from one prefix."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if not self.prefix or not _PREFIX_RE.match(self.prefix):
            raise ContractError(
                f"key prefix {self.prefix!r} is not a valid Kubernetes key prefix; "
                f"use a DNS subdomain ending in '/', such as {DEFAULT_PREFIX!r}, "
                f"or {POC_PREFIX!r} for the proof of concept's names"
            )

    @property
    def gpu_mem(self) -> str:
        """Container resource limit: the model's GPU memory, a quantity in bytes."""
        return f"{self.prefix}gpu-mem"

    @property
    def model_id(self) -> str:
        """Pod annotation: the model's public id, the name its clients send (the agent installs
        each pod's model under a private name in Triton, `common.tritonname`)."""
        return f"{self.prefix}model-id"

    @property
    def gpu(self) -> str:
        """Pod annotation written by the binder: UUID of the GPU chosen on the node."""
        return f"{self.prefix}gpu"

    @property
    def placement(self) -> str:
        """Pod annotation written by the binder with the GPU: its signed proof of placement
        (`common.proofs`)."""
        return f"{self.prefix}placement"

    @property
    def nomination(self) -> str:
        """Pod annotation written by the binder when the pod's preemption makes room for it:
        JSON `{"node", "gpu", "proof"}`, the room held and its proof (signed for the hold, never
        a placement), so that a new leader holds it again."""
        return f"{self.prefix}nomination"

    @property
    def gpu_mem_total(self) -> str:
        """Node annotation written by the agent: total memory of healthy GPUs, decimal bytes."""
        return f"{self.prefix}gpu-mem-total"

    @property
    def gpu_usage(self) -> str:
        """Node annotation written by the agent: JSON, per GPU UUID its NVML used bytes and its
        loaded models' measured bytes (`agent.gpus.memory`), by each model's name in Triton (its
        pod's private name, `common.tritonname`, or a legacy model's id); rate-limited."""
        return f"{self.prefix}gpu-usage"

    @property
    def quarantined(self) -> str:
        """Node annotation written by the agent: JSON list of the models quarantined on the
        node after Triton exited while loading them (`agent.quarantine.crashledger`); absent
        when none."""
        return f"{self.prefix}quarantined"

    @property
    def quarantine_clear(self) -> str:
        """Node annotation written by an operator (`tritonshare quarantine clear`): the
        quarantines the node's agent lifts, comma-separated; the agent removes it once done."""
        return f"{self.prefix}quarantine-clear"

    @property
    def gpus(self) -> str:
        """Node annotation written by the agent: JSON list of the node's GPUs."""
        return f"{self.prefix}gpus"

    @property
    def model_loaded(self) -> str:
        """Pod condition type: True when the node serves the pod's model; written by the pod's
        agent, and by the binder (Unknown) while that agent is down."""
        return f"{self.prefix}ModelLoaded"

    @property
    def tenant_code(self) -> str:
        """Node label set by the operator (value `TENANT_CODE_NODE`): the node is dedicated to
        the model pods of namespaces allowed to run their own code in Triton, and to no other
        model pod."""
        return f"{self.prefix}tenant-code"

    @property
    def gpu_node(self) -> str:
        """Node taint set by the operator on every GPU node tritonshare serves (value
        `GPU_NODE_TAINT_VALUE`, effect `GPU_NODE_TAINT_EFFECT`): only the node pod and model pods
        tolerate it, and an admission policy refuses it to every other pod."""
        return f"{self.prefix}gpu-node"

    def gpu_node_toleration(self) -> dict[str, str]:
        """The toleration of the GPU-node taint a model pod carries."""
        return {"key": self.gpu_node, "operator": "Exists", "effect": GPU_NODE_TAINT_EFFECT}

    @property
    def tenant_code_namespaces(self) -> str:
        """Leader Lease annotation written by the binder: the namespaces it places as tenant
        code, comma-separated, so `tritonshare explain` judges as the binder does."""
        return f"{self.prefix}tenant-code-namespaces"

    @property
    def residency(self) -> str:
        """Pod annotation: the model's residency class, `always` (the default) or `on-demand`."""
        return f"{self.prefix}residency"

    @property
    def replica_spread(self) -> str:
        """Pod annotation: how the binder spreads the replicas of the pod's model, `GPU` (the
        default: other GPUs, other nodes first), `Node` (other nodes only) or `None` (packed)."""
        return f"{self.prefix}replica-spread"

    @property
    def triton_version(self) -> str:
        """Node annotation written by the agent: the NGC release of the node's Triton (`24.10`);
        pod annotation: the release the model needs (a TensorRT plan's), placed only there."""
        return f"{self.prefix}triton-version"

    @property
    def tensorrt_version(self) -> str:
        """Node annotation written by the agent: the TensorRT of the node's Triton (`10.5.0`),
        where its release is known (`common.tritonrelease.RELEASES`)."""
        return f"{self.prefix}tensorrt-version"

    @property
    def onnxruntime_version(self) -> str:
        """Node annotation written by the agent: the ONNX Runtime of the node's Triton, where
        its release is known."""
        return f"{self.prefix}onnxruntime-version"

    @property
    def idempotent(self) -> str:
        """Pod annotation: "true" when the model's calls may run twice (no sequence batcher, no
        side effects), so the proxy sends again one lost with the node gateway's process."""
        return f"{self.prefix}idempotent"

    @property
    def backend(self) -> str:
        """Pod and TritonModel annotation: the Triton backend of the model (`onnxruntime`...);
        an in-process one spares the per-process allowance (`common.backends`)."""
        return f"{self.prefix}backend"

    @property
    def gpu_mem_overcommit(self) -> str:
        """Node label set by the operator: the over-commit factor of the node's GPUs for
        `on-demand` models, a decimal number from 1 (off, the default) to `MAX_OVERCOMMIT`."""
        return f"{self.prefix}gpu-mem-overcommit"

    @property
    def gpu_mem_reserve(self) -> str:
        """Leader Lease annotation written by the binder: the GPU memory reserve it places with,
        decimal bytes, so `tritonshare status` counts as the binder does."""
        return f"{self.prefix}gpu-mem-reserve"

    @property
    def gpu_mem_process_allowance(self) -> str:
        """Leader Lease annotation written by the binder: the per-process allowance it books
        (`common.backends`), decimal bytes, so `tritonshare explain` books as the binder does."""
        return f"{self.prefix}gpu-mem-process-allowance"


def agent_lease_name(node_name: str) -> str:
    """The name of the Lease an agent renews for its node."""
    return f"{AGENT_LEASE_PREFIX}{node_name}"


def validate_model_id(model_id: str) -> str:
    """Return `model_id` if it is a valid model id, else raise ContractError saying why."""
    if not isinstance(model_id, str) or not model_id:
        raise ContractError(
            "model id is empty; set it to the model's name, the one its clients send"
        )
    if len(model_id) > 128:
        raise ContractError(
            f"model id {model_id[:40]!r}... is {len(model_id)} characters; at most 128 are allowed"
        )
    if model_id.startswith("."):
        raise ContractError(
            f"model id {model_id!r} starts with a dot; Triton would list it as a hidden directory"
        )
    # fullmatch: with match, "$" lets a trailing newline through into paths and log lines.
    if not _MODEL_ID_RE.fullmatch(model_id):
        raise ContractError(
            f"model id {model_id!r} has characters outside [A-Za-z0-9_.-]; rename the model"
        )
    return model_id


def validate_residency(value: str, key: str) -> str:
    """Return the residency class `value` names, else raise ContractError saying what to write;
    `key` is the annotation's name, for the message."""
    if value in RESIDENCIES:
        return value
    raise ContractError(
        f"annotation {key}={str(value)[:64]!r} is not a residency class; write "
        f"{key}: {RESIDENCY_ALWAYS} (loaded while the pod lives, the default) or "
        f"{key}: {RESIDENCY_ON_DEMAND} (unloaded when idle, loaded again by the next request)"
    )


def validate_replica_spread(value: str, key: str) -> str:
    """Return the replica spread `value` names, else raise ContractError saying what to write;
    `key` is the annotation's (or field's) name, for the message."""
    if value in REPLICA_SPREADS:
        return value
    raise ContractError(
        f"{key}={str(value)[:64]!r} is not a replica spread; write {SPREAD_GPU} (replicas on "
        f"other nodes, then other GPUs, the default), {SPREAD_NODE} (other nodes only) or "
        f"{SPREAD_NONE} (packed)"
    )


def validate_triton_version(value: str, key: str) -> str:
    """Return the NGC Triton release `value` names (`24.10`), else raise ContractError saying
    what to write; `key` is the annotation's (or field's) name, for the message."""
    if _TRITON_RELEASE_RE.fullmatch(value):
        return value
    raise ContractError(
        f"{key}={str(value)[:64]!r} is not a Triton release; write the NGC container's tag "
        f"without -py3, such as 24.10"
    )


def parse_overcommit(value: str, key: str) -> float:
    """The over-commit factor a node label `key` sets, or ContractError saying what to write."""
    try:
        factor = float(value)
    except ValueError:
        factor = math.nan
    if not 1.0 <= factor <= MAX_OVERCOMMIT:  # also refuses nan and inf
        raise ContractError(
            f"label {key}={value[:64]!r} is not an over-commit factor; write a number from 1 "
            f'(no over-commit) to {MAX_OVERCOMMIT:g}, such as {key}: "3"'
        )
    return factor


def gpu_mem_problem(request: int, floor: int, key: str) -> str:
    """Why a model's GPU-memory request (bytes) cannot be placed, "" when it can: the one rule
    for model pods and TritonModels; `key` is the resource's name, for the message."""
    if request <= 0:
        return (
            f"pod requests no GPU memory; set a {key} limit (such as '2Gi') on the container that "
            f"serves the model"
        )
    if request < floor:
        return (
            f"{key} of {request} bytes is under the {floor} bytes every model is placed with at "
            f"least (the binder's --min-gpu-mem: a model takes at least that in Triton, whatever "
            f"it asks); ask for {floor} bytes or more"
        )
    return ""


def model_id_problem(model_id: str) -> str:
    """Why `model_id` is not a model id ("" when it is): the one grammar of a pod's model-id
    annotation and a TritonModel's spec.modelName."""
    try:
        validate_model_id(model_id)
    except ContractError as e:
        return str(e)
    return ""


def is_valid_model_id(model_id: str) -> bool:
    """True when `model_id` follows the contract."""
    try:
        validate_model_id(model_id)
    except ContractError:
        return False
    return True
