"""The simulated cluster restarts its node pods' containers as the kubelet would: a gateway that
exits is started again at once, and one whose liveness probe fails (the chart's GET /healthz,
every 10 s, 3 failures; here the process is stopped, so the probe times out) is killed and
started again, each time on the node's same ports, logged and counted."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.cluster import GatewayHandle, NodeSpec, SimCluster
from sim.processes import http_ok, wait_until
from sim.triton import TritonInstall

NODE = NodeSpec("gpu-0", "1xT4", real=True)
LIVENESS_SECONDS = 3 * 10 + 10 + 20
"""Three failed probes 10 s apart, the kill's grace (10 s), and room to start again."""


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    with SimCluster(tmp_path / "cluster", [NODE], binders=1) as running:
        yield running


def serving_again(cluster: SimCluster, old_pid: int) -> GatewayHandle | None:
    """The node's gateway, when a process other than `old_pid` runs it and its /healthz answers."""
    gateway = cluster.gateways.get(NODE.name)
    if gateway is None or gateway.process.process is None or not gateway.process.alive():
        return None
    if gateway.process.process.pid == old_pid:
        return None
    healthz = f"http://{gateway.address}:{gateway.metrics}/healthz"
    return gateway if http_ok(healthz) else None


def gateway_pid(cluster: SimCluster) -> int:
    gateway = cluster.gateways[NODE.name]
    assert gateway.process.process is not None and gateway.process.alive()
    return gateway.process.process.pid


@pytest.mark.slow
@pytest.mark.triton
def test_a_killed_gateway_is_started_again_on_its_ports(
    cluster: SimCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    before = cluster.gateways[NODE.name]
    pid = gateway_pid(cluster)
    os.killpg(pid, signal.SIGKILL)

    again = wait_until(
        "the gateway serving again", lambda: serving_again(cluster, pid), 20, cluster.log_tails
    )

    assert (again.http, again.grpc, again.metrics) == (before.http, before.grpc, before.metrics)
    assert cluster.restarts(NODE.name) == {"triton": 0, "agent": 0, "gateway": 1}
    [exit] = cluster.container_exits()
    assert (exit.node, exit.container, exit.returncode) == (NODE.name, "gateway", -signal.SIGKILL)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"{NODE.name}'s gateway" in m and "SIGKILL" in m for m in said), said

    # A restart the cluster makes on purpose is no crash.
    cluster.restart_node_container("gateway", NODE.name)
    assert cluster.restarts(NODE.name)["gateway"] == 1
    assert len(cluster.container_exits()) == 1


@pytest.mark.slow
@pytest.mark.triton
def test_a_hung_gateway_fails_its_liveness_probe_and_is_started_again(
    cluster: SimCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    pid = gateway_pid(cluster)
    os.killpg(pid, signal.SIGSTOP)
    try:
        wait_until(
            "the hung gateway replaced",
            lambda: serving_again(cluster, pid),
            LIVENESS_SECONDS,
            cluster.log_tails,
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGCONT)

    assert cluster.restarts(NODE.name)["gateway"] == 1
    [exit] = cluster.container_exits()
    assert exit.container == "gateway" and "liveness probe" in exit.reason
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"{NODE.name}'s gateway" in m and "liveness probe" in m for m in said), said
