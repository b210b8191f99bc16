"""A model Deployment follows its traffic: KServe's concurrency experiment, short.

Through the simulated cluster with a real Triton and a real Prometheus (`sim.demo.autoscale`, the
demo's step): a ScaledObject with target concurrency 1 on the proxies' concurrency integral, three
clients sending back to back, Prometheus scraping every second and the HPA syncing every two.
The Deployment must reach three Ready replicas, each placed by the binder, loaded by the agent and
answering; no request may fail while it scales up, nor while it scales back to one replica
(the scaled-down pods drain)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.cluster import SimCluster
from sim.demo import autoscale
from sim.demo.scenario import MODELS_DIR, NODES
from sim.triton import TritonInstall
from tests.conftest import require_executable

NAMESPACE = "models"


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    with SimCluster(tmp_path / "cluster", [NODES[0]], binders=1, webhook=True) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


@pytest.mark.slow
@pytest.mark.triton
def test_a_deployment_scales_out_under_load_and_back_with_no_failed_request(
    cluster: SimCluster, tmp_path: Path
) -> None:
    result = autoscale.run(
        cluster,
        MODELS_DIR / "add_one",
        tmp_path / "autoscale",
        NAMESPACE,
        require_executable("prometheus"),
        clients=3,
        duration=20.0,
        max_replicas=3,
        sync_period=2.0,
        scrape_interval="1s",
        scale_down_window=4,
        settle=0.0,
    )
    assert result.peak_ready == 3, (result.timeline, result.cold_starts, result.hpa_status)
    assert result.failed == [], result.failed[:5]
    assert result.scaled_down_to == 1, result.timeline
    assert result.scale_down_failed == [], result.scale_down_failed[:5]
    assert result.scale_down_requests > 0
    # Every new replica went through every phase, in order, and answered.
    assert len(result.cold_starts) >= 2
    for phases in result.cold_starts:
        assert list(phases) == list(autoscale.PHASES) or set(phases) == set(autoscale.PHASES)
        assert phases["bound"] <= phases["loaded"] <= phases["ready"] <= phases["first answer"]
