"""The scale-down guard: a node whose GPUs serve models is not one a node autoscaler removes.

Cluster Autoscaler would drain a GPU node whose model pods it thinks fit elsewhere (its
simulation knows nothing of GPU memory), and Karpenter's consolidation would replace it; either
stops every model the node serves for a reload elsewhere, if there is room at all. So while a
node runs a model pod or a model host that is not terminated, the binder keeps on it
Cluster Autoscaler's `cluster-autoscaler.kubernetes.io/scale-down-disabled: "true"` and
Karpenter's `karpenter.sh/do-not-disrupt: "true"`, and records which of them it set in
`<prefix>scale-down-guard`; once the node serves nothing it removes only those, so an empty GPU
node scales down and an operator's own annotation stays.

Pure: the patches follow from the nodes' annotations and which nodes serve.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from common.contract import Keys

GUARDS = ("cluster-autoscaler.kubernetes.io/scale-down-disabled", "karpenter.sh/do-not-disrupt")


def guard_annotation(keys: Keys) -> str:
    """The annotation that lists the guards the binder set on a node (comma-separated)."""
    return f"{keys.prefix}scale-down-guard"


def patches(
    annotations: Mapping[str, Mapping[str, str]], serving: Collection[str], keys: Keys
) -> dict[str, dict[str, str | None]]:
    """Node -> the annotations to set (None: remove) so that exactly the serving nodes are
    guarded. `annotations`: every node's annotations."""
    marker = guard_annotation(keys)
    out: dict[str, dict[str, str | None]] = {}
    for node, current in annotations.items():
        ours = current.get(marker)
        if node in serving and ours is None:
            missing = [key for key in GUARDS if current.get(key) != "true"]
            if missing:
                out[node] = {**dict.fromkeys(missing, "true"), marker: ",".join(missing)}
        elif node not in serving and ours is not None:
            set_by_us = [key for key in ours.split(",") if key in GUARDS]
            out[node] = {**dict.fromkeys(set_by_us), marker: None}
    return out
