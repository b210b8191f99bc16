"""Model pods as the agent sees them: converted once from API objects, and which models are wanted.

Pure: takes the JSON dicts `agent.kube` returns, gives frozen values. Nothing read here is proof
of anything (`agent.placement` decides which pods the binder placed). A pod being deleted still
wants its model: its proxy drains first, then asks to unload.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from common.contract import RESIDENCY_ALWAYS, RESIDENCY_ON_DEMAND, Keys

TERMINATED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class PodInfo:
    """The fields of a pod the agent decides on."""

    namespace: str
    name: str
    uid: str
    node_name: str
    scheduler_name: str
    phase: str
    model_id: str
    gpu_uuid: str
    deleting: bool = False
    placement: str = ""
    """The binder's proof of placement (annotation), unverified: see `agent.placement`."""
    pod_ip: str = ""
    """status.podIP: the address the node gateway knows the pod's connections by."""
    host_ip: str = ""
    """status.hostIP: the node's address, which never identifies a pod."""
    host_network: bool = False
    """spec.hostNetwork: such a pod shares the node's address and is never a gateway caller."""
    concurrency: int = 0
    """The in-flight limit the pod's proxy declares (`--container-concurrency`, as a flag or its
    variable; the webhook writes it from the concurrency annotation), 0 when none: the gateway's
    per-pod limit follows it. Tenant-written, so it only ever lowers the gateway's ceiling."""
    model_loaded: tuple[str, str] = ("", "")
    """The pod's ModelLoaded condition as it stands (status, reason); empty when it has none."""
    controlled: bool = False
    """A controller (a ReplicaSet, a StatefulSet...) owns it and replaces it when it fails."""
    residency: str = RESIDENCY_ALWAYS
    """The residency annotation as a class (`on-demand`, else `always`), unverified: the proof
    of placement binds it (`agent.placement`)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def terminated(self) -> bool:
        return self.phase in TERMINATED_PHASES

    @property
    def running(self) -> bool:
        """Running means every init container, the loader included, has succeeded."""
        return self.phase == "Running"


def pod_from_dict(obj: Mapping[str, Any], keys: Keys) -> PodInfo:
    """A PodInfo from a Pod as the API returns it (JSON)."""
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    annotations = metadata.get("annotations") or {}
    return PodInfo(
        namespace=str(metadata.get("namespace", "")),
        name=str(metadata.get("name", "")),
        uid=str(metadata.get("uid", "")),
        node_name=str(spec.get("nodeName") or ""),
        scheduler_name=str(spec.get("schedulerName") or "default-scheduler"),
        phase=str(status.get("phase") or "Pending"),
        model_id=str(annotations.get(keys.model_id, "")),
        residency=(
            RESIDENCY_ON_DEMAND
            if annotations.get(keys.residency) == RESIDENCY_ON_DEMAND
            else RESIDENCY_ALWAYS
        ),
        gpu_uuid=str(annotations.get(keys.gpu, "")),
        deleting=bool(metadata.get("deletionTimestamp")),
        placement=str(annotations.get(keys.placement, "")),
        pod_ip=str(status.get("podIP") or ""),
        host_ip=str(status.get("hostIP") or ""),
        host_network=bool(spec.get("hostNetwork")),
        concurrency=declared_concurrency(spec),
        model_loaded=_condition(status, keys.model_loaded),
        controlled=any(
            isinstance(ref, Mapping) and ref.get("controller") is True
            for ref in metadata.get("ownerReferences") or []
        ),
    )


def _condition(status: Mapping[str, Any], condition_type: str) -> tuple[str, str]:
    for condition in status.get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == condition_type:
            return str(condition.get("status") or ""), str(condition.get("reason") or "")
    return ("", "")


_FLAG = "--container-concurrency"
_VARIABLE = "TRITONSHARE_CONTAINER_CONCURRENCY"


def declared_concurrency(spec: Mapping[str, Any]) -> int:
    """The largest `--container-concurrency` any container of the pod declares (the flag wins
    over the variable, as in the proxy), 0 when none declares a whole number above 0."""
    found = 0
    for container in spec.get("containers") or []:
        if not isinstance(container, Mapping):
            continue
        words = [str(w) for w in (container.get("command") or []) + (container.get("args") or [])]
        value = None
        for i, word in enumerate(words):
            if word.startswith(_FLAG + "="):
                value = word[len(_FLAG) + 1 :]
            elif word == _FLAG and i + 1 < len(words):
                value = words[i + 1]
        if value is None:
            for variable in container.get("env") or []:
                if isinstance(variable, Mapping) and variable.get("name") == _VARIABLE:
                    value = str(variable.get("value") or "")
        if value is not None and value.strip().isdigit():
            found = max(found, int(value.strip()))
    return found
