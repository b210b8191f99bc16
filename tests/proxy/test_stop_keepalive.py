"""A stopping proxy tells its keep-alive REST clients to reconnect instead of closing their
connections under them. After the drain, a client that keeps sending on its connection (as one
does between a Service's endpoints changing and its next connection) gets each request answered,
the last one with `Connection: close`, never a connection closed before its answer. The proxy as
a real process, the real Triton, http.client as the tenant."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sim.triton import TritonServer, free_port

pytestmark = pytest.mark.triton
ROOT = Path(__file__).resolve().parents[2]
BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
).encode()


def wait_until(predicate: Callable[[], bool], what: str, within: float) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"{what} did not happen within {within:g} s"
        time.sleep(0.02)


def _ready(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/v2/health/ready")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def test_a_stopping_proxy_answers_keep_alive_clients_with_connection_close(
    served_triton: TritonServer,
) -> None:
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    process = subprocess.Popen(
        [
            sys.executable, "-m", "proxy",
            "--model-id", "add_one",
            "--triton-http-url", served_triton.http_url,
            "--triton-grpc-url", served_triton.grpc_url,
            "--listen-http", f"127.0.0.1:{http_port}",
            "--listen-grpc", f"127.0.0.1:{grpc_port}",
            "--listen-metrics", f"127.0.0.1:{metrics_port}",
            "--drain-seconds", "0.5",
            "--finish-timeout", "10",
        ],
        cwd=ROOT,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    answers: list[str] = []
    done = threading.Event()

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", http_port, timeout=10)
        try:
            while not done.is_set():
                try:
                    connection.request("POST", "/v2/models/add_one/infer", BODY)
                    answer = connection.getresponse()
                    answer.read()
                except (OSError, http.client.HTTPException) as e:
                    answers.append(f"{type(e).__name__}: {e}")
                    return
                answers.append(f"{answer.status} {answer.getheader('Connection') or ''}".strip())
                if answer.getheader("Connection") == "close":
                    return
                time.sleep(0.05)
        finally:
            connection.close()

    thread = threading.Thread(target=client)
    try:
        wait_until(lambda: _ready(http_port), "the proxy ready", 60)
        thread.start()
        wait_until(lambda: bool(answers), "a first answer", 30)
        process.send_signal(signal.SIGTERM)
        thread.join(30)
        assert not thread.is_alive()
        assert answers[-1] == "200 close", answers[-3:]
        assert all(answer == "200" for answer in answers[:-1]), answers
    finally:
        done.set()
        thread.join(10)
        process.terminate()
        process.wait(30)
