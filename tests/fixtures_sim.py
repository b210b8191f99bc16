"""Pytest fixtures for the simulated cluster: a fresh in-memory API server per test.

`apiserver` is a `RunningApiServer` (stopped after the test), `kube_api` an official-client
`ApiClient` for it (closed after), `kubeconfig` the path of a kubeconfig file pointing at it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import pytest

from sim.apiserver import RunningApiServer, start_in_thread


@pytest.fixture
def apiserver() -> Iterator[RunningApiServer]:
    """A fresh simulated API server (namespaces default, kube-system, tritonshare-system)."""
    server = start_in_thread()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def kube_api(apiserver: RunningApiServer) -> Iterator[kubernetes.client.ApiClient]:
    """An official `kubernetes` ApiClient talking to `apiserver`."""
    client = apiserver.api_client()
    try:
        yield client
    finally:
        client.close()  # type: ignore[no-untyped-call]


@pytest.fixture
def kubeconfig(apiserver: RunningApiServer, tmp_path: Path) -> Path:
    """A kubeconfig file for `apiserver`, usable by `kubernetes.config.load_kube_config`."""
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig")
