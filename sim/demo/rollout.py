"""The rollout step of `make demo` (and so of tests/e2e/test_demo.py): a model's Deployment rolled
to new model files while a client keeps sending.

The Deployment is what a team writes: Kubernetes' default strategy (maxSurge 25%, which rounds up
to 1 pod; maxUnavailable 25%, which rounds down to 0), as many replicas as nodes that can take the
model (one, the node with the real Triton), a template in the short form tritonshare's webhook
completes. The release changes the template's model URI annotation to other files of the same
model id (they answer input + 100 where the first answered input + 1). A `SteadyClient` sends an
inference every 50 ms through the Service-style path (`sim.service.Endpoints`: the ready,
non-terminating pods) from before the change until the new revision has served for a while, and
counts every failed request.

`roll` returns what happened; it stops early, saying why, when the new revision's pod cannot load
its model (its loader ends with a message), rather than wait out its deadline.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import numpy as np
import tritonclient.http as httpclient
from kubernetes.client.exceptions import ApiException

from common.contract import Keys
from sim.cluster import SimCluster
from sim.controllers.podtemplate import HASH_LABEL
from sim.processes import wait_until
from sim.service import Endpoints

KEYS = Keys()
MODEL_URI = KEYS.prefix + "model-uri"
NAME = "counter"
"""The Deployment's name and its model id (a model of its own: no scenario pod shares it)."""
SELECTOR = f"app={NAME}"
INPUT = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
OLD_ANSWER = [[2.0, 3.0, 4.0]]
NEW_ANSWER = [[101.0, 102.0, 103.0]]
REVISION = "deployment.kubernetes.io/revision"


def new_release(source: Path, directory: Path) -> Path:
    """A copy of the add_one model directory `source` whose model answers input + 100: the same
    model, other files."""
    shutil.copytree(source, directory, ignore=shutil.ignore_patterns("__pycache__"))
    code = directory / "1" / "model.py"
    code.write_text(code.read_text().replace("(data + 1)", "(data + 100)"))
    return directory


def deployment_manifest(
    uri: str, replicas: int = 1, node: str = "", name: str = NAME
) -> dict[str, Any]:
    """The model as a team deploys it, with Kubernetes' default rollout strategy; with `node`,
    kept to that one node (the simulated cluster's node with a real Triton), so its replicas
    equal the nodes that can take it, the case a surge pod must share a node in."""
    pod_spec: dict[str, Any] = {
        # A Deployment's template needs a container: the webhook fills this one in.
        "containers": [{"name": "proxy", "image": "ghcr.io/tritonshare/tritonshare"}]
    }
    if node:
        pod_spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {
                    "labels": {"app": name, "tritonshare.io/role": "model"},
                    "annotations": {
                        MODEL_URI: uri,
                        KEYS.model_id: name,
                        KEYS.gpu_mem: "1Gi",
                    },
                },
                "spec": pod_spec,
            },
        },
    }


@dataclass
class SteadyClient:
    """One inference every `interval` seconds to the next ready endpoint, until stopped; every
    answer and every failure (no endpoint, a refused connection, an error answer) is kept."""

    endpoints: Endpoints
    model: str = NAME
    interval: float = 0.05
    answers: list[tuple[float, str, list[list[float]]]] = field(default_factory=list)
    failures: list[tuple[float, str, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="steady-client")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            address = self.endpoints.pick()
            now = time.monotonic()
            if address is None:
                self.failures.append((now, "", "no ready endpoint"))
                continue
            try:
                with httpclient.InferenceServerClient(
                    f"{address}:9000", connection_timeout=10, network_timeout=10
                ) as http:
                    tensor = httpclient.InferInput("INPUT0", list(INPUT.shape), "FP32")
                    tensor.set_data_from_numpy(INPUT)
                    output = http.infer(self.model, [tensor]).as_numpy("OUTPUT0")
                    self.answers.append((now, address, output.tolist()))
            except Exception as e:
                self.failures.append((now, address, f"{type(e).__name__}: {e}"))

    def since(self, moment: float) -> list[list[list[float]]]:
        return [answer for when, _, answer in list(self.answers) if when >= moment]


@dataclass
class RolloutResult:
    finished: bool = False
    """The Deployment reached revision 2, complete, with the old pod gone."""
    stuck: str = ""
    """Why the new revision's pod could not serve (its loader's message), when it could not."""
    old_node: str = ""
    surge_node: str = ""
    """Where the new revision's first pod was placed (beside the old one: one node)."""
    requests: int = 0
    failures: list[str] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    """The distinct answers, in the order first seen."""
    answers_after: list[str] = field(default_factory=list)
    """The distinct answers once the rollout was over."""
    seconds: float = 0.0


def _pods(core: Any, namespace: str) -> list[dict[str, Any]]:
    listed = core.list_namespaced_pod(namespace, label_selector=SELECTOR, _preload_content=False)
    pods: list[dict[str, Any]] = json.loads(listed.data)["items"]
    return pods


def _loader_message(pod: dict[str, Any]) -> str:
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if status.get("name") != "loader":
            continue
        for where in ("state", "lastState"):
            ended = (status.get(where) or {}).get("terminated") or {}
            if ended and ended.get("exitCode") not in (None, 0):
                return str(ended.get("message") or f"exit code {ended.get('exitCode')}").strip()
    return ""


def _rolled(apps: Any, namespace: str, revision: str) -> bool:
    d = apps.read_namespaced_deployment(NAME, namespace)
    s = d.status
    done = next((c for c in s.conditions or [] if c.type == "Progressing"), None)
    return bool(
        (d.metadata.annotations or {}).get(REVISION) == revision
        and (s.replicas, s.updated_replicas, s.available_replicas) == (1, 1, 1)
        and done is not None
        and done.reason == "NewReplicaSetAvailable"
    )


def roll(
    cluster: SimCluster,
    source: Path,
    workdir: Path,
    namespace: str,
    say: Callable[[str], None] = lambda _: None,
    deadline: float = 180.0,
) -> RolloutResult:
    """Deploy `source` (the add_one model) as Deployment `counter`, send steadily, release new
    files, and report. The Deployment is left in place (`retire` deletes it)."""
    assert cluster.model_store is not None and cluster.kube is not None
    started = time.monotonic()
    result = RolloutResult()
    apps = cast(Any, kubernetes.client.AppsV1Api(cluster.kube))
    core = cluster.core
    old_uri = cluster.model_store.publish(NAME, source)
    new_uri = cluster.model_store.publish(NAME, new_release(source, workdir / "v2"), release="v2")
    # On the node with a real Triton: the others are simulated GPUs whose Triton is not there.
    real = cluster.real_node.name if cluster.real_node is not None else ""
    apps.create_namespaced_deployment(namespace, deployment_manifest(old_uri, node=real))
    say(
        f"Deployment {NAME}: 1 replica (as many as nodes that can take it), Kubernetes' default "
        "rollout strategy (maxSurge 25% rounds up to 1, maxUnavailable 25% down to 0)."
    )
    wait_until(
        "the Deployment's first revision available", lambda: _rolled(apps, namespace, "1"), 180
    )
    [old] = _pods(core, namespace)
    result.old_node = str(old["spec"].get("nodeName") or "")
    with Endpoints(cluster.kube, namespace, SELECTOR) as endpoints:
        wait_until("a ready endpoint", endpoints.addresses, 30)
        client = SteadyClient(endpoints)
        client.start()
        try:
            wait_until("answers from revision 1", lambda: len(client.answers) >= 10, 30)
            say(
                f"  A client sends to it every 50 ms through the Service's ready endpoints; "
                f"releasing new model files ({new_uri.rsplit('/', 2)[-2]}/{NAME}.tar.gz)."
            )
            patch = {"spec": {"template": {"metadata": {"annotations": {MODEL_URI: new_uri}}}}}
            apps.patch_namespaced_deployment(NAME, namespace, patch)
            limit = time.monotonic() + deadline
            while time.monotonic() < limit:
                pods = _pods(core, namespace)
                new = [p for p in pods if p["metadata"]["annotations"].get(MODEL_URI) == new_uri]
                if new and not result.surge_node:
                    result.surge_node = str(new[0]["spec"].get("nodeName") or "")
                stuck = next((m for p in new if (m := _loader_message(p))), "")
                if stuck:
                    result.stuck = stuck
                    break
                if len(pods) == 1 and new and _rolled(apps, namespace, "2"):
                    result.finished = True
                    break
                time.sleep(0.2)
            if result.finished:
                settled = time.monotonic()
                wait_until(
                    "answers after the rollout", lambda: len(client.since(settled)) >= 20, 60
                )
                result.answers_after = sorted({str(a) for a in client.since(settled)})
        finally:
            client.stop()
    result.requests = len(client.answers) + len(client.failures)
    result.failures = [f"{address or '-'}: {why}" for _, address, why in client.failures]
    result.answers = list(dict.fromkeys(str(a) for _, _, a in client.answers))
    result.seconds = time.monotonic() - started
    hashes = {p["metadata"]["labels"].get(HASH_LABEL) for p in _pods(core, namespace)}
    if result.finished:
        say(
            f"  Rolled: the new revision's pod joined the old one on {result.surge_node}, served, "
            f"and the old one went; {result.requests} requests, {len(result.failures)} failed."
        )
    else:
        say(
            f"  NOT rolled: {result.stuck or 'no new pod served within the deadline'} "
            f"({len(hashes)} revisions' pods left; {result.requests} requests, "
            f"{len(result.failures)} failed). A rollout on one node needs each pod's model under "
            "a private name in Triton."
        )
    return result


def retire(cluster: SimCluster, namespace: str) -> None:
    """Delete the Deployment; the controller manager collects its ReplicaSets and pods."""
    apps = cast(Any, kubernetes.client.AppsV1Api(cluster.kube))
    with contextlib.suppress(ApiException):
        apps.delete_namespaced_deployment(NAME, namespace)
