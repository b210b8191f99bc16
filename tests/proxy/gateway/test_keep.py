"""The gateway under its keeper (`--keep-listening`, as the node pod runs it), real processes in
front of the real Triton: a killed gateway process leaves its ports listening, and the request
that came while none ran is answered by the next one; the exit is said and counted; SIGTERM
stops both and the ports then refuse; a gateway whose keeper is gone stops too."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import signal
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from common.keeper import STARTS_ENV
from proxy.gateway.keep import SOCKETS_ENV, Kept, kept
from proxy.settings import SettingsError
from sim.processes import wait_until
from sim.triton import TritonServer
from tests.proxy.gateway.conftest import caller, publish
from tests.proxy.gateway.test_inflate_attacks import GatewayProcess, serving

POD = "127.1.0.7"
INFER = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
).encode()


@pytest.fixture
def kept_gateway(served_triton: TritonServer, tmp_path: Path) -> Iterator[GatewayProcess]:
    table = tmp_path / "callers.json"
    publish(table, caller(POD, "add_one"))
    flags = ["--caller-table", str(table), "--table-max-age", "3600", "--keep-listening"]
    flags += ["--triton-http-url", served_triton.http_url]
    flags += ["--triton-grpc-url", served_triton.grpc_url]
    with serving("proxy.gateway", flags) as running:
        yield running


def infer(url: str) -> tuple[int, bytes]:
    """add_one's inference from the pod's address, on a connection of its own."""
    host, port = url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30, source_address=(POD, 0))
    try:
        connection.request("POST", "/v2/models/add_one/infer", body=INFER)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def served_by(keeper: psutil.Process) -> psutil.Process:
    """The gateway process the keeper runs now (its one child)."""

    def child() -> psutil.Process | None:
        children = [c for c in keeper.children() if c.status() != psutil.STATUS_ZOMBIE]
        return children[0] if len(children) == 1 else None

    found: psutil.Process = wait_until("the keeper's gateway process", child, 30)
    return found


def starts(metrics_url: str) -> float | None:
    try:
        with urllib.request.urlopen(metrics_url, timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    line = next(x for x in text.splitlines() if x.startswith("tritonshare_gateway_process_starts"))
    return float(line.split()[1])


def refuses(url: str) -> bool:
    host, port = url.split(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


@pytest.mark.triton
def test_a_killed_gateway_process_leaves_its_ports_listening_and_the_next_serves_what_came(
    kept_gateway: GatewayProcess,
) -> None:
    keeper = psutil.Process(kept_gateway.process.pid)
    first = served_by(keeper)
    assert infer(kept_gateway.http_url)[0] == 200

    # No gateway process accepts (the first is stopped, then killed): the request's connection
    # is queued by the kernel, not refused, and the next process answers it.
    first.suspend()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(infer, kept_gateway.http_url)
        grpc_port = kept_gateway.grpc_url.rpartition(":")[2]
        socket.create_connection(("127.0.0.1", int(grpc_port)), timeout=5).close()
        with pytest.raises(concurrent.futures.TimeoutError):
            answer.result(timeout=1.0)  # nothing serves it while the process is stopped
        first.kill()
        status, body = answer.result(timeout=30)
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [2, 3, 4]

    second = served_by(keeper)
    assert second.pid != first.pid and keeper.is_running()
    metrics = f"http://{kept_gateway.http_url.rpartition(':')[0]}:{metrics_port(second)}/metrics"
    assert wait_until("the second start counted", lambda: starts(metrics) == 2.0, 30)


def metrics_port(gateway: psutil.Process) -> int:
    """The metrics port from the gateway's command line."""
    argv = gateway.cmdline()
    return int(argv[argv.index("--listen-metrics") + 1].rpartition(":")[2])


@pytest.mark.triton
def test_sigterm_stops_the_gateway_and_its_keeper_and_the_ports_refuse(
    kept_gateway: GatewayProcess,
) -> None:
    process = kept_gateway.process
    gateway = served_by(psutil.Process(process.pid))
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    gateway.wait(10)
    assert refuses(kept_gateway.http_url) and refuses(kept_gateway.grpc_url)


@pytest.mark.triton
def test_a_gateway_whose_keeper_is_gone_stops(kept_gateway: GatewayProcess) -> None:
    process = kept_gateway.process
    gateway = served_by(psutil.Process(process.pid))
    process.kill()  # the keeper alone: its gateway is not signalled
    process.wait(10)
    gateway.wait(30)  # no longer its child: psutil waits without its status
    assert not gateway.is_running()
    assert refuses(kept_gateway.http_url)


def test_what_a_keeper_passes_is_read_and_anything_else_refused() -> None:
    assert kept({}) == Kept()
    with socket.socket() as http, socket.socket() as grpc:
        given = {SOCKETS_ENV: f"http={http.fileno()},grpc={grpc.fileno()},keeper=7"}
        read = kept({**given, STARTS_ENV: "3"})
        try:
            assert (read.keeper, read.starts) == (7, 3)
            assert {p: s.fileno() for p, s in read.listening.items()} == {
                "http": http.fileno(),
                "grpc": grpc.fileno(),
            }
        finally:
            for sock in read.listening.values():
                sock.detach()  # the test's own sockets close them
    for wrong in ("http=3,grpc=4", "http=3,grpc=4,keeper=x", "http=3;grpc=4;keeper=5"):
        with pytest.raises(SettingsError, match=SOCKETS_ENV):
            kept({SOCKETS_ENV: wrong})
