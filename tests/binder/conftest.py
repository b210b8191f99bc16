"""Fixtures of the binder's tests against the simulated API server: binder replicas started
in-process (stopped after the test) and an official-client CoreV1Api."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from tests.binder.simcluster import MakeBinder
from tests.fixtures_sim import PlacementKeys, core_v1


@pytest.fixture
async def make_binder(kubeconfig: Path, placement_keys: PlacementKeys) -> AsyncIterator[MakeBinder]:
    replicas = MakeBinder(
        {
            "kubeconfig": str(kubeconfig),
            "placement_key_dir": placement_keys.directory,
            "listen_http": ("127.0.0.1", 0),
            "leader_elect": False,
            "backoff_initial_seconds": 0.2,
            "backoff_max_seconds": 0.8,
            "lease_duration_seconds": 2.0,
            "renew_deadline_seconds": 1.5,
            "retry_period_seconds": 0.2,
            # Their GPU arithmetic counts requests alone; test_process_allowance.py adds the
            # per-process allowance.
            "gpu_mem_process_allowance": 0,
        }
    )
    yield replicas
    await replicas.stop_all()


@pytest.fixture
def core(kube_api: kubernetes.client.ApiClient) -> Any:
    return core_v1(kube_api)
