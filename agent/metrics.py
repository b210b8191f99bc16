"""The agent's Prometheus metrics, in one explicit registry per process.

GPU figures come from a collector that reads the latest snapshot at scrape time, so a scrape never
calls NVML. Names follow Prometheus conventions (`_bytes`, `_seconds`, `_total`). Only
`common.health` serves them (`agent.app` wires it).

A GPU is labelled as NVIDIA's dcgm-exporter labels it, `gpu` (its index) and `UUID`, so a query
joins tritonshare's per-model figures with DCGM's per-GPU ones: `... * on(UUID) group_left
DCGM_FI_DEV_GPU_UTIL`. (Triton's own per-GPU series call the UUID `gpu_uuid`:
`label_replace(nv_gpu_memory_used_bytes, "UUID", "$1", "gpu_uuid", "(.*)")`.)

A model is labelled `model` by its name in Triton, as Triton's own `nv_*` series label it: a
pod's private name (`common.tritonname`), or a legacy model's public id. The info series
`tritonshare_agent_model_info` (always 1) joins that name to the pod's namespace, name and model
id, so a dashboard shows model ids: `nv_inference_request_success * on(node, model)
group_left(model_namespace, model_pod, model_id) tritonshare_agent_model_info` (docs/agent.md).
Its labels are not `namespace` and `pod`: scrapes add those for the node pod itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from agent.gpus.inventory import GpuSnapshot
from agent.gpus.memory import MemoryLedger
from agent.installs.filecache import KeptCopy
from agent.phases import Phase
from agent.pods.provenpods import Proven
from agent.quarantine.crashledger import CrashRecord, NamespaceRecord
from agent.quarantine.suspects import CallerRecord

_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class _GpuCollector(Collector):
    def __init__(
        self, snapshot: Callable[[], GpuSnapshot | None], loaded: Callable[[], dict[str, int]]
    ) -> None:
        self._snapshot = snapshot
        self._loaded = loaded

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["gpu", "UUID", "product"]
        total = GaugeMetricFamily(
            "tritonshare_agent_gpu_memory_total_bytes", "GPU memory", labels=labels
        )
        used = GaugeMetricFamily(
            "tritonshare_agent_gpu_memory_used_bytes", "GPU memory in use (NVML)", labels=labels
        )
        free = GaugeMetricFamily(
            "tritonshare_agent_gpu_memory_free_bytes", "GPU memory free (NVML)", labels=labels
        )
        healthy = GaugeMetricFamily(
            "tritonshare_agent_gpu_healthy", "1 when the GPU answers NVML, else 0", labels=labels
        )
        loaded = GaugeMetricFamily(
            "tritonshare_agent_models_loaded",
            "Models loaded by the agent, per GPU (gpu and UUID empty: CPU)",
            labels=["gpu", "UUID"],
        )
        snapshot = self._snapshot()
        for gpu in snapshot.gpus if snapshot else ():
            values = [str(gpu.index), gpu.uuid, gpu.product]
            total.add_metric(values, gpu.memory_total)
            used.add_metric(values, gpu.memory_used)
            free.add_metric(values, gpu.memory_free)
            healthy.add_metric(values, 1 if gpu.healthy else 0)
        index = _indexes(snapshot)
        for uuid, count in sorted(self._loaded().items()):
            loaded.add_metric([index.get(uuid, ""), uuid], count)
        yield from (total, used, free, healthy, loaded)


class _HostMemoryCollector(Collector):
    def __init__(
        self,
        used: Callable[[], int],
        limit: Callable[[], int | None],
        models: Callable[[], Mapping[str, int]],
    ) -> None:
        self._used = used
        self._limit = limit
        self._models = models

    def collect(self) -> Iterator[GaugeMetricFamily]:
        used = GaugeMetricFamily(
            "tritonshare_agent_triton_host_memory_bytes",
            "Resident memory of Triton's processes at the last load",
            value=self._used(),
        )
        limit = GaugeMetricFamily(
            "tritonshare_agent_triton_host_memory_limit_bytes",
            "Triton's container memory limit loads are admitted against (0: none known)",
            value=self._limit() or 0,
        )
        models = GaugeMetricFamily(
            "tritonshare_agent_model_host_memory_bytes",
            "Host memory a model is billed: its own processes, and Triton's growth across its "
            "load when no other model was served meanwhile",
            labels=["model"],
        )
        for name, grown in sorted(self._models().items()):
            models.add_metric([name], grown)
        yield from (used, limit, models)


class _ForeignCollector(Collector):
    def __init__(self, counts: Callable[[], Mapping[tuple[str, str], int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "tritonshare_agent_gpu_foreign_processes",
            "Processes on the GPU that are not the node's Triton (NVML), at the last check",
            labels=["gpu", "UUID"],
        )
        for (index, uuid), count in sorted(self._counts().items()):
            family.add_metric([index, uuid], count)
        yield family


_KEPT_SERIES = (
    (
        "tritonshare_agent_kept_copies",
        "Model revisions whose files the node keeps after their last pod left (phase cached), "
        "by namespace",
    ),
    (
        "tritonshare_agent_kept_bytes",
        "Bytes of the files the node keeps after their last pod left, by namespace",
    ),
)


class _KeptCollector(Collector):
    def __init__(self, kept: Callable[[], list[KeptCopy]]) -> None:
        self._kept = kept

    def collect(self) -> Iterator[GaugeMetricFamily]:
        figures: dict[str, list[int]] = {}
        for copy in self._kept():
            if copy.phase is Phase.CACHED:
                counted = figures.setdefault(copy.namespace, [0, 0])
                counted[0] += 1
                counted[1] += copy.bytes
        for column, (name, documentation) in enumerate(_KEPT_SERIES):
            gauge = GaugeMetricFamily(name, documentation, labels=["namespace"])
            for namespace, counted in sorted(figures.items()):
                gauge.add_metric([namespace], counted[column])
            yield gauge


def _indexes(snapshot: GpuSnapshot | None) -> dict[str, str]:
    """GPU UUID -> its index, as the `gpu` label writes it."""
    return {g.uuid: str(g.index) for g in snapshot.gpus} if snapshot else {}


class _ModelMemoryCollector(Collector):
    def __init__(self, ledger: MemoryLedger, snapshot: Callable[[], GpuSnapshot | None]) -> None:
        self._ledger = ledger
        self._snapshot = snapshot

    def collect(self) -> Iterator[GaugeMetricFamily]:
        measured = GaugeMetricFamily(
            "tritonshare_agent_model_gpu_memory_bytes",
            "GPU memory a loaded model is measured to use (Triton's figure, else NVML's growth)",
            labels=["model", "gpu", "UUID"],
        )
        requested = GaugeMetricFamily(
            "tritonshare_agent_model_gpu_memory_request_bytes",
            "GPU memory the binder booked for a loaded model (its pod's request)",
            labels=["model", "gpu", "UUID"],
        )
        uncertain = GaugeMetricFamily(
            "tritonshare_agent_model_gpu_memory_uncertainty_bytes",
            "Bytes of a model's measured figure that another model on its GPU may have caused "
            "(0 for Triton's own figure): it is never evicted for them",
            labels=["model", "gpu", "UUID"],
        )
        unattributed = GaugeMetricFamily(
            "tritonshare_agent_gpu_unattributed_memory_bytes",
            "Used GPU memory no loaded model accounts for (beyond the GPU's baseline)",
            labels=["gpu", "UUID"],
        )
        snapshot = self._snapshot()
        index = _indexes(snapshot)
        for entry in sorted(self._ledger.models.values(), key=lambda m: m.model_id):
            where = [index.get(entry.gpu_uuid, ""), entry.gpu_uuid]
            measured.add_metric([entry.model_id, *where], entry.bytes)
            requested.add_metric([entry.model_id, *where], entry.request)
            uncertain.add_metric([entry.model_id, *where], self._ledger.uncertainty(entry.model_id))
        for gpu in snapshot.gpus if snapshot else ():
            unattributed.add_metric([str(gpu.index), gpu.uuid], self._ledger.unattributed(gpu.uuid))
        yield from (measured, requested, uncertain, unattributed)


class _ModelInfoCollector(Collector):
    def __init__(self, owners: Callable[[], Mapping[str, Proven] | None]) -> None:
        self._owners = owners

    def collect(self) -> Iterator[GaugeMetricFamily]:
        info = GaugeMetricFamily(
            "tritonshare_agent_model_info",
            "1 for each model the agent serves: its name in Triton (model, as Triton's nv_* "
            "series label it) and its pod's (a model host's, for a replica) namespace, name "
            "and model id",
            labels=["model", "model_namespace", "model_pod", "model_id"],
        )
        for name, owner in sorted((self._owners() or {}).items()):
            info.add_metric([name, owner.namespace, owner.pod.object_name, owner.model_id], 1)
        yield info


class _ResidencyCollector(Collector):
    def __init__(self, states: Callable[[], Mapping[str, str]]) -> None:
        self._states = states

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = GaugeMetricFamily(
            "tritonshare_agent_model_residency_state",
            "1 for the state each on-demand model is in (loaded, sleeping, waking), by its name "
            "in Triton",
            labels=["model", "state"],
        )
        for name, state in sorted(self._states().items()):
            gauge.add_metric([name, state], 1)
        yield gauge


class _QuarantineCollector:
    def __init__(
        self,
        records: Callable[[], list[CrashRecord]],
        callers: Callable[[], list[CallerRecord]],
        namespaces: Callable[[], list[NamespaceRecord]],
    ) -> None:
        self._records = records
        self._callers = callers
        self._namespaces = namespaces

    def collect(self) -> Iterator[GaugeMetricFamily]:
        quarantined = GaugeMetricFamily(
            "tritonshare_agent_quarantined_models",
            "Models quarantined on this node after Triton exited while loading them (1 each, "
            "by the pod's namespace, model id and the digest of the model's files)",
            labels=["model_namespace", "model_id", "digest"],
        )
        for record in self._records():
            if record.quarantined:
                quarantined.add_metric([record.namespace, record.model_id, record.digest], 1)
        yield quarantined
        pods = GaugeMetricFamily(
            "tritonshare_agent_quarantined_pods",
            "Pods whose requests the node gateway refuses after Triton exited with their "
            "requests at it (1 each, by the pod's namespace, name and model id)",
            labels=["model_namespace", "pod", "model_id"],
        )
        for caller in self._callers():
            if caller.quarantined:
                pods.add_metric(
                    [caller.namespace, caller.pod.partition("/")[2], caller.model_id], 1
                )
        yield pods
        held = GaugeMetricFamily(
            "tritonshare_agent_quarantined_namespaces",
            "Namespaces whose new loads this node refuses after Triton exited under them past "
            "the quarantine of their files (1 each)",
            labels=["model_namespace"],
        )
        for namespace in self._namespaces():
            if namespace.quarantined:
                held.add_metric([namespace.namespace], 1)
        yield held


class AgentMetrics:
    """Every metric the agent exports."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.installs = Counter(
            "tritonshare_agent_installs",
            "Model installs by outcome (installed, unchanged, failed)",
            ["outcome"],
            registry=r,
        )
        self.kept_installs = Counter(
            "tritonshare_agent_kept_installs",
            "Installs served from the files the node kept (hit) or not (miss)",
            ["outcome"],
            registry=r,
        )
        self.install_bytes = Counter(
            "tritonshare_agent_install_written_bytes", "Model bytes written", registry=r
        )
        self.install_seconds = Histogram(
            "tritonshare_agent_install_duration_seconds",
            "Time to receive, verify and install a model",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.load_seconds = Histogram(
            "tritonshare_agent_load_duration_seconds",
            "Time Triton took to load a model",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.unload_seconds = Histogram(
            "tritonshare_agent_unload_duration_seconds",
            "Time from unload until the model is UNAVAILABLE and removed",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.load_failures = Counter(
            "tritonshare_agent_load_failures", "Failed loads by reason", ["reason"], registry=r
        )
        self.unload_failures = Counter(
            "tritonshare_agent_unload_failures", "Failed unloads by reason", ["reason"], registry=r
        )
        self.requests = Counter(
            "tritonshare_agent_requests",
            "Agent API calls by method and gRPC code",
            ["method", "code"],
            registry=r,
        )
        self.reconciles = Counter(
            "tritonshare_agent_reconcile_actions",
            "Reconciliation actions (orphan_removed, adopted, reloaded, load_given_up)",
            ["action"],
            registry=r,
        )
        self.gpu_memory_over = Counter(
            "tritonshare_agent_gpu_memory_over_request",
            "Models found using more GPU memory than their request plus the tolerance, by "
            "action (warned, evicted)",
            ["action"],
            registry=r,
        )
        self.gpu_memory_unexplained = Counter(
            "tritonshare_agent_gpu_unexplained_growth_bytes",
            "Growth of a GPU's used memory that no model could be billed for (several models "
            "shared the GPU, or a neighbour's load window), by GPU UUID",
            ["UUID"],
            registry=r,
        )
        self.gpu_memory_refusals = Counter(
            "tritonshare_agent_gpu_memory_refusals",
            "Loads refused because the GPU's memory would not hold them",
            registry=r,
        )
        self.host_memory_refusals = Counter(
            "tritonshare_agent_host_memory_refusals",
            "Loads refused because Triton's container memory limit would not hold them",
            registry=r,
        )
        self.crashes_suspected = Counter(
            "tritonshare_agent_triton_crashes_suspected",
            "Loads Triton exited under (each counted against the model being loaded)",
            registry=r,
        )
        self.sleeps = Counter(
            "tritonshare_agent_model_sleeps",
            "On-demand models put to sleep (unloaded, files kept), by reason (idle: asked by "
            "the pod's proxy; evicted: to make room for another load; rested: found at rest)",
            ["reason"],
            registry=r,
        )
        self.wakes = Counter(
            "tritonshare_agent_model_wakes",
            "Loads of sleeping models, by outcome (woken, no_room, failed)",
            ["outcome"],
            registry=r,
        )
        self.wake_seconds = Histogram(
            "tritonshare_agent_wake_duration_seconds",
            "Time from a wake's start until Triton answered its load READY (eviction included)",
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.evictions = Counter(
            "tritonshare_agent_evictions",
            "Idle on-demand models unloaded to make room, by what they made room for (wake, load)",
            ["reason"],
            registry=r,
        )
        self.triton_exits = Counter(
            "tritonshare_agent_triton_exits",
            "Exits of Triton the agent's watch on its port saw (Triton's keeper starts it again "
            "at once: the container's restartCount does not count them)",
            registry=r,
        )
        self.request_crashes = Counter(
            "tritonshare_agent_triton_exits_witnessed",
            "Unexpected exits of Triton the node gateway saw requests at (each counted against "
            "the pods whose requests were at Triton)",
            registry=r,
        )
        self.kube_writes = Counter(
            "tritonshare_agent_kube_writes",
            "Writes to the Kubernetes API by kind (node, node_status, lease)",
            ["kind"],
            registry=r,
        )

    def watch_memory(
        self, ledger: MemoryLedger, snapshot: Callable[[], GpuSnapshot | None]
    ) -> None:
        """Export each loaded model's measured memory and each GPU's unattributed rest."""
        self.registry.register(_ModelMemoryCollector(ledger, snapshot))

    def watch_kept(self, kept: Callable[[], list[KeptCopy]]) -> None:
        """Export the kept copies, read from `kept()` at scrape time."""
        self.registry.register(_KeptCollector(kept))

    def watch_models(self, owners: Callable[[], Mapping[str, Proven] | None]) -> None:
        """Export the info series of each served model, read from `owners()` (by name in
        Triton) at scrape time."""
        self.registry.register(_ModelInfoCollector(owners))

    def watch_residency(self, states: Callable[[], Mapping[str, str]]) -> None:
        """Export each on-demand model's state, read from `states()` (name in Triton -> loaded,
        sleeping or waking) at scrape time."""
        self.registry.register(_ResidencyCollector(states))

    def watch_quarantine(
        self,
        records: Callable[[], list[CrashRecord]],
        callers: Callable[[], list[CallerRecord]] = list,
        namespaces: Callable[[], list[NamespaceRecord]] = list,
    ) -> None:
        """Export the quarantined models, pods and namespaces, read from `records()`,
        `callers()` and `namespaces()` at scrape time."""
        self.registry.register(_QuarantineCollector(records, callers, namespaces))

    def watch_host_memory(
        self,
        used: Callable[[], int],
        limit: Callable[[], int | None],
        models: Callable[[], Mapping[str, int]],
    ) -> None:
        """Export Triton's host memory, its limit and each model's measured share."""
        self.registry.register(_HostMemoryCollector(used, limit, models))

    def watch_foreign(self, counts: Callable[[], Mapping[tuple[str, str], int]]) -> None:
        """Export each GPU's count of processes that are not Triton's (`agent.gpus.foreign`)."""
        self.registry.register(_ForeignCollector(counts))

    def watch_gpus(
        self, snapshot: Callable[[], GpuSnapshot | None], loaded: Callable[[], dict[str, int]]
    ) -> None:
        """Export per-GPU figures read from `snapshot()` at scrape time."""
        self.registry.register(_GpuCollector(snapshot, loaded))
