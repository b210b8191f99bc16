"""The webhook completes a pod from its annotations into the model pod deploy/example writes by
hand, idempotently, keeps what the pod already has, and refuses malformed annotations with a
message saying what to write. The completed pod validates against the Kubernetes schema and its
loader and proxy accept their arguments."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import kubernetes_validate
import pytest

from common.contract import Keys
from loader.settings import parse_settings as parse_loader_settings
from proxy.settings import parse_settings as parse_proxy_settings
from sim.apiserver.patch import json_patch
from webhook.mutation import AnnotationError, complete, patch
from webhook.review import ReviewError, review
from webhook.settings import Settings, SettingsError, parse_settings

SETTINGS = Settings()


def pod(**annotations: str) -> dict[str, Any]:
    """A pod as the API server hands it to admission: defaulted, no containers of ours."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "m",
            "namespace": "models",
            "labels": {"tritonshare.io/role": "model", "app": "add-one"},
            "annotations": annotations,
        },
        "spec": {"schedulerName": "default-scheduler", "containers": []},
    }


GS = {"tritonshare.io/model-uri": "gs://my-models/triton/add_one", "tritonshare.io/gpu-mem": "1Gi"}


def _args(container: dict[str, Any]) -> list[str]:
    env = {"$(HOST_IP)": "10.0.0.5", "$(MODEL_ID)": "add_one"}
    args = list(container["args"])
    for variable, value in env.items():
        args = [a.replace(variable, value) for a in args]
    return args


def test_a_few_annotations_become_a_complete_model_pod() -> None:
    done = complete(pod(**GS, **{"tritonshare.io/concurrency": "4"}), SETTINGS)
    kubernetes_validate.validate(done, "1.30.0", strict=True)
    spec = done["spec"]
    assert spec["schedulerName"] == "tritonshare"
    assert done["metadata"]["annotations"]["tritonshare.io/model-id"] == "add_one"
    assert done["metadata"]["labels"] == {"tritonshare.io/role": "model", "app": "add-one"}
    assert [c["name"] for c in spec["initContainers"]] == ["storage-initializer", "loader"]
    assert spec["initContainers"][0]["args"] == ["gs://my-models/triton/add_one", "/mnt/models"]
    [proxy] = spec["containers"]
    assert proxy["resources"]["limits"]["tritonshare.io/gpu-mem"] == "1Gi"
    assert proxy["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "tritonshare.io/gpu-node", "operator": "Exists", "effect": "NoExecute"},
    ]
    [token] = [v for v in spec["volumes"] if v["name"] == "agent-token"]
    assert token["projected"]["sources"][0]["serviceAccountToken"]["audience"] == (
        "tritonshare-agent"
    )
    loader = parse_loader_settings(_args(spec["initContainers"][1]), {})
    assert loader.agent_address == "10.0.0.5:8100" and loader.model_id == "add_one"
    proxied = parse_proxy_settings(_args(proxy), {})
    assert proxied.model_id == "add_one" and proxied.container_concurrency == 4


def test_the_proxy_is_probed_every_second_only_while_it_starts() -> None:
    """A new replica's readiness is probed as soon as its proxy has started (the kubelet runs
    the readiness probe when the startup probe passes), not a readiness period later; once
    started, the proxy is probed at the steady periods, and liveness waits for the start."""
    [proxy] = complete(pod(**GS), SETTINGS)["spec"]["containers"]
    startup = proxy["startupProbe"]
    # The proxy's own health, not its model's: a slow model must not restart the proxy.
    assert startup["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert startup["periodSeconds"] == 1
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 30
    assert proxy["readinessProbe"]["periodSeconds"] > startup["periodSeconds"]
    assert proxy["livenessProbe"]["httpGet"]["port"] == "metrics"


def test_completion_is_idempotent_and_the_patch_gets_there() -> None:
    original = pod(**GS)
    done = complete(original, SETTINGS)
    operations = patch(original, done)
    assert operations, "an incomplete pod needs a patch"
    assert json_patch(copy.deepcopy(original), operations) == done
    assert complete(done, SETTINGS) == done
    assert patch(done, complete(done, SETTINGS)) == []


def test_what_the_pod_already_has_is_kept() -> None:
    mine = pod(**GS, **{"tritonshare.io/model-id": "my_model"})
    spec = mine["spec"]
    spec["securityContext"] = {"runAsNonRoot": True, "runAsUser": 2000}
    spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "a100"}]
    spec["containers"] = [{"name": "sidecar", "image": "s:1"}]
    spec["volumes"] = [{"name": "model", "emptyDir": {"sizeLimit": "100Gi"}}]
    done = complete(mine, SETTINGS)["spec"]
    assert done["securityContext"] == {"runAsNonRoot": True, "runAsUser": 2000}
    assert done["tolerations"] == [*spec["tolerations"], Keys().gpu_node_toleration()]
    assert done["containers"][1:] == spec["containers"], "other containers are kept as they are"
    assert [v for v in done["volumes"] if v["name"] == "model"] == spec["volumes"]
    assert complete(mine, SETTINGS)["metadata"]["annotations"]["tritonshare.io/model-id"] == (
        "my_model"
    )


def test_a_placeholder_proxy_is_filled_in_where_it_is_silent() -> None:
    """A Deployment's template must name a container; a bare `proxy` becomes the full proxy,
    and what it says (its image, an extra env entry, a CPU request) stays."""
    mine = pod(**GS)
    mine["spec"]["containers"] = [
        {
            "name": "proxy",
            "image": "registry.example.com/ts:2",
            "env": [{"name": "EXTRA", "value": "1"}],
            "resources": {"requests": {"cpu": "1"}},
        }
    ]
    done = complete(mine, SETTINGS)
    [proxy] = done["spec"]["containers"]
    assert proxy["image"] == "registry.example.com/ts:2"
    assert proxy["command"] == ["python", "-m", "proxy"]
    assert [e["name"] for e in proxy["env"]] == ["EXTRA", "MODEL_ID", "HOST_IP"]
    assert proxy["resources"]["requests"] == {"cpu": "1", "memory": "128Mi"}
    assert proxy["resources"]["limits"]["tritonshare.io/gpu-mem"] == "1Gi"
    assert proxy["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert parse_proxy_settings(_args(proxy), {}).model_id == "add_one"
    assert complete(done, SETTINGS) == done
    kubernetes_validate.validate(done, "1.30.0", strict=True)


def test_a_pvc_model_is_copied_from_the_claim_mounted_read_only() -> None:
    done = complete(
        pod(
            **{
                "tritonshare.io/model-uri": "pvc://models-pvc/triton/bert",
                "tritonshare.io/gpu-mem": "2Gi",
            }
        ),
        SETTINGS,
    )
    spec = done["spec"]
    [claim] = [v for v in spec["volumes"] if "persistentVolumeClaim" in v]
    assert claim["persistentVolumeClaim"] == {"claimName": "models-pvc", "readOnly": True}
    initializer = spec["initContainers"][0]
    assert initializer["args"] == ["/mnt/pvc/triton/bert", "/mnt/models"]
    assert {"name": claim["name"], "mountPath": "/mnt/pvc", "readOnly": True} in initializer[
        "volumeMounts"
    ]
    assert done["metadata"]["annotations"]["tritonshare.io/model-id"] == "bert"
    kubernetes_validate.validate(done, "1.30.0", strict=True)


URI, MEM = "tritonshare.io/model-uri", "tritonshare.io/gpu-mem"


@pytest.mark.parametrize(
    ("uri", "model_id"),
    [
        ("https://models.example.com/triton/add_one.tar.gz", "add_one"),
        ("https://models.example.com/triton/add_one.tgz", "add_one"),
        ("https://models.example.com/triton/v1.2.zip", "v1.2"),
        ("https://models.example.com/triton/model.onnx", "model.onnx"),
        ("gs://my-models/triton/add_one/", "add_one"),
    ],
)
def test_the_model_id_is_the_uris_last_segment_without_an_archive_extension(
    uri: str, model_id: str
) -> None:
    done = complete(pod(**{URI: uri, MEM: "1Gi"}), SETTINGS)
    assert done["metadata"]["annotations"]["tritonshare.io/model-id"] == model_id
    assert done["spec"]["initContainers"][0]["args"] == [uri, "/mnt/models"]


@pytest.mark.parametrize(
    ("annotations", "says"),
    [
        ({URI: "ftp://x/y", MEM: "1Gi"}, "write gs://BUCKET/PATH"),
        ({URI: "models/add_one", MEM: "1Gi"}, "is not a model URI"),
        ({URI: "pvc://Bad_Claim/x", MEM: "1Gi"}, "write pvc://CLAIM/PATH"),
        ({URI: "gs://b/m"}, "tritonshare.io/gpu-mem is missing; write"),
        ({URI: "gs://b/m", MEM: "lots"}, "such as 1500Mi"),
        ({URI: "gs://b/m", MEM: "0"}, "not a GPU memory size"),
        ({URI: "gs://b/", MEM: "1Gi"}, "set tritonshare.io/model-id"),
        ({URI: "https://b/.tar.gz", MEM: "1Gi"}, "set tritonshare.io/model-id"),
        ({**GS, "tritonshare.io/model-id": ".hidden"}, "tritonshare.io/model-id is not a usable"),
        ({**GS, "tritonshare.io/concurrency": "four"}, 'example tritonshare.io/concurrency: "4"'),
    ],
)
def test_malformed_annotations_are_refused_saying_what_to_write(
    annotations: dict[str, str], says: str
) -> None:
    with pytest.raises(AnnotationError) as e:
        complete(pod(**annotations), SETTINGS)
    assert says in str(e.value)


def _review(obj: dict[str, Any]) -> dict[str, Any]:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "namespace": "models",
            "object": obj,
        },
    }
    return review(body, SETTINGS)


def test_the_review_answers_with_a_json_patch_or_a_reason() -> None:
    answer = _review(pod(**GS))
    response = answer["response"]
    assert answer["kind"] == "AdmissionReview" and response["allowed"] is True
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert response["patchType"] == "JSONPatch"
    operations = json.loads(base64.b64decode(response["patch"]))
    assert json_patch(pod(**GS), operations) == complete(pod(**GS), SETTINGS)
    refused = _review(pod(**{"tritonshare.io/model-uri": "gs://b/m"}))["response"]
    assert refused["allowed"] is False and refused["status"]["code"] == 400
    assert "tritonshare.io/gpu-mem is missing" in refused["status"]["message"]
    # Pods that are no model pods, and complete ones, pass untouched.
    other = pod()
    other["metadata"]["labels"] = {"app": "web"}
    untouched = _review(other)["response"]
    assert untouched == {"uid": untouched["uid"], "allowed": True}
    # A model pod asking to be completed (no container, or a GPU-memory annotation) with no URI
    # is refused, naming what to add.
    for unfinished in (pod(), pod(**{"tritonshare.io/gpu-mem": "1Gi"})):
        refused = _review(unfinished)["response"]
        assert refused["allowed"] is False and refused["status"]["code"] == 400
        assert "add the annotation tritonshare.io/model-uri" in refused["status"]["message"]
    assert "patch" not in _review(complete(pod(**GS), SETTINGS))["response"]
    with pytest.raises(ReviewError):
        review({"kind": "Pod"}, SETTINGS)


def test_settings_follow_the_key_prefix_and_ports() -> None:
    settings = parse_settings(
        ["--key-prefix", "seldon.io/trtis-", "--agent-port", "8200", "--scheduler-name", "gpu"], {}
    )
    done = complete(
        pod(**{"seldon.io/trtis-model-uri": "s3://b/m", "seldon.io/trtis-gpu-mem": "1Gi"}), settings
    )
    assert done["spec"]["schedulerName"] == "gpu"
    assert done["metadata"]["annotations"]["seldon.io/trtis-model-id"] == "m"
    assert "seldon.io/trtis-gpu-mem" in done["spec"]["containers"][0]["resources"]["limits"]
    assert "--agent-address=$(HOST_IP):8200" in done["spec"]["initContainers"][1]["args"]
    with pytest.raises(SettingsError, match="write a number from 1 to 65535"):
        parse_settings(["--agent-port", "http"], {})


RESIDENCY = "tritonshare.io/residency"


@pytest.mark.parametrize("value", ["always", "on-demand"])
def test_both_forms_accept_a_residency_class_and_keep_it(value: str) -> None:
    short = _review(pod(**GS, **{RESIDENCY: value}))["response"]
    assert short["allowed"] is True
    operations = json.loads(base64.b64decode(short["patch"]))
    done = json_patch(pod(**GS, **{RESIDENCY: value}), operations)
    assert done["metadata"]["annotations"][RESIDENCY] == value
    full = complete(pod(**GS), SETTINGS)
    full["metadata"]["annotations"][RESIDENCY] = value
    assert _review(full)["response"] == {"uid": short["uid"], "allowed": True}


@pytest.mark.parametrize("value", ["On-Demand", "ondemand", "", "never"])
def test_a_bad_residency_is_refused_on_both_forms_saying_what_to_write(value: str) -> None:
    full = complete(pod(**GS), SETTINGS)
    full["metadata"]["annotations"][RESIDENCY] = value
    for obj in (pod(**GS, **{RESIDENCY: value}), full):
        refused = _review(obj)["response"]
        assert refused["allowed"] is False and refused["status"]["code"] == 400
        message = refused["status"]["message"]
        assert f"annotation {RESIDENCY}={value!r} is not a residency class" in message
        assert f"{RESIDENCY}: always" in message and f"{RESIDENCY}: on-demand" in message


@pytest.mark.parametrize(
    ("annotations", "flags", "idle"),
    [
        ({}, [], None),
        ({"tritonshare.io/residency": "always", "tritonshare.io/idle-seconds": "600"}, [], None),
        ({"tritonshare.io/residency": "on-demand"}, ["--idle-seconds=300"], 300.0),
        (
            {"tritonshare.io/residency": "on-demand", "tritonshare.io/idle-seconds": "900"},
            ["--idle-seconds=900"],
            900.0,
        ),
        (
            {"tritonshare.io/residency": "on-demand", "tritonshare.io/idle-seconds": "5"},
            ["--idle-seconds=60"],
            60.0,
        ),
    ],
)
def test_an_on_demand_pod_s_proxy_gets_its_idle_time_never_below_the_floor(
    annotations: dict[str, str], flags: list[str], idle: float | None
) -> None:
    [proxy] = complete(pod(**GS, **annotations), SETTINGS)["spec"]["containers"]
    proxied = parse_proxy_settings(_args(proxy), {})
    if idle is None:
        assert proxied.residency == "always"
        assert not any(a.startswith(("--residency", "--idle-seconds")) for a in proxy["args"])
    else:
        assert proxied.residency == "on-demand" and proxied.idle_seconds == idle
        assert "--residency=on-demand" in proxy["args"] and flags[0] in proxy["args"]


def test_the_idle_floor_and_default_are_the_operator_s() -> None:
    settings = parse_settings(["--min-idle-seconds=120", "--default-idle-seconds=30"], {})
    done = complete(pod(**GS, **{"tritonshare.io/residency": "on-demand"}), settings)
    assert "--idle-seconds=120" in done["spec"]["containers"][0]["args"]


@pytest.mark.parametrize("value", ["soon", "0", "-5", "nan", "inf"])
def test_an_idle_time_that_is_no_number_of_seconds_is_refused(value: str) -> None:
    annotations = {"tritonshare.io/residency": "on-demand", "tritonshare.io/idle-seconds": value}
    with pytest.raises(AnnotationError, match=r'tritonshare\.io/idle-seconds: "600"'):
        complete(pod(**GS, **annotations), SETTINGS)


@pytest.mark.parametrize(("value", "idempotent"), [(None, None), ("false", False), ("true", True)])
def test_an_idempotent_pod_s_proxy_sends_a_lost_call_again(
    value: str | None, idempotent: bool | None
) -> None:
    """Without the annotation the proxy is told neither way: it goes by the model's config."""
    annotations = {} if value is None else {"tritonshare.io/idempotent": value}
    [proxy] = complete(pod(**GS, **annotations), SETTINGS)["spec"]["containers"]
    assert parse_proxy_settings(_args(proxy), {}).idempotent is idempotent


def test_an_idempotent_annotation_that_is_no_boolean_is_refused() -> None:
    annotations = {"tritonshare.io/idempotent": "maybe"}
    with pytest.raises(AnnotationError, match=r'tritonshare\.io/idempotent: "false" when'):
        complete(pod(**GS, **annotations), SETTINGS)


def _of_replica_set(obj: dict[str, Any]) -> dict[str, Any]:
    obj["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "add-one-5d8f7", "uid": "u1"}
        | {"controller": True}
    ]
    return obj


def test_a_controllers_pod_must_name_its_model_id() -> None:
    """A Deployment's pods keep one id across rollouts: the file's name is no default for them
    (a rollout to `addone-noname.tar.gz` would change the id clients call)."""
    with pytest.raises(AnnotationError) as e:
        complete(_of_replica_set(pod(**GS)), SETTINGS)
    assert str(e.value) == (
        "pod of ReplicaSet add-one-5d8f7 sets no tritonshare.io/model-id, so its model id would "
        "be the last segment of tritonshare.io/model-uri ('add_one' now), and a rollout to a "
        "file of another name would change the id its clients call; set "
        "tritonshare.io/model-id (such as 'add_one') in the pod template's annotations, and "
        "keep it across rollouts"
    )
    named = _of_replica_set(pod(**GS, **{"tritonshare.io/model-id": "add_one"}))
    assert complete(named, SETTINGS)["metadata"]["annotations"]["tritonshare.io/model-id"] == (
        "add_one"
    )
    # A bare pod (no controller) still takes the URI's last segment.
    assert complete(pod(**GS), SETTINGS)["metadata"]["annotations"]["tritonshare.io/model-id"] == (
        "add_one"
    )
