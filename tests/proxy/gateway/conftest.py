"""Fixtures for the node gateway's tests: a gateway in a thread, in front of the real Triton.

The caller table is written by the test, as the agent would write it (the agent's own side is
tested in tests/agent/pods/test_gateway_table.py). Clients pick the pod they play by the source
address they connect from: any address of 127.0.0.0/8 is local on Linux.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from common.callers import Caller, CallerTable, write_table
from proxy.gateway.app import Gateway, shutdown_seconds
from proxy.gateway.settings import GatewaySettings
from sim.triton import TritonServer
from tests.proxy.served import ServedInThread

NODE = "gpu-node-1"


def caller(address: str, model_id: str, pod: str = "") -> Caller:
    return Caller(address, model_id, pod or f"team/{model_id}-pod", f"uid-{address}")


def publish(path: Path, *callers: Caller, written_at: float | None = None) -> None:
    """Write the caller table as the agent does."""
    write_table(path, CallerTable(NODE, time.time() if written_at is None else written_at, callers))


class RunningGateway(ServedInThread[Gateway]):
    """A Gateway serving from a background thread's event loop."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        super().__init__("gateway", partial(Gateway, settings), shutdown_seconds(settings))
        self.gateway = self.app

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.gateway.ports['http']}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.gateway.ports['grpc']}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway.ports['metrics']}/metrics"


def gateway_settings(triton: TritonServer, table: Path, **changes: Any) -> GatewaySettings:
    settings = GatewaySettings(
        caller_table=table,
        triton_http_url=triton.http_url,
        triton_grpc_url=triton.grpc_url,
        listen_http=("127.0.0.1", 0),
        listen_grpc=("127.0.0.1", 0),
        listen_metrics=("127.0.0.1", 0),
        table_poll_seconds=0.02,
        finish_timeout_seconds=5.0,
    )
    return replace(settings, **changes)


@contextlib.contextmanager
def running_gateway(settings: GatewaySettings) -> Iterator[RunningGateway]:
    running = RunningGateway(settings)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def table(tmp_path: Path) -> Path:
    return tmp_path / "gateway" / "callers.json"
