"""The binder's side of a dead agent, as Kubernetes' node lifecycle controller does for a dead
kubelet: the model pods of a node whose agent's Lease has expired are told, then replaced.

Placement already leaves such a node alone (a node without a live agent lease fits nothing).
Here, every PERIOD_SECONDS while this replica leads, for each node whose agent Lease has expired
(or was deleted), the tritonshare pods bound to it that are neither terminated nor being deleted:
- those still Pending (their loader has not finished, so nothing of theirs is served) and owned by
  a controller are failed at once: phase `Failed` with reason `AgentUnreachable`, the condition
  `False` with the same reason, and a Warning Event `NodeAgentDown` quoting the loader's last
  termination message, so their controller creates replacements, which the binder places on a
  node with a live agent. As Kubernetes' pod garbage collector marks a pod on a gone node Failed,
  the node's kubelet then stops it. Not rate limited: nothing is served by such a pod;
- the others get the `tritonshare.io/ModelLoaded` condition `Unknown` with reason
  `AgentUnreachable` (once; the agent sets it back from what it knows when it runs again) and a
  Warning Event `NodeAgentDown`. The model may still be served: the node gateway serves the pods
  of its last caller table for its --table-stale-grace;
- once the agent has been down for --agent-down-grace (default 300 s, the gateway's
  --table-stale-grace and Kubernetes' unreachable-node grace, so the gateway stops serving them
  about when they are replaced), pods owned by a controller are deleted (uid precondition) so the
  controller creates replacements, which the binder places on a node with a live agent. Each
  node's at a rate scaled by its size, so all of them go within --agent-down-replace-seconds of
  the first pass past the grace (its deletable pods / that, at least
  --agent-down-deletions-per-second; a bucket of one pass's worth). While more than 2 nodes'
  agents and at least UNHEALTHY_FRACTION of them are down at once (a bad agent roll-out, a
  partition: replacements would find few live nodes), only --agent-down-deletions-per-second
  cluster-wide (a token bucket of 1), as kube's node lifecycle controller slows its evictions in
  a zone mostly unhealthy (--unhealthy-zone-threshold). A pod that no controller owns is never
  deleted: nothing would replace it.
Down since: the Lease's own expiry (renewTime + leaseDurationSeconds), or, for a Lease that is
gone, when this replica first saw it gone. Nodes whose Lease this replica never saw are left alone.
Owns this decision (`judge`, pure) and its pass; the API calls are binder.api.kube's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, Unpack

from binder.pods.tokenbucket import TokenBucket
from common.conditions import Condition, condition_for, find, rfc3339
from common.events import EventText
from common.kubeapi.errors import ApiError
from common.kubeapi.session import JsonObject

log = logging.getLogger(__name__)

PERIOD_SECONDS = 5.0
UNHEALTHY_FRACTION = 0.55
"""kube-controller-manager's --unhealthy-zone-threshold: the share of the nodes whose agents are
down from which deletions fall back to --agent-down-deletions-per-second, cluster-wide."""
REASON = "AgentUnreachable"
EVENT_REASON = "NodeAgentDown"
_TERMINATED = frozenset({"Succeeded", "Failed"})

Verdict = Literal["mark", "delete", "fail"]


class AgentDownKube(Protocol):
    def pods_on_node(self, node: str) -> list[JsonObject]: ...

    def set_pod_condition(self, namespace: str, name: str, condition: JsonObject) -> None: ...

    def delete_pod(self, namespace: str, name: str, uid: str) -> None: ...

    def fail_pod(
        self, namespace: str, name: str, reason: str, message: str, condition: JsonObject
    ) -> None: ...

    def record_event(
        self,
        namespace: str,
        name: str,
        uid: str,
        *,
        reporting_instance: str,
        **said: Unpack[EventText],
    ) -> None: ...


@dataclass(frozen=True)
class Rules:
    """What the pass decides by."""

    scheduler_name: str
    condition_type: str
    grace_seconds: float


def judge(pod: Mapping[str, Any], down_for: float, rules: Rules) -> list[Verdict]:
    """What to do about one pod bound to a node whose agent has been down `down_for` seconds."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    if spec.get("schedulerName") != rules.scheduler_name or metadata.get("deletionTimestamp"):
        return []
    if status.get("phase") in _TERMINATED:
        return []
    owned = any(ref.get("controller") for ref in metadata.get("ownerReferences") or [])
    if owned and status.get("phase", "Pending") == "Pending":
        return ["fail"]
    verdicts: list[Verdict] = []
    marked = any(
        c.get("type") == rules.condition_type
        and c.get("status") == "Unknown"
        and c.get("reason") == REASON
        for c in status.get("conditions") or []
    )
    if not marked:
        verdicts.append("mark")
    if rules.grace_seconds > 0 and down_for >= rules.grace_seconds and owned:
        verdicts.append("delete")
    return verdicts


class AgentDown:
    """Marks, then after the grace deletes, the model pods of nodes whose agent is down."""

    def __init__(
        self,
        kube: AgentDownKube,
        rules: Rules,
        *,
        deletions_per_second: float,
        identity: str,
        clock: Callable[[], float] = time.time,
        replace_seconds: float = 0.0,
    ) -> None:
        """`replace_seconds`: the time a node's deletable pods are all deleted within, once
        past the grace (0: only `deletions_per_second`, cluster-wide)."""
        self._kube = kube
        self.rules = rules
        self._identity = identity
        self._clock = clock
        self._bucket = TokenBucket(deletions_per_second, clock)
        self._replace_seconds = replace_seconds
        self._node_buckets: dict[str, TokenBucket] = {}
        """Node -> its deletions' bucket, scaled by its deletable pods (see `_bucket_for`)."""
        self._agents = 0
        """Nodes with an agent Lease, as `down_nodes` last saw them."""
        self._gone_since: dict[str, float] = {}
        self.deleted: list[str] = []
        """Keys of the pods this replica deleted (for tests and the log)."""
        self.failed: list[str] = []
        """Keys of the pods this replica failed."""

    def down_nodes(self, leases: Mapping[str, float], now: float) -> dict[str, float]:
        """Node -> since when its agent is down, from the lease expiries (0: the Lease is gone)."""
        self._agents = len(leases)
        down = {}
        for node, expiry in leases.items():
            if expiry > now:
                self._gone_since.pop(node, None)
                continue
            if expiry <= 0:
                expiry = self._gone_since.setdefault(node, now)
            down[node] = expiry
        for node in list(self._gone_since):
            if node not in leases:
                del self._gone_since[node]
        return down

    async def run(
        self,
        leases: Callable[[], Mapping[str, float]],
        leading: Callable[[], bool],
        stop: asyncio.Event,
        executor: Executor,
    ) -> None:
        """A pass every PERIOD_SECONDS while this replica leads, until `stop` is set."""
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            if leading():
                down = self.down_nodes(dict(leases()), self._clock())
                if down:
                    await loop.run_in_executor(executor, self.pass_once, down, leading)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), PERIOD_SECONDS)

    def pass_once(self, down: Mapping[str, float], leading: Callable[[], bool]) -> None:
        """One pass over the nodes whose agent is down (blocking: run in the API executor)."""
        for node in [n for n in self._node_buckets if n not in down]:
            del self._node_buckets[node]  # back, or gone: a later loss starts afresh
        scaled = self._replace_seconds > 0 and not self.widespread(len(down))
        for node, since in sorted(down.items()):
            if not leading():
                return
            try:
                pods = self._kube.pods_on_node(node)
            except ApiError as e:
                log.warning(
                    "Cannot list the pods of node %s, whose agent is down (%s): trying again in "
                    "%.0f s.",
                    node,
                    e,
                    PERIOD_SECONDS,
                )
                continue
            down_for = self._clock() - since
            verdicts = [(pod, judge(pod, down_for, self.rules)) for pod in pods]
            deletable = sum("delete" in said for _, said in verdicts)
            bucket = self._bucket_for(node, deletable) if scaled else self._bucket
            for pod, said in verdicts:
                for verdict in said:
                    try:
                        self._act(verdict, pod, node, since, down_for, bucket)
                    except ApiError as e:
                        log.warning(
                            "Could not %s pod %s on node %s, whose agent is down (%s): trying "
                            "again next pass.",
                            verdict,
                            _key(pod),
                            node,
                            e,
                        )

    def widespread(self, down: int) -> bool:
        """Whether `down` nodes' agents down at once is an outage rather than a node's loss:
        more than 2, and at least UNHEALTHY_FRACTION of the nodes with an agent."""
        return down > 2 and down >= UNHEALTHY_FRACTION * max(self._agents, down)

    def _bucket_for(self, node: str, deletable: int) -> TokenBucket:
        """The node's deletions: `deletable` pods within --agent-down-replace-seconds, at least
        --agent-down-deletions-per-second; a pass's worth held, and a fifth more for a pass
        that runs late, so the last deletions come a pass before the time is up."""
        rate = max(self._bucket.rate, deletable / self._replace_seconds)
        bucket = self._node_buckets.get(node)
        if bucket is None or bucket.rate < rate:
            bucket = TokenBucket(rate, self._clock, burst=rate * PERIOD_SECONDS * 1.2)
            self._node_buckets[node] = bucket
        return bucket

    def _act(
        self,
        verdict: Verdict,
        pod: Mapping[str, Any],
        node: str,
        since: float,
        down_for: float,
        bucket: TokenBucket,
    ) -> None:
        metadata = pod.get("metadata") or {}
        namespace, name, uid = metadata["namespace"], metadata["name"], metadata.get("uid", "")
        grace = self.rules.grace_seconds
        if verdict == "fail":
            self._fail(pod, node, since)
            return
        if verdict == "mark":
            when = rfc3339(datetime.fromtimestamp(since, UTC))
            then = (
                f"; it is deleted, for its controller to replace it elsewhere, if the agent is "
                f"still down {grace:.0f} s after that"
                if grace > 0
                else ""
            )
            message = (
                f"the tritonshare agent of node {node} has not renewed its Lease since {when}: "
                f"nothing installs, reloads or reports this pod's model there (the node gateway "
                f"may still serve it for its grace){then}"
            )
            self._kube.set_pod_condition(namespace, name, self._condition(pod, "Unknown", message))
            self._tell(namespace, name, uid, message)
            log.warning("Pod %s/%s: %s.", namespace, name, message)
            return
        if not bucket.take():
            return  # the next pass: --agent-down-replace-seconds, --agent-down-deletions-per-second
        self._kube.delete_pod(namespace, name, uid)
        self.deleted.append(f"{namespace}/{name}")
        self._kube.record_event(
            namespace,
            name,
            uid,
            reason=EVENT_REASON,
            message=(
                f"deleted: the tritonshare agent of node {node} has been down for "
                f"{down_for:.0f} s (--agent-down-grace {grace:g}); its controller replaces it"
            ),
            reporting_instance=self._identity,
        )
        log.warning(
            "Deleted pod %s/%s: the agent of node %s has been down for %.0f s (grace %g s); its "
            "controller replaces it on a node with a live agent.",
            namespace,
            name,
            node,
            down_for,
            grace,
        )

    def _fail(self, pod: Mapping[str, Any], node: str, since: float) -> None:
        metadata = pod.get("metadata") or {}
        namespace, name, uid = metadata["namespace"], metadata["name"], metadata.get("uid", "")
        when = rfc3339(datetime.fromtimestamp(since, UTC))
        said = loader_message(pod)
        message = (
            f"the tritonshare agent of node {node} has not renewed its Lease since {when}, so "
            f"nothing there can load this pod's model; the pod is failed for its controller to "
            f"replace it on a node with a live agent" + (f" (its loader: {said})" if said else "")
        )
        self._kube.fail_pod(
            namespace, name, REASON, message, self._condition(pod, "False", message)
        )
        self.failed.append(f"{namespace}/{name}")
        self._tell(namespace, name, uid, message)
        log.warning("Failed pod %s/%s: %s.", namespace, name, message)

    def _condition(self, pod: Mapping[str, Any], status: str, message: str) -> JsonObject:
        """The pod's model condition saying its node's agent is gone."""
        old = find((pod.get("status") or {}).get("conditions"), self.rules.condition_type)
        return condition_for(Condition(self.rules.condition_type, status, REASON, message), old)

    def _tell(self, namespace: str, name: str, uid: str, message: str) -> None:
        """The pod's Warning Event `EVENT_REASON` with `message`."""
        self._kube.record_event(
            namespace,
            name,
            uid,
            reason=EVENT_REASON,
            message=message,
            reporting_instance=self._identity,
        )


def loader_message(pod: Mapping[str, Any]) -> str:
    """The termination message of the pod's last failed init container (the loader says why it
    gave up there), or ''."""
    status = pod.get("status") or {}
    for container in status.get("initContainerStatuses") or []:
        for state in ("state", "lastState"):
            ended = ((container.get(state) or {}).get("terminated")) or {}
            if ended.get("exitCode") and ended.get("message"):
                return " ".join(str(ended["message"]).split())[:300]
    return ""


def _key(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"
