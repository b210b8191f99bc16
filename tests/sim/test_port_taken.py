"""A simulated cluster's node ports are chosen free, then bound by its processes a few seconds
later: a port another process takes in between (another test's cluster, a client connection)
makes the cluster choose its node ports again, not fail; so too the simulated Triton's own."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

import sim.triton
from sim.cluster import NodeSpec, SimCluster
from sim.processes import http_ok
from sim.triton import TritonInstall, TritonServer


def test_a_node_port_taken_before_the_gateway_binds_is_chosen_again(
    tmp_path: Path, triton_install: TritonInstall, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        held = taken.getsockname()[1]
        # The ports are chosen in NodePorts' order: the agent's, then the gateway's REST port.
        chosen: Iterator[int] = iter([0, held])
        free = SimCluster._free_node_port

        def choose(self: SimCluster) -> int:
            """The gateway's first REST port is one a listener already holds."""
            return next(chosen, 0) or free(self)

        monkeypatch.setattr(SimCluster, "_free_node_port", choose)
        node = NodeSpec("gpu-0", "1xT4", real=True)
        with SimCluster(tmp_path, [node], binders=1) as cluster:
            gateway = cluster.gateways["gpu-0"]
            assert held not in (gateway.http, gateway.grpc, gateway.metrics)
            assert http_ok(f"http://{gateway.address}:{gateway.metrics}/healthz")
    # The gateway's first start met the taken port (its log is appended to by each start).
    log = (tmp_path / "logs" / "gateway-gpu-0.log").read_text()
    assert "address already in use" in log.lower()


def test_a_triton_port_taken_before_triton_binds_is_chosen_again(
    tmp_path: Path, triton_install: TritonInstall, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Triton exits at once on a port in use (its metrics port, in one CI run): the simulated
    Triton picks its own ports again and starts."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        held = taken.getsockname()[1]
        # Picked in order http, grpc, metrics: the first metrics port is the one held.
        first: Iterator[int] = iter([0, 0, held])
        free = sim.triton.free_port

        def pick() -> int:
            return next(first, 0) or free()

        monkeypatch.setattr(sim.triton, "free_port", pick)
        models = tmp_path / "models"
        models.mkdir()
        server = TritonServer(models, log_path=tmp_path / "tritonserver.log").start()
        try:
            assert held != server.metrics_port
            assert http_ok(f"http://{server.http_url}/v2/health/live")
        finally:
            server.stop()
