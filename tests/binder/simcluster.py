"""Helpers for the binder's tests against the simulated API server: create nodes (with a live
agent lease) and pods through the official client, read back what the binder wrote, and poll
with a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import kubernetes.client
import pytest

from binder.app import Binder
from binder.settings import Settings
from common.lifecycle import Lifecycle
from sim.apiserver import RunningApiServer
from tests.binder.objects import lease_obj, node_obj, pod_obj
from tests.fixtures_sim import coordination_v1, core_v1

SYSTEM = "tritonshare-system"


class MakeBinder:
    """Starts binder replicas in this process, each under a lifecycle of its own (as
    `python -m binder` runs one), and stops them: `await make_binder(**settings)`."""

    def __init__(self, defaults: dict[str, Any]) -> None:
        self._defaults = defaults
        self._lifecycles: dict[Binder, Lifecycle] = {}

    async def __call__(self, **overrides: Any) -> Binder:
        values = {**self._defaults, "identity": f"binder-{len(self._lifecycles)}", **overrides}
        binder = Binder(Settings(**values))
        lifecycle = Lifecycle()
        self._lifecycles[binder] = lifecycle
        try:
            await binder.start(lifecycle)
        except BaseException:
            await self.stop(binder)
            raise
        return binder

    def lifecycle(self, binder: Binder) -> Lifecycle:
        return self._lifecycles[binder]

    async def stop(self, binder: Binder, *, release: bool = True) -> None:
        """Stop a replica in its documented order; release=False leaves the leader lease to
        expire, as a crashed replica would."""
        lifecycle = self._lifecycles[binder]
        binder.elector.release_on_stop = release
        lifecycle.request_stop("the test stops it")
        await lifecycle.shutdown()

    async def stop_all(self) -> None:
        for binder in self._lifecycles:
            await self.stop(binder)


async def eventually(check: Callable[[], Any], within: float = 30.0, what: str = "") -> Any:
    """Poll `check` until it returns something truthy, or fail after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {within} s waiting for {what or check}")
        await asyncio.sleep(0.05)


def add_node(kube_api: kubernetes.client.ApiClient, name: str, gpus: list[int], **kw: Any) -> None:
    core_v1(kube_api).create_node(node_obj(name, gpus, **kw))
    coordination_v1(kube_api).create_namespaced_lease(SYSTEM, lease_obj(name, time.time(), 3600))


def add_pod(core: Any, name: str, **kw: Any) -> None:
    obj = pod_obj(name, **kw)
    del obj["metadata"]["uid"], obj["metadata"]["creationTimestamp"]
    core.create_namespaced_pod(
        "default", {**obj, "metadata": {**obj["metadata"], "namespace": "default"}}
    )


def node_of(core: Any, name: str) -> str:
    return str(core.read_namespaced_pod(name, "default").spec.node_name or "")


def binder_writes(apiserver: RunningApiServer, name: str | None = None) -> list[Any]:
    return [
        r
        for r in apiserver.audit.writes(user_agent="tritonshare-binder/")
        if name is None or r.name == name or r.name.startswith(f"{name}.")
    ]


def scheduled_condition(core: Any, name: str) -> Any:
    pod = core.read_namespaced_pod(name, "default")
    for condition in pod.status.conditions or []:
        if condition.type == "PodScheduled":
            return condition
    return None


def failed_events(core: Any, name: str) -> list[Any]:
    events = core.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={name}"
    ).items
    return [e for e in events if e.reason == "FailedScheduling"]


def bound(core: Any, names: list[str]) -> dict[str, str]:
    return {name: node for name in names if (node := node_of(core, name))}


def failure(core: Any, name: str) -> str:
    events = failed_events(core, name)
    return str(events[-1].message) if events else ""
