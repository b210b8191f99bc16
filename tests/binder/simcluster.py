"""Helpers for the binder's tests against the simulated API server: create nodes (with a live
agent lease) and pods through the official client, read back what the binder wrote, and poll
with a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import kubernetes.client
import pytest

from binder.app import Binder
from sim.apiserver import RunningApiServer
from tests.binder.objects import lease_obj, node_obj, pod_obj
from tests.fixtures_sim import coordination_v1, core_v1

MakeBinder = Callable[..., Awaitable[Binder]]
SYSTEM = "tritonshare-system"


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
