"""TritonModels from buckets end to end on the simulated cluster with the real processes: one from
`s3://` (moto's S3 API server, IAM authentication on) with its keys in the Secret `storageSecret`
names and the S3 endpoint in KServe's s3-* annotations, as a model pod takes them, and one from
`gs://` (the GCS emulator, which the host's loader finds through STORAGE_EMULATOR_HOST, as its
clients find the real service through their identity). The host's loader fetches each through
the clouds' libraries and loads it; each answers through its Service. A third names a Secret
whose key S3 refuses: its Ready condition says S3 refused that Secret's credential, without it."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import numpy as np
import pytest
import tritonclient.http as httpclient

from common.contract import Keys
from common.hosted import serves_label
from sim.cluster import SimCluster
from sim.demo.scenario import MODELS_DIR, NODES
from sim.processes import wait_until
from sim.service import Endpoints
from sim.triton import TritonInstall
from tests.buckets import S3, Gcs, archive, gcs_server, s3_server

NODE = NODES[0]
NAMESPACE = "team-s"
GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"
KEYS = Keys()
DATA = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)


@pytest.fixture
def buckets(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[S3, Gcs]]:
    with s3_server() as s3, gcs_server() as gcs:
        # Before the cluster starts: its pods' processes inherit the environment.
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.host)
        yield s3, gcs


@pytest.fixture
def cluster(
    tmp_path: Path, triton_install: TritonInstall, buckets: tuple[S3, Gcs]
) -> Iterator[SimCluster]:
    # The test's model is Python (tenant code): the namespace is let run it.
    with SimCluster(
        tmp_path / "cluster", [NODE], binders=1, webhook=True, tenant_code_namespaces=(NAMESPACE,)
    ) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


def _renamed(name: str, target: Path) -> Path:
    """add_one's files, its config naming `name` (a TritonModel's name is its model id)."""
    shutil.copytree(MODELS_DIR / "add_one", target, ignore=shutil.ignore_patterns("__pycache__"))
    config = target / "config.pbtxt"
    config.write_text(re.sub(r'^name: ".*"', f'name: "{name}"', config.read_text(), count=1))
    return target


def _model(name: str, uri: str, secret: str = "", **annotations: str) -> dict[str, Any]:
    spec = {"storageUri": uri, "gpuMemory": "1Gi", "replicas": 1, "maxConcurrency": 4}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TritonModel",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {**spec, **({"storageSecret": secret} if secret else {})},
    }


def _status(custom: Any, name: str) -> dict[str, Any]:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
    return dict(obj.get("status") or {})


def _fetch_failed(custom: Any, name: str) -> dict[str, Any] | None:
    conditions = {c["type"]: c for c in _status(custom, name).get("conditions") or []}
    ready: dict[str, Any] = conditions.get("Ready") or {}
    return ready if ready.get("reason") == "FetchFailed" else None


def _answer(address: str, model: str) -> list[list[float]]:
    with httpclient.InferenceServerClient(f"{address}:9000") as http:
        tensor = httpclient.InferInput("INPUT0", list(DATA.shape), "FP32")
        tensor.set_data_from_numpy(DATA)
        result = http.infer(model, [tensor])
        assert result.get_response()["model_name"] == model
        answer: list[list[float]] = result.as_numpy("OUTPUT0").tolist()
        return answer


@pytest.mark.slow
@pytest.mark.triton
def test_tritonmodels_from_s3_and_gcs_are_fetched_by_their_host_and_served(
    cluster: SimCluster, buckets: tuple[S3, Gcs], tmp_path: Path
) -> None:
    s3, gcs = buckets
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    from_s3 = s3.put_model("models", "triton/from-s3", _renamed("from-s3", tmp_path / "s3"))
    gcs.put("models", "archives/from-gs.tar.gz", archive(_renamed("from-gs", tmp_path / "gs")))
    keys = {"AWS_ACCESS_KEY_ID": s3.key_id, "AWS_SECRET_ACCESS_KEY": s3.secret}
    for name, data in (("s3-creds", keys), ("bad-creds", {**keys, "AWS_SECRET_ACCESS_KEY": "x"})):
        core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": name}, "stringData": data})
    endpoint = {"tritonshare.io/s3-endpoint": s3.endpoint, "tritonshare.io/s3-usehttps": "0"}
    models = [
        _model("from-s3", from_s3, "s3-creds", **endpoint),
        _model("from-gs", "gs://models/archives/from-gs.tar.gz"),
        _model("refused", from_s3, "bad-creds", **endpoint),
    ]
    for body in models:
        custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, body)

    assert cluster.kube is not None
    for name in ("from-s3", "from-gs"):
        wait_until(
            f"{name}'s replica ready",
            lambda name=name: _status(custom, name).get("readyReplicas") == 1,  # type: ignore[misc]
            150,
        )
        with Endpoints(cluster.kube, NAMESPACE, f"{serves_label(KEYS, name)}=true") as service:
            address = wait_until(f"{name}'s Service endpoint", service.pick, 30)
        assert _answer(address, name) == [[2.0, 3.0, 4.0]], name

    refused = wait_until(
        "the refused model's Ready saying why", partial(_fetch_failed, custom, "refused"), 60
    )
    assert "S3 refused the credential of Secret bad-creds" in refused["message"], refused
    assert s3.secret not in refused["message"]
    assert not _status(custom, "refused").get("readyReplicas")
