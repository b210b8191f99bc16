"""What the agent keeps on the API server for its node: GPU annotations (and its Triton's versions,
`agent.status.tritonversion`), capacity, and the Lease.

One loop reads the GPUs every poll period, patches the Node only when an annotation value changes
(used memory is not published, so a busy GPU costs no writes), rereads the Node rarely to repair
edits by others, and renews the Lease `tritonshare-agent-<node>`: on a quiet node the Lease
renewal is the only write. Time comes from injected `Clocks` so tests run an hour in
milliseconds. It must not touch models or Triton.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, Unpack

from agent.errors import AgentError, NvmlUnavailableError
from agent.gpus.inventory import (
    GPU_RESOURCE,
    GpuInfo,
    GpuSnapshot,
    advertised_gpus,
    annotations_patch,
    capacity_patch,
    health_changes,
    node_annotations,
)
from agent.gpus.nvml import GpuReader
from agent.metrics import AgentMetrics
from common.contract import TENANT_CODE_NODE, Keys, agent_lease_name
from common.events import EventText

log = logging.getLogger(__name__)


class NodeApi(Protocol):
    async def get_node(self, name: str) -> dict[str, Any] | None: ...

    async def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None]
    ) -> None: ...

    async def patch_node_capacity(self, name: str, resources: dict[str, str]) -> None: ...

    async def record_node_event(
        self, name: str, *, component: str, **said: Unpack[EventText]
    ) -> None: ...

    async def renew_lease(
        self, namespace: str, name: str, holder: str, duration: int, now: datetime
    ) -> None: ...


@dataclass(frozen=True)
class NodeSettings:
    """What the agent's settings say about publishing its node."""

    node_name: str
    keys: Keys
    system_namespace: str
    """Where the agent Lease lives."""
    cpu_only: bool
    """No GPUs on the node: a missing NVML publishes no GPUs instead of keeping it not ready."""
    advertise_gpu_mem: bool = False
    """Also patch the Node's capacity with the GPU memory extended resource."""
    gpu_poll_seconds: float = 10.0
    lease_renew_seconds: float = 5.0
    lease_duration_seconds: int = 15
    node_resync_seconds: float = 600.0
    """How often the Node is reread, to repair edits by others."""
    usage_publish_seconds: float = 60.0
    """Shortest time between two writes of the measured memory annotation."""
    holder: str = ""
    """The Lease's holder identity; empty: tritonshare-agent@<node>."""


@dataclass(frozen=True)
class Clocks:
    """Where the publisher's time comes from; tests inject fakes to run an hour in milliseconds."""

    monotonic: Callable[[], float] = time.monotonic
    """Seconds for periods and deadlines."""
    sleep: Callable[[float], Awaitable[None]] | None = None
    """How a pause is taken; None: wait on the stop event for that long."""
    wall: Callable[[], datetime] = lambda: datetime.now(UTC)
    """The date written on the Lease."""


class NodePublisher:
    """Reads GPUs and keeps the Node's annotations and the agent Lease current."""

    def __init__(
        self,
        kube: NodeApi,
        reader: GpuReader,
        metrics: AgentMetrics,
        settings: NodeSettings,
        *,
        clocks: Clocks = Clocks(),
        nvml_executor: Executor,
        on_snapshot: Callable[[GpuSnapshot], None],
        usage: Callable[[GpuSnapshot | None], str | None],
    ) -> None:
        """NVML calls can block for seconds on a failing GPU: they run on `nvml_executor`, so
        health checks and the API keep answering. `on_snapshot` sees each good reading (where
        NVML was read); `usage` gives the measured memory annotation (None: none to publish)."""
        self._kube = kube
        self._reader = reader
        self._metrics = metrics
        self.settings = settings
        self.holder = settings.holder or f"tritonshare-agent@{settings.node_name}"
        self._clock = clocks.monotonic
        self._sleep = clocks.sleep
        self._wall = clocks.wall
        self._nvml_executor = nvml_executor
        self.snapshot: GpuSnapshot | None = None
        self.gpus_read = False
        self.nvml_error = ""
        self._node_annotations: dict[str, str] | None = None
        self._node_capacity: dict[str, str] = {}
        self._on_snapshot = on_snapshot
        self._usage = usage
        self._usage_written_at: float | None = None
        self._triton: dict[str, str] | None = None
        """The node's Triton versions; None until Triton has told its version."""

    def set_triton(self, annotations: dict[str, str]) -> None:
        """The node's Triton release and backend versions (`agent.status.tritonversion`),
        written with the GPU annotations from the next patch on; those of an earlier Triton
        that these lack are removed."""
        self._triton = dict(annotations)

    # GPUs.
    def read_gpus(self) -> GpuSnapshot | None:
        """Read NVML once; keep the last good snapshot when NVML fails, in any way."""
        try:
            snapshot = self._reader.read()
        except NvmlUnavailableError as e:
            if self.settings.cpu_only:
                if not self.gpus_read:
                    log.info("NVML is not available on this CPU-only node: it publishes no GPUs.")
                self.snapshot, self.gpus_read = GpuSnapshot(), True
                return self.snapshot
            if str(e) != self.nvml_error:
                log.error("Reading the GPUs failed: %s The node stays not ready.", e)
            self.nvml_error = str(e)
            self.gpus_read = False
            return self.snapshot
        except Exception as e:
            # Whatever NVML's library raises beyond its own errors: the agent's loops go on, and
            # the node stays not ready until a reading succeeds.
            if str(e) != self.nvml_error:
                log.exception(
                    "Reading the GPUs failed unexpectedly (%s): the node stays not ready, and "
                    "the last reading is kept until NVML answers again.",
                    e,
                )
            self.nvml_error = str(e)
            self.gpus_read = False
            return self.snapshot
        if self.nvml_error:
            log.info("NVML answers again: reading the node's GPUs.")
            self.nvml_error = ""
        for message in health_changes(self.snapshot, snapshot):
            log.warning("%s.", message)
        if self.snapshot is None:
            log.info(
                "The node has %d GPUs: %s.",
                len(snapshot.gpus),
                ", ".join(f"{g.index}={g.product} ({g.uuid})" for g in snapshot.gpus) or "none",
            )
        self.snapshot, self.gpus_read = snapshot, True
        self._on_snapshot(snapshot)
        return snapshot

    async def wait_for_gpus(self, seconds: float, retry: float, source: str) -> None:
        """Read the GPUs again every `retry` seconds until they are read, `seconds` at most:
        `source` (a relay, say) may start as the agent does."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        said = ""
        while not self.gpus_read and loop.time() < deadline:
            if self.nvml_error != said:
                said = self.nvml_error
                log.info("Waiting up to %g s for %s: %s", seconds, source, said)
            await asyncio.sleep(retry)
            await self.refresh_gpus()

    async def refresh_gpus(self) -> GpuSnapshot | None:
        """`read_gpus` on the NVML executor."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._nvml_executor, self.read_gpus)

    async def read_gpu(self, uuid: str) -> GpuInfo | None:
        """A fresh reading of one GPU (on the NVML executor); None when it is not on the node."""
        snapshot = await self.refresh_gpus()
        return snapshot.by_uuid(uuid) if snapshot is not None else None

    # The Node.
    async def sync_node(self) -> None:
        """Reread the Node's annotations and capacity (a read, no write)."""
        node = await self._kube.get_node(self.settings.node_name)
        if node is None:
            raise AgentError(
                f"node {self.settings.node_name} does not exist in the API; check --node-name"
            )
        self._node_annotations = dict((node.get("metadata") or {}).get("annotations") or {})
        self._node_capacity = dict((node.get("status") or {}).get("capacity") or {})

    async def check_tenant_code(self, namespaces: Sequence[str]) -> None:
        """Refuse to serve tenant code (`namespaces`, --tenant-code-namespaces) on a node not
        labelled as dedicated to it: the binder places every other namespace's models on such
        a node, where that code could call, read and unload them in the shared Triton."""
        if not namespaces:
            return
        name, key = self.settings.node_name, self.settings.keys.tenant_code
        node = await self._kube.get_node(name)
        if node is None:
            raise AgentError(f"node {name} does not exist in the API; check --node-name")
        labels = (node.get("metadata") or {}).get("labels") or {}
        if labels.get(key) != TENANT_CODE_NODE:
            raise AgentError(
                f"this agent lets namespaces {', '.join(namespaces)} run their own code in "
                f"Triton (--tenant-code-namespaces), but node {name} is not dedicated to tenant "
                f"code, so other teams' models would share its Triton; label the node "
                f"(kubectl label node {name} {key}={TENANT_CODE_NODE}) and give the binder the "
                f"same --tenant-code-namespaces, or run the agent on this node without "
                f"--tenant-code-namespaces"
            )

    async def check_gpu_count(self) -> None:
        """Refuse to start (AgentError, and a Warning Event `GpusMissing` on the Node) when NVML
        shows fewer GPUs than the node's device plugin advertises: the node pod was not given
        them all, and the binder would place models on GPUs this Triton cannot reach. Nothing
        is compared where the node advertises no `nvidia.com/gpu` (DRA, the environment-variable
        mode) or on a CPU-only node."""
        if self.settings.cpu_only:
            return
        name = self.settings.node_name
        node = await self._kube.get_node(name)
        if node is None:
            raise AgentError(f"node {name} does not exist in the API; check --node-name")
        advertised = advertised_gpus(node)
        if advertised is None:
            return
        seen = len(self.snapshot.gpus) if self.snapshot is not None else 0
        if seen >= advertised:
            return
        how = (
            f"NVML is not usable ({self.nvml_error})"
            if self.snapshot is None and self.nvml_error
            else f"{self._reader.source} shows {seen}"
        )
        message = (
            f"node {name} advertises {advertised} GPUs ({GPU_RESOURCE}) but {how} to the agent: "
            f"the node pod must be given every GPU of its node; request {GPU_RESOURCE}: "
            f"{advertised} for it (the chart's GPU pool of this node), or, with the "
            f"environment-variable mode, enable the NVIDIA container runtime's "
            f"accept-nvidia-visible-devices-envvar-when-unprivileged"
        )
        try:
            await self._kube.record_node_event(
                name,
                reason="GpusMissing",
                message=f"{message}; the agent does not start until it sees them all",
                component="tritonshare-agent",
            )
        except AgentError as e:
            log.warning("Recording the GpusMissing event on node %s has failed: %s", name, e)
        raise AgentError(message)

    async def publish(self) -> int:
        """Patch what changed; returns the number of writes made."""
        if self.snapshot is None or not self.gpus_read:
            return 0
        if self._node_annotations is None:
            await self.sync_node()
        assert self._node_annotations is not None
        writes = 0
        wanted = {**node_annotations(self.snapshot, self.settings.keys), **(self._triton or {})}
        now = self._clock()
        if (
            self._usage_written_at is None
            or now - self._usage_written_at >= self.settings.usage_publish_seconds
        ):
            # Measured memory changes often; it is published at most once per period.
            usage = self._usage(self.snapshot)
            if usage is not None:
                wanted[self.settings.keys.gpu_usage] = usage
        changed: dict[str, str | None] = dict(annotations_patch(self._node_annotations, wanted))
        if self._triton is not None:
            keys = self.settings.keys
            for key in (keys.triton_version, keys.tensorrt_version, keys.onnxruntime_version):
                if key in self._node_annotations and key not in self._triton:
                    changed[key] = None
        if changed:
            await self._kube.patch_node_annotations(self.settings.node_name, changed)
            for key, value in changed.items():
                if value is None:
                    self._node_annotations.pop(key, None)
                else:
                    self._node_annotations[key] = value
            self._metrics.kube_writes.labels("node").inc()
            writes += 1
            if self.settings.keys.gpu_usage in changed:
                self._usage_written_at = now
        if set(changed) - {self.settings.keys.gpu_usage}:
            log.info(
                "Node %s now advertises %s bytes of healthy GPU memory on %d GPUs.",
                self.settings.node_name,
                self.snapshot.healthy_memory_total,
                sum(1 for g in self.snapshot.gpus if g.healthy),
            )
        if self.settings.advertise_gpu_mem:
            capacity = capacity_patch(self.snapshot, self.settings.keys, self._node_capacity)
            if capacity is not None:
                await self._kube.patch_node_capacity(self.settings.node_name, capacity)
                self._node_capacity.update(capacity)
                self._metrics.kube_writes.labels("node_status").inc()
                writes += 1
        return writes

    async def renew_lease(self) -> None:
        await self._kube.renew_lease(
            self.settings.system_namespace,
            agent_lease_name(self.settings.node_name),
            self.holder,
            self.settings.lease_duration_seconds,
            self._wall(),
        )
        self._metrics.kube_writes.labels("lease").inc()

    # The loop.
    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop`: GPUs every poll period, Lease every renew period, Node reread rarely.

        Each duty fails alone: a Node that cannot be patched must not stop the Lease renewals.
        """
        next_gpu = next_lease = self._clock()
        next_node = self._clock() + self.settings.node_resync_seconds
        while not stop.is_set():
            now = self._clock()
            retry = now + min(self.settings.gpu_poll_seconds, self.settings.lease_renew_seconds / 4)
            if now >= next_node:
                next_node = now + self.settings.node_resync_seconds
                if not await self._attempt("reread the node", self.sync_node()):
                    self._node_annotations = None  # publish() rereads it first
            if now >= next_gpu:
                await self.refresh_gpus()
                ok = await self._attempt("publish the GPUs on the node", self.publish())
                next_gpu = now + self.settings.gpu_poll_seconds if ok else retry
            if now >= next_lease:
                ok = await self._attempt("renew the agent lease", self.renew_lease())
                next_lease = now + self.settings.lease_renew_seconds if ok else retry
            delay = max(min(next_gpu, next_lease, next_node) - self._clock(), 0.0)
            await self._wait(stop, delay)

    async def _attempt(self, what: str, step: Awaitable[object]) -> bool:
        try:
            await step
        except AgentError as e:
            log.warning(
                "Node %s could not %s (%s): retrying shortly.", self.settings.node_name, what, e
            )
            return False
        return True

    async def _wait(self, stop: asyncio.Event, delay: float) -> None:
        if self._sleep is not None:
            await self._sleep(delay)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
