"""Model pods as the agent sees them: converted once from API objects, and which models are wanted.

Pure: takes the JSON dicts `agent.kube.client` returns, gives frozen values. Nothing read here is
proof of anything (`agent.pods.provenpods` decides which pods the binder placed). A pod being
deleted still wants its model: its proxy drains first, then asks to unload.

A model host (`common.hosted`: the model-host label, named as its node's host) stands for one
`PodInfo` per entry of its hosted-models annotation: a replica, handled exactly as a model pod
(its name and uid are the replica's, as the binder signed them; namespace, node, phase and
address are the host's; `host` names the host pod). A draining entry is a replica being deleted;
an entry gone from the annotation is a pod gone. A host naming more entries than the node can
hold replicas of one namespace stands for none. A model pod is a host of one model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from common.contract import RESIDENCY_ALWAYS, RESIDENCY_ON_DEMAND, Keys
from common.hosted import (
    LOAD_FAILURE_REASONS,
    HostedError,
    HostedReplica,
    decode_hosted,
    host_label,
    host_name,
    host_secret_annotation,
    hosted_models_annotation,
    loaded_condition,
    loaded_prefix,
)

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
    """The binder's proof of placement (annotation), unverified: see `agent.pods.provenpods`."""
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
    loaded_message: str = ""
    """For a replica: its loaded condition's message (a new load failure replaces it)."""
    controlled: bool = False
    """A controller (a ReplicaSet, a StatefulSet...) owns it and replaces it when it fails."""
    residency: str = RESIDENCY_ALWAYS
    """The residency annotation as a class (`on-demand`, else `always`), unverified: the proof
    of placement binds it (`agent.pods.provenpods`)."""
    backend: str = ""
    """The backend the pod declares (`<prefix>backend`, "" when none), unverified: the binder
    booked the per-process allowance unless it names an in-process one (`common.backends`)."""
    host: str = ""
    """For a replica of a model host: the host pod's name ("" for a model pod)."""
    host_uid: str = ""
    """For a replica: the host pod's uid."""
    draining: bool = False
    """For a replica: the binder marked it leaving the host (it is also `deleting`)."""
    condition_type: str = ""
    """The condition that says whether its model is served, on the pod (`object_name`): the
    host's `<prefix>loaded-<model>` for a replica; "" for the agent's ModelLoaded."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def object_name(self) -> str:
        """The pod that stands for it in the API: the host for a replica, else itself."""
        return self.host or self.name

    @property
    def object_uid(self) -> str:
        return self.host_uid or self.uid

    @property
    def object_key(self) -> str:
        """namespace/name of `object_name`: where its Events and its condition go."""
        return f"{self.namespace}/{self.object_name}"

    @property
    def terminated(self) -> bool:
        return self.phase in TERMINATED_PHASES

    @property
    def running(self) -> bool:
        """Running means its loader is done with its model: for a model pod, every init
        container, the loader included, has succeeded; for a replica, the host runs and the
        agent has said how its model stands (`host_running` before that)."""
        if self.host:
            return self.host_running and self.model_loaded[0] != "" and not self.pending
        return self.phase == "Running"

    @property
    def host_running(self) -> bool:
        """The pod (a replica's host) runs: its loader may be installing the model."""
        return self.phase == "Running"

    @property
    def pending(self) -> bool:
        """A replica whose model the host's loader has not yet made READY once (or reports it
        cannot load)."""
        reason = self.model_loaded[1]
        return reason == PENDING_REASON or reason in LOAD_FAILURE_REASONS


PENDING_REASON = "ModelPending"
"""A replica's condition reason until its host's loader first makes it READY (no Event)."""


def pod_ready(obj: Mapping[str, Any]) -> bool:
    """Whether the pod's Ready condition is True (its Services' endpoints route to it)."""
    return _condition(obj.get("status") or {}, "Ready")[0] == "True"


def condition_reason(obj: Mapping[str, Any], condition_type: str) -> str:
    """The reason of the pod's `condition_type` condition; '' when it has none."""
    return _condition(obj.get("status") or {}, condition_type)[1]


def controller_uid(obj: Mapping[str, Any]) -> str:
    """The uid of the controller that owns the pod (its ReplicaSet, StatefulSet...); '' none."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return str(ref.get("uid") or "")
    return ""


def is_host(obj: Mapping[str, Any], keys: Keys) -> bool:
    """Whether the pod carries the model-host label (which proves nothing by itself)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(host_label(keys)) == "true")


def pods_from_dict(obj: Mapping[str, Any], keys: Keys, most: int = 0) -> tuple[list[PodInfo], str]:
    """What a Pod stands for: itself, or a host's replicas; and, for a host whose replicas
    cannot be read, what is wrong (it then stands for none)."""
    if not is_host(obj, keys):
        return [pod_from_dict(obj, keys)], ""
    return replicas_from_dict(obj, keys, most)


def replicas_from_dict(
    obj: Mapping[str, Any], keys: Keys, most: int = 0
) -> tuple[list[PodInfo], str]:
    """A model host's replicas, one PodInfo each, unverified; and what is wrong when the host
    stands for none (not named as its node's host, a malformed annotation, or more than `most`
    entries: more than the node can hold of one namespace, 0 when not known)."""
    hosted, problem = hosted_from_dict(obj, keys, most)
    return [replica for _, replica in hosted], problem


def hosted_from_dict(
    obj: Mapping[str, Any], keys: Keys, most: int = 0
) -> tuple[list[tuple[HostedReplica, PodInfo]], str]:
    """As `replicas_from_dict`, each replica beside its entry in the annotation."""
    host = pod_from_dict(obj, keys)
    metadata = obj.get("metadata") or {}
    status = obj.get("status") or {}
    annotation = hosted_models_annotation(keys)
    value = (metadata.get("annotations") or {}).get(annotation, "")
    secret = str((metadata.get("annotations") or {}).get(host_secret_annotation(keys)) or "")
    if host.name != host_name(host.node_name, secret):
        return [], (
            f"pod {host.key} carries the label {host_label(keys)}=true but is not its node's "
            f"model host ({host_name(host.node_name, secret)}); only the binder creates hosts"
        )
    try:
        entries = decode_hosted(str(value))
    except HostedError as e:
        return [], f"model host {host.key} serves no replica: {e}"
    if most and len(entries) > most:
        return [], (
            f"model host {host.key} names {len(entries)} replicas, more than this node can hold "
            f"of one namespace ({most}: its GPUs' memory over the least GPU memory a model may "
            f"ask, --min-gpu-mem), so it serves none of them; only the binder writes a host's "
            f"hosted-models annotation: delete the host pod and the binder makes it again"
        )
    hosted = []
    for entry in entries:
        condition = loaded_condition(keys, entry.model, entry.replica)
        replica = replace(
            host,
            name=entry.replica_name,
            uid=entry.replica_uid,
            model_id=entry.model_id,
            gpu_uuid=entry.gpu,
            residency=entry.residency,
            placement=entry.proof,
            concurrency=entry.concurrency,
            deleting=host.deleting or entry.draining,
            draining=entry.draining,
            model_loaded=_condition(status, condition),
            loaded_message=_message(status, condition),
            host=host.name,
            host_uid=host.uid,
            condition_type=condition,
            controlled=False,  # a host serves other replicas: never marked Failed for one
        )
        hosted.append((entry, replica))
    return hosted, ""


def stale_conditions(obj: Mapping[str, Any], keys: Keys, replicas: list[PodInfo]) -> list[str]:
    """The loaded conditions on a model host whose replica is no longer in its annotation."""
    status = obj.get("status") or {}
    prefix = loaded_prefix(keys)
    wanted = {replica.condition_type for replica in replicas}
    return sorted(
        str(c.get("type"))
        for c in status.get("conditions") or []
        if isinstance(c, Mapping)
        and str(c.get("type") or "").startswith(prefix)
        and c.get("type") not in wanted
    )


def pod_from_dict(obj: Mapping[str, Any], keys: Keys) -> PodInfo:
    """A PodInfo from a Pod as the API returns it (JSON), as a model pod."""
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
        backend=str(annotations.get(keys.backend) or ""),
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


def init_failure(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """The init container that failed last (the storage initializer, the loader) and why: its
    name and its termination message as the kubelet reports it (with FallbackToLogsOnError, the
    end of its log), or its exit code; None while none has failed."""
    for container in (obj.get("status") or {}).get("initContainerStatuses") or []:
        for where in ("state", "lastState"):
            ended = ((container.get(where) or {}).get("terminated")) or {}
            if ended.get("exitCode"):
                message = " ".join(str(ended.get("message") or "").split())
                why = message or f"exit code {ended['exitCode']}, no termination message"
                return str(container.get("name", "")), why[-1000:]
    return None


def _condition(status: Mapping[str, Any], condition_type: str) -> tuple[str, str]:
    for condition in status.get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == condition_type:
            return str(condition.get("status") or ""), str(condition.get("reason") or "")
    return ("", "")


def _message(status: Mapping[str, Any], condition_type: str) -> str:
    for condition in status.get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == condition_type:
            return str(condition.get("message") or "")
    return ""


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
