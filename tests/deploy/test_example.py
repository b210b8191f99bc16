"""deploy/example runs as shipped: its model is one the agent accepts by default (ONNX Runtime, no
tenant code, no external data), the loader's checks pass, it answers as the simulated cluster's
add_one does, and it travels in the kustomization itself (no bucket, no credentials, no KEDA, no
cloud's node label). deploy/overlays/example-keda adds the ScaledObject and nothing else.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import json_format

from agent.errors import TenantCodeNotAllowedError
from agent.installs.modelconfig import ModelPolicy, parse_config
from agent.installs.onnxmodel import external_locations
from loader.validate import validate_model_directory
from sim.modelstore import ModelStore
from sim.tls import self_signed
from tests.conftest import require_executable
from tests.deploy.example_model import MODEL_FILE, build
from tests.deploy.rendering import DEPLOY, Obj, name_of, pod_spec, render
from tests.deploy.test_manifests import KEYS
from webhook.mutation import complete
from webhook.settings import Settings

MODEL_DIR = DEPLOY / "example" / "model"
DEMO_MODEL = DEPLOY.parent / "tests" / "models" / "add_one"


@pytest.fixture(scope="module")
def kubectl() -> str:
    return require_executable("kubectl")


def _the(objects: tuple[Obj, ...], kind: str, name: str) -> Obj:
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def test_the_committed_model_is_what_the_builder_builds() -> None:
    """Regenerate with `python -m tests.deploy.example_model`."""
    assert MODEL_FILE.read_bytes() == build()


def test_the_agent_accepts_the_model_by_default() -> None:
    """No --tenant-code-namespaces needed: the default policy of every node accepts it."""
    config = parse_config((MODEL_DIR / "config.pbtxt").read_text(), "add_one")
    assert config.backend == "onnxruntime"
    policy = ModelPolicy()
    policy.check_config(config, "add_one", "models", [1])
    policy.check_files("add_one", ["config.pbtxt", "1/model.onnx"], "models")
    assert list(external_locations(MODEL_FILE.read_bytes())) == []


def test_a_model_of_tenant_code_is_refused_by_default() -> None:
    """The check above can fail: the simulated cluster's Python add_one is refused by the same
    default policy (that is why the example does not use it)."""
    config = parse_config((DEMO_MODEL / "config.pbtxt").read_text(), "add_one")
    with pytest.raises(TenantCodeNotAllowedError, match="its own code"):
        ModelPolicy().check_config(config, "add_one", "models", [1])


def test_the_loader_accepts_the_model_directory() -> None:
    checked = validate_model_directory(MODEL_DIR, "add_one", 64 * 1024**2)
    assert checked.versions == (1,)
    assert {f.path for f in checked.files} == {"config.pbtxt", "1/model.onnx"}


def test_the_model_has_the_demo_models_inputs_and_outputs() -> None:
    """The same tensors, types, shapes and batching as tests/models/add_one, so a client of the
    demo's model calls the example's unchanged."""

    def interface(directory: Path) -> dict[str, object]:
        config = parse_config((directory / "config.pbtxt").read_text(), "add_one")
        as_dict = json_format.MessageToDict(config)
        return {k: as_dict.get(k) for k in ("name", "maxBatchSize", "input", "output")}

    assert interface(MODEL_DIR) == interface(DEMO_MODEL)


def test_the_example_ships_its_model_and_needs_nothing_else(kubectl: str) -> None:
    objects = render(kubectl, "example")
    assert {o["kind"] for o in objects} == {
        "Namespace",
        "ServiceAccount",
        "ConfigMap",
        "Deployment",
        "Service",
        "NetworkPolicy",
        "PodDisruptionBudget",
    }, "no custom resource (KEDA, ...) that a bare cluster lacks"
    config_map = _the(objects, "ConfigMap", "add-one-model")
    files = {k: v.encode() for k, v in config_map.get("data", {}).items()}
    files |= {k: base64.b64decode(v) for k, v in config_map.get("binaryData", {}).items()}
    deployment = _the(objects, "Deployment", "add-one")
    spec = pod_spec(deployment)
    assert spec is not None
    [source] = [v for v in spec["volumes"] if v["name"] == "model-source"]
    assert source["configMap"]["name"] == "add-one-model"
    # The volume lays the ConfigMap's keys out as the model directory, byte for byte.
    laid_out = {item["path"]: files[item["key"]] for item in source["configMap"]["items"]}
    assert laid_out == {
        p.relative_to(MODEL_DIR).as_posix(): p.read_bytes()
        for p in MODEL_DIR.rglob("*")
        if p.is_file()
    }
    model_id = deployment["spec"]["template"]["metadata"]["annotations"][KEYS.model_id]
    assert model_id == "add_one"
    for obj in objects:
        assert "://" not in str(pod_spec(obj) or ""), f"{name_of(obj)} fetches from outside"


def test_the_copy_makes_the_model_directory_the_loader_reads(kubectl: str, tmp_path: Path) -> None:
    """The model-files container's command, run on a tree shaped as the kubelet mounts a
    ConfigMap volume (each item a symlink through ..data), leaves a directory the loader
    accepts, with no trace of the ConfigMap's hidden entries."""
    cp = shutil.which("cp")
    if cp is None:
        pytest.skip("no cp on this machine")
    deployment = _the(render(kubectl, "example"), "Deployment", "add-one")
    spec = pod_spec(deployment)
    assert spec is not None
    [init] = [c for c in spec["initContainers"] if c["name"] == "model-files"]
    source, models = tmp_path / "mnt" / "source", tmp_path / "mnt" / "models"
    data = source / "..2026_01_01_00_00_00.000000000"
    (data / "1").mkdir(parents=True)
    shutil.copy(MODEL_DIR / "config.pbtxt", data / "config.pbtxt")
    shutil.copy(MODEL_FILE, data / "1" / "model.onnx")
    (source / "..data").symlink_to(data.name)
    (source / "config.pbtxt").symlink_to("..data/config.pbtxt")
    (source / "1").symlink_to("..data/1")
    models.mkdir()
    command = [a.replace("/mnt/", f"{tmp_path}/mnt/") for a in init["command"]]
    subprocess.run(command, check=True, timeout=30)
    checked = validate_model_directory(models, "add_one", 64 * 1024**2)
    assert {f.path for f in checked.files} == {"config.pbtxt", "1/model.onnx"}
    assert not any(p.is_symlink() for p in models.rglob("*"))
    assert (models / "1" / "model.onnx").read_bytes() == MODEL_FILE.read_bytes()


def test_the_model_served_from_a_web_server_reaches_the_loader(tmp_path: Path) -> None:
    """docs/deploy.md's way to serve your own model, with the example's: its directory as a
    .tar.gz on an HTTPS server (the simulated model store), a pod in the webhook's short form
    naming it, and the storage initializer the webhook writes (the simulated kubelet's stand-in
    for KServe's) fetching it; the loader accepts what arrives, byte for byte."""
    cert, key = self_signed(tmp_path / "tls")
    store = ModelStore(tmp_path / "store", cert, key)
    store.start()
    try:
        url = store.publish("add_one", MODEL_DIR)
        pod = {
            "metadata": {
                "name": "add-one",
                "namespace": "models",
                "labels": {"tritonshare.io/role": "model"},
                "annotations": {"tritonshare.io/model-uri": url, "tritonshare.io/gpu-mem": "1Gi"},
            },
            "spec": {"containers": []},
        }
        done = complete(pod, Settings())
        assert done["metadata"]["annotations"][KEYS.model_id] == "add_one"
        [initializer] = [
            c for c in done["spec"]["initContainers"] if c["name"] == "storage-initializer"
        ]
        source, target = initializer["args"]
        models = tmp_path / target.lstrip("/")
        base = {k: v for k, v in os.environ.items() if k != "SSL_CERT_FILE"}
        fetched = subprocess.run(
            [sys.executable, "-m", "sim.node.storage_initializer", source, str(models)],
            env={**base, "SSL_CERT_FILE": str(cert)},
            cwd=DEPLOY.parent,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        store.stop()
    assert fetched.returncode == 0, fetched.stderr
    checked = validate_model_directory(models, "add_one", 64 * 1024**2)
    assert {f.path for f in checked.files} == {"config.pbtxt", "1/model.onnx"}
    assert (models / "1" / "model.onnx").read_bytes() == MODEL_FILE.read_bytes()


def test_the_keda_overlay_adds_only_the_scaled_object(kubectl: str) -> None:
    plain = {name_of(o) for o in render(kubectl, "example")}
    scaled = render(kubectl, "overlays/example-keda")
    assert {name_of(o) for o in scaled} - plain == {"ScaledObject/models/add-one"}
    assert _the(scaled, "ScaledObject", "add-one")["spec"]["scaleTargetRef"]["name"] == "add-one"


def test_the_kserve_example_is_a_kustomization(kubectl: str) -> None:
    """`kubectl apply -k deploy/example/kserve` applies the runtime and the InferenceService in
    the example's namespace, with the release's image."""
    objects = render(kubectl, "example/kserve")
    assert sorted(o["kind"] for o in objects) == ["InferenceService", "ServingRuntime"]
    assert {o["metadata"]["namespace"] for o in objects} == {"models"}
    [runtime] = [o for o in objects if o["kind"] == "ServingRuntime"]
    assert [c["image"] for c in runtime["spec"]["containers"]] == [
        "ghcr.io/tritonshare/tritonshare:0.1.0"
    ]
