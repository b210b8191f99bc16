"""A completed model pod's storage initializer gets the credentials its annotations name, as
KServe's credential builder gives them (a Secret's AWS keys and the s3-* settings for s3://, the
Secret's key file for gs://), and nothing else gets them: the loader and the proxy, which talk
to the shared node, never see a storage credential. Names that could reach outside the pod's
namespace, and credentials a scheme cannot use, are refused with what to write instead."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from webhook.mutation import AnnotationError, complete
from webhook.settings import Settings, parse_settings

SETTINGS = Settings()
URI, MEM, SECRET = (
    "tritonshare.io/model-uri",
    "tritonshare.io/gpu-mem",
    "tritonshare.io/storage-secret",
)


def pod(**annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "m",
            "namespace": "models",
            "labels": {"tritonshare.io/role": "model"},
            "annotations": {MEM: "1Gi", **annotations},
        },
        "spec": {"schedulerName": "default-scheduler", "containers": []},
    }


def _initializer(done: dict[str, Any]) -> dict[str, Any]:
    found: list[dict[str, Any]] = [
        c for c in done["spec"]["initContainers"] if c["name"] == "storage-initializer"
    ]
    assert len(found) == 1
    return found[0]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _others_see_no_secret(done: dict[str, Any]) -> None:
    spec = done["spec"]
    for container in spec["initContainers"] + spec["containers"]:
        if container["name"] == "storage-initializer":
            continue
        assert "secretKeyRef" not in str(container), f"{container['name']} reads the Secret"
        assert "envFrom" not in container
        mounts = {m["name"] for m in container.get("volumeMounts", [])}
        assert "storage-secret" not in mounts, f"{container['name']} mounts the Secret"


def test_an_s3_secret_and_kserves_s3_settings_reach_the_storage_initializer_only() -> None:
    done = complete(
        pod(
            **{
                URI: "s3://models/triton/add_one",
                SECRET: "s3-creds",
                "tritonshare.io/s3-endpoint": "minio.data:9000",
                "tritonshare.io/s3-usehttps": "0",
                "tritonshare.io/s3-verifyssl": "0",
                "tritonshare.io/s3-region": "eu-west-1",
            }
        ),
        SETTINGS,
    )
    kubernetes_validate.validate(done, "1.30.0", strict=True)
    env = _env(_initializer(done))
    assert env["AWS_ACCESS_KEY_ID"] == {
        "secretKeyRef": {"name": "s3-creds", "key": "AWS_ACCESS_KEY_ID"}
    }, "required: a Secret without the key fails the pod at start, saying so"
    assert env["AWS_SECRET_ACCESS_KEY"] == {
        "secretKeyRef": {"name": "s3-creds", "key": "AWS_SECRET_ACCESS_KEY"}
    }
    assert env["AWS_SESSION_TOKEN"]["secretKeyRef"]["optional"] is True
    assert env["S3_ENDPOINT"] == "minio.data:9000"
    assert env["AWS_ENDPOINT_URL"] == "http://minio.data:9000"
    assert env["S3_USE_HTTPS"] == "0" and env["S3_VERIFY_SSL"] == "0"
    assert env["AWS_REGION"] == env["AWS_DEFAULT_REGION"] == "eu-west-1"
    assert not any("secret" in v for v in done["spec"]["volumes"]), "s3 needs no Secret volume"
    _others_see_no_secret(done)
    assert complete(done, SETTINGS) == done


def test_an_endpoint_is_https_unless_the_pod_says_otherwise() -> None:
    done = complete(
        pod(**{URI: "s3://models/m", "tritonshare.io/s3-endpoint": "s3.eu-west-1.amazonaws.com"}),
        SETTINGS,
    )
    env = _env(_initializer(done))
    assert env["AWS_ENDPOINT_URL"] == "https://s3.eu-west-1.amazonaws.com"
    assert "AWS_ACCESS_KEY_ID" not in env, "no Secret named: the pod's own identity (IRSA)"


def test_a_gcs_secret_is_mounted_in_the_storage_initializer_only() -> None:
    done = complete(pod(**{URI: "gs://models/triton/add_one", SECRET: "gcs-creds"}), SETTINGS)
    kubernetes_validate.validate(done, "1.30.0", strict=True)
    [volume] = [v for v in done["spec"]["volumes"] if v["name"] == "storage-secret"]
    assert volume == {"name": "storage-secret", "secret": {"secretName": "gcs-creds"}}
    initializer = _initializer(done)
    mount = {"name": "storage-secret", "mountPath": "/var/secrets/storage", "readOnly": True}
    assert mount in initializer["volumeMounts"]
    assert _env(initializer) == {
        "GOOGLE_APPLICATION_CREDENTIALS": "/var/secrets/storage/gcloud-application-credentials.json"
    }
    _others_see_no_secret(done)
    assert complete(done, SETTINGS) == done


@pytest.mark.parametrize("uri", ["s3://models/m", "gs://models/m"])
def test_without_a_secret_the_pods_own_identity_is_left_to_work(uri: str) -> None:
    """IRSA and GKE Workload Identity: the ServiceAccount carries the role; the webhook adds no
    credential and no volume."""
    initializer = _initializer(complete(pod(**{URI: uri}), SETTINGS))
    assert "env" not in initializer
    assert {m["name"] for m in initializer["volumeMounts"]} == {"model", "tmp"}


@pytest.mark.parametrize(
    ("annotations", "says"),
    [
        # A Secret of another namespace, or a path: only a name of the pod's own namespace.
        ({URI: "s3://b/m", SECRET: "kube-system/aws"}, "is not a Secret name"),
        ({URI: "s3://b/m", SECRET: "../aws"}, "is not a Secret name"),
        ({URI: "s3://b/m", SECRET: ""}, "is not a Secret name"),
        ({URI: "pvc://claim/m", SECRET: "creds"}, "needs no storage credential"),
        ({URI: "https://h/m.tar.gz", SECRET: "creds"}, "use a pre-signed URL"),
        ({URI: "gs://b/m", "tritonshare.io/s3-endpoint": "x:9000"}, "s3:// models only"),
        ({URI: "s3://b/m", "tritonshare.io/s3-usehttps": "false"}, 'must be "1" or "0"'),
        (
            {URI: "s3://b/m", "tritonshare.io/s3-endpoint": "http://minio:9000"},
            "without a scheme",
        ),
        ({URI: "s3://b/m", "tritonshare.io/s3-region": "EU West"}, "not an AWS region"),
    ],
)
def test_storage_annotations_that_cannot_work_are_refused(
    annotations: dict[str, str], says: str
) -> None:
    with pytest.raises(AnnotationError) as e:
        complete(pod(**annotations), SETTINGS)
    assert says in str(e.value)


def test_the_storage_keys_follow_the_prefix() -> None:
    settings = parse_settings(["--key-prefix", "seldon.io/trtis-"], {})
    done = complete(
        {
            **pod(),
            "metadata": {
                "name": "m",
                "labels": {"tritonshare.io/role": "model"},
                "annotations": {
                    "seldon.io/trtis-model-uri": "s3://b/m",
                    "seldon.io/trtis-gpu-mem": "1Gi",
                    "seldon.io/trtis-storage-secret": "creds",
                },
            },
        },
        settings,
    )
    assert _env(_initializer(done))["AWS_ACCESS_KEY_ID"]["secretKeyRef"]["name"] == "creds"
