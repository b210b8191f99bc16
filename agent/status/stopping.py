"""The node pod's stop: before the agent stops on SIGTERM with its node pod deleted (a DaemonSet
update, `kubectl delete pod`), the node's model hosts and model pods leave their Services while
Triton and the gateway still answer (the chart's preStop pauses keep them up as long).

`drain` marks every host replica's loaded condition False, NodePodStopping (`ModelConditions.
stopping`), which the binder's `serves-` labels follow (a model's last served replica keeps its
label: nothing else would answer); `on_stopping` tells the hosts' loaders (ListHosted's
`node_stopping`), which list every model leaving, so their proxies close each client's
connection after its next answer and the client reconnects through its Service to another node.
A model pod leaves only when its controller (a Deployment's ReplicaSet...) has another pod Ready on
another node: its condition reads NodePodStopping too, and `leave_services` has the node gateway
answer its readiness not ready (`common.callers.Caller.stopping`), so its proxy closes each
client's connection after its answer and the kubelet marks it unready; a lone replica stays in its
Service to the end (nothing else would answer). It waits until no host of the node is labelled to
serve a replica (`NodePods.routed_hosts`) and no leaving model pod is Ready, at most
--stop-drain-seconds, then --stop-unroute-seconds for the endpoints to catch up. SIGINT never
drains, nor does a SIGTERM while the node pod stays (the kubelet restarting the agent's container
alone): the agent reads its own Pod (--pod-name); unnamed or unreadable, it drains. What it must
not do: stop anything itself (the lifecycle's cleanups after it do).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agent.errors import AgentError
from agent.pods.modelpods import PodInfo, condition_reason, controller_uid, pod_ready
from agent.pods.nodepods import NodePods
from agent.pods.provenpods import Proven
from agent.status.conditions import ModelConditions
from common.hosted import NODE_STOPPING_REASON

log = logging.getLogger(__name__)

POLL_SECONDS = 0.2
"""How often a stopping agent looks whether its node's hosts have left their Services."""
MESSAGE = (
    "the node pod is stopping (deleted or replaced): the model's replicas on other nodes, if any, "
    "serve its requests until this node serves it again"
)
"""What each host replica's loaded condition says meanwhile."""
LEAVING = (
    "the node pod is stopping (deleted or replaced): this pod leaves its Service while the "
    "model's replicas on other nodes serve its requests"
)
"""What the node gateway answers a leaving model pod's readiness calls with."""


class NodeStop:
    """Decides whether a stop drains the node's hosts, and drains them."""

    def __init__(
        self,
        pods: NodePods,
        conditions: ModelConditions,
        read_pod: Callable[[str, str], Awaitable[dict[str, Any] | None]],
        on_stopping: Callable[[], None],
        triton_live: Callable[[], bool],
        *,
        list_pods: Callable[[str], Awaitable[list[dict[str, Any]]]],
        leave_services: Callable[[Mapping[str, str]], None] | None,
        namespace: str,
        pod_name: str,
        drain_seconds: float,
        unroute_seconds: float,
    ) -> None:
        """`read_pod(namespace, name)`: the node pod as the API server has it (None: gone);
        `on_stopping()`: tells the hosts' loaders; `namespace`/`pod_name`: the node pod's;
        `list_pods(namespace)`: every pod of a namespace (the model pods' replicas elsewhere);
        `leave_services(pods)`: the gateway's caller table (None: no gateway, model pods stay)."""
        self._pods = pods
        self._conditions = conditions
        self._read_pod = read_pod
        self._on_stopping = on_stopping
        self._triton_live = triton_live
        self._list_pods = list_pods
        self._leave_services = leave_services
        self._namespace = namespace
        self._pod_name = pod_name
        self._drain_seconds = drain_seconds
        self._unroute_seconds = unroute_seconds
        self.drains = False
        """Whether the signal that stops the agent asks for the drain (SIGTERM)."""

    def signalled(self, sig: signal.Signals) -> None:
        """SIGTERM, the kubelet's, drains before the stop; SIGINT stops at once."""
        self.drains = sig == signal.SIGTERM

    async def pod_deleted(self) -> bool:
        """Whether the node pod is being deleted (True when it cannot tell: a drain costs the
        node's hosts a few seconds out of their Services, a missed one their clients'
        requests)."""
        namespace, name = self._namespace, self._pod_name
        if not name:
            return True
        try:
            pod = await self._read_pod(namespace, name)
        except AgentError as e:
            log.warning("Cannot read the node pod %s/%s (%s): draining anyway.", namespace, name, e)
            return True
        if pod is not None and not (pod.get("metadata") or {}).get("deletionTimestamp"):
            log.info(
                "The node pod %s/%s stays (the agent's container alone restarts): its model "
                "hosts stay in their Services.",
                namespace,
                name,
            )
            return False
        return True

    async def drain(self) -> None:
        """At the stop, first of the cleanups: the drain, when the stop calls for one."""
        if not self.drains or self._drain_seconds <= 0 or not self._pods.synced:
            return
        routed = self._pods.routed_hosts()
        served = self._pods.served_model_pods() if self._leave_services is not None else []
        if not (routed or served) or not await self.pod_deleted():
            return
        leaving = await self._replicated(served)
        if not (routed or leaving):
            return
        log.info(
            "Stopping: taking model hosts %s and model pods %s out of their Services first (at "
            "most %g s, then %g s more).",
            ", ".join(routed) or "(none)",
            ", ".join(leaving) or "(none)",
            self._drain_seconds,
            self._unroute_seconds,
        )
        if routed:
            self._conditions.stopping = MESSAGE
            self._on_stopping()
        if leaving and self._leave_services is not None:
            self._conditions.leaving = dict.fromkeys(leaving, LEAVING)
            self._leave_services(self._conditions.leaving)
        deadline = time.monotonic() + self._drain_seconds
        ready = self._pods.ready(leaving)
        while (routed or ready) and time.monotonic() < deadline:
            await self._conditions.sync(self._proven(), self._triton_live())
            await asyncio.sleep(POLL_SECONDS)
            routed = self._pods.routed_hosts()
            ready = self._pods.ready(leaving)
        if routed or ready:
            log.warning(
                "%s still in their Services after %g s (is the binder running? are the pods' "
                "readiness probes slower?): stopping anyway.",
                ", ".join(routed + ready),
                self._drain_seconds,
            )
        await asyncio.sleep(self._unroute_seconds)

    async def _replicated(self, served: list[tuple[PodInfo, str]]) -> list[str]:
        """The model pods of `served` (each with its controller's uid) whose controller has
        another pod Ready on another node, not itself leaving (its condition NodePodStopping),
        by namespace/name: they may leave their Services. Two node pods stopping at the same
        moment may each see the other's pod before it says so: their nodes are replaced one at
        a time (docs/upgrade.md)."""
        if not served:
            return []
        node = served[0][0].node_name
        loaded = self._pods.keys.model_loaded
        elsewhere: set[str] = set()
        for namespace in sorted({pod.namespace for pod, _ in served}):
            try:
                pods = await self._list_pods(namespace)
            except AgentError as e:
                log.warning(
                    "Cannot list the pods of namespace %s (%s): its model pods on this node stay "
                    "in their Services to the end.",
                    namespace,
                    e,
                )
                continue
            elsewhere.update(
                controller_uid(obj)
                for obj in pods
                if (obj.get("spec") or {}).get("nodeName") not in (None, "", node)
                and not (obj.get("metadata") or {}).get("deletionTimestamp")
                and pod_ready(obj)
                and condition_reason(obj, loaded) != NODE_STOPPING_REASON
            )
        return [pod.key for pod, controller in served if controller in elsewhere]

    def _proven(self) -> list[Proven]:
        return self._pods.all_proven()
