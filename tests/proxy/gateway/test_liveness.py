"""The node gateway's liveness: /healthz fails once a listener stops accepting, so the kubelet
restarts a gateway that is alive but no longer reachable on a model port; it holds while the
gateway stops on purpose."""

from __future__ import annotations

import logging
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sim.triton import TritonServer
from tests.proxy.gateway.conftest import RunningGateway, gateway_settings, publish, running_gateway

pytestmark = pytest.mark.triton


def healthz(running: RunningGateway) -> tuple[int, str]:
    url = f"http://127.0.0.1:{running.gateway.ports['metrics']}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def failing_healthz(running: RunningGateway, within: float = 10.0) -> str:
    """The body of /healthz once it answers 503, polled until `within` seconds have passed."""
    deadline = time.monotonic() + within
    while (answer := healthz(running))[0] != 503:
        if time.monotonic() > deadline:
            raise AssertionError(f"/healthz still answers {answer} after {within:g} s")
        time.sleep(0.02)
    return answer[1]


def test_healthz_fails_once_a_listener_no_longer_listens(
    served_triton: TritonServer, table: Path, caplog: pytest.LogCaptureFixture
) -> None:
    publish(table)
    caplog.set_level(logging.ERROR, logger="proxy.gateway.app")
    with running_gateway(gateway_settings(served_triton, table)) as running:
        gateway = running.gateway
        port = gateway.ports["http"]
        assert healthz(running) == (200, "ok\n")

        # The REST port's socket stops listening under its accept loop: the port now refuses
        # every connection while the process runs on.
        gateway._sockets["http"].shutdown(socket.SHUT_RDWR)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=10).close()

        body = failing_healthz(running)
        assert body.startswith(f"the REST listener on 127.0.0.1:{port} stopped accepting: ")
        assert "gRPC" not in body
        assert healthz(running) == (503, body), "a listener that stopped stays down"
        ended = [r for r in caplog.records if "REST listener" in r.getMessage()]
        assert len(ended) == 1 and ended[0].levelno == logging.ERROR and ended[0].exc_info


def test_healthz_fails_once_an_accept_loop_ends_and_holds_while_stopping(
    served_triton: TritonServer, table: Path
) -> None:
    publish(table)
    with running_gateway(gateway_settings(served_triton, table)) as running:
        gateway = running.gateway
        assert healthz(running) == (200, "ok\n")

        running.loop.call_soon_threadsafe(gateway._accepting["grpc"].cancel)
        body = failing_healthz(running)
        port = gateway.ports["grpc"]
        assert body == (
            f"the gRPC listener on 127.0.0.1:{port} stopped accepting: "
            "its accept loop was cancelled\n"
        )

        async def stop_and_ask() -> list[str]:
            # Asked in the same turn as the stop: what /healthz says while the gateway stops.
            running._lifecycle.request_stop("the test is over")
            return gateway.not_alive()

        assert running.call(stop_and_ask()) == []
