"""A private registry: every image the manifests and the chart name, in a container's `image:` or
anywhere else (a flag, a variable), follows a kustomize overlay's `images:` and the chart's
values. Nothing rendered may still point at the public registries, or a pod the binder or the
webhook writes pulls an image the cluster cannot reach."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import require_executable
from tests.deploy.rendering import DEPLOY, containers, pod_spec, render_chart

MIRROR = "registry.example.internal"
# The public images the release names, without tags: an overlay moves each to the mirror.
PUBLIC = (
    "ghcr.io/tritonshare/tritonshare",
    "nvcr.io/nvidia/tritonserver",
    "kserve/storage-initializer",
)
# The folders under base/ are the base's parts (the node DaemonSet and its per-GPU-count copies),
# and those under an overlay its own (a pool's node DaemonSet), which only the base or the overlay
# installs, with its images.
EVERY_KUSTOMIZATION = sorted(
    str(k.parent.relative_to(DEPLOY))
    for k in DEPLOY.rglob("kustomization.yaml")
    if k.parent.parent != DEPLOY / "base"
    and k.parent.parent.parent not in (DEPLOY / "base", DEPLOY / "overlays")
)
GPU_ACCESS = ("devicePlugin", "dra", "env")


@pytest.fixture(scope="module")
def kubectl() -> str:
    return require_executable("kubectl")


def strings(value: Any) -> Iterator[str]:
    """Every string in a rendered object, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def unmoved(objects: Any) -> list[str]:
    """The strings that still name a public image outside the mirror."""
    left = []
    for text in strings(objects):
        for image in PUBLIC:
            if image in text.replace(f"{MIRROR}/{image}", ""):
                left.append(text)
    return left


def mirrored(kubectl: str, tmp_path: Path, kustomization: str) -> list[Any]:
    """`kubectl kustomize` of an overlay of deploy/<kustomization> whose `images:` moves every
    public image to the mirror, as docs/deploy.md's overlay does."""
    if not (tmp_path / "deploy").exists():
        (tmp_path / "deploy").symlink_to(DEPLOY)  # kustomize takes no absolute base
    overlay = {
        "resources": [f"../deploy/{kustomization}"],
        "images": [{"name": image, "newName": f"{MIRROR}/{image}"} for image in PUBLIC],
    }
    (tmp_path / "my-cluster").mkdir(exist_ok=True)
    (tmp_path / "my-cluster" / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    rendered = subprocess.run(
        [kubectl, "kustomize", str(tmp_path / "my-cluster")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    return [doc for doc in yaml.safe_load_all(rendered.stdout) if doc]


@pytest.mark.parametrize("kustomization", EVERY_KUSTOMIZATION)
def test_an_overlays_images_reach_every_image_a_kustomization_names(
    kubectl: str, tmp_path: Path, kustomization: str
) -> None:
    objects = mirrored(kubectl, tmp_path, kustomization)
    assert not unmoved(objects), f"deploy/{kustomization} keeps public images: {unmoved(objects)}"
    # The overlay moved what it names, so a new public image the release adds must join PUBLIC.
    for obj in objects:
        for container in containers(pod_spec(obj) or {}):
            assert container["image"].startswith(f"{MIRROR}/"), container["image"]


def test_the_binder_and_the_webhook_write_the_mirrored_images(kubectl: str, tmp_path: Path) -> None:
    """What the binder writes into model hosts and the webhook into model pods is the mirror's
    image, with the release's tag: the variables the binary reads, as the overlay left them."""
    objects = mirrored(kubectl, tmp_path, "overlays/production") + mirrored(
        kubectl, tmp_path, "webhook"
    )
    env = {
        (obj["metadata"]["name"], var["name"]): var.get("value")
        for obj in objects
        for container in containers(pod_spec(obj) or {})
        for var in container.get("env", [])
    }
    release = f"{MIRROR}/ghcr.io/tritonshare/tritonshare:0.1.0"
    assert env[("tritonshare-binder", "TRITONSHARE_HOST_IMAGE")] == release
    assert env[("tritonshare-webhook", "TRITONSHARE_IMAGE")] == release
    assert env[("tritonshare-webhook", "TRITONSHARE_STORAGE_INITIALIZER_IMAGE")] == (
        f"{MIRROR}/kserve/storage-initializer:v0.14.1"
    )


@pytest.mark.parametrize("gpu_access", GPU_ACCESS)
def test_the_charts_image_values_reach_every_image_it_names(gpu_access: str) -> None:
    values = {
        "image": {"repository": f"{MIRROR}/{PUBLIC[0]}"},
        "triton": {"image": {"repository": f"{MIRROR}/{PUBLIC[1]}"}},
        "node": {"gpuAccess": gpu_access},
        "webhook": {"enabled": True, "storageInitializerImage": f"{MIRROR}/{PUBLIC[2]}:v0.14.1"},
        "example": {
            "enabled": True,
            "storageUri": "s3://models/add_one",
            "storageInitializerImage": f"{MIRROR}/{PUBLIC[2]}:v0.14.1",
            "keda": {"enabled": True},
        },
    }
    objects = render_chart(values, include_crds=True)
    assert not unmoved(objects), f"the chart keeps public images: {unmoved(objects)}"
