"""The Kubernetes adapter against sim/: the pod watch keeps going across server-side watch
timeouts, sees only this node's pods and relists when its resourceVersion is too old (410
Expired); token reviews; its calls go over a few kept connections (the product's one door to the
API server), and a hanging server fails a call in time."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from agent.errors import KubeError
from agent.kube.client import WORKERS, KubeClient
from common.conditions import Condition
from sim.apiserver import RunningApiServer, start_in_thread
from sim.apiserver.faults import Fault
from sim.apiserver.settings import ApiServerSettings
from tests.agent.conftest import NODE, eventually, make_pod
from tests.fixtures_sim import core_v1


async def test_the_pod_watch_survives_watch_timeouts_and_filters_by_node(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient, kubeconfig: Path
) -> None:
    make_pod(kube_api, "before", "m0")
    listed: list[list[str]] = []
    events: list[tuple[str, str]] = []

    def on_list(items: list[dict[str, Any]]) -> None:
        listed.append([i["metadata"]["name"] for i in items])

    def on_event(kind: str, obj: dict[str, Any]) -> None:
        events.append((kind, obj["metadata"]["name"]))

    kube = KubeClient(str(kubeconfig))
    watch = kube.watch_pods(NODE, on_list, on_event, timeout_seconds=1)
    try:
        await eventually(lambda: bool(listed), what="the first list")
        assert listed[0] == ["before"]
        # Outlive a few server-side watch timeouts (each one a new watch call) first.
        await eventually(
            lambda: sum(1 for r in apiserver.audit if r.verb == "watch") >= 3,
            what="the watch to be renewed after server-side timeouts",
        )
        make_pod(kube_api, "after", "m1")
        make_pod(kube_api, "other", "m2", node="another-node")
        kubernetes.client.CoreV1Api(kube_api).delete_namespaced_pod(
            "before", "default", grace_period_seconds=0
        )
        await eventually(
            lambda: ("ADDED", "after") in events and ("DELETED", "before") in events,
            what="the watch to report the new and the deleted pod",
        )
        assert all(name != "other" for _, name in events)
        assert len(listed) == 1, "a watch timeout resumes from its resourceVersion, no relist"
    finally:
        watch.stop()
        await kube.close()


def _watched(kube: KubeClient) -> tuple[Any, list[list[str]], list[tuple[str, str]]]:
    """The node's pod watch (1 s server-side timeouts), the names of each list it hands on,
    and each event's (kind, name)."""
    listed: list[list[str]] = []
    events: list[tuple[str, str]] = []
    watch = kube.watch_pods(
        NODE,
        lambda items: listed.append([i["metadata"]["name"] for i in items]),
        lambda kind, obj: events.append((kind, obj["metadata"]["name"])),
        timeout_seconds=1,
    )
    return watch, listed, events


async def test_the_pod_watch_relists_quietly_when_its_version_expired(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The server keeps 5 events and sends no bookmarks: ten pods created on another node (which
    this watch never sees) push its resourceVersion out of the history, so its next watch gets
    410 Expired; the watch lists again at once, without the warning and back-off of a failure,
    and goes on reporting this node's pods."""
    caplog.set_level(logging.WARNING, logger="agent.kube.client")
    settings = ApiServerSettings(history_size=5, bookmark_interval_seconds=3600)
    server = start_in_thread(settings=settings)
    api = server.api_client()
    kube = KubeClient(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
    watch, listed, events = _watched(kube)
    try:
        await eventually(lambda: bool(listed), what="the first list")
        make_pod(api, "before", "m0")
        await eventually(lambda: ("ADDED", "before") in events, what="the first pod's event")
        for n in range(10):
            make_pod(api, f"elsewhere-{n}", "m1", node="another-node")
        await eventually(lambda: len(listed) >= 2, what="a relist after 410 Expired")
        assert listed[0] == [] and listed[1] == ["before"]
        make_pod(api, "after", "m2")
        await eventually(lambda: ("ADDED", "after") in events, what="the new pod's event")
        assert all(not name.startswith("elsewhere") for _, name in events)
        assert not [r for r in caplog.records if "failed" in r.getMessage()], caplog.text
    finally:
        watch.stop()
        await kube.close()
        api.close()  # type: ignore[no-untyped-call]
        server.stop()


async def test_token_review_reports_the_pod_of_a_projected_token(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient, kubeconfig: Path
) -> None:
    pod = make_pod(kube_api, "p", "m")
    token = apiserver.mint_token("default", "p")
    kube = KubeClient(str(kubeconfig))
    try:
        review = await kube.review_token(token, "tritonshare-agent")
        wrong = await kube.review_token(token, "another-audience")
        missing = await kube.get_pod("default", "nope")
    finally:
        await kube.close()
    assert review.authenticated
    assert review.username == "system:serviceaccount:default:default"
    assert review.extra["authentication.kubernetes.io/pod-uid"] == [pod["metadata"]["uid"]]
    assert not wrong.authenticated and "audience" in wrong.error
    assert missing is None


async def test_a_hanging_api_server_fails_a_call_after_the_timeout_not_never(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient, kubeconfig: Path
) -> None:
    """A call that gets no answer ends with KubeError, so the lease loop and the other
    callers on the agent's few API threads go on (the API server held it 30 s)."""
    make_pod(kube_api, "p", "m")
    # Every attempt hangs (urllib3 repeats a GET whose answer timed out).
    apiserver.faults.arm(Fault(503, times=100, resource="pods", verb="get", delay_seconds=30))
    kube = KubeClient(str(kubeconfig), request_timeout=(1.0, 0.5))
    try:
        started = time.monotonic()
        with pytest.raises(KubeError, match="unreachable while trying to read pod default/p"):
            await kube.get_pod("default", "p")
        assert time.monotonic() - started < 10
        apiserver.faults.clear()
        assert await kube.get_pod("default", "p") is not None
    finally:
        await kube.close()


async def test_the_agents_calls_go_over_a_few_kept_connections_with_its_own_user_agent(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient, kubeconfig: Path
) -> None:
    """Condition writes, reads and Events, several at once, reuse the adapter's connections
    (at most one per worker thread), each request named as the agent's."""
    make_pod(kube_api, "p", "m")
    kube = KubeClient(str(kubeconfig))
    try:
        for i in range(25):
            status = "True" if i % 2 else "False"
            await asyncio.gather(
                kube.set_pod_condition("default", "p", Condition("example.io/c", status, "R", "")),
                kube.get_pod("default", "p"),
                kube.record_pod_event(
                    "default", "p", "uid-p", component="tritonshare-agent", reason="R", message="m"
                ),
            )
    finally:
        await kube.close()
    calls = [r for r in apiserver.audit.snapshot() if r.user_agent.startswith("tritonshare-agent/")]
    writes = [r for r in calls if r.is_write]
    assert len([w for w in writes if w.resource == "pods"]) == 25, writes
    assert len([w for w in writes if w.resource == "events"]) == 25  # one create, 24 counts
    assert len(calls) == 75
    # At most one connection per worker thread (and one the server closed, opened again).
    assert len({c.peer for c in calls}) <= WORKERS + 1, sorted({c.peer for c in calls})
    events = core_v1(kube_api).list_namespaced_event("default").items
    assert [(e.reason, e.count) for e in events] == [("R", 25)]


async def test_the_pod_watch_and_the_calls_come_back_after_an_api_server_outage(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    kubeconfig: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """While the API server refuses connections a call fails as unreachable and the watch
    retries; once it is back, calls answer and the watch reports what happened meanwhile."""
    caplog.set_level(logging.WARNING, logger="agent.kube.client")
    kube = KubeClient(str(kubeconfig), request_timeout=(1.0, 2.0))
    watch, listed, events = _watched(kube)
    try:
        await eventually(lambda: bool(listed), what="the first list")
        apiserver.pause()
        with pytest.raises(KubeError, match="unreachable while trying to read pod default/p"):
            await kube.get_pod("default", "p")
        # The outage ended the watch: it tries again while the server is away.
        await eventually(
            lambda: "Watching this node's pods failed" in caplog.text,
            what="the watch to retry during the outage",
        )
        apiserver.resume()
        make_pod(kube_api, "p", "m")
        await eventually(
            lambda: ("ADDED", "p") in events or any("p" in names for names in listed[1:]),
            what="the watch to see the pod made after the outage",
        )
        assert await kube.get_pod("default", "p") is not None
    finally:
        watch.stop()
        await kube.close()
