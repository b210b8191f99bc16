"""Mirror pods (`sim.node.mirrorpods`) through the official client against the simulated API
server: the pods the cluster runs as processes listed in the system namespace with their
containers' state and restarts, made again when deleted, a node pod's deletion replacing its
processes under a new name, and never run by a kubelet."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from sim.apiserver import RunningApiServer
from sim.node.kubelet import is_mirror
from sim.node.mirrorpods import Mirror, MirrorPods
from sim.processes import wait_until
from tests.fixtures_sim import core_v1

NS = "tritonshare-system"
TEMPLATE = {
    "metadata": {"labels": {"app.kubernetes.io/name": "tritonshare-node"}},
    "spec": {"containers": [{"name": "agent", "image": "x"}, {"name": "gateway", "image": "x"}]},
}
NODE = Mirror("node/gpu-1", "tritonshare-node", TEMPLATE, "gpu-1", None, replaceable=True)


class Processes:
    def __init__(self) -> None:
        self.states = {"agent": (True, 0), "gateway": (True, 0)}
        self.replaced: list[str] = []

    def state(self, mirror: Mirror) -> dict[str, tuple[bool, int]]:
        return dict(self.states)

    def replace(self, mirror: Mirror) -> None:
        self.replaced.append(mirror.node)


@pytest.fixture
def processes() -> Processes:
    return Processes()


@pytest.fixture
def mirrors(apiserver: RunningApiServer, processes: Processes) -> Iterator[MirrorPods]:
    api = apiserver.api_client()
    running = MirrorPods(
        api,
        NS,
        lambda: [NODE],
        processes.state,
        processes.replace,
        clock=apiserver.clock.now,
        period=0.1,
    )
    running.start()
    try:
        yield running
    finally:
        running.stop()
        api.close()  # type: ignore[no-untyped-call]


def listed(core: Any) -> list[Any]:
    return [p for p in core.list_namespaced_pod(NS).items if not p.metadata.deletion_timestamp]


def statuses(core: Any) -> dict[str, tuple[bool, int]] | None:
    pods = listed(core)
    if len(pods) != 1 or not pods[0].status.container_statuses:
        return None
    return {c.name: (c.ready, c.restart_count) for c in pods[0].status.container_statuses}


def test_a_process_run_pod_is_listed_with_its_state_and_replaced_when_deleted(
    kube_api: kubernetes.client.ApiClient, mirrors: MirrorPods, processes: Processes
) -> None:
    core = core_v1(kube_api)
    wait_until("the mirror pod", lambda: statuses(core) == processes.states, 10)
    [pod] = listed(core)
    assert pod.metadata.name.startswith("tritonshare-node-")
    assert (pod.spec.node_name, pod.status.phase) == ("gpu-1", "Running")
    assert pod.metadata.labels["app.kubernetes.io/name"] == "tritonshare-node"
    assert is_mirror({"metadata": {"annotations": pod.metadata.annotations}})
    assert {c.type: c.status for c in pod.status.conditions}["Ready"] == "True"

    # A container that exited and was started again: its restarts; one down: not Ready.
    processes.states = {"agent": (True, 2), "gateway": (False, 0)}
    wait_until("the restarts shown", lambda: statuses(core) == processes.states, 10)
    [pod] = listed(core)
    assert {c.type: c.status for c in pod.status.conditions}["Ready"] == "False"

    # `kubectl delete pod`: the node pod is replaced, under a new name, as its DaemonSet does.
    processes.states = {"agent": (True, 0), "gateway": (True, 0)}
    core.delete_namespaced_pod(pod.metadata.name, NS)
    wait_until("the replacement", lambda: processes.replaced == ["gpu-1"], 10)

    def replaced() -> bool:
        pods = listed(core)
        return len(pods) == 1 and pods[0].metadata.name != pod.metadata.name

    wait_until("a new mirror pod", replaced, 10)
    wait_until("it runs", lambda: statuses(core) == processes.states, 10)
