"""`tritonshare uninstall-cleanup`: remove what tritonshare wrote at run time on objects that
outlive it, once the agents and the binder are gone.

Helm and kustomize delete the objects they created. What the parts wrote while running stays:
on every Node the agent's annotations (`<prefix>gpus`, `<prefix>gpu-mem-total`,
`<prefix>gpu-usage`, `<prefix>quarantined`, and an operator's `<prefix>quarantine-clear`) and,
with `--advertise-gpu-mem`, the extended resource `<prefix>gpu-mem` in its capacity and
allocatable; with `--node-autoscaling`, the binder's scale-down guards (`<prefix>scale-down-guard`
and the node autoscalers' annotations it lists there, never an operator's own); in the system
namespace, when it is kept, the agents' Leases
(`tritonshare-agent-<node>`) and the binder leader's (`tritonshare-binder`). tritonshare writes no
node labels. Model pods, their annotations and conditions belong to their owners and are left
alone.

A running agent writes its annotations back, so the cleanup refuses while any agent's Lease is
live (`--force` overrides, for agents whose nodes are gone). `plan` is pure; `carry_out` writes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from binder.api.kube import Kube
from binder.cluster.objects import lease_expiry
from binder.nodescaling.guard import GUARDS, guard_annotation
from common.contract import AGENT_LEASE_PREFIX, BINDER_LEADER_LEASE, Keys
from common.kubeapi.session import JsonObject


def written_node_annotations(keys: Keys) -> tuple[str, ...]:
    """The Node annotations the agent writes."""
    return (keys.gpus, keys.gpu_mem_total, keys.gpu_usage, keys.quarantined, keys.quarantine_clear)


@dataclass(frozen=True)
class Plan:
    """What the cleanup removes, and the agents still running that would write it back."""

    annotations: dict[str, list[str]]
    """Node name -> the annotation keys to remove."""
    resources: dict[str, list[str]]
    """Node name -> the extended resources to remove from status capacity and allocatable."""
    leases: list[str]
    """Leases in the system namespace to delete."""
    live_agents: list[str]
    """Nodes whose agent's Lease has not run out."""

    @property
    def empty(self) -> bool:
        return not (self.annotations or self.resources or self.leases)

    def describe(self) -> list[str]:
        """One line per object the cleanup changes."""
        lines = []
        for node in sorted(set(self.annotations) | set(self.resources)):
            what = [f"annotation {key}" for key in self.annotations.get(node, [])]
            what += [f"resource {key}" for key in self.resources.get(node, [])]
            lines.append(f"node {node}: remove {', '.join(what)}")
        lines += [f"lease {name}: delete" for name in self.leases]
        return lines


def plan(nodes: Iterable[JsonObject], leases: Iterable[JsonObject], keys: Keys, now: float) -> Plan:
    """What to remove from these Nodes and the system namespace's Leases."""
    ours = written_node_annotations(keys)
    annotations: dict[str, list[str]] = {}
    resources: dict[str, list[str]] = {}
    for node in nodes:
        metadata = node.get("metadata") or {}
        name = str(metadata.get("name", ""))
        present = metadata.get("annotations") or {}
        found = [key for key in ours if key in present]
        guards = present.get(guard_annotation(keys))
        if guards is not None:
            found += [key for key in guards.split(",") if key in GUARDS and key in present]
            found.append(guard_annotation(keys))
        if found:
            annotations[name] = found
        status = node.get("status") or {}
        advertised = set(status.get("capacity") or {}) | set(status.get("allocatable") or {})
        if keys.gpu_mem in advertised:
            resources[name] = [keys.gpu_mem]
    names, live = [], []
    for lease in leases:
        name = str((lease.get("metadata") or {}).get("name", ""))
        if name.startswith(AGENT_LEASE_PREFIX):
            names.append(name)
            if lease_expiry(lease) > now:
                live.append(name[len(AGENT_LEASE_PREFIX) :])
        elif name == BINDER_LEADER_LEASE:
            names.append(name)
    return Plan(annotations, resources, sorted(names), sorted(live))


def carry_out(kube: Kube, cleanup: Plan, system_namespace: str) -> None:
    """Remove what `cleanup` names: annotations first, then resources, then the Leases. Each write
    is idempotent, so running it again after a failure finishes the job."""
    for node, found in sorted(cleanup.annotations.items()):
        kube.merge_patch_node(node, {"metadata": {"annotations": dict.fromkeys(found)}})
    for node, found in sorted(cleanup.resources.items()):
        gone = dict.fromkeys(found)
        kube.merge_patch_node(
            node, {"status": {"capacity": gone, "allocatable": gone}}, subresource="status"
        )
    for name in cleanup.leases:
        kube.delete_lease(system_namespace, name)
