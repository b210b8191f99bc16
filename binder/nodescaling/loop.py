"""The node autoscaling pass (`--node-autoscaling`): placeholders and scale-down guards, written
while this replica leads.

Fed by the binder's watches (pods, nodes, TritonModels: the raw objects, on the loop), it keeps
what its decisions need: the waiting models, the placeholders, which nodes run a model pod or a
model host, and each node's annotations. Every PERIOD_SECONDS, and at once when a model starts
or stops waiting, it plans on the loop (`binder.nodescaling.planning.plan`,
`binder.nodescaling.guard.patches`, both pure, with the largest GPU and each namespace's quota
room as the binder's cache holds them) and writes in the API executor: placeholders made (a name
taken already is one made before) with a `WaitingForNode` Event on each model they stand for,
placeholders deleted (by uid), a `NoNodeScaleUp` Warning on each model refused one (once per
reason), guards set and removed. A group whose added node did not take it, or whose placeholder
stayed pending `--placeholder-pending-timeout`, stays refused for REFUSED_SECONDS, or until none
of its models waits. A failed write is logged and tried again
next pass.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol, Unpack

from binder.nodescaling.guard import patches
from binder.nodescaling.placeholders import (
    MAX_NAMED_WAITERS,
    Group,
    Placeholder,
    Waiting,
    manifest,
    next_name,
    placeholder_of,
    waiting_model,
    waiting_pod,
)
from binder.nodescaling.planning import Bounds, Plan, Refusal, plan
from common.contract import Keys
from common.events import EventText
from common.hosted import host_label
from common.kubeapi.errors import ApiError
from common.kubeapi.session import JsonObject

log = logging.getLogger(__name__)

PERIOD_SECONDS = 2.0
EVENT_REASON = "WaitingForNode"
REFUSED_REASON = "NoNodeScaleUp"
REFUSED_SECONDS = 1800.0
"""How long a group whose added node did not take it asks for no node (Cluster Autoscaler's
longest backoff of a node group that failed to scale up, --max-node-group-backoff-duration)."""
_ENDED = frozenset({"Succeeded", "Failed"})
MIB = 2**20


class NodeScalingKube(Protocol):
    def create_pod(self, namespace: str, body: JsonObject) -> None: ...

    def delete_pod(self, namespace: str, name: str, uid: str) -> None: ...

    def patch_node_annotations(self, name: str, annotations: Mapping[str, str | None]) -> None: ...

    def record_object_event(
        self,
        involved: Mapping[str, str],
        *,
        reporting_instance: str,
        component: str = "tritonshare",
        **said: Unpack[EventText],
    ) -> None: ...


@dataclass(frozen=True)
class Config:
    """What the pass decides and writes by (from the binder's settings)."""

    keys: Keys
    scheduler_name: str
    namespace: str
    """Where placeholders live: the system namespace."""
    image: str
    node_selector: Sequence[tuple[str, str | None]]
    grace_seconds: float
    identity: str
    """This replica, as its Events' reportingInstance."""
    node_group_gpu_mem: int = 0
    """The largest GPU, in bytes, a node group can add (`--node-group-gpu-mem`; 0: none
    beyond the cluster's nodes')."""
    gpu_mem_reserve: int = 0
    """Bytes kept free on every GPU (`--gpu-mem-reserve`)."""
    pending_seconds: float = 0.0
    """Seconds a placeholder may stay pending before its group is refused
    (`--placeholder-pending-timeout`; 0: never)."""
    gpu_memory_label: str = ""
    """The node label of a GPU's memory in MiB a placeholder asks enough of
    (`--placeholder-gpu-memory-label`; empty: none)."""


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    metadata = obj.get("metadata") or {}
    return str(metadata.get("namespace", "")), str(metadata.get("name", ""))


@dataclass(frozen=True)
class Creation:
    """A placeholder to make and the waiting models it stands for."""

    body: JsonObject
    waiting: Sequence[Waiting]
    gpu_memory: tuple[str, int] | None = None
    """The node label and the MiB of GPU it asks for (None: no size)."""


@dataclass(frozen=True)
class Writes:
    """One pass's API writes."""

    delete: Sequence[Placeholder] = ()
    create: Sequence[Creation] = ()
    refused: Sequence[Refusal] = ()
    """Models to tell, once per reason, that no placeholder asks a node for them."""
    guards: Mapping[str, Mapping[str, str | None]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.delete or self.create or self.refused or self.guards)


class NodeScaling:
    """Keeps one placeholder per kind of node waiting models need, and guards serving nodes."""

    def __init__(
        self,
        kube: NodeScalingKube,
        config: Config,
        *,
        serves: Callable[[str], bool],
        leading: Callable[[], bool],
        executor: Executor,
        largest_gpu: Callable[[], int] = lambda: 0,
        quota_room: Callable[[str], int | None] = lambda namespace: None,
        period: float = PERIOD_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`serves(node)`: the node has a live agent and published GPUs (binder.cluster);
        `largest_gpu()`: the bytes the largest healthy GPU of the cluster offers after the
        reserve; `quota_room(namespace)`: the GPU memory its quotas leave (None: no quota)."""
        self._kube = kube
        self.config = config
        self._serves = serves
        self._largest_gpu = largest_gpu
        self._quota_room = quota_room
        self._largest_seen = 0
        self._pending_since: dict[str, float] = {}
        """Placeholder name -> when this replica first saw it pending."""
        self._refused: dict[str, tuple[str, float]] = {}
        """Group key -> why it asks for no node, and since when."""
        self._told: dict[str, str] = {}
        """Refused model (its `what`) -> the reason it was last told."""
        self._leading = leading
        self._executor = executor
        self._period = period
        self._monotonic = monotonic
        self._host_label = host_label(config.keys)
        self._waiting_pods: dict[tuple[str, str], Waiting] = {}
        self._waiting_models: dict[tuple[str, str], Waiting] = {}
        self.placeholders: dict[str, Placeholder] = {}
        self._node_pods: dict[tuple[str, str], str] = {}
        """Model pods and hosts not ended -> their node."""
        self._annotations: dict[str, dict[str, str]] = {}
        self._serving_since: dict[str, float] = {}
        # Set when a model starts or stops waiting: its placeholder is made, or deleted, at once
        # rather than at the next period, so a node autoscaler scanning meanwhile does not add a
        # node for a placeholder whose model was just placed (on the node added for it).
        self._waiting_changed = asyncio.Event()

    # ---- the watches (on the loop) ---------------------------------------------------------

    def replace_pods(self, items: list[JsonObject]) -> None:
        self._waiting_pods.clear()
        self.placeholders.clear()
        self._node_pods.clear()
        for obj in items:
            self.apply_pod("ADDED", obj)

    def apply_pod(self, event: str, obj: JsonObject) -> None:
        key = _key(obj)
        was_waiting = self._waiting_pods.pop(key, None) is not None
        self._node_pods.pop(key, None)
        if key[0] == self.config.namespace:
            self.placeholders.pop(key[1], None)
        if event == "DELETED":
            if was_waiting:
                self._waiting_changed.set()
            return
        placeholder = placeholder_of(obj, self.config.keys)
        if placeholder is not None and key[0] == self.config.namespace:
            self.placeholders[placeholder.name] = placeholder
            return
        waiting = waiting_pod(obj, self.config.scheduler_name, self.config.keys)
        if waiting is not None:
            self._waiting_pods[key] = waiting
        if (waiting is not None) != was_waiting:
            self._waiting_changed.set()
        if waiting is not None:
            return
        metadata, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        node = spec.get("nodeName")
        model = (
            spec.get("schedulerName") == self.config.scheduler_name
            or (metadata.get("labels") or {}).get(self._host_label) == "true"
        )
        if node and model and (obj.get("status") or {}).get("phase") not in _ENDED:
            self._node_pods[key] = str(node)

    def replace_nodes(self, items: list[JsonObject]) -> None:
        self._annotations.clear()
        for obj in items:
            self.apply_node("ADDED", obj)

    def apply_node(self, event: str, obj: JsonObject) -> None:
        name = _key(obj)[1]
        if event == "DELETED":
            self._annotations.pop(name, None)
            return
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        self._annotations[name] = {str(k): str(v) for k, v in annotations.items()}

    def replace_models(self, items: list[JsonObject]) -> None:
        self._waiting_models.clear()
        for obj in items:
            self.apply_model("ADDED", obj)

    def apply_model(self, event: str, obj: JsonObject) -> None:
        key = _key(obj)
        was_waiting = self._waiting_models.pop(key, None) is not None
        waiting = waiting_model(obj) if event != "DELETED" else None
        if waiting is not None:
            self._waiting_models[key] = waiting
        if (waiting is not None) != was_waiting:
            self._waiting_changed.set()

    # ---- the pass ----------------------------------------------------------------------------

    def waiting(self) -> list[Waiting]:
        return [*self._waiting_pods.values(), *self._waiting_models.values()]

    def serving_nodes(self) -> set[str]:
        return set(self._node_pods.values())

    def _served_for(self, node: str) -> float | None:
        """Seconds since this replica first saw `node` serve (None: it does not)."""
        if not self._serves(node):
            self._serving_since.pop(node, None)
            return None
        now = self._monotonic()
        return now - self._serving_since.setdefault(node, now)

    def _pending_for(self, placeholder: Placeholder) -> float:
        """Seconds this replica has seen the placeholder pending."""
        now = self._monotonic()
        return now - self._pending_since.setdefault(placeholder.name, now)

    def bounds(self, namespaces: Iterable[str]) -> Bounds:
        """The largest GPU a new node could bring (of those the cluster's nodes have had since
        this replica started, and `--node-group-gpu-mem`) and the namespaces' quota room."""
        config = self.config
        # The largest GPU seen since this replica started: a node scaled down still tells what
        # its group adds, so a model too large for it does not have one added and removed in turn.
        self._largest_seen = max(self._largest_seen, self._largest_gpu())
        largest = max(self._largest_seen, config.node_group_gpu_mem - config.gpu_mem_reserve)
        headroom = {}
        for namespace in sorted(set(namespaces)):
            room = self._quota_room(namespace)
            if room is not None:
                headroom[namespace] = room
        return Bounds(largest, headroom)

    def plan(self) -> tuple[Plan, Writes]:
        """This pass's decisions and writes: placeholders deleted, the placeholder pods made
        (with the models each stands for), the models told why none is made, the node
        patches."""
        waiting = self.waiting()
        now = self._monotonic()
        groups = {w.group.key for w in waiting}
        for key, (_, since) in list(self._refused.items()):
            if key not in groups or now - since >= REFUSED_SECONDS:
                del self._refused[key]
        pending = {p.name for p in self.placeholders.values() if not p.node and not p.ended}
        for name in set(self._pending_since) - pending:
            del self._pending_since[name]
        decided = plan(
            waiting,
            self.placeholders.values(),
            self._served_for,
            self.config.grace_seconds,
            running=self.serving_nodes(),
            bounds=self.bounds(w.namespace for w in waiting),
            refused={key: why for key, (why, _) in self._refused.items()},
            pending_for=self._pending_for,
            pending_limit=self.config.pending_seconds,
        )
        for key, why in decided.unhelped:
            self._refused[key] = (why, now)
        creations = []
        taken = set(self.placeholders)
        for group in decided.create:
            name = next_name(group.key, taken)
            taken.add(name)
            mine = sorted((w for w in waiting if w.group == group), key=lambda w: w.what)
            sized = self._sized(mine)
            creations.append(Creation(self._manifest(group, name, mine, sized), mine, sized))
        told = {r.waiting.what: r.reason for r in decided.refused}
        refusals = [r for r in decided.refused if self._told.get(r.waiting.what) != r.reason]
        self._told = told
        guards = patches(self._annotations, self.serving_nodes(), self.config.keys)
        return decided, Writes(decided.delete, creations, refusals, guards)

    def _sized(self, waiting: list[Waiting]) -> tuple[str, int] | None:
        """The node label and the MiB of one GPU the placeholder asks for: the largest of the
        models with the reserve kept free (None: no label set, or no size known)."""
        config = self.config
        largest = max((w.request for w in waiting), default=0)
        if not config.gpu_memory_label or not largest:
            return None
        return config.gpu_memory_label, -(-(largest + config.gpu_mem_reserve) // MIB)

    def _manifest(
        self, group: Group, name: str, waiting: list[Waiting], sized: tuple[str, int] | None
    ) -> JsonObject:
        config = self.config
        return manifest(
            group,
            name=name,
            namespace=config.namespace,
            keys=config.keys,
            image=config.image,
            node_selector=config.node_selector,
            waiting_for=[w.what for w in waiting],
            gpu_memory=sized,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """A pass every period, or at once when a model starts or stops waiting, while this
        replica leads, until `stop` is set."""
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            self._waiting_changed.clear()  # a change during the writes wakes the next pass
            if self._leading():
                _, writes = self.plan()
                if writes:
                    await loop.run_in_executor(self._executor, self.write, writes)
            stopping = asyncio.ensure_future(stop.wait())
            changed = asyncio.ensure_future(self._waiting_changed.wait())
            try:
                await asyncio.wait(
                    (stopping, changed), timeout=self._period, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                stopping.cancel()
                changed.cancel()

    def write(self, writes: Writes) -> None:
        """The pass's API writes (blocking: run in the API executor)."""
        namespace = self.config.namespace
        for placeholder in writes.delete:
            if not self._leading():
                return
            log.info(
                "Placeholder %s/%s is no longer needed (the models it stood for are placed or "
                "gone): deleting it.",
                namespace,
                placeholder.name,
            )
            self._try(
                f"delete placeholder {namespace}/{placeholder.name}",
                partial(self._kube.delete_pod, namespace, placeholder.name, placeholder.uid),
                quiet=404,
            )
        for creation in writes.create:
            if not self._leading():
                return
            name = creation.body["metadata"]["name"]
            size = ""
            if creation.gpu_memory is not None:
                label, mebibytes = creation.gpu_memory
                size = f" with a GPU of {mebibytes} MiB or more ({label}, or a node without it)"
            log.info(
                "No node fits %s: placeholder pod %s/%s asks the node autoscaler for a node%s.",
                ", ".join(w.what for w in creation.waiting),
                namespace,
                name,
                size,
            )
            self._try(
                f"create placeholder {namespace}/{name}",
                partial(self._kube.create_pod, namespace, creation.body),
                quiet=409,
            )
            for waiting in creation.waiting[:MAX_NAMED_WAITERS]:
                self._try(
                    f"record a {EVENT_REASON} Event for {waiting.what}",
                    partial(
                        self._kube.record_object_event,
                        waiting.involved,
                        reporting_instance=self.config.identity,
                        reason=EVENT_REASON,
                        message=f"No node fits it: placeholder pod {namespace}/{name} asks the "
                        f"node autoscaler for a node{size}.",
                        event_type="Normal",
                    ),
                    quiet=404,
                )
        for refusal in writes.refused:
            if not self._leading():
                return
            waiting = refusal.waiting
            log.info(
                "No node a node autoscaler adds would take %s (%s): no placeholder asks for one.",
                waiting.what,
                refusal.reason,
            )
            self._try(
                f"record a {REFUSED_REASON} Event for {waiting.what}",
                partial(
                    self._kube.record_object_event,
                    waiting.involved,
                    reporting_instance=self.config.identity,
                    reason=REFUSED_REASON,
                    message="No placeholder asks the node autoscaler for a node: "
                    f"{refusal.reason}.",
                    event_type="Warning",
                ),
                quiet=404,
            )
        for node, wanted in sorted(writes.guards.items()):
            if not self._leading():
                return
            what = "guarding" if any(v is not None for v in wanted.values()) else "unguarding"
            log.info(
                "Node %s %s: %s it against node autoscalers' scale-down.",
                node,
                "serves models" if what == "guarding" else "serves no model any more",
                "protecting" if what == "guarding" else "no longer protecting",
            )
            self._try(
                f"{what} node {node}",
                partial(self._kube.patch_node_annotations, node, wanted),
                quiet=404,
            )

    def _try(self, what: str, call: Callable[[], None], *, quiet: int) -> None:
        try:
            call()
        except ApiError as e:
            if e.status != quiet:
                log.warning("Could not %s (%s): trying again in %.0f s.", what, e, self._period)
