"""What `agent.models.nodemodels.Models` reads of the node, for tests that build Models alone: a
CPU-only node (no GPU to read) and pods whose recorded owners are all alive or all gone; and such
a `Models` itself, with no Triton to reach and its safeguards switched off as a deployment
without them has them (nothing kept, evicted, held, or measured apart or on Triton's host
memory)."""

from __future__ import annotations

from typing import Unpack

from agent.gpus.apart import ApartMemory
from agent.gpus.inventory import GpuInfo, GpuSnapshot
from agent.gpus.memory import MemoryLedger
from agent.gpus.nvml import GpuReader
from agent.gpus.processes import TritonProcesses
from agent.installs.filecache import FileCache, NamespaceDisk
from agent.installs.modelconfig import ModelPolicy
from agent.installs.repository import Repository
from agent.kube.events import PodEvents
from agent.metrics import AgentMetrics
from agent.models.evictor import Evictor
from agent.models.node import Gpus, Node
from agent.models.nodemodels import ModelLimits, Models, Pods
from agent.models.probationhold import ProbationHold
from agent.models.quietwindow import QuietWindow
from agent.models.tritonram import HostMemory, HostMemoryRules
from agent.phases import Rules
from agent.pods.modelpods import PodInfo
from agent.pods.ownership import OwnerRecord, OwnerStore
from agent.pods.provenpods import Proven
from agent.quarantine.crashledger import CrashLedger
from agent.triton import TritonClient
from common.events import EventText
from sim.gpu.nvml import MockNvml
from sim.gpu.spec import parse_spec
from tests.executors import CallerThread


class NoGpus:
    """A node without GPUs (`Gpus`)."""

    @property
    def snapshot(self) -> GpuSnapshot | None:
        return None

    async def read_gpu(self, uuid: str) -> GpuInfo | None:
        return None


class OwnersAlive:
    """No other proven pod on the node; every recorded owner alive, or none (`Pods`)."""

    def __init__(self, alive: bool) -> None:
        self.alive = alive

    def all_proven(self) -> list[Proven]:
        return []

    async def owner_alive(self, owner: OwnerRecord) -> bool:
        return self.alive


def no_replicas(pod_key: str, uid: str) -> PodInfo | None:
    """A node with no model host: no pod stands for a replica (`NodePods.replica`)."""
    return None


class EventsSaid:
    """The API server as `PodEvents` writes to it: the Events said, by pod and reason."""

    def __init__(self) -> None:
        self.said: list[tuple[str, str]] = []

    async def record_pod_event(
        self, namespace: str, name: str, uid: str, *, component: str, **said: Unpack[EventText]
    ) -> None:
        self.said.append((f"{namespace}/{name}", said["reason"]))


def bare_models(
    repository: Repository,
    owners: OwnerStore,
    namespaces: frozenset[str],
    *,
    gpus: Gpus,
    pods: Pods,
) -> Models:
    """Models for `namespaces`' tenant code, CPU only, with no Triton to reach (its port is
    closed) and its safeguards off, as on a node without a gateway nor Triton's PID: nothing
    kept (a cache of 0 bytes), evicted (no activity table), held (a hold of 0 seconds) or
    measured apart or on Triton's host memory."""
    metrics = AgentMetrics()
    events = PodEvents(EventsSaid(), "tritonshare-agent/node", replicas=no_replicas)
    unknown = TritonProcesses(None)
    node = Node(
        TritonClient("127.0.0.1:1", "127.0.0.1:1"),
        repository,
        ModelLimits(policy=ModelPolicy(tenant_code_namespaces=namespaces), cpu_only=True),
        gpus=gpus,
        ledger=MemoryLedger(),
        host=HostMemory(unknown, HostMemoryRules(), quiet=QuietWindow(None, max_age=10.0)),
        apart=ApartMemory(
            GpuReader(nvml=MockNvml(parse_spec("1xA100-80GB")).as_module()),
            unknown,
            executor=CallerThread(),
        ),
        metrics=metrics,
    )
    return Models(
        node,
        owners,
        pods,
        cache=FileCache(repository.root.parent / ".kept", 0),
        namespace_disk=NamespaceDisk(0),
        crashes=CrashLedger(owners.directory, Rules().quarantine_after),
        evictor=Evictor(None, max_age=10.0, min_idle=0.0, events=events, metrics=metrics),
        hold=ProbationHold(0),
        events=events,
    )
