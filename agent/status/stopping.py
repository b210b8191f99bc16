"""The node pod's stop: before the agent stops on SIGTERM with its node pod deleted (a DaemonSet
update, `kubectl delete pod`), the node's model hosts leave their Services while Triton and the
gateway still answer (the chart's preStop pauses keep them up as long).

`drain` marks every host replica's loaded condition False, NodePodStopping (`ModelConditions.
stopping`), which the binder's `serves-` labels follow (a model's last served replica keeps its
label: nothing else would answer); `on_stopping` tells the hosts' loaders (ListHosted's
`node_stopping`), which list every model leaving, so their proxies close each client's
connection after its next answer and the client reconnects through its Service to another node.
It waits until no host of the node is labelled to serve a replica (`NodePods.routed_hosts`), at
most --stop-drain-seconds, then --stop-unroute-seconds for the endpoints to catch up. SIGINT
never drains, nor does a SIGTERM while the node pod stays (the kubelet restarting the agent's
container alone): the agent reads its own Pod (--pod-name); unnamed or unreadable, it drains.
What it must not do: stop anything itself (the lifecycle's cleanups after it do).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agent.errors import AgentError
from agent.pods.nodepods import NodePods
from agent.pods.proofs import Proven
from agent.status.conditions import ModelConditions

log = logging.getLogger(__name__)

POLL_SECONDS = 0.2
"""How often a stopping agent looks whether its node's hosts have left their Services."""
MESSAGE = (
    "the node pod is stopping (deleted or replaced): the model's replicas on other nodes, if any, "
    "serve its requests until this node serves it again"
)
"""What each host replica's loaded condition says meanwhile."""


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
        namespace: str,
        pod_name: str,
        drain_seconds: float,
        unroute_seconds: float,
    ) -> None:
        """`read_pod(namespace, name)`: the node pod as the API server has it (None: gone);
        `on_stopping()`: tells the hosts' loaders; `namespace`/`pod_name`: the node pod's."""
        self._pods = pods
        self._conditions = conditions
        self._read_pod = read_pod
        self._on_stopping = on_stopping
        self._triton_live = triton_live
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
        if not routed or not await self.pod_deleted():
            return
        log.info(
            "Stopping: taking model hosts %s out of their Services first (at most %g s, then "
            "%g s more).",
            ", ".join(routed),
            self._drain_seconds,
            self._unroute_seconds,
        )
        self._conditions.stopping = MESSAGE
        self._on_stopping()
        deadline = time.monotonic() + self._drain_seconds
        while routed and time.monotonic() < deadline:
            await self._conditions.sync(self._proven(), self._triton_live())
            await asyncio.sleep(POLL_SECONDS)
            routed = self._pods.routed_hosts()
        if routed:
            log.warning(
                "Model hosts %s are still in their Services after %g s (is the binder "
                "running?): stopping anyway.",
                ", ".join(routed),
                self._drain_seconds,
            )
        await asyncio.sleep(self._unroute_seconds)

    def _proven(self) -> list[Proven]:
        return self._pods.all_proven()
