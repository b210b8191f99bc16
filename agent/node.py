"""What the agent keeps on the API server for its node: GPU annotations, capacity, and the Lease.

One loop reads the GPUs every poll period, patches the Node only when an annotation value changes
(used memory is not published, so a busy GPU costs no writes), rereads the Node rarely to repair
edits by others, and renews the Lease `tritonshare-agent-<node>`: on a quiet node the Lease
renewal is the only write. Time comes from injected `clock`/`sleep`/`wall` so tests run an hour in
milliseconds. It must not touch models or Triton.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from datetime import UTC, datetime
from typing import Any, Protocol

from agent.errors import AgentError, NvmlUnavailableError
from agent.gpus import GpuReader
from agent.inventory import (
    GpuInfo,
    GpuSnapshot,
    annotations_patch,
    capacity_patch,
    health_changes,
    node_annotations,
)
from agent.metrics import AgentMetrics
from common.contract import Keys, agent_lease_name

log = logging.getLogger(__name__)


class NodeApi(Protocol):
    async def get_node(self, name: str) -> dict[str, Any] | None: ...

    async def patch_node_annotations(self, name: str, annotations: dict[str, str]) -> None: ...

    async def patch_node_capacity(self, name: str, resources: dict[str, str]) -> None: ...

    async def renew_lease(
        self, namespace: str, name: str, holder: str, duration: int, now: datetime
    ) -> None: ...


class NodePublisher:
    """Reads GPUs and keeps the Node's annotations and the agent Lease current."""

    def __init__(
        self,
        kube: NodeApi,
        reader: GpuReader | None,
        metrics: AgentMetrics,
        *,
        node_name: str,
        keys: Keys,
        system_namespace: str,
        cpu_only: bool,
        advertise_gpu_mem: bool = False,
        gpu_poll_seconds: float = 10.0,
        lease_renew_seconds: float = 20.0,
        lease_duration_seconds: int = 60,
        node_resync_seconds: float = 600.0,
        holder: str = "",
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        nvml_executor: Executor | None = None,
        on_snapshot: Callable[[GpuSnapshot], None] | None = None,
        usage: Callable[[GpuSnapshot | None], str] | None = None,
        usage_publish_seconds: float = 60.0,
    ) -> None:
        self._kube = kube
        self._reader = reader
        self._metrics = metrics
        self.node_name = node_name
        self.keys = keys
        self.system_namespace = system_namespace
        self.cpu_only = cpu_only
        self.advertise_gpu_mem = advertise_gpu_mem
        self.gpu_poll_seconds = gpu_poll_seconds
        self.lease_renew_seconds = lease_renew_seconds
        self.lease_duration_seconds = lease_duration_seconds
        self.node_resync_seconds = node_resync_seconds
        self.holder = holder or f"tritonshare-agent@{node_name}"
        self._clock = clock
        self._sleep = sleep
        self._wall = wall
        # NVML calls can block for seconds on a failing GPU: with an executor they run there,
        # so health checks and the API keep answering.
        self._nvml_executor = nvml_executor
        self.snapshot: GpuSnapshot | None = None
        self.gpus_read = False
        self.nvml_error = ""
        self._node_annotations: dict[str, str] | None = None
        self._node_capacity: dict[str, str] = {}
        self._on_snapshot = on_snapshot
        self._usage = usage
        self.usage_publish_seconds = usage_publish_seconds
        self._usage_written_at: float | None = None

    # GPUs.
    def read_gpus(self) -> GpuSnapshot | None:
        """Read NVML once; keep the last good snapshot when NVML itself fails."""
        if self._reader is None:
            self.snapshot, self.gpus_read = GpuSnapshot(), True
            return self.snapshot
        try:
            snapshot = self._reader.read()
        except NvmlUnavailableError as e:
            if self.cpu_only:
                if not self.gpus_read:
                    log.info("NVML is not available on this CPU-only node: it publishes no GPUs.")
                self.snapshot, self.gpus_read = GpuSnapshot(), True
                return self.snapshot
            if str(e) != self.nvml_error:
                log.error("Reading the GPUs failed: %s The node stays not ready.", e)
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
        if self._on_snapshot is not None:
            self._on_snapshot(snapshot)
        return snapshot

    async def refresh_gpus(self) -> GpuSnapshot | None:
        """`read_gpus` on the NVML executor when there is one."""
        if self._nvml_executor is None:
            return self.read_gpus()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._nvml_executor, self.read_gpus)

    async def read_gpu(self, uuid: str) -> GpuInfo | None:
        """A fresh reading of one GPU (on the NVML executor); None when it is not on the node."""
        snapshot = await self.refresh_gpus()
        return snapshot.by_uuid(uuid) if snapshot is not None else None

    # The Node.
    async def sync_node(self) -> None:
        """Reread the Node's annotations and capacity (a read, no write)."""
        node = await self._kube.get_node(self.node_name)
        if node is None:
            raise AgentError(f"node {self.node_name} does not exist in the API; check --node-name")
        self._node_annotations = dict((node.get("metadata") or {}).get("annotations") or {})
        self._node_capacity = dict((node.get("status") or {}).get("capacity") or {})

    async def publish(self) -> int:
        """Patch what changed; returns the number of writes made."""
        if self.snapshot is None or not self.gpus_read:
            return 0
        if self._node_annotations is None:
            await self.sync_node()
        assert self._node_annotations is not None
        writes = 0
        wanted = node_annotations(self.snapshot, self.keys)
        now = self._clock()
        if self._usage is not None and (
            self._usage_written_at is None
            or now - self._usage_written_at >= self.usage_publish_seconds
        ):
            # Measured memory changes often; it is published at most once per period.
            wanted[self.keys.gpu_usage] = self._usage(self.snapshot)
        changed = annotations_patch(self._node_annotations, wanted)
        if changed:
            await self._kube.patch_node_annotations(self.node_name, changed)
            self._node_annotations.update(changed)
            self._metrics.kube_writes.labels("node").inc()
            writes += 1
            if self.keys.gpu_usage in changed:
                self._usage_written_at = now
        if set(changed) - {self.keys.gpu_usage}:
            log.info(
                "Node %s now advertises %s bytes of healthy GPU memory on %d GPUs.",
                self.node_name,
                self.snapshot.healthy_memory_total,
                sum(1 for g in self.snapshot.gpus if g.healthy),
            )
        if self.advertise_gpu_mem:
            capacity = capacity_patch(self.snapshot, self.keys, self._node_capacity)
            if capacity is not None:
                await self._kube.patch_node_capacity(self.node_name, capacity)
                self._node_capacity.update(capacity)
                self._metrics.kube_writes.labels("node_status").inc()
                writes += 1
        return writes

    async def renew_lease(self) -> None:
        await self._kube.renew_lease(
            self.system_namespace,
            agent_lease_name(self.node_name),
            self.holder,
            self.lease_duration_seconds,
            self._wall(),
        )
        self._metrics.kube_writes.labels("lease").inc()

    # The loop.
    async def run(self, stop: asyncio.Event) -> None:
        """Until `stop`: GPUs every poll period, Lease every renew period, Node reread rarely.

        Each duty fails alone: a Node that cannot be patched must not stop the Lease renewals.
        """
        next_gpu = next_lease = self._clock()
        next_node = self._clock() + self.node_resync_seconds
        while not stop.is_set():
            now = self._clock()
            retry = now + min(self.gpu_poll_seconds, self.lease_renew_seconds / 4)
            if now >= next_node:
                next_node = now + self.node_resync_seconds
                if not await self._attempt("reread the node", self.sync_node()):
                    self._node_annotations = None  # publish() rereads it first
            if now >= next_gpu:
                await self.refresh_gpus()
                ok = await self._attempt("publish the GPUs on the node", self.publish())
                next_gpu = now + self.gpu_poll_seconds if ok else retry
            if now >= next_lease:
                ok = await self._attempt("renew the agent lease", self.renew_lease())
                next_lease = now + self.lease_renew_seconds if ok else retry
            delay = max(min(next_gpu, next_lease, next_node) - self._clock(), 0.0)
            await self._wait(stop, delay)

    async def _attempt(self, what: str, step: Awaitable[object]) -> bool:
        try:
            await step
        except AgentError as e:
            log.warning("Node %s could not %s (%s): retrying shortly.", self.node_name, what, e)
            return False
        return True

    async def _wait(self, stop: asyncio.Event, delay: float) -> None:
        if self._sleep is not None:
            await self._sleep(delay)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
