"""Outages and faults on demand: `pause()` refuses connections and `resume()` comes back on the
same port with every object and the watch history; armed faults answer 429 (with Retry-After)
or 5xx and change nothing; the audit log names each request's client connection."""

from __future__ import annotations

import socket
import time
from typing import Any

import kubernetes.client
import pytest

from sim.apiserver import Fault, RunningApiServer
from tests.fixtures_sim import core_v1, status_of


def refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_a_paused_server_refuses_connections_and_resumes_with_its_objects_and_history(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient
) -> None:
    core: Any = core_v1(kube_api)
    core.create_node({"metadata": {"name": "before"}})
    version = apiserver.resource_version
    port = apiserver.port
    apiserver.pause()
    assert apiserver.paused
    assert refuses_connections(port)
    apiserver.resume()
    assert apiserver.port == port
    assert [n.metadata.name for n in core.list_node().items] == ["before"]
    core.create_node({"metadata": {"name": "after"}})
    assert apiserver.resource_version > version
    # A watch from the version seen before the outage resumes: nothing is Gone.
    watched = core.list_node(
        watch=True, resource_version=str(version), timeout_seconds=1, _preload_content=False
    )
    assert b'"name":"after"' in watched.data


def test_armed_faults_answer_instead_of_the_server_and_change_nothing(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient
) -> None:
    core: Any = core_v1(kube_api)
    apiserver.faults.arm(Fault(429, times=1, verb="create", retry_after=3))
    apiserver.faults.arm(Fault(503, times=1, user_agent="someone-else"))
    with pytest.raises(kubernetes.client.ApiException) as refused:
        core.create_node({"metadata": {"name": "n"}})
    assert refused.value.status == 429
    headers: Any = refused.value.headers
    assert headers["Retry-After"] == "3"
    assert status_of(refused.value)["reason"] == "TooManyRequests"
    assert core.list_node().items == []  # unchanged, and the 503 is for another client
    core.create_node({"metadata": {"name": "n"}})  # the 429 was used up
    assert [r.code for r in apiserver.audit if r.resource == "nodes"] == [429, 200, 201]
    # A committed fault loses only the answer: the write is done.
    apiserver.faults.arm(Fault(503, times=1, verb="create", committed=True))
    with pytest.raises(kubernetes.client.ApiException) as lost:
        core.create_node({"metadata": {"name": "m"}})
    assert lost.value.status == 503
    assert sorted(n.metadata.name for n in core.list_node().items) == ["m", "n"]


def test_the_audit_log_names_the_client_connection(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient
) -> None:
    core: Any = core_v1(kube_api)
    for i in range(5):
        core.create_node({"metadata": {"name": f"n{i}"}})
    peers = {r.peer for r in apiserver.audit if r.resource == "nodes"}
    # The official client's pool reuses its connection for preloaded answers.
    assert len(peers) == 1
    assert next(iter(peers)).startswith("127.0.0.1:")


def test_a_slow_server_answers_every_call_late_until_set_back(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient
) -> None:
    core: Any = core_v1(kube_api)
    started = time.monotonic()
    core.list_node()
    prompt = time.monotonic() - started
    apiserver.slow(0.5)
    started = time.monotonic()
    core.create_node({"metadata": {"name": "late"}})
    core.list_node()
    assert time.monotonic() - started >= 1.0  # each of the two calls waited
    apiserver.slow(0)
    started = time.monotonic()
    assert [n.metadata.name for n in core.list_node().items] == ["late"]
    assert time.monotonic() - started < 0.5 + prompt
    with pytest.raises(ValueError, match="0 or more"):
        apiserver.slow(-1)
