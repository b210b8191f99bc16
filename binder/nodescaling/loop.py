"""The node autoscaling pass (`--node-autoscaling`): placeholders and scale-down guards, written
while this replica leads.

Fed by the binder's watches (pods, nodes, TritonModels: the raw objects, on the loop), it keeps
what its decisions need: the waiting models, the placeholders, which nodes run a model pod or a
model host, and each node's annotations. Every PERIOD_SECONDS, and at once when a model starts
or stops waiting, it plans on the loop (`binder.nodescaling.placeholders.plan`,
`binder.nodescaling.guard.patches`, both pure) and writes in the API executor: placeholders made
(a name taken already is one made before) with a `WaitingForNode` Event on each model they stand
for, placeholders deleted (by uid), guards set and removed. A failed write is logged and tried
again next pass.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, Unpack

from binder.nodescaling.guard import patches
from binder.nodescaling.placeholders import (
    MAX_NAMED_WAITERS,
    Placeholder,
    Plan,
    Selection,
    Waiting,
    manifest,
    next_name,
    placeholder_of,
    plan,
    waiting_model,
    waiting_pod,
)
from common.contract import Keys
from common.events import EventText
from common.hosted import host_label
from common.kubeapi.errors import ApiError
from common.kubeapi.session import JsonObject

log = logging.getLogger(__name__)

PERIOD_SECONDS = 2.0
EVENT_REASON = "WaitingForNode"
_ENDED = frozenset({"Succeeded", "Failed"})


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


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    metadata = obj.get("metadata") or {}
    return str(metadata.get("namespace", "")), str(metadata.get("name", ""))


@dataclass(frozen=True)
class Creation:
    """A placeholder to make and the waiting models it stands for."""

    body: JsonObject
    waiting: Sequence[Waiting]


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
        period: float = PERIOD_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`serves(node)`: the node has a live agent and published GPUs (binder.cluster)."""
        self._kube = kube
        self.config = config
        self._serves = serves
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
        waiting = waiting_pod(obj, self.config.scheduler_name)
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

    def plan(self) -> tuple[Plan, list[Creation], dict[str, dict[str, str | None]]]:
        """This pass's writes: the plan, the placeholder pods it makes (with the models each
        stands for), the node patches."""
        waiting = self.waiting()
        decided = plan(
            waiting, self.placeholders.values(), self._served_for, self.config.grace_seconds
        )
        creations = []
        taken = set(self.placeholders)
        for selection in decided.create:
            name = next_name(selection.group, taken)
            taken.add(name)
            mine = sorted(
                (w for w in waiting if w.selection.group == selection.group), key=lambda w: w.what
            )
            creations.append(Creation(self._manifest(selection, name, mine), mine))
        guards = patches(self._annotations, self.serving_nodes(), self.config.keys)
        return decided, creations, guards

    def _manifest(self, selection: Selection, name: str, waiting: list[Waiting]) -> JsonObject:
        config = self.config
        return manifest(
            selection,
            name=name,
            namespace=config.namespace,
            keys=config.keys,
            image=config.image,
            node_selector=config.node_selector,
            waiting_for=[w.what for w in waiting],
        )

    async def run(self, stop: asyncio.Event) -> None:
        """A pass every period, or at once when a model starts or stops waiting, while this
        replica leads, until `stop` is set."""
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            self._waiting_changed.clear()  # a change during the writes wakes the next pass
            if self._leading():
                decided, creations, guards = self.plan()
                if creations or decided.delete or guards:
                    await loop.run_in_executor(
                        self._executor, self.write, decided.delete, creations, guards
                    )
            stopping = asyncio.ensure_future(stop.wait())
            changed = asyncio.ensure_future(self._waiting_changed.wait())
            try:
                await asyncio.wait(
                    (stopping, changed), timeout=self._period, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                stopping.cancel()
                changed.cancel()

    def write(
        self,
        delete: Sequence[Placeholder],
        create: Sequence[Creation],
        guards: Mapping[str, Mapping[str, str | None]],
    ) -> None:
        """The pass's API writes (blocking: run in the API executor)."""
        namespace = self.config.namespace
        for placeholder in delete:
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
        for creation in create:
            if not self._leading():
                return
            name = creation.body["metadata"]["name"]
            log.info(
                "No node fits %s: placeholder pod %s/%s asks the node autoscaler for a node.",
                ", ".join(w.what for w in creation.waiting),
                namespace,
                name,
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
                        "node autoscaler for a node.",
                        event_type="Normal",
                    ),
                    quiet=404,
                )
        for node, wanted in sorted(guards.items()):
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
