"""kube-scheduler's filters and scores that look at the other pods, in its order, for one pod:
NodePorts and NodeResourcesFit (`binder.framework.fit`), PodTopologySpread
(`binder.framework.spread`) and InterPodAffinity (`binder.framework.interpod`), after our Triton
release filter (`binder.framework.tritonversion`), a node property as NodeAffinity. Replicas of one
model may share a node, as pods of one model id may (each has its own private name in Triton);
placement prefers a node without one.

`PodFilters` is what placement reads: which nodes pass all five (a mask over every node), why
each node that fails does (the first failing plugin's reasons, as kube-scheduler reports them),
and the two plugins' scores over the candidate nodes, None when they would score every candidate
alike (then placement may read its free-memory index instead of scoring every node).

Pure: reads the state, no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from binder.cluster.clusterstate import ClusterState, IntArray
from binder.cluster.objects import PodInfo
from binder.framework.fit import fit_mask, fits_node, node_fit_reasons
from binder.framework.interpod import AFFINITY_WEIGHT, affinity_filter, affinity_scores
from binder.framework.spread import SPREAD_WEIGHT, spread_filter, spread_scores
from binder.framework.tritonversion import version_filter

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


@dataclass
class PodFilters:
    """The filters that look at other pods, for one decision. `passes` reads one node; `ok`
    (every node at once) is computed on first use, as only a full scan needs it."""

    state: ClusterState
    pod: PodInfo
    spread: dict[int, str] = field(default_factory=dict)
    affinity: dict[int, str] = field(default_factory=dict)
    version: dict[int, str] = field(default_factory=dict)
    """The nodes whose Triton is not the release the pod needs, with why."""
    _fit: BoolArray | None = None
    _ok: BoolArray | None = None
    _passed: dict[int, bool] = field(default_factory=dict)
    """`passes` per node already read: the index walks a node's GPUs one after another."""

    @property
    def fit(self) -> BoolArray:
        if self._fit is None:
            self._fit = fit_mask(self.state, self.pod)
        return self._fit

    @property
    def ok(self) -> BoolArray:
        """Per node (index order): whether the Triton release, NodePorts, NodeResourcesFit,
        PodTopologySpread and InterPodAffinity all pass."""
        if self._ok is None:
            ok = self.fit.copy()
            for rejected in (self.version, self.spread, self.affinity):
                if rejected:
                    ok[np.fromiter(rejected, np.int64, len(rejected))] = False
            self._ok = ok
        return self._ok

    def passes(self, i: int) -> bool:
        """Whether node `i` passes all five."""
        if self._ok is not None:
            return bool(self._ok[i])
        passed = self._passed.get(i)
        if passed is None:
            passed = self._passed[i] = (
                i not in self.version
                and i not in self.spread
                and i not in self.affinity
                and fits_node(self.state, self.pod, i)
            )
        return passed

    def reasons(self, i: int) -> list[str]:
        """Why node `i` fails, as kube-scheduler reports it (the first failing plugin's
        reasons); empty when it passes."""
        if i in self.version:
            return [self.version[i]]
        reasons = node_fit_reasons(self.state, self.pod, self.state.names[i])
        if reasons:
            return reasons
        if i in self.spread:
            return [self.spread[i]]
        if i in self.affinity:
            return [self.affinity[i]]
        return []

    def scores(self, candidates: IntArray) -> FloatArray | None:
        """PodTopologySpread's and InterPodAffinity's weighted scores over the candidates, or
        None when neither tells them apart."""
        total: FloatArray | None = None
        for weight, scores in (
            (SPREAD_WEIGHT, spread_scores(self.state, self.pod, candidates)),
            (AFFINITY_WEIGHT, affinity_scores(self.state, self.pod, candidates)),
        ):
            if scores is not None:
                total = weight * scores if total is None else total + weight * scores
        return total


def pod_filters(state: ClusterState, pod: PodInfo) -> PodFilters:
    return PodFilters(
        state,
        pod,
        spread_filter(state, pod),
        affinity_filter(state, pod),
        version_filter(state, pod),
    )
