"""The binder's Prometheus metrics, in a registry of its own.

Counters and the latency histogram are updated by the controller as it decides. Per-node and
per-GPU capacity and allocation are not pushed: a collector reads the cluster state when
Prometheus scrapes, so the numbers are never stale and cost nothing between scrapes. A GPU is
labelled `gpu` (its index) and `UUID`, as dcgm-exporter labels it, so queries join the two.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from binder.cluster.chargedpods import CHANGED, KEY_UNKNOWN, NOT_PLACED
from binder.cluster.clusterstate import ClusterState

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class StateCollector(Collector):
    """Per-node and per-GPU capacity and allocated bytes, read from the state at scrape time."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        state = self._state
        gpu_capacity = GaugeMetricFamily(
            "tritonshare_binder_gpu_capacity_bytes",
            "GPU memory a GPU offers to pods (its memory minus the reserve; 0 when unhealthy).",
            labels=["node", "gpu", "UUID"],
        )
        gpu_allocated = GaugeMetricFamily(
            "tritonshare_binder_gpu_allocated_bytes",
            "GPU memory requested by the pods assigned to a GPU, assumed ones included.",
            labels=["node", "gpu", "UUID"],
        )
        node_capacity = GaugeMetricFamily(
            "tritonshare_binder_node_capacity_bytes",
            "GPU memory a node offers to pods, over its healthy GPUs.",
            labels=["node"],
        )
        node_allocated = GaugeMetricFamily(
            "tritonshare_binder_node_allocated_bytes",
            "GPU memory requested by the pods assigned to a node.",
            labels=["node"],
        )
        for name, info in sorted(state.nodes.items()):
            allocated = state.memory.allocated(name)
            for gpu, used in zip(info.gpus, allocated, strict=False):
                labels = [name, str(gpu.index), gpu.uuid]
                gpu_capacity.add_metric(labels, state.memory.usable(gpu))
                gpu_allocated.add_metric(labels, used)
            node_capacity.add_metric([name], sum(state.memory.usable(g) for g in info.gpus))
            node_allocated.add_metric([name], sum(allocated))
        yield from (gpu_capacity, gpu_allocated, node_capacity, node_allocated)


class UnprovenCollector(Collector):
    """Pods on tritonshare nodes that prove no placement (never charged), by reason, read from
    the cache at scrape time."""

    def __init__(self, reasons: Callable[[], Iterable[str]]) -> None:
        self._reasons = reasons

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "tritonshare_binder_unproven_pods",
            "Bound pods on tritonshare nodes carrying tritonshare resources or annotations whose "
            "placement the binder cannot prove, by reason; not charged.",
            labels=["reason"],
        )
        counts = collections.Counter(self._reasons())
        for reason in (NOT_PLACED, CHANGED, KEY_UNKNOWN):
            family.add_metric([reason], counts.get(reason, 0))
        yield family


class Metrics:
    """Every metric the binder exports."""

    def __init__(
        self,
        *,
        state: ClusterState,
        unproven: Callable[[], Iterable[str]] = tuple,
    ) -> None:
        """`state` (the cache's, read at scrape time) and `unproven` (the reasons of the unproven
        pods) feed the gauges of GPU memory and unproven pods (an empty state, the default
        `unproven`: none)."""
        self.registry = CollectorRegistry()
        self.attempts = Counter(
            "tritonshare_binder_schedule_attempts",
            "Scheduling attempts by result: scheduled, unschedulable or error.",
            ["result"],
            registry=self.registry,
        )
        for result in ("scheduled", "unschedulable", "error"):
            self.attempts.labels(result)
        self.latency = Histogram(
            "tritonshare_binder_scheduling_latency_seconds",
            "Seconds from a pod's creation until the binder bound it.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.pending = Gauge(
            "tritonshare_binder_pending_pods",
            "Pods with our scheduler name that are not bound yet.",
            registry=self.registry,
        )
        self.leader = Gauge(
            "tritonshare_binder_is_leader",
            "1 while this replica is the leader that binds pods, else 0.",
            registry=self.registry,
        )
        self.api_calls = Counter(
            "tritonshare_binder_api_writes",
            "Pod writes to the Kubernetes API by kind: annotate, bind, event, condition.",
            ["call"],
            registry=self.registry,
        )
        self.scheduled_events_skipped = Counter(
            "tritonshare_binder_scheduled_events_skipped",
            "Pods bound without a Scheduled Event: bound while --scheduled-events-per-second "
            "was spent.",
            registry=self.registry,
        )
        self.registry.register(StateCollector(state))
        self.registry.register(UnprovenCollector(unproven))
