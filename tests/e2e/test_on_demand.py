"""An on-demand model pod sleeps when idle and wakes on its next request, end to end: written in
the short form with `tritonshare.io/residency: on-demand` and a three-second idle time, completed
by the webhook, loaded into the real Triton, then unloaded by the agent at its proxy's request
(the agent reports it sleeping) while the pod stays Ready; concurrent REST and gRPC requests wake
it with one load and all get their answers; a request that waits past the wake bound gets 503
with Retry-After. A pod whose tenant points its proxy at another pod's model id cannot sleep or
wake that model."""

from __future__ import annotations

import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from common.tritonname import private_triton_name
from sim.cluster import SimCluster
from sim.demo.scenario import MODELS_DIR, NODES
from sim.processes import wait_until
from sim.triton import TritonInstall
from tests.e2e.test_short_form import _loaded, _ready

NAMESPACE = "models"
DATA = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
SLOW_LOAD = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(4)  # a model slower to load than its proxy's wake bound

    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (data + 1).astype(data.dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    with SimCluster(tmp_path / "cluster", [NODES[0]], binders=1, webhook=True) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


def on_demand(
    name: str, uri: str, idle: str, proxy_env: dict[str, str] | None = None
) -> kubernetes.client.V1Pod:
    """The short form with an idle time; `proxy_env` goes on the proxy's placeholder container
    (the tenant's own settings, which the webhook keeps)."""
    containers = []
    if proxy_env is not None:
        env = [kubernetes.client.V1EnvVar(name=k, value=v) for k, v in proxy_env.items()]
        containers.append(kubernetes.client.V1Container(name="proxy", env=env))
    return kubernetes.client.V1Pod(
        metadata=kubernetes.client.V1ObjectMeta(
            name=name,
            labels={"tritonshare.io/role": "model"},
            annotations={
                "tritonshare.io/model-uri": uri,
                "tritonshare.io/gpu-mem": "1Gi",
                "tritonshare.io/residency": "on-demand",
                "tritonshare.io/idle-seconds": idle,
            },
        ),
        spec=kubernetes.client.V1PodSpec(containers=containers),
    )


def _metrics(address: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://{address}:9002/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model"))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("tritonshare_proxy_model_")
    }


def _state(address: str) -> str:
    states = [
        dict(labels)["state"]
        for (name, labels), value in _metrics(address).items()
        if name == "tritonshare_proxy_model_state" and value == 1
    ]
    return states[0] if states else ""


def _count(address: str, name: str, outcome: str) -> float:
    """A counter of the proxy at `address` by outcome; -1 while it does not listen yet."""
    try:
        return _metrics(address).get((name + "_total", (("outcome", outcome),)), 0.0)
    except OSError:
        return -1.0


def _condition_reason(core: Any, name: str) -> str:
    pod = core.read_namespaced_pod(name, NAMESPACE)
    for condition in pod.status.conditions or []:
        if condition.type == "tritonshare.io/ModelLoaded":
            return str(condition.reason)
    return ""


class ReadyWatch:
    """Polls the pods' Ready condition on a thread; `flaps` lists every time one was not."""

    def __init__(self, core: Any, names: list[str]) -> None:
        self.flaps: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(core, names))

    def _run(self, core: Any, names: list[str]) -> None:
        while not self._stop.wait(0.3):
            for name in names:
                if _ready(core, name) is None:
                    self.flaps.append(f"{name} not Ready at {time.monotonic():.1f}")

    def __enter__(self) -> ReadyWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _rest(address: str) -> list[list[float]]:
    with httpclient.InferenceServerClient(f"{address}:9000", network_timeout=60) as http:
        tensor = httpclient.InferInput("INPUT0", list(DATA.shape), "FP32")
        tensor.set_data_from_numpy(DATA)
        return cast(list[list[float]], http.infer("add_one", [tensor]).as_numpy("OUTPUT0").tolist())


def _grpc(address: str) -> list[list[float]]:
    with grpcclient.InferenceServerClient(f"{address}:9001") as grpc:
        tensor = grpcclient.InferInput("INPUT0", list(DATA.shape), "FP32")
        tensor.set_data_from_numpy(DATA)
        answer = grpc.infer("add_one", [tensor], client_timeout=60)
        return cast(list[list[float]], answer.as_numpy("OUTPUT0").tolist())


def _raw_infer(address: str, model: str) -> tuple[int, dict[str, str], str]:
    """A REST inference by hand: status, headers and body, whatever the status."""
    body = b'{"inputs":[{"name":"INPUT0","shape":[1,3],"datatype":"FP32","data":[1,2,3]}]}'
    request = urllib.request.Request(
        f"http://{address}:9000/v2/models/{model}/infer", data=body, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


@pytest.mark.slow
@pytest.mark.triton
def test_an_idle_on_demand_model_sleeps_stays_ready_and_wakes_for_its_requests(
    cluster: SimCluster, tmp_path: Path
) -> None:
    assert cluster.model_store is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    slow_files = tmp_path / "slow_start"
    shutil.copytree(MODELS_DIR / "add_one", slow_files)
    (slow_files / "1" / "model.py").write_text(SLOW_LOAD)
    add_one = cluster.model_store.publish("add_one", MODELS_DIR / "add_one")
    slow = cluster.model_store.publish("slow_start", slow_files)
    echo = cluster.model_store.publish("echo", MODELS_DIR / "identity")
    core.create_namespaced_pod(NAMESPACE, on_demand("lazy", add_one, "3"))
    core.create_namespaced_pod(
        NAMESPACE, on_demand("slow", slow, "3", {"TRITONSHARE_WAKE_TIMEOUT_SECONDS": "1"})
    )
    # The attack: a tenant's own pod whose proxy names another pod's model id (the webhook
    # keeps the placeholder's MODEL_ID), on-demand with a one-second idle time.
    core.create_namespaced_pod(NAMESPACE, on_demand("intruder", echo, "1", {"MODEL_ID": "add_one"}))

    pods = {
        name: wait_until(f"pod {name} Ready", partial(_ready, core, name), 150)
        for name in ("lazy", "slow")
    }
    lazy, slow_ip = pods["lazy"].status.pod_ip, pods["slow"].status.pod_ip
    private = private_triton_name(NAMESPACE, "add_one", pods["lazy"].metadata.uid)

    with ReadyWatch(core, ["lazy", "slow"]) as watch:
        # The intruder's proxy asks the agent to sleep "add_one" with its own pod's token:
        # refused, and the owner's model stays loaded until its own proxy sleeps it.
        intruder = wait_until(
            "the intruder's proxy to serve metrics",
            lambda: core.read_namespaced_pod("intruder", NAMESPACE).status.pod_ip,
            60,
        )
        wait_until(
            "the agent to refuse the intruder's idle unload",
            lambda: _count(intruder, "tritonshare_proxy_model_sleeps", "refused") >= 1,
            60,
        )
        assert _count(intruder, "tritonshare_proxy_model_sleeps", "ok") == 0

        # Idle for three seconds: asleep on the node, files kept, the pod Ready.
        wait_until("lazy's model asleep", lambda: _state(lazy) == "idle-unloaded", 30)
        assert private not in _loaded(cluster)
        wait_until(
            "the agent to report lazy's model sleeping",
            lambda: _condition_reason(core, "lazy") == "ModelSleeping",
            30,
        )
        assert _count(lazy, "tritonshare_proxy_model_sleeps", "ok") == 1

        # The intruder cannot wake it through its own proxy either.
        status, _, _ = _raw_infer(intruder, "add_one")
        assert status != 200
        assert _state(lazy) == "idle-unloaded" and private not in _loaded(cluster)

        # Concurrent requests, both protocols, during one wake: every one is answered.
        calls = [partial(_rest, lazy)] * 6 + [partial(_grpc, lazy)] * 2
        with ThreadPoolExecutor(len(calls)) as pool:
            answers = list(pool.map(lambda call: call(), calls))
        assert answers == [[[2.0, 3.0, 4.0]]] * len(calls)
        assert _count(lazy, "tritonshare_proxy_model_wakes", "ok") == 1, "one wake for all"
        assert _state(lazy) == "loaded" and private in _loaded(cluster)

        # A model slower to load than its proxy's bound: 503 with Retry-After, and the wake
        # goes on, so a later request is served.
        wait_until("slow's model asleep", lambda: _state(slow_ip) == "idle-unloaded", 30)
        status, headers, body = _raw_infer(slow_ip, "slow_start")
        assert status == 503, body
        assert int(headers["Retry-After"]) >= 1
        assert "not ready within 1 s" in body
        wait_until("slow's model awake", lambda: _state(slow_ip) == "loaded", 30)
        status, _, body = _raw_infer(slow_ip, "slow_start")
        assert status == 200, body
    assert watch.flaps == []
