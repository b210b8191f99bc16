"""docs/deploy.md's kustomize walkthrough, pasted in order: the overlay of "Build and push the
image", then the patches for a Prometheus outside `monitoring` with another release name. The
blocks run as written in a directory beside `deploy/` (a link to this tree), `kubectl apply -k`
swapped for `kubectl kustomize`, and what they render is checked: the image, every monitoring
object selected by the new release and namespace."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest
import yaml

from tests.conftest import require_executable
from tests.deploy.rendering import REPO

DOC = REPO / "docs" / "deploy.md"


def _block(starting: str) -> str:
    """The first `sh` block of docs/deploy.md whose text starts with `starting`."""
    for block in re.findall(r"^```sh\n(.*?)^```", DOC.read_text(), re.S | re.M):
        if block.startswith(starting):
            return str(block)
    raise AssertionError(f"docs/deploy.md has no sh block starting {starting!r}")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    kubectl = require_executable("kubectl")
    workdir = tmp_path_factory.mktemp("walkthrough")
    (workdir / "deploy").symlink_to(REPO / "deploy")
    overlay = _block("mkdir -p my-cluster\n")
    patches = _block("cat >> my-cluster/kustomization.yaml")
    assert "kubectl apply -k my-cluster" in patches
    script = "set -e\n" + overlay + patches.replace("kubectl apply -k", f"{kubectl} kustomize")
    done = subprocess.run(
        ["bash", "-c", script], cwd=workdir, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def test_the_overlay_deploys_the_pushed_image(rendered: list[dict[str, Any]]) -> None:
    images = {
        c["image"]
        for o in rendered
        if o["kind"] in ("Deployment", "DaemonSet")
        for c in o["spec"]["template"]["spec"]["containers"]
        if "tritonshare" in c["image"]
    }
    assert images == {"registry.example.com/tritonshare:0.1.0"}


def test_every_monitoring_object_is_selected_by_the_new_release(
    rendered: list[dict[str, Any]],
) -> None:
    monitors = [o for o in rendered if o["kind"] in ("PodMonitor", "PrometheusRule")]
    assert len(monitors) == 4
    releases = {o["metadata"]["name"]: o["metadata"]["labels"]["release"] for o in monitors}
    assert set(releases.values()) == {"prometheus"}, releases


def test_prometheus_namespace_is_admitted_and_gets_the_dashboard(
    rendered: list[dict[str, Any]],
) -> None:
    [dashboard] = [o for o in rendered if o["metadata"]["name"] == "tritonshare-grafana-dashboard"]
    assert dashboard["metadata"]["namespace"] == "observability"
    policies = {
        o["metadata"]["name"]: yaml.safe_dump(o["spec"])
        for o in rendered
        if o["kind"] == "NetworkPolicy"
    }
    for name in ("tritonshare-node", "tritonshare-binder"):
        assert "observability" in policies[name] and "monitoring" not in policies[name], name
