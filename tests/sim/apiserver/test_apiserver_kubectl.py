"""`kubectl get` against the simulated API server prints the real server's columns, quietly.

The real kubectl binary asks for the Table form: TritonModels print their CRD's printer columns,
pods their status and (`-o wide`) IP, node, nominated node and readiness gates, events their
last-seen, type, reason, object and message. Discovery advertises only what is served, so no
call warns about an API group it cannot read. `kubectl apply` (which asks for Strict field
validation) is refused an unknown field in the API server's words, and `kubectl explain` reads
the TritonModel schema from the OpenAPI v3 documents.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import pytest

from sim.apiserver import ApiServerSettings, RunningApiServer, start_in_thread
from tests.conftest import require_executable
from tests.deploy.rendering import CHART, DEPLOY
from tests.fixtures_sim import core_v1


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    server: RunningApiServer = start_in_thread(settings=ApiServerSettings(crds=(CHART / "crds",)))
    api = server.api_client()
    try:
        _populate(api)
        yield server.write_kubeconfig(tmp_path_factory.mktemp("kubectl") / "kubeconfig")
    finally:
        api.close()  # type: ignore[no-untyped-call]
        server.stop()


def _populate(api: kubernetes.client.ApiClient) -> None:
    custom = kubernetes.client.CustomObjectsApi(api)
    model = {
        "apiVersion": "tritonshare.io/v1alpha1",
        "kind": "TritonModel",
        "metadata": {"name": "resnet"},
        "spec": {"storageUri": "s3://models/resnet", "gpuMemory": "2Gi", "replicas": 3},
    }
    custom.create_namespaced_custom_object(
        "tritonshare.io", "v1alpha1", "default", "tritonmodels", model
    )
    custom.patch_namespaced_custom_object_status(
        "tritonshare.io",
        "v1alpha1",
        "default",
        "tritonmodels",
        "resnet",
        {
            "status": {
                "replicas": 3,
                "readyReplicas": 2,
                "gpuMemory": {"source": "Declared", "booked": "2Gi", "measured": "1800Mi"},
                "conditions": [
                    {"type": "Placed", "status": "True", "reason": "AllReplicasPlaced"},
                    {
                        "type": "Ready",
                        "status": "False",
                        "reason": "ModelInvalid",
                        "message": "2 of 3 replicas ready; replica 2 on gpu-1: ModelInvalid",
                    },
                ],
            }
        },
    )
    core = core_v1(api)
    pod = {
        "metadata": {"name": "model-0"},
        "spec": {
            "nodeName": "gpu-1",
            "containers": [{"name": "proxy", "image": "tritonshare"}],
            "readinessGates": [{"conditionType": "tritonshare.io/model-loaded"}],
        },
    }
    core.create_namespaced_pod("default", pod)
    core.patch_namespaced_pod_status(
        "model-0",
        "default",
        {
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.7",
                "conditions": [{"type": "tritonshare.io/model-loaded", "status": "True"}],
                "containerStatuses": [
                    {
                        "name": "proxy",
                        "ready": True,
                        "restartCount": 2,
                        "image": "tritonshare",
                        "imageID": "",
                        "state": {"running": {"startedAt": "2026-11-25T00:00:00Z"}},
                    }
                ],
            }
        },
    )
    core.create_namespaced_event(
        "default",
        {
            "metadata": {"name": "model-0.1"},
            "involvedObject": {"kind": "Pod", "name": "model-0", "namespace": "default"},
            "type": "Warning",
            "reason": "ModelNotLoaded",
            "message": "the model's files are missing on gpu-1",
            "source": {"component": "tritonshare-agent"},
            "count": 1,
        },
    )


def _kubectl(kubeconfig: Path, *args: str) -> list[list[str]]:
    result = subprocess.run(
        [require_executable("kubectl"), *args],
        env=dict(os.environ, KUBECONFIG=str(kubeconfig)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", f"kubectl {' '.join(args)} warned: {result.stderr}"
    return [line.split() for line in result.stdout.splitlines()]


def _kubectl_refused(kubeconfig: Path, *args: str) -> str:
    """What kubectl says on stderr when the command fails (it must fail)."""
    result = subprocess.run(
        [require_executable("kubectl"), *args],
        env=dict(os.environ, KUBECONFIG=str(kubeconfig)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stdout
    return result.stderr


def test_kubectl_get_tritonmodels_prints_the_crd_columns(kubeconfig: Path) -> None:
    message = "2 of 3 replicas ready; replica 2 on gpu-1: ModelInvalid"
    for args in (["tritonmodels"], ["tm"], ["tm", "-o", "wide"]):
        # The Ready condition's message is a column of its own, wide or not.
        header, row = _kubectl(kubeconfig, "get", *args)
        assert header == [
            "NAME",
            "READY",
            "REPLICAS",
            "GPU-MEM",
            "MEASURED",
            "RESIDENCY",
            "REASON",
            "AGE",
            "MESSAGE",
        ]
        assert row[:7] == ["resnet", "2", "3", "2Gi", "1800Mi", "always", "ModelInvalid"]
        assert " ".join(row[8:]) == message


def test_kubectl_get_pods_wide_prints_the_pod_columns(kubeconfig: Path) -> None:
    header, row = _kubectl(kubeconfig, "get", "pods", "-o", "wide")
    assert " ".join(header) == (
        "NAME READY STATUS RESTARTS AGE IP NODE NOMINATED NODE READINESS GATES"
    )
    assert row[:4] == ["model-0", "1/1", "Running", "2"]
    assert row[5:] == ["10.0.0.7", "gpu-1", "<none>", "1/1"]
    header, _ = _kubectl(kubeconfig, "get", "pods")
    assert header == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]


def test_kubectl_get_events_prints_the_event_columns(kubeconfig: Path) -> None:
    header, row = _kubectl(kubeconfig, "get", "events")
    assert " ".join(header) == "LAST SEEN TYPE REASON OBJECT MESSAGE"
    assert row[1:] == [
        "Warning",
        "ModelNotLoaded",
        "pod/model-0",
        *["the", "model's", "files", "are", "missing", "on", "gpu-1"],
    ]


def test_kubectl_finds_every_advertised_group_without_warnings(kubeconfig: Path) -> None:
    rows = _kubectl(kubeconfig, "api-resources")
    names = {row[0] for row in rows[1:]}
    assert {"tritonmodels", "pods", "events", "customresourcedefinitions"} <= names
    _kubectl(kubeconfig, "get", "nodes,namespaces,deployments,crds")
    everything = _kubectl(kubeconfig, "get", "all")
    assert everything[1][:4] == ["pod/model-0", "1/1", "Running", "2"]
    assert _kubectl(kubeconfig, "get", "tritonshare", "-o", "name")[0] == [
        "tritonmodel.tritonshare.io/resnet"
    ]


def test_kubectl_scales_a_tritonmodel_and_watches_it_change(
    kubeconfig: Path, tmp_path: Path
) -> None:
    manifest = tmp_path / "model.yaml"
    manifest.write_text(
        "apiVersion: tritonshare.io/v1alpha1\nkind: TritonModel\nmetadata:\n  name: watched\n"
        "spec:\n  storageUri: s3://models/watched\n  gpuMemory: 512Mi\n  residency: on-demand\n"
    )
    (said,) = _kubectl(kubeconfig, "apply", "-f", str(manifest))
    assert said == ["tritonmodel.tritonshare.io/watched", "created"]
    watching = subprocess.Popen(
        [require_executable("kubectl"), "get", "tm", "watched", "--watch"],
        env=dict(os.environ, KUBECONFIG=str(kubeconfig)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    guard = threading.Timer(60, watching.kill)  # a hung watch fails the test, never blocks it
    guard.start()
    try:
        assert watching.stdout is not None
        header, first = watching.stdout.readline().split(), watching.stdout.readline().split()
        assert header[:6] == ["NAME", "READY", "REPLICAS", "GPU-MEM", "MEASURED", "RESIDENCY"]
        # No binder here: no status, so Ready, GPU-Mem (as booked) and Measured print empty.
        assert first[:3] == ["watched", "1", "on-demand"]
        (said,) = _kubectl(kubeconfig, "scale", "tm", "watched", "--replicas=4")
        assert said == ["tritonmodel.tritonshare.io/watched", "scaled"]
        assert watching.stdout.readline().split()[:3] == ["watched", "4", "on-demand"]
    finally:
        guard.cancel()
        watching.kill()
        watching.communicate()
    manifest.write_text(manifest.read_text().replace("on-demand", "sometimes"))
    refused = _kubectl_refused(kubeconfig, "apply", "-f", str(manifest))
    assert 'spec.residency: Unsupported value: "sometimes": supported values: "always",' in (
        refused
    )


def test_kubectl_apply_refuses_an_unknown_field_in_the_servers_words(
    kubeconfig: Path, tmp_path: Path
) -> None:
    manifest = tmp_path / "typo.yaml"
    manifest.write_text(
        "apiVersion: tritonshare.io/v1alpha1\nkind: TritonModel\nmetadata:\n  name: typo\n"
        "spec:\n  storageUri: s3://models/typo\n  gpuMemory: 1Gi\n  replica: 3\n"
    )
    refused = _kubectl_refused(kubeconfig, "apply", "-f", str(manifest))
    assert refused == (
        f'Error from server (BadRequest): error when creating "{manifest}": TritonModel in version'
        ' "v1alpha1" cannot be handled as a TritonModel: strict decoding error: unknown field'
        ' "spec.replica"\n'
    )
    # --validate=false sends Ignore: the field is dropped and the model created.
    (said,) = _kubectl(kubeconfig, "apply", "--validate=false", "-f", str(manifest))
    assert said == ["tritonmodel.tritonshare.io/typo", "created"]
    # On an existing model, apply's merge patch is refused in the patch's words.
    refused = _kubectl_refused(kubeconfig, "apply", "-f", str(manifest))
    assert refused.rstrip().endswith(
        f'for: "{manifest}": error when patching "{manifest}": strict decoding error:'
        ' unknown field "spec.replica"'
    )


def test_kubectl_explain_prints_the_tritonmodel_spec_fields(kubeconfig: Path) -> None:
    result = subprocess.run(
        [require_executable("kubectl"), "explain", "tritonmodel.spec"],
        env=dict(os.environ, KUBECONFIG=str(kubeconfig)),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr
    lines = result.stdout.splitlines()
    assert lines[:3] == [
        "GROUP:      tritonshare.io",
        "KIND:       TritonModel",
        "VERSION:    v1alpha1",
    ]
    assert "FIELD: spec <Object>" in lines
    fields = {
        line.split()[0]: line.split()[1:]
        for line in lines
        if line.startswith("  ") and "\t" in line
    }
    assert fields["storageUri"] == ["<string>", "-required-"]
    assert fields["replicas"] == ["<integer>"]
    assert fields["tolerations"] == ["<[]Object>"]
    assert {"gpuMemory", "residency", "modelName", "affinity"} <= fields.keys()
    (line,) = (i for i, text in enumerate(lines) if text.startswith("  storageUri"))
    assert lines[line + 1].strip().startswith("Where the model's files are")
    top = subprocess.run(
        [require_executable("kubectl"), "explain", "tm"],
        env=dict(os.environ, KUBECONFIG=str(kubeconfig)),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "metadata\t<ObjectMeta>" in top and "spec\t<Object> -required-" in top


def test_kubectl_apply_k_deploy_kserve_crds_creates_the_crds_and_their_roles(
    tmp_path: Path,
) -> None:
    """docs/modelmesh.md's step for a cluster without KServe, run twice as a user may: the
    roles are stored (never enforced), so kubectl finds their kind and exits 0."""
    server: RunningApiServer = start_in_thread(settings=ApiServerSettings(crds=(CHART / "crds",)))
    try:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        created = _kubectl(kubeconfig, "apply", "-k", str(DEPLOY / "kserve-crds"))
        assert ["clusterrole.rbac.authorization.k8s.io/tritonshare-kserve-edit", "created"] in (
            created
        )
        again = _kubectl(kubeconfig, "apply", "-k", str(DEPLOY / "kserve-crds"))
        assert {said[-1] for said in again} == {"unchanged"}, again
        roles = _kubectl(kubeconfig, "get", "clusterroles", "-o", "name")
        assert [r[0] for r in roles] == [
            "clusterrole.rbac.authorization.k8s.io/tritonshare-kserve-edit",
            "clusterrole.rbac.authorization.k8s.io/tritonshare-kserve-view",
        ]
        assert _kubectl(kubeconfig, "get", "inferenceservices", "-A", "-o", "name") == []
    finally:
        server.stop()
