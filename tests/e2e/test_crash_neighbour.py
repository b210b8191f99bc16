"""How long one namespace's crashes can keep a neighbour's model from serving, on the simulated
cluster with the real processes (one real node; Triton run by a keeper that starts it again at
once, as the kubelet restarts a crashed container).

A namespace let run tenant code deploys four models at once, each different files, each killing
Triton as it loads; a neighbour's model (ONNX, marked `idempotent`), of another namespace let run
tenant code (only such namespaces share a node with it), is called through its host all the while,
one request after another, retrying at once. The bound (docs/security.md): the attacker's namespace
takes Triton down at most `--crash-quarantine-after` (3) plus `--crash-namespace-quarantine-after`
(2) times on the node, and once more a file where an exit came beside the neighbour's requests,
after which the node loads none of its models; through each exit the neighbour's requests are held
by the node gateway until its model is loaded again (at most the restore's 20 s) or sent again; a
neighbour whose requests were at Triton when it exited is a probationer, refused (503, told to
retry) only while a suspect's load is tried alone: at most half the attack's time. Nothing else
fails."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from common.hosted import host_name
from sim.cluster import SimCluster
from sim.crashers import load_killer
from sim.demo.rollout import deployment_manifest
from sim.onnxmodels import CONV_IMAGE, CONV_INPUT, CONV_NAME, CONV_OUTPUT, write_conv_model
from sim.processes import wait_until
from sim.triton import TritonInstall
from tests.conftest import copy_model
from tests.e2e.test_node_pod_drain import _listening
from tests.e2e.test_tritonmodel_one_node import NODE
from tests.e2e.test_tritonmodel_two_nodes import GROUP, PLURAL, VERSION

ATTACKER, NEIGHBOUR = "team-bad", "team-good"
KILLERS = 4
MOST_EXITS = 3 + 2 + KILLERS
"""--crash-quarantine-after plus --crash-namespace-quarantine-after (the defaults), counted
alone; plus, at most once a file, an exit beside the neighbour's requests, counted only once
those files are tried alone (the neighbour's pod on probation meanwhile)."""
RESTORE_HOLD = 20.0
"""The node gateway's hold of a model's requests while Triton loads it again."""
LOADED = "tritonshare.io/ModelLoaded"
PROBATION = "[503] the pod is on probation on this node"
"""The node gateway's refusal of a probationer's request while a suspect's load is tried."""


@pytest.fixture
def cluster(tmp_path: Path, triton_install: TritonInstall) -> Iterator[SimCluster]:
    with SimCluster(
        tmp_path / "cluster",
        (NODE,),
        binders=1,
        webhook=True,
        tenant_code_namespaces=(ATTACKER, NEIGHBOUR),
    ) as running:
        assert running.missing == [], running.missing
        for namespace in (ATTACKER, NEIGHBOUR):
            running.core.create_namespace({"metadata": {"name": namespace}}, _preload_content=False)
        yield running


@dataclass(frozen=True)
class Answer:
    start: float
    seconds: float
    error: str


class Caller:
    """The neighbour's model called through its host, one request after another, every answer
    kept."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.answers: list[Answer] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="neighbour", daemon=True)
        self._image = np.ones((1, *CONV_IMAGE), np.float32)

    def __enter__(self) -> Caller:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(RESTORE_HOLD + 40)

    def _run(self) -> None:
        with httpclient.InferenceServerClient(
            f"{self.address}:9000", network_timeout=RESTORE_HOLD + 30
        ) as client:
            while not self._stop.is_set():
                tensor = httpclient.InferInput(CONV_INPUT, list(self._image.shape), "FP32")
                tensor.set_data_from_numpy(self._image)
                start = time.monotonic()
                error = ""
                try:
                    scores = client.infer(CONV_NAME, [tensor]).as_numpy(CONV_OUTPUT)
                    if scores is None or scores.shape != (1, 100):
                        error = f"scores of shape {None if scores is None else scores.shape}"
                except (InferenceServerException, OSError) as e:
                    error = str(e)
                self.answers.append(Answer(start, time.monotonic() - start, error))


def _ready(custom: Any) -> int:
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, NEIGHBOUR, PLURAL, CONV_NAME)
    return int((obj.get("status") or {}).get("readyReplicas") or 0)


def _attacker_reasons(core: Any) -> set[str]:
    """The reasons of the attacker's pods' ModelLoaded conditions and Warning Events."""
    reasons = {e.reason for e in core.list_namespaced_event(ATTACKER).items if e.type == "Warning"}
    for pod in core.list_namespaced_pod(ATTACKER).items:
        for c in pod.status.conditions or []:
            if c.type == LOADED and c.status == "False":
                reasons.add(c.reason)
    return reasons


@pytest.mark.slow
@pytest.mark.triton
def test_a_namespaces_crashes_take_triton_down_a_bounded_number_of_times_and_fail_no_neighbour(
    cluster: SimCluster, tmp_path: Path
) -> None:
    assert cluster.model_store is not None and cluster.kube is not None
    core = cast(Any, kubernetes.client.CoreV1Api(cluster.kube))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(cluster.kube))
    apps = cast(Any, kubernetes.client.AppsV1Api(cluster.kube))
    triton = cluster.tritons[NODE.name]

    uri = cluster.model_store.publish(CONV_NAME, write_conv_model(tmp_path / CONV_NAME))
    spec = {"storageUri": uri, "gpuMemory": "1Gi", "replicas": 1, "idempotent": True}
    custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        NEIGHBOUR,
        PLURAL,
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TritonModel"}
        | {"metadata": {"name": CONV_NAME}, "spec": spec},
    )
    wait_until("the neighbour ready", lambda: _ready(custom) == 1, 180)
    address = core.read_namespaced_pod(host_name(NODE.name), NEIGHBOUR).status.pod_ip
    wait_until("the neighbour's host listening", lambda: _listening(address), 30)

    with Caller(address) as caller:
        wait_until("the neighbour answered", lambda: any(not a.error for a in caller.answers), 30)
        for index in range(KILLERS):
            name = f"killer-{index}"
            source = copy_model("add_one", tmp_path / "killers", as_name=name)
            # Each killer's own files: a file quarantine stops one, not the next.
            (source / "1" / "model.py").write_text(f"# {name}\n{load_killer()}")
            killer_uri = cluster.model_store.publish(name, source)
            apps.create_namespaced_deployment(
                ATTACKER, deployment_manifest(killer_uri, node=NODE.name, name=name)
            )
        attack = time.monotonic()
        wait_until(
            "the attacker's namespace refused on the node",
            lambda: "NamespaceCrashedTriton" in _attacker_reasons(core),
            300,
            lambda: f"{triton.kept_exits()} exits; reasons {_attacker_reasons(core)}",
        )
        exits = triton.kept_exits()
        attack = time.monotonic() - attack
        # The node loads none of its models any more: the neighbour answers, and Triton stays up
        # for the next 20 of its answers.
        settled = len(caller.answers)
        wait_until(
            "20 more neighbour answers",
            lambda: len(caller.answers) >= settled + 20,
            RESTORE_HOLD + 60,
        )
        assert triton.kept_exits() == exits, "Triton exited after the namespace was refused"
    failed = [a for a in caller.answers if a.error]
    slowest = max(a.seconds for a in caller.answers)
    windows = _refused_windows(caller.answers)
    print(
        f"{exits} exits in {attack:.1f} s; {len(caller.answers)} neighbour answers, slowest "
        f"{slowest:.2f} s; refused {sum(windows):.1f} s in {len(windows)} windows, longest "
        f"{max(windows, default=0):.1f} s"
    )
    assert 1 <= exits <= MOST_EXITS, exits
    # Refused only while a suspect's load is tried alone, as a probationer, and told to retry;
    # never an answer lost (502, a reset) or held past the restore's bound.
    assert all(a.error.startswith(PROBATION) for a in failed), {a.error for a in failed}
    assert sum(windows) <= attack / 2, (windows, attack)
    assert slowest <= RESTORE_HOLD + 10, slowest


def _refused_windows(answers: list[Answer]) -> list[float]:
    """The spans of consecutive failed answers, from the first's start to the next success."""
    windows: list[float] = []
    began: float | None = None
    for answer in answers:
        if answer.error and began is None:
            began = answer.start
        elif not answer.error and began is not None:
            windows.append(answer.start - began)
            began = None
    if began is not None:
        windows.append(answers[-1].start + answers[-1].seconds - began)
    return windows
