"""The Service-style path (`sim.service.Endpoints`): a pod is an endpoint while it is Ready and
not being deleted, as a Service's ready endpoints are."""

from __future__ import annotations

from typing import Any

import kubernetes.client
import pytest

from sim.processes import wait_until
from sim.service import KUBE_PROXY_BURST_SYNCS, KUBE_PROXY_MIN_SYNC_SECONDS, Endpoints, RuleSyncs
from tests.fixtures_sim import core_v1


def _pod(core: Any, name: str, app: str = "web") -> None:
    core.create_namespaced_pod(
        "default",
        {
            "metadata": {"name": name, "labels": {"app": app}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]},
        },
    )


def _ready(core: Any, name: str, address: str, ready: bool = True) -> None:
    status = {
        "status": {
            "phase": "Running",
            "podIP": address,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        }
    }
    core.patch_namespaced_pod_status(name, "default", status)


def test_endpoints_are_the_ready_pods_not_being_deleted(
    kube_api: kubernetes.client.ApiClient,
) -> None:
    core = core_v1(kube_api)
    core.create_node({"metadata": {"name": "n1"}})
    for name in ("a", "b", "c"):
        _pod(core, name)
    _pod(core, "other", app="db")
    with Endpoints(kube_api, "default", "app=web") as endpoints:
        assert endpoints.pick() is None
        _ready(core, "a", "127.1.0.1")
        _ready(core, "b", "127.1.0.2")
        _ready(core, "c", "127.1.0.3", ready=False)
        _ready(core, "other", "127.1.0.9")
        wanted = ["127.1.0.1", "127.1.0.2"]
        wait_until("a and b ready", lambda: endpoints.addresses() == wanted, 10)
        assert {endpoints.pick() for _ in range(4)} == set(wanted)
        # Marked for deletion (graceful: the pod still runs and drains): no longer an endpoint.
        core.delete_namespaced_pod("a", "default")
        assert core.read_namespaced_pod("a", "default").metadata.deletion_timestamp
        wait_until("a gone from the endpoints", lambda: endpoints.addresses() == wanted[1:], 10)
        _ready(core, "b", "127.1.0.2", ready=False)
        wait_until("none ready", lambda: endpoints.addresses() == [], 10)


def test_kube_proxy_applies_changes_at_most_as_often_as_its_minimum_sync_period() -> None:
    """Two changes back to back are applied at once (kube-proxy's burst), a third waits for
    the next sync to accrue (1 s), and after a quiet period a change is applied at once."""
    syncs = RuleSyncs(KUBE_PROXY_MIN_SYNC_SECONDS, KUBE_PROXY_BURST_SYNCS, now=100.0)
    assert syncs.take(100.0) and syncs.take(100.1)
    assert not syncs.take(100.2)
    assert not syncs.take(100.9), "the third sync of a burst waits for its period"
    assert syncs.take(101.1)
    assert not syncs.take(101.2)
    assert syncs.take(110.0) and syncs.take(110.0), "a quiet period saves a full burst"
    assert not syncs.take(110.0)
    assert RuleSyncs(0.0, 1, now=0.0).take(0.0)


def test_a_minimum_sync_period_that_cannot_be_is_refused() -> None:
    with pytest.raises(ValueError, match="burst at least 1"):
        RuleSyncs(1.0, 0, now=0.0)
