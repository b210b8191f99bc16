"""The Triton release filter: a model that needs a release (a TensorRT plan, built by one TensorRT
version) goes only to nodes whose agent publishes that release (`Keys.triton_version`, read from
the node's Triton), so a pool can run its own Triton beside the others.

A node that fails says which release it runs, so a pending model's message names the releases
the cluster has ("2 node(s) ran Triton 24.10, not 24.09 as the model requires"). No other pod's
leaving changes a node's Triton: preemption skips those nodes.

Pure: reads the state, no I/O, no clock.
"""

from __future__ import annotations

from binder.cluster.clusterstate import ClusterState
from binder.cluster.objects import PodInfo

REASON_NO_VERSION = "node(s) published no Triton version"


def reason_version(have: str, want: str) -> str:
    return f"node(s) ran Triton {have}, not {want} as the model requires"


def version_filter(state: ClusterState, pod: PodInfo) -> dict[int, str]:
    """The nodes (by index) whose Triton is not the release the pod needs, with why; empty when
    the pod needs none."""
    want = pod.triton_version
    if not want:
        return {}
    rejected = {}
    for i, name in enumerate(state.names):
        have = state.nodes[name].triton_version
        if have != want:
            rejected[i] = reason_version(have, want) if have else REASON_NO_VERSION
    return rejected
