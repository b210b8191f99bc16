"""Scale to zero over gRPC, for a TritonModel whose spec.modelName differs from its name, end to
end on the simulated cluster with the real processes (one real node): `add-one` declares
`modelName: add_one`, is scaled to zero and parked on its host under `add_one`. While parked,
ModelReady says not ready (REST and gRPC) and wakes nothing, and a call for `add-one` gets the
404 of any unknown model, naming the id the host serves. A gRPC inference for `add_one` and a
REST one sent beside it are held, count as the model's demand, wake it and are answered under
`add_one`; the host then serves it as any model."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any, cast

import kubernetes.client
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from binder.autoscaler.parkedmodels import parked_on
from common.contract import PROXY_AUTOSCALING_PATH
from common.hosted import serves_label
from sim.cluster import SimCluster
from sim.demo.scenario import MODELS_DIR
from sim.processes import wait_until
from sim.service import Endpoints
from tests.e2e.test_scale_to_zero import (
    DATA,
    KEYS,
    NAMESPACE,
    UNLOADS,
    agent_metric,
    cluster,
    load_seconds,
    scale_to_zero_model,
)
from tests.e2e.test_tritonmodel_hosts import GROUP, PLURAL, VERSION, _host

__all__ = ["cluster"]  # the fixture, shared with the REST test of scale to zero

NAME, MODEL_NAME = "add-one", "add_one"


def _replicas(custom: Any) -> int:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, NAME)
    return int(obj["spec"]["replicas"])


def _ready_replicas(custom: Any) -> int:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, NAME)
    return int((obj.get("status") or {}).get("readyReplicas") or 0)


def _grpc_infer(address: str, model: str, out: dict[str, Any]) -> None:
    """One gRPC inference of [1, 2, 3]; its answer (or error) and the seconds it took in `out`."""
    started = time.monotonic()
    try:
        with grpcclient.InferenceServerClient(f"{address}:9001") as client:
            tensor = grpcclient.InferInput("INPUT0", list(DATA.shape), "FP32")
            tensor.set_data_from_numpy(DATA)
            result = client.infer(model, [tensor], client_timeout=90)
            out["model_name"] = result.get_response().model_name
            out["output"] = result.as_numpy("OUTPUT0").reshape(-1).tolist()
    except InferenceServerException as e:
        out["error"] = f"{e.status()} {e.message()} {e.debug_details()}"
    out["seconds"] = time.monotonic() - started


def _rest_infer(address: str, model: str, out: dict[str, Any]) -> None:
    started = time.monotonic()
    try:
        with httpclient.InferenceServerClient(
            f"{address}:9000", network_timeout=90, connection_timeout=90
        ) as client:
            tensor = httpclient.InferInput("INPUT0", list(DATA.shape), "FP32")
            tensor.set_data_from_numpy(DATA)
            result = client.infer(model, [tensor])
            out["model_name"] = result.get_response()["model_name"]
            out["output"] = result.as_numpy("OUTPUT0").reshape(-1).tolist()
    except InferenceServerException as e:
        out["error"] = f"{e.status()} {e.message()} {e.debug_details()}"
    out["seconds"] = time.monotonic() - started


@pytest.mark.slow
@pytest.mark.triton
def test_a_parked_model_named_by_model_name_wakes_on_a_grpc_request(cluster: SimCluster) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    kube = cluster.kube
    core = cast(Any, kubernetes.client.CoreV1Api(kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(kube))
    uri = cluster.model_store.publish(MODEL_NAME, MODELS_DIR / "add_one")
    model = scale_to_zero_model(uri)
    model["metadata"]["name"] = NAME
    model["spec"]["modelName"] = MODEL_NAME
    custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, model)

    wait_until("scaled to zero", lambda: _replicas(custom) == 0, 120)
    wait_until("parked", lambda: parked_on(_host(core, NAMESPACE).to_dict(), KEYS) == [NAME], 60)
    with Endpoints(kube, NAMESPACE, f"{serves_label(KEYS, NAME)}=true") as service:
        address = wait_until("the Service's endpoint", service.pick, 60)
        wait_until("unloaded", lambda: agent_metric(cluster, UNLOADS) >= 1, 90)
        # The host lists the model parked under the id its clients send.
        rest = httpclient.InferenceServerClient(f"{address}:9000")
        rpc = grpcclient.InferenceServerClient(f"{address}:9001")
        try:
            wait_until(
                "the host's proxy holds add_one", lambda: _parked_here(address, MODEL_NAME), 30
            )
            # Parked: not ready (KServe v2), asked over REST and gRPC, and no wake for it.
            assert not rest.is_model_ready(MODEL_NAME)
            assert not rpc.is_model_ready(MODEL_NAME)
            # The TritonModel's name is no model id: the 404 of any unknown model.
            served = (
                f"Request for unknown model: '{NAME}' is not found; this host serves '{MODEL_NAME}'"
            )
            tensor = httpclient.InferInput("INPUT0", list(DATA.shape), "FP32")
            tensor.set_data_from_numpy(DATA)
            with pytest.raises(InferenceServerException) as rest_404:
                rest.infer(NAME, [tensor])
            assert served in str(rest_404.value), rest_404.value
            assert rest_404.value.status() == "404", rest_404.value
            rpc_tensor = grpcclient.InferInput("INPUT0", list(DATA.shape), "FP32")
            rpc_tensor.set_data_from_numpy(DATA)
            with pytest.raises(InferenceServerException) as grpc_404:
                rpc.infer(NAME, [rpc_tensor])
            assert served in str(grpc_404.value), grpc_404.value
            assert grpc_404.value.status() == "StatusCode.NOT_FOUND", grpc_404.value
            # No demand: the autoscaler's read of the host counts nothing held for it.
            assert _held_seconds(address) == 0, "readiness and unknown names wake nothing"
        finally:
            rest.close()
            rpc.close()

        # A gRPC inference and a REST one: held, counted as demand, answered under add_one.
        before = load_seconds(cluster)
        by_grpc: dict[str, Any] = {}
        by_rest: dict[str, Any] = {}
        threads = [
            threading.Thread(target=_grpc_infer, args=(address, MODEL_NAME, by_grpc)),
            threading.Thread(target=_rest_infer, args=(address, MODEL_NAME, by_rest)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        load = load_seconds(cluster) - before
        assert "error" not in by_grpc, by_grpc
        assert "error" not in by_rest, by_rest
        assert by_grpc["model_name"] == by_rest["model_name"] == MODEL_NAME
        assert by_grpc["output"] == by_rest["output"] == [2.0, 3.0, 4.0]
        print(f"gRPC from zero {by_grpc['seconds']:.2f} s, Triton's load {load:.2f} s")
        assert load > 0, "the model was loaded again for them"
        assert _replicas(custom) >= 1
        wait_until("unparked", lambda: parked_on(_host(core, NAMESPACE).to_dict(), KEYS) == [], 30)
        wait_until("ready", lambda: _ready_replicas(custom) >= 1, 30)
        with grpcclient.InferenceServerClient(f"{address}:9001") as rpc:
            assert rpc.is_model_ready(MODEL_NAME)
            assert rpc.get_model_metadata(MODEL_NAME).name == MODEL_NAME


def _held_seconds(address: str) -> float:
    """The seconds the host's proxy held add_one's calls, as the autoscaler reads them."""
    with urllib.request.urlopen(f"http://{address}:9002{PROXY_AUTOSCALING_PATH}", timeout=5) as r:
        counts = json.loads(r.read())
    return float(counts.get(MODEL_NAME, [0.0, 0])[0])


def _parked_here(address: str, model: str) -> bool:
    """Whether the host's proxy holds `model` parked: its readiness says so (an unknown one
    is answered 404)."""
    try:
        urllib.request.urlopen(f"http://{address}:9000/v2/models/{model}/ready", timeout=5)
    except urllib.error.HTTPError as e:
        return e.code == 400 and "scaled to zero" in e.read().decode()
    return False
