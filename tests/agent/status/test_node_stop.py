"""Which model pods the node pod's stop takes out of their Services (`NodeStop.drain`), and how
long it waits: a pod whose controller has another pod Ready on another node leaves (the gateway's
table says so), a lone replica stays (nothing else would answer), and the drain ends as soon as
the leaving pods are unready. The whole path, with the real processes, is
tests/e2e/test_node_pod_drain.py."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Mapping
from typing import Any, cast

from agent.errors import AgentError
from agent.pods.nodepods import NodePods
from agent.pods.provenpods import PlacementVerifier
from agent.status.conditions import ModelConditions
from agent.status.stopping import LEAVING, NodeStop
from common.contract import Keys

NODE, OTHER = "gpu-a", "gpu-b"
KEYS = Keys()


def pod(name: str, node: str, controller: str, *, ready: bool = True) -> dict[str, Any]:
    """A model pod as the API returns it, owned by `controller` ('' none)."""
    owners = [{"kind": "ReplicaSet", "uid": controller, "controller": True}] if controller else []
    return {
        "metadata": {
            "namespace": "team",
            "name": name,
            "uid": f"uid-{name}",
            "ownerReferences": owners,
            "annotations": {KEYS.model_id: name.rpartition("-")[0]},
        },
        "spec": {"nodeName": node, "schedulerName": "tritonshare"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


class Conditions:
    """What the drain asks of `ModelConditions`: passes, and which pods read NodePodStopping."""

    def __init__(self) -> None:
        self.stopping = ""
        self.leaving: dict[str, str] = {}
        self.passes = 0

    async def sync(self, pods: object, triton_live: bool) -> None:
        self.passes += 1


def node_stop(
    pods: NodePods,
    listed: list[dict[str, Any]],
    left: list[Mapping[str, str]],
    conditions: Conditions | None = None,
) -> NodeStop:
    async def list_pods(namespace: str) -> list[dict[str, Any]]:
        if not listed:
            raise AgentError("the API server is down")
        return [p for p in listed if p["metadata"]["namespace"] == namespace]

    async def read_pod(namespace: str, name: str) -> dict[str, Any] | None:
        return None  # the node pod is gone: the stop drains

    stop = NodeStop(
        pods,
        cast(ModelConditions, conditions or Conditions()),
        read_pod,
        lambda: None,
        lambda: True,
        namespace="tritonshare-system",
        pod_name="node-pod",
        drain_seconds=5.0,
        unroute_seconds=0.0,
        list_pods=list_pods,
        leave_services=left.append,
    )
    stop.signalled(signal.SIGTERM)
    return stop


class Unproven:
    """No pod here has a proof: the drain's passes judge none."""

    def proven(self, pod: object) -> None:
        return None


def node_pods(*objs: dict[str, Any]) -> NodePods:
    pods = NodePods(
        cast(PlacementVerifier, Unproven()), read_pod_never, scheduler_name="tritonshare", keys=KEYS
    )
    pods.replace(list(objs))
    return pods


async def read_pod_never(namespace: str, name: str) -> dict[str, Any] | None:
    raise AssertionError("not read")


async def test_only_a_pod_with_a_ready_replica_elsewhere_leaves_and_the_drain_ends_with_it() -> (
    None
):
    replicated = pod("a-1", NODE, "rs-a")
    here = [replicated, pod("lone-1", NODE, "rs-lone"), pod("bare-1", NODE, "")]
    elsewhere = [
        pod("a-2", OTHER, "rs-a"),
        pod("lone-2", OTHER, "rs-lone", ready=False),  # not Ready: no replica to go to
    ]
    pods = node_pods(*here)
    left: list[Mapping[str, str]] = []
    conditions = Conditions()
    stop = node_stop(pods, here + elsewhere, left, conditions)

    async def unready_later() -> None:
        await asyncio.sleep(0.5)
        pods.apply("MODIFIED", pod("a-1", NODE, "rs-a", ready=False))

    began = time.monotonic()
    await asyncio.gather(stop.drain(), unready_later())
    assert left == [{"team/a-1": LEAVING}]
    # Its condition says why, from the first pass; no host's does (none is routed).
    assert conditions.leaving == {"team/a-1": LEAVING}
    assert conditions.passes >= 1 and conditions.stopping == ""
    # It waited for the pod to turn unready, and no longer.
    assert 0.4 < time.monotonic() - began < 3.0


async def test_a_replica_elsewhere_being_deleted_leaving_or_on_this_node_does_not_count() -> None:
    here = [pod("a-1", NODE, "rs-a"), pod("a-2", NODE, "rs-a")]
    going = pod("a-3", OTHER, "rs-a")
    going["metadata"]["deletionTimestamp"] = "2026-11-27T12:00:00Z"
    # Its own node pod stops too, and it said so first: the other Ready replica is leaving.
    leaving = pod("a-4", OTHER, "rs-a")
    leaving["status"]["conditions"].append(
        {"type": KEYS.model_loaded, "status": "False", "reason": "NodePodStopping"}
    )
    left: list[Mapping[str, str]] = []
    await node_stop(node_pods(*here), [*here, going, leaving], left).drain()
    assert left == []
    # Once it serves again, it counts.
    leaving["status"]["conditions"][-1].update(status="True", reason="ModelReady")
    await node_stop(node_pods(*here), [*here, going, leaving], left).drain()
    assert left == [{"team/a-1": LEAVING, "team/a-2": LEAVING}]


async def test_pods_that_cannot_be_listed_stay_in_their_services() -> None:
    left: list[Mapping[str, str]] = []
    await node_stop(node_pods(pod("a-1", NODE, "rs-a")), [], left).drain()
    assert left == []
