"""Fixtures for the proxy's tests: one real Triton for the session, proxies on free ports.

The Triton serves the shipped add_one and identity models and the proxy's own test models
(tests/proxy/models): text_stream (decoupled, for generate_stream and ModelStreamInfer) and
sleepy (holds a request in flight). Tests of gRPC run once with each gRPC mode (`grpc_mode`). A
proxy runs in a thread with its own event loop, so both synchronous and asyncio clients can use
it, and is stopped (and its thread joined) after the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from proxy.app import Proxy, shutdown_seconds
from proxy.http2 import frames as f
from proxy.settings import Settings
from sim.triton import TritonInstall, TritonServer
from tests.conftest import copy_model
from tests.proxy.served import ServedInThread

PROXY_MODELS = Path(__file__).parent / "models"
SERVED_MODELS = ("add_one", "identity", "text_stream", "sleepy", "sleepy_sequence")


@pytest.fixture(scope="session")
def served_triton(
    tmp_path_factory: pytest.TempPathFactory, triton_install: TritonInstall
) -> Iterator[TritonServer]:
    """A real Triton with every test model loaded, shared by the proxy's tests."""
    repository = tmp_path_factory.mktemp("proxy-repository")
    copy_model("add_one", repository)
    copy_model("identity", repository)
    for name in ("text_stream", "sleepy"):
        shutil.copytree(PROXY_MODELS / name, repository / name)
    # sleepy with a sequence batcher: stateful, its calls never sent again unless marked so.
    stateful = repository / "sleepy_sequence"
    shutil.copytree(PROXY_MODELS / "sleepy", stateful)
    config = (stateful / "config.pbtxt").read_text().replace('"sleepy"', '"sleepy_sequence"')
    (stateful / "config.pbtxt").write_text(config + "sequence_batching { }\n")
    server = TritonServer(repository)
    server.start()
    try:
        for name in SERVED_MODELS:
            request = urllib.request.Request(
                f"http://{server.http_url}/v2/repository/models/{name}/load", method="POST"
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                assert response.status == 200, f"Triton did not load {name}"
        yield server
    finally:
        server.discard()


class RunningProxy(ServedInThread[Proxy]):
    """A Proxy serving from a background thread's event loop."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        super().__init__("proxy", partial(Proxy, settings), shutdown_seconds(settings))
        self.proxy = self.app

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.proxy.rest.port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.proxy.grpc.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy.metrics_server.port}/metrics"


def proxy_settings(triton: TritonServer, model_id: str = "add_one", **changes: Any) -> Settings:
    """Settings for a proxy in front of `triton` on free ports, with a quick shutdown."""
    settings = Settings(
        model_id=model_id,
        triton_http_url=triton.http_url,
        triton_grpc_url=triton.grpc_url,
        listen_http=("127.0.0.1", 0),
        listen_grpc=("127.0.0.1", 0),
        listen_metrics=("127.0.0.1", 0),
        drain_seconds=0.0,
        finish_timeout_seconds=5.0,
    )
    return replace(settings, **changes)


@contextlib.contextmanager
def running_proxy(settings: Settings) -> Iterator[RunningProxy]:
    """Run a proxy for the duration of the block."""
    running = RunningProxy(settings)
    try:
        yield running
    finally:
        running.stop()


GRPC_MODES = ("grpcio", "relay")


@pytest.fixture(params=GRPC_MODES)
def grpc_mode(request: pytest.FixtureRequest) -> str:
    """Each gRPC endpoint implementation (`--grpc-mode`): the test runs once with each."""
    mode: str = request.param
    return mode


@pytest.fixture
def proxy(served_triton: TritonServer, grpc_mode: str) -> Iterator[RunningProxy]:
    """A proxy for add_one in front of the shared Triton, in each gRPC mode."""
    with running_proxy(proxy_settings(served_triton, grpc_mode=grpc_mode)) as running:
        yield running


async def wait_until(predicate: Callable[[], bool], what: str, within: float = 20.0) -> None:
    """Poll `predicate` until it holds; fail saying `what` did not happen `within` seconds."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {within:g} s")
        await asyncio.sleep(0.02)


def data_frames(stream_id: int, data: bytes, end_stream: bool) -> bytes:
    """`data` as the DATA frames a client would send (at most 16 KiB each); END_STREAM on the
    last when asked."""
    if not data:
        return f.frame(f.DATA, f.END_STREAM, stream_id) if end_stream else b""
    out = []
    for pos in range(0, len(data), f.DEFAULT_MAX_FRAME):
        last = pos + f.DEFAULT_MAX_FRAME >= len(data)
        flags = f.END_STREAM if end_stream and last else 0
        out.append(f.frame(f.DATA, flags, stream_id, data[pos : pos + f.DEFAULT_MAX_FRAME]))
    return b"".join(out)
