"""TritonModels end to end on the simulated cluster with the real processes: two teams each apply a
TritonModel named `add-one` (different files); the binder places each replica and creates each
namespace's model host on the node; the host's loader fetches the files over HTTPS and loads them
through the agent under the replica's private name; the agent marks the replica loaded on the host
and the binder puts the host behind the model's Service. Each team's clients, through the
Service's endpoints, get that team's answers (REST and gRPC) naming only `add-one`. team-a's files
are private (a bearer token in its Secret, named by `storageSecret`): team-b's TritonModel naming
that Secret and URI is not served, its host's loader says why, and the store never gets team-a's
token from it. A TritonModel whose storageUri is a 404 at the store says so (its Ready
condition FetchFailed, naming the node and the 404, and an Event) until its storageUri is fixed,
then is Ready. A roll to new files on the one node surges in place (a surge replica beside the
old one, on the same host), and the answers through the Service move to the new files'. Scaling
to 0 through the `scale` subresource drains and unloads the replica and removes the host."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from common.contract import Keys
from common.hosted import decode_hosted, host_name, hosted_models_annotation, serves_label
from common.tritonname import private_triton_name
from sim.cluster import SimCluster
from sim.demo.rollout import SteadyClient, new_release
from sim.demo.scenario import MODELS_DIR, NODES
from sim.processes import wait_until
from sim.service import Endpoints
from sim.triton import TritonInstall
from tests.e2e.test_short_form import _loaded

NODE = NODES[0]
MODEL = "add-one"
TEAMS = {"team-a": [[2.0, 3.0, 4.0]], "team-b": [[101.0, 102.0, 103.0]]}
"""Each team's answer to [1, 2, 3]: team-a's model adds 1, team-b's other files add 100."""
DATA = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
GROUP, VERSION, PLURAL = "tritonshare.io", "v1alpha1", "tritonmodels"
TOKEN = "Bearer team-a-only"
KEYS = Keys()


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    # The test's model is Python (tenant code): both teams are let run it.
    with SimCluster(
        tmp_path / "cluster", [NODE], binders=1, webhook=True, tenant_code_namespaces=tuple(TEAMS)
    ) as running:
        assert running.missing == [], running.missing
        for namespace in TEAMS:
            running.core.create_namespace({"metadata": {"name": namespace}}, _preload_content=False)
        yield running


def _model(uri: str, secret: str = "", name: str = MODEL) -> dict[str, Any]:
    spec = {"storageUri": uri, "gpuMemory": "1Gi", "replicas": 1, "maxConcurrency": 4}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TritonModel",
        "metadata": {"name": name},
        "spec": {**spec, **({"storageSecret": secret} if secret else {})},
    }


def _ready_replicas(custom: Any, namespace: str) -> int:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, MODEL)
    return int((obj.get("status") or {}).get("readyReplicas") or 0)


SECRETS = {"team-a": "creds", "team-b": ""}
"""The storage Secret of each team's `add-one`: its host is that Secret's."""


def _host(core: Any, namespace: str) -> Any:
    pods = core.list_namespaced_pod(namespace, label_selector=f"{KEYS.prefix}model-host=true")
    return pods.items[0] if pods.items else None


def _team_host(core: Any, namespace: str) -> Any:
    """The team's host of `add-one` (None when there is none)."""
    name = host_name(NODE.name, SECRETS[namespace])
    pods = core.list_namespaced_pod(namespace, field_selector=f"metadata.name={name}")
    return pods.items[0] if pods.items else None


def _answers(address: str) -> tuple[list[list[float]], list[list[float]]]:
    """[1, 2, 3] through the host at `address`: the REST and the gRPC answer, each checked to
    name the public model id."""
    with httpclient.InferenceServerClient(f"{address}:9000") as http:
        tensor = httpclient.InferInput("INPUT0", list(DATA.shape), "FP32")
        tensor.set_data_from_numpy(DATA)
        result = http.infer(MODEL, [tensor])
        assert result.get_response()["model_name"] == MODEL
        assert http.get_model_metadata(MODEL)["name"] == MODEL
        rest = result.as_numpy("OUTPUT0").tolist()
    with grpcclient.InferenceServerClient(f"{address}:9001") as grpc:
        tensor = grpcclient.InferInput("INPUT0", list(DATA.shape), "FP32")
        tensor.set_data_from_numpy(DATA)
        answer = grpc.infer(MODEL, [tensor])
        assert answer.get_response().model_name == MODEL
        return rest, answer.as_numpy("OUTPUT0").tolist()


@pytest.mark.slow
@pytest.mark.triton
def test_tritonmodels_of_two_teams_are_served_by_their_hosts_through_their_services(
    cluster: SimCluster, tmp_path: Path
) -> None:
    assert cluster.model_store is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    sources = {
        "team-a": MODELS_DIR / "add_one",
        "team-b": new_release(MODELS_DIR / "add_one", tmp_path / "team-b-files"),
    }
    store = cluster.model_store
    store.protect("team-a", TOKEN.removeprefix("Bearer "))
    private = store.publish(MODEL, sources["team-a"], release="team-a")
    credential = {"https-host": "127.0.0.1", "headers": json.dumps({"Authorization": TOKEN})}
    core.create_namespaced_secret(
        "team-a", {"metadata": {"name": "creds"}, "stringData": credential}
    )
    # On team-b's host of Secret "creds", which mounts team-b's "creds" (there is none).
    stolen = _model(private, secret="creds", name="stolen")
    custom.create_namespaced_custom_object(GROUP, VERSION, "team-b", PLURAL, stolen)
    custom.create_namespaced_custom_object(
        GROUP, VERSION, "team-a", PLURAL, _model(private, secret="creds")
    )
    other = store.publish(MODEL, sources["team-b"], release="team-b")
    custom.create_namespaced_custom_object(GROUP, VERSION, "team-b", PLURAL, _model(other))
    absent = store.url("late", release="team-b-absent")
    custom.create_namespaced_custom_object(
        GROUP, VERSION, "team-b", PLURAL, _model(absent, name="late")
    )

    for namespace in TEAMS:
        wait_until(f"{namespace}'s replica ready", partial(_ready_replicas, custom, namespace), 150)
    hosts = {namespace: _team_host(core, namespace) for namespace in TEAMS}
    names = set()
    for namespace, host in hosts.items():
        assert host.metadata.name == host_name(NODE.name, SECRETS[namespace])
        assert host.spec.node_name == NODE.name
        assert host.metadata.labels[serves_label(KEYS, MODEL)] == "true"
        listed = decode_hosted(host.metadata.annotations[hosted_models_annotation(KEYS)])
        [replica] = [r for r in listed if r.model == MODEL]
        names.add(private_triton_name(namespace, MODEL, replica.replica_uid))
    assert len(names) == 2 and names <= _loaded(cluster), (names, _loaded(cluster))
    # team-b's host reads "creds" in team-b alone: no credential, so nothing is sent.
    [log] = cluster.workdir.rglob(f"team-b_{host_name(NODE.name, 'creds')}_*/logs/loader.log")
    wait_until(
        "team-b's loader refusing the stolen model",
        lambda: "Secret creds is not in this model host: it does not exist" in log.read_text(),
        30,
    )
    stolen_status = custom.get_namespaced_custom_object(GROUP, VERSION, "team-b", PLURAL, "stolen")
    assert not (stolen_status.get("status") or {}).get("readyReplicas")
    # Each failure is on its TritonModel, named after its cause, with the node and the cause.
    stolen_ready = wait_until(
        "the stolen model's Ready saying why", partial(_failed, custom, "stolen"), 30
    )
    assert "Secret creds is not in this model host" in stolen_ready["message"], stolen_ready
    late_ready = wait_until("the 404's Ready saying why", partial(_failed, custom, "late"), 30)
    assert f"replica 0 on {NODE.name}: FetchFailed" in late_ready["message"], late_ready
    assert f"{absent} answered HTTP 404" in late_ready["message"], late_ready
    said = core.list_namespaced_event("team-b", field_selector="involvedObject.name=late").items
    assert [e.type for e in said if "HTTP 404" in e.message] == ["Warning"], said
    # Fixed: the files published, the storageUri pointed at them.
    fixed = store.publish("late", MODELS_DIR / "add_one", release="team-b-fixed")
    custom.patch_namespaced_custom_object(
        GROUP, VERSION, "team-b", PLURAL, "late", {"spec": {"storageUri": fixed}}
    )
    # Only team-a's host asked for team-a's files, with the token: team-b's never asked.
    asked = [bearer for _, path, bearer in store.seen if path.startswith("/triton/team-a/")]
    assert asked and all(asked), store.seen
    assert MODEL not in _loaded(cluster), "no model has the public name in Triton"

    assert cluster.kube is not None
    for namespace, expected in TEAMS.items():
        # The model's Service: the hosts labelled as serving it, as its EndpointSlice holds them.
        with Endpoints(cluster.kube, namespace, f"{serves_label(KEYS, MODEL)}=true") as service:
            address = wait_until(f"{namespace}'s Service endpoint", service.pick, 30)
        assert address == hosts[namespace].status.pod_ip
        assert _answers(address) == (expected, expected), namespace

    # Scale to 0 through the scale subresource, as an HPA does: unloaded, the host removed.
    custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, "team-a", PLURAL, MODEL, {"spec": {"replicas": 0}}
    )
    wait_until("team-a's host removed", lambda: _team_host(core, "team-a") is None, 90)
    wait_until("team-a's replica unloaded", lambda: len(names & _loaded(cluster)) == 1, 60)
    # team-b's replica is untouched.
    address = hosts["team-b"].status.pod_ip
    assert _answers(address) == (TEAMS["team-b"], TEAMS["team-b"])
    late = partial(custom.get_namespaced_custom_object, GROUP, VERSION, "team-b", PLURAL, "late")
    wait_until(
        "the fixed model ready", lambda: (late().get("status") or {}).get("readyReplicas"), 60
    )
    conditions = {c["type"]: c for c in late()["status"]["conditions"]}
    assert conditions["Ready"]["reason"] == "AllReplicasReady", conditions

    # team-b rolls to team-a's files. The one node takes a surge replica beside the old one,
    # which drains once the surge serves, while a client sends through the Service; its answers
    # move to the new files'.
    with Endpoints(cluster.kube, "team-b", f"{serves_label(KEYS, MODEL)}=true") as service:
        client = SteadyClient(service, model=MODEL)
        client.start()
        try:
            wait_until("team-b's answer", partial(client.since, 0.0), 30)
            new_uri = cluster.model_store.publish(MODEL, sources["team-a"], release="team-b-2")
            custom.patch_namespaced_custom_object(
                GROUP, VERSION, "team-b", PLURAL, MODEL, {"spec": {"storageUri": new_uri}}
            )
            wait_until(
                "team-b's roll complete",
                lambda: (
                    _status(custom, "team-b").get("observedGeneration") == 2
                    and _progressing(custom, "team-b").get("reason") == "NewFilesServed"
                    and _status(custom, "team-b").get("readyReplicas") == 1
                ),
                90,
            )
            done = time.monotonic()
            wait_until("a new answer", lambda: TEAMS["team-a"] in client.since(done), 30)
        finally:
            client.stop()
    status = _status(custom, "team-b")
    assert status["updatedReplicas"] == 1
    assert [e["storageUri"] for e in status["placements"]] == [new_uri]
    events = core.list_namespaced_event("team-b", field_selector=f"involvedObject.name={MODEL}")
    reasons = [e.reason for e in events.items]
    assert "RollingWithoutSurge" not in reasons and "NewFilesNotServed" not in reasons, reasons
    answers = [answer for _, _, answer in client.answers]
    assert answers[0] == TEAMS["team-b"] and answers[-1] == TEAMS["team-a"]
    # The old replica answers what reaches it until the gateway moves to the surge (its agent
    # sees it draining); from the first new answer on, only the new files answer.
    first_new = min(t for t, _, a in client.answers if t >= done and a == TEAMS["team-a"])
    assert TEAMS["team-b"] not in client.since(first_new), "the old files are gone once rolled"


def _status(custom: Any, namespace: str) -> dict[str, Any]:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, MODEL)
    found: dict[str, Any] = obj.get("status") or {}
    return found


def _failed(custom: Any, name: str) -> dict[str, Any] | None:
    """team-b's model `name`'s Ready condition once it says its host's loader cannot fetch it."""
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, "team-b", PLURAL, name)
    conditions = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}
    ready: dict[str, Any] = conditions.get("Ready") or {}
    return ready if ready.get("reason") == "FetchFailed" else None


def _progressing(custom: Any, namespace: str) -> dict[str, Any]:
    conditions = {c["type"]: c for c in _status(custom, namespace).get("conditions") or []}
    found: dict[str, Any] = conditions.get("Progressing") or {}
    return found
