"""What `agent.models.nodemodels.Models` reads of the node, for tests that build Models alone: a
CPU-only node (no GPU to read) and pods whose recorded owners are all alive or all gone; and such
a `Models` itself, with no Triton to reach and none of its optional collaborators."""

from __future__ import annotations

from agent.gpus.inventory import GpuInfo, GpuSnapshot
from agent.gpus.memory import MemoryLedger
from agent.installs.filecache import NamespaceDisk
from agent.installs.modelconfig import ModelPolicy
from agent.installs.repository import Repository
from agent.metrics import AgentMetrics
from agent.models.gpuadmission import Gpus
from agent.models.nodemodels import ModelLimits, Models, Pods
from agent.phases import Rules
from agent.pods.ownership import OwnerRecord, OwnerStore
from agent.pods.provenpods import Proven
from agent.quarantine.crashledger import CrashLedger
from agent.triton import TritonClient


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


def bare_models(
    repository: Repository,
    owners: OwnerStore,
    namespaces: frozenset[str],
    *,
    gpus: Gpus,
    pods: Pods,
) -> Models:
    """Models for `namespaces`' tenant code, CPU only, with no Triton to reach (its port is
    closed) and none of its optional collaborators: nothing kept, evicted, held or measured
    apart."""
    return Models(
        repository,
        TritonClient("127.0.0.1:1", "127.0.0.1:1"),
        owners,
        ModelLimits(policy=ModelPolicy(tenant_code_namespaces=namespaces), cpu_only=True),
        gpus=gpus,
        pods=pods,
        metrics=AgentMetrics(),
        ledger=MemoryLedger(),
        cache=None,
        namespace_disk=NamespaceDisk(0),
        crashes=CrashLedger(owners.directory, Rules().quarantine_after),
        evictor=None,
        host=None,
        hold=None,
        apart=None,
    )
