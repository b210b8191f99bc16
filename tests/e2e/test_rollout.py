"""A Deployment of a model rolls to new model files with no failed request.

Through the simulated cluster with a real Triton (`sim.demo.rollout`, the demo's step): the
Deployment (Kubernetes' default strategy: surge 25% of 1 rounds up to 1, unavailable rounds down
to 0) has as many replicas as nodes that can take its model, one. Its template is the short form
tritonshare's webhook completes; the release changes the model URI annotation to other files of
the same model id. The controller manager creates the new revision's pod beside the old one, the
binder places it on the same node (another revision), the agent loads it, and the old pod goes
once the new one is available. A client sends steadily through the Service-style path (the
ready endpoints) all along: no request may fail, and the answers move from the old files' to
the new files'."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sim.cluster import SimCluster
from sim.demo import rollout
from sim.demo.scenario import MODELS_DIR, NODES
from sim.triton import TritonInstall

NAMESPACE = "models"
NODE = NODES[0]


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    with SimCluster(tmp_path / "cluster", [NODE], binders=1, webhook=True) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


@pytest.mark.slow
@pytest.mark.triton
def test_a_deployment_rolls_to_new_model_files_with_no_failed_request(
    cluster: SimCluster, tmp_path: Path
) -> None:
    result = rollout.roll(cluster, MODELS_DIR / "add_one", tmp_path, NAMESPACE)
    # The surge pod, a new revision, joined the old one on the only node.
    assert result.surge_node == result.old_node == NODE.name
    assert result.stuck == "", result.stuck
    assert result.finished
    assert result.failures == [], result.failures[:5]
    assert result.answers == [str(rollout.OLD_ANSWER), str(rollout.NEW_ANSWER)]
    assert result.answers_after == [str(rollout.NEW_ANSWER)]
    assert result.requests >= 30
