"""A node pod replaced as a DaemonSet update replaces it (new Triton, agent and gateway, every
emptyDir empty) loses no model for good: each model pod's proxy notices its model missing and has
it installed and loaded again from the pod's own files, on the GPU of its proof, without the pod
being recreated or its containers restarted.

Probes send an inference through each pod's proxy every 0.2 s for the whole scenario; the figures
(printed) are, per model, the seconds from the new node pod running to the first answer, and the
whole gap without answers.
Run: pytest tests/e2e/test_node_pod_replacement.py -s -q
"""

from __future__ import annotations

import itertools
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from common.contract import Keys
from sim.cluster import SimCluster
from sim.demo.scenario import MODELS_DIR, NODES
from sim.processes import wait_until
from sim.triton import TritonInstall
from tests.e2e.test_short_form import NAMESPACE, _ready, short_form

KEYS = Keys()
NODE = NODES[0]
# (pod, model id, source directory, input name and shape, GPU memory)
MODELS = (
    ("add-one", "add_one", "add_one", ("INPUT0", [1, 3]), "2Gi"),
    ("echo", "echo", "identity", ("INPUT_FP32", [3]), "1Gi"),
    ("echo-two", "echo_two", "identity", ("INPUT_FP32", [3]), "1Gi"),
)
BACK_WITHIN_SECONDS = 30.0


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    with SimCluster(tmp_path / "cluster", [NODE], binders=1, webhook=True) as running:
        assert running.missing == [], running.missing
        running.core.create_namespace({"metadata": {"name": NAMESPACE}}, _preload_content=False)
        yield running


@dataclass
class Probe:
    """Sends an inference through one pod's proxy every 0.2 s; keeps when each one answered."""

    address: str
    model_id: str
    input_name: str
    shape: list[int]
    answered: list[float] = field(default_factory=list)
    failed: int = 0

    def run(self, stop: threading.Event) -> None:
        data = np.array([1.0, 2.0, 3.0], dtype=np.float32).reshape(self.shape)
        with httpclient.InferenceServerClient(
            f"{self.address}:9000", connection_timeout=1.0, network_timeout=1.0
        ) as client:
            while not stop.is_set():
                tensor = httpclient.InferInput(self.input_name, self.shape, "FP32")
                tensor.set_data_from_numpy(data)
                try:
                    client.infer(self.model_id, [tensor])
                    self.answered.append(time.monotonic())
                except Exception:  # any failure is a probe without an answer
                    self.failed += 1
                stop.wait(0.2)

    def first_answer_after(self, moment: float) -> float | None:
        return next((t for t in self.answered if t >= moment), None)

    def longest_gap(self, since: float = 0.0) -> float:
        """The longest time between two answers, from the answer at `since` on."""
        answered = [t for t in self.answered if t >= since]
        return max((b - a for a, b in itertools.pairwise(answered)), default=0)


def _model_gpus(cluster: SimCluster) -> dict[str, str]:
    """The GPU UUID the agent has each loaded model on, by model id: its per-model request gauge
    names the model as Triton does (privately), joined to the model id by the info series."""
    agent = cluster.agents[NODE.name]
    with urllib.request.urlopen(f"http://{agent.http}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    by_name: dict[str, str] = {}
    model_ids: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "tritonshare_agent_model_gpu_memory_request_bytes":
                by_name[sample.labels["model"]] = sample.labels["UUID"]
            elif sample.name == "tritonshare_agent_model_info":
                model_ids[sample.labels["model"]] = sample.labels["model_id"]
    return {model_ids.get(name, name): gpu for name, gpu in by_name.items()}


def _proxy_restarts(pod: Any) -> int:
    return sum(s.restart_count for s in pod.status.container_statuses or [])


@pytest.mark.slow
@pytest.mark.triton
def test_a_replaced_node_pod_gets_every_model_back_within_30_s_without_recreating_pods(
    cluster: SimCluster,
) -> None:
    assert cluster.model_store is not None
    core = cluster.core
    for name, model_id, source, _input, gpu_mem in MODELS:
        uri = cluster.model_store.publish(model_id, MODELS_DIR / source)
        core.create_namespaced_pod(NAMESPACE, short_form(name, uri, gpu_mem))
    before = {
        name: wait_until(f"pod {name} Ready", partial(_ready, core, name), 150)
        for name, *_ in MODELS
    }
    proven = {name: pod.metadata.annotations[KEYS.gpu] for name, pod in before.items()}
    assert all(gpu.startswith("GPU-") for gpu in proven.values()), proven

    probes = [
        Probe(before[name].status.pod_ip, model_id, *tensor)
        for name, model_id, _source, tensor, _mem in MODELS
    ]
    stop = threading.Event()
    threads = [threading.Thread(target=p.run, args=(stop,), daemon=True) for p in probes]
    for thread in threads:
        thread.start()
    try:
        wait_until("every probe answered", lambda: all(p.answered for p in probes), 30)
        replaced_at = time.monotonic()
        back_at = cluster.replace_node_pod()

        def all_back() -> bool:
            return all(p.first_answer_after(back_at) is not None for p in probes)

        wait_until("every model served again", all_back, BACK_WITHIN_SECONDS + 30)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)

    after_gpus = _model_gpus(cluster)
    figures = []
    for probe, (name, model_id, *_rest) in zip(probes, MODELS, strict=True):
        first = probe.first_answer_after(back_at)
        assert first is not None
        back = first - back_at
        figures.append(
            f"{model_id}: served {back:.1f} s after the new node pod ran; "
            f"{probe.longest_gap():.1f} s without answers in all "
            f"(node pod replaced in {back_at - replaced_at:.1f} s)"
        )
        assert back <= BACK_WITHIN_SECONDS, figures[-1]
        pod = core.read_namespaced_pod(name, NAMESPACE)
        assert pod.metadata.uid == before[name].metadata.uid, f"{name} was recreated"
        assert pod.metadata.annotations[KEYS.gpu] == proven[name]
        assert _proxy_restarts(pod) == _proxy_restarts(before[name]), f"{name} restarted"
        assert after_gpus.get(model_id) == proven[name], (model_id, after_gpus, proven)
        assert _proxy_log_mentions(cluster, name, "reinstalling it"), f"{name}'s proxy log"
    print("\n" + "\n".join(figures))

    # Nobody was left unaware: each pod got a Warning Event saying its model was missing, and its
    # ModelLoaded condition is True again, both written by the new node pod's agent.
    def loaded(name: str) -> Any:
        pod = core.read_namespaced_pod(name, NAMESPACE)
        conditions = {c.type: c for c in pod.status.conditions or []}
        condition = conditions.get(KEYS.model_loaded)
        return condition if condition is not None and condition.status == "True" else None

    events = core.list_namespaced_event(NAMESPACE).items
    for name, model_id, *_rest in MODELS:
        condition = wait_until(f"{name}'s ModelLoaded=True", partial(loaded, name), 15)
        assert condition.reason == "ModelReady" and proven[name] in condition.message
        missing = [
            e for e in events if e.involved_object.name == name and e.reason == "ModelNotServed"
        ]
        assert missing, f"no ModelNotServed event on {name}"
        assert missing[0].type == "Warning" and f"model {model_id} is missing" in missing[0].message


GAP_LIMITS = {"agent": 2.0, "gateway": 15.0}
"""The longest a model may go without answers while the container restarts in place."""


@pytest.mark.slow
@pytest.mark.triton
def test_an_in_place_restart_of_the_agent_or_gateway_keeps_triton_and_its_models(
    cluster: SimCluster,
) -> None:
    """What an upgrade of the agent or gateway alone costs when their container is restarted in
    place (the pod's image changed, Triton and the volumes kept): no reinstall, the models stay
    loaded; the gap is the gateway's own restart when it is the gateway. The agent, then the
    gateway, each restarted with the other running."""
    assert cluster.model_store is not None
    core = cluster.core
    name, model_id, source, tensor, gpu_mem = MODELS[0]
    uri = cluster.model_store.publish(model_id, MODELS_DIR / source)
    core.create_namespaced_pod(NAMESPACE, short_form(name, uri, gpu_mem))
    pod = wait_until(f"pod {name} Ready", partial(_ready, core, name), 150)
    probe = Probe(pod.status.pod_ip, model_id, *tensor)
    stop = threading.Event()
    thread = threading.Thread(target=probe.run, args=(stop,), daemon=True)
    thread.start()
    gaps = {}
    try:
        wait_until("the probe answered", lambda: probe.answered, 30)
        for container in GAP_LIMITS:
            before = probe.answered[-1]
            back_at = cluster.restart_node_container(container)
            served = partial(probe.first_answer_after, back_at)
            wait_until(f"served after the {container}'s restart", served, 30)
            time.sleep(1.0)  # a few more probes after it, so a late gap would show
            gaps[container] = probe.longest_gap(since=before)
    finally:
        stop.set()
        thread.join(10)
    for container, gap in gaps.items():
        print(f"\n{container} restarted in place: longest gap without answers {gap:.1f} s")
    assert {c: gap for c, gap in gaps.items() if gap >= GAP_LIMITS[c]} == {}, gaps
    reinstalls = _proxy_log_mentions(cluster, name, "reinstalling it")
    assert not reinstalls, "Triton kept the model: nothing to reinstall"


def _proxy_log_mentions(cluster: SimCluster, pod: str, words: str) -> list[str]:
    found = []
    for log in (cluster.workdir / "kubelet").rglob("*.log"):
        if pod in str(log) and "proxy" in log.name:
            found += [
                line for line in log.read_text(errors="replace").splitlines() if words in line
            ]
    return found
