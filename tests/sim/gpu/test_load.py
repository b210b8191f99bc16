"""The simulated GPUs' model memory (sim/gpu/load.py) when the API server is away: the GPUs keep
their last state, as a real GPU's memory does not depend on it, so the agent reading the mock
NVML sees no error of the API server's."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import kubernetes.client
import pytest

from sim.gpu.load import ModelFootprints


class _Index(BaseHTTPRequestHandler):
    """Triton's repository index, with nothing loaded."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"[]")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def triton() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_an_unreachable_api_server_leaves_the_memory_as_it_was(tmp_path: Path, triton: str) -> None:
    configuration = kubernetes.client.Configuration()
    holder = socket.socket()  # held, never listened on: refused, and no other server takes it
    holder.bind(("127.0.0.1", 0))
    configuration.host = f"http://127.0.0.1:{holder.getsockname()[1]}"
    configuration.retries = 0
    api = kubernetes.client.ApiClient(configuration)
    try:
        footprints = ModelFootprints(triton, tmp_path, api, "node-a", {"GPU-0": 0}, cache_seconds=0)
        footprints._cached = (-1e9, {0: 1 << 30})  # what it last read
        assert footprints() == {0: 1 << 30}
    finally:
        api.close()  # type: ignore[no-untyped-call]
        holder.close()
