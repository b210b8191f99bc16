"""`make sim-up` as a new user meets it: `python -m sim.up start` returns once the simulated
cluster is ready with `export KUBECONFIG=...` last; plain `kubectl apply -k deploy/example` gets
a Ready model pod answering through its Service's address; a Deployment in the short form is
completed by the webhook and served, sim-up's convolutional ONNX model too; `tritonshare status`
shows them; `tritonshare preflight` fails nothing; ModelMesh's example-onnx-mnist is served once
KServe's CRDs are applied; `python -m sim.up stop` ends every process and removes the directory.
One cluster for the module."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import kubernetes.config
import numpy as np
import onnxruntime
import psutil
import pytest
import tritonclient.http as httpclient
from numpy.typing import NDArray
from tritonclient.utils import InferenceServerException

from sim.onnxmodels import CONV_IMAGE, CONV_INPUT, CONV_NAME, CONV_OUTPUT, write_conv_model
from sim.processes import wait_until
from sim.triton import TritonInstall
from tests.buckets import s3_server
from tests.conftest import require_executable
from tests.e2e import test_modelmesh_onnx as mm

ROOT = Path(__file__).resolve().parents[2]
INFER = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}
SHORT_FORM = """\
apiVersion: apps/v1
kind: Deployment
metadata: {{name: add-one, namespace: team-a}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: add-one}}}}
  template:
    metadata:
      labels: {{app: add-one, tritonshare.io/role: model}}
      annotations:
        tritonshare.io/model-uri: {uri}
        tritonshare.io/model-id: add_one
        tritonshare.io/gpu-mem: 1Gi
    spec:
      containers:
      - name: proxy
        image: ghcr.io/tritonshare/tritonshare:0.1.0
"""

pytestmark = [pytest.mark.slow, pytest.mark.triton]


@dataclass
class SimUp:
    directory: Path
    output: str
    env: dict[str, str]
    kubectl: str

    def run(self, *argv: str, stdin: str | None = None) -> str:
        done = subprocess.run(
            argv, env=self.env, input=stdin, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
        return done.stdout

    def get(self, *argv: str) -> Any:
        return json.loads(self.run(self.kubectl, "get", *argv, "-o", "json"))


def _sim_up(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sim.up", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=360,
    )


@pytest.fixture(scope="module")
def sim_up(
    tmp_path_factory: pytest.TempPathFactory, triton_install: TritonInstall
) -> Iterator[SimUp]:
    kubectl = require_executable("kubectl")
    directory = tmp_path_factory.mktemp("sim-up") / "cluster"
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    started = _sim_up("start", "--dir", str(directory), env=env)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        last = started.stdout.strip().splitlines()[-1]
        assert last == f"export KUBECONFIG={directory / 'kubeconfig'}", started.stdout
        bin_dir = str(Path(sys.executable).parent)
        yield SimUp(
            directory,
            started.stdout,
            {
                **env,
                "KUBECONFIG": str(directory / "kubeconfig"),
                "PATH": f"{bin_dir}:{env['PATH']}",
            },
            kubectl,
        )
    finally:
        _sim_up("stop", "--dir", str(directory), env=env)


def _logs_of(sim: SimUp, namespace: str, selector: str) -> str:
    """For a failure's message: the last lines of the pods' proxies and of the node's agent."""
    said = []
    for pod in sim.get("pods", "-n", namespace, "-l", selector)["items"]:
        name = pod["metadata"]["name"]
        logs = sim.run(sim.kubectl, "logs", "-n", namespace, name, "-c", "proxy")
        said.append(f"--- {namespace}/{name} proxy:\n" + "\n".join(logs.splitlines()[-30:]))
    for path in sorted((sim.directory / "logs").glob("agent*.log")):
        said.append(f"--- {path.name}:\n" + "\n".join(path.read_text().splitlines()[-40:]))
    return "\n" + "\n".join(said)


def _is_ready(pod: dict[str, Any]) -> bool:
    conditions = pod["status"].get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _ready_pod(sim: SimUp, namespace: str, selector: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while True:
        pods = sim.get("pods", "-n", namespace, "-l", selector)["items"]
        ready = [p for p in pods if _is_ready(p)]
        if ready:
            return dict(ready[0])
        assert time.monotonic() < deadline, f"no Ready pod in {namespace}: {json.dumps(pods)}"
        time.sleep(0.5)


def _infer(address: str) -> list[float]:
    request = urllib.request.Request(
        f"http://{address}/v2/models/add_one/infer", data=json.dumps(INFER).encode()
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.loads(response.read())
    return [float(x) for x in answer["outputs"][0]["data"]]


def _quickstart_block() -> list[str]:
    """docs/quickstart.md's `make sim-up` block, line by line."""
    text = (ROOT / "docs" / "quickstart.md").read_text()
    section = text.split("\n## On your machine\n", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return block.replace("\\\n", "").splitlines()


def test_the_quickstarts_steps_run_as_written(sim_up: SimUp) -> None:
    """Between `make sim-up` (the fixture) and `make sim-down` (the last test), the block runs
    as written with the variables sim-up exports: the example applied, rolled out, shown by
    status and answering through its Service's address."""
    lines = _quickstart_block()
    assert lines[0].startswith('eval "$(make -s sim-up')
    assert lines[-1].startswith("make sim-down")
    uri = next(x for x in sim_up.output.splitlines() if x.startswith("export MODEL_URI="))
    script = "\n".join(["set -e", uri, *(x for x in lines[1:-1] if not x.startswith(". "))])
    output = sim_up.run("bash", "-c", script)
    assert "deployment.apps/add-one created" in output
    assert "successfully rolled out" in output
    assert "models/add-one-" in output  # tritonshare status
    assert '"data":[2.0,3.0,4.0]' in output
    pod = _ready_pod(sim_up, "models", "app.kubernetes.io/name=add-one")
    assert pod["spec"]["nodeName"] == "gpu-node-0"
    # kustomize's `images:` rewrote the image the example names.
    assert pod["spec"]["containers"][0]["image"] == "ghcr.io/tritonshare/tritonshare:0.1.0"
    service = sim_up.get("service", "add-one", "-n", "models")
    assert service["spec"]["clusterIP"].startswith("127.2.")


def test_the_quickstarts_autoscaling_experiment_runs_as_written(
    sim_up: SimUp, tmp_path: Path
) -> None:
    """Its block, after the first's: the Deployment scales to four Ready replicas under `hey`'s
    load, every request answered 200, and back to one after it. The waits' timeouts are
    longer here, so a loaded machine does not fail it; the figure is the docs'."""
    require_executable("hey")
    text = (ROOT / "docs" / "quickstart.md").read_text()
    section = text.split("\n## On your machine\n", 1)[1]
    block = section.split("```sh\n")[2].split("```", 1)[0]
    assert "--timeout=30s" in block and "/tmp/hey" in block
    for timeout in ("--timeout=30s", "--timeout=60s"):
        block = block.replace(timeout, "--timeout=90s")
    block = block.replace("/tmp/hey", str(tmp_path / "hey"))
    service = sim_up.get("service", "add-one", "-n", "models")["spec"]["clusterIP"]
    body = json.dumps(INFER, separators=(",", ":"))
    script = "\n".join(["set -e", f"SERVICE={service}", f"BODY='{body}'", block])
    done = subprocess.run(
        ["bash", "-c", script], env=sim_up.env, capture_output=True, text=True, timeout=240
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert output.count("condition met") == 2, output
    codes = (tmp_path / "hey").read_text().split("Status code distribution:", 1)[1]
    assert [line.split()[0] for line in codes.strip().splitlines()] == ["[200]"], codes


def test_the_short_form_is_completed_by_the_webhook_and_served(sim_up: SimUp) -> None:
    uri = next(
        line.split("=", 1)[1]
        for line in sim_up.output.splitlines()
        if line.startswith("export MODEL_URI=")
    )
    sim_up.run(sim_up.kubectl, "create", "namespace", "team-a")
    sim_up.run(sim_up.kubectl, "apply", "-f", "-", stdin=SHORT_FORM.format(uri=uri))
    pod = _ready_pod(sim_up, "team-a", "app=add-one")
    assert pod["spec"]["schedulerName"] == "tritonshare"
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["storage-initializer", "loader"]
    assert _infer(f"{pod['status']['podIP']}:9000") == [2.0, 3.0, 4.0]


def test_the_convolutional_model_answers_through_its_pods_proxy(
    sim_up: SimUp, tmp_path: Path
) -> None:
    """sim-up's ONNX network, in the short form: served by ONNX Runtime in the node's Triton,
    its answer through the pod's proxy is ONNX Runtime's own for the same file."""
    uri = next(
        line.split("=", 1)[1]
        for line in sim_up.output.splitlines()
        if line.startswith("export CONV_MODEL_URI=")
    )
    manifest = SHORT_FORM.replace("add-one", "conv").replace("team-a", "vision")
    manifest = manifest.replace("model-id: add_one", f"model-id: {CONV_NAME}")
    sim_up.run(sim_up.kubectl, "create", "namespace", "vision")
    sim_up.run(sim_up.kubectl, "apply", "-f", "-", stdin=manifest.format(uri=uri))
    pod = _ready_pod(sim_up, "vision", "app=conv")
    images = np.random.default_rng(7).random((2, *CONV_IMAGE), dtype=np.float32)
    client = httpclient.InferenceServerClient(f"{pod['status']['podIP']}:9000")
    try:
        tensor = httpclient.InferInput(CONV_INPUT, list(images.shape), "FP32")
        tensor.set_data_from_numpy(images)
        answer = client.infer(CONV_NAME, [tensor]).as_numpy(CONV_OUTPUT)
    finally:
        client.close()
    model = write_conv_model(tmp_path / CONV_NAME) / "1" / "model.onnx"
    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(answer, session.run(None, {CONV_INPUT: images})[0], rtol=1e-4)


def test_the_concepts_residency_walkthrough_runs_as_written(sim_up: SimUp) -> None:
    """docs/concepts.md's on-demand step: placed with the over-commit label, asleep once idle,
    woken by a request. Its `sleep 10` is a poll here, so a loaded machine does not fail it."""
    text = (ROOT / "docs" / "concepts.md").read_text()
    section = text.split("\n## Residency classes\n", 1)[1]
    block = section.split("```sh\n", 1)[1].split("\n```", 1)[0]
    assert "sleep 10; tritonshare status" in block
    poll = "for i in $(seq 240); do tritonshare status | grep -q 'on-demand, asleep' && break; "
    poll += "sleep 0.5; done; "
    block = block.replace("sleep 10; ", poll)
    uri = next(x for x in sim_up.output.splitlines() if x.startswith("export MODEL_URI="))
    output = sim_up.run("bash", "-c", "\n".join(["set -e", uri, block]))
    if "on-demand, asleep" not in output:
        output += _logs_of(sim_up, "team-b", "app=add-one")
    assert "team-b/add-one-" in output and "on-demand, asleep" in output, output
    node = sim_up.get("node", "gpu-node-0")
    assert node["metadata"]["labels"]["tritonshare.io/gpu-mem-overcommit"] == "3"
    pod = _ready_pod(sim_up, "team-b", "app=add-one")
    assert _infer(f"{pod['status']['podIP']}:9000") == [2.0, 3.0, 4.0]  # the wake


def test_prometheus_scrapes_the_model_pods_where_installed(sim_up: SimUp) -> None:
    line = next((x for x in sim_up.output.splitlines() if "Prometheus scrapes" in x), None)
    if shutil.which("prometheus") is None:
        assert line is None
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    assert line is not None, sim_up.output
    url = line.rsplit(" ", 1)[1] + "/api/v1/targets"
    deadline = time.monotonic() + 60
    while True:
        with urllib.request.urlopen(url, timeout=10) as response:
            targets = json.loads(response.read())["data"]["activeTargets"]
        up = {t["labels"].get("namespace") for t in targets if t["health"] == "up"}
        if "models" in up:
            break
        assert time.monotonic() < deadline, targets
        time.sleep(1)


def test_status_shows_both_pods_on_the_node(sim_up: SimUp) -> None:
    status = sim_up.run(str(Path(sys.executable).parent / "tritonshare"), "status")
    assert "gpu-node-0" in status
    assert "models/add-one-" in status
    assert "team-a/add-one-" in status
    assert "may be that old" not in status  # said once asked, not on every call
    verbose = sim_up.run(str(Path(sys.executable).parent / "tritonshare"), "status", "-v")
    assert "may be that old" in verbose  # the residency columns say how old they can be
    # concepts.md reads the node gateway's split from its metrics port, as deploy/base has it.
    with urllib.request.urlopen("http://127.0.0.1:8012/metrics", timeout=10) as response:
        assert b"tritonshare_gateway_namespaces_sending" in response.read()


def test_preflight_finds_the_cluster_installed_as_deploy_base_installs_it(sim_up: SimUp) -> None:
    """`tritonshare preflight` on sim-up, as a new user runs it first: the node DaemonSets that
    deploy/base renders, and the node as the GPU Operator labels it, with room for the node
    pod beside the model pods of the tests above. It fails nothing; each warning says its fix."""
    tritonshare = str(Path(sys.executable).parent / "tritonshare")
    report = sim_up.run(tritonshare, "preflight")  # exit status 0
    assert "[fail]" not in report and ", 0 failed." in report, report
    checks = report.split("\n[")
    warned = [c for c in checks if c.startswith("warn]")]
    assert all("\n    fix: " in c for c in warned), report
    assert "[ok]   gpu-nodes: 1 GPU node\n" in report, report
    assert "allocatable nvidia.com/gpu=2" in report and "nvidia.com/gpu.count=2" in report
    assert "[ok]   node-pod-fit: the node pod fits on every GPU node" in report, report
    daemonsets = sim_up.get("daemonsets", "-n", "tritonshare-system")["items"]
    names = {d["metadata"]["name"] for d in daemonsets}
    assert names == {f"tritonshare-node{s}" for s in ("", "-2gpu", "-4gpu", "-8gpu")}
    # The one whose pod asks for both T4s is the one preflight found there.
    two = next(d for d in daemonsets if d["metadata"]["name"] == "tritonshare-node-2gpu")
    triton = two["spec"]["template"]["spec"]["containers"][0]
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == "2"


def _upgrade_node_block() -> str:
    """docs/upgrade.md's node step (2.), as written."""
    text = (ROOT / "docs" / "upgrade.md").read_text()
    section = text.split("\n**2. The node pods**", 1)[1]
    return section.split("```sh\n", 1)[1].split("```", 1)[0]


def test_the_upgrade_runbooks_node_step_runs_as_written(sim_up: SimUp) -> None:
    """docs/upgrade.md's step 2 on sim-up's node, with a TritonModel there (its `kubectl wait tm`
    needs one): the node pod is replaced under a new name and Ready again, the TritonModel Ready,
    the node's model pods the same pods (not recreated) and Ready again."""
    block = _upgrade_node_block()
    assert block.startswith("NODE=gpu-node-0\n"), block  # sim-up's node: it runs as written
    uri = next(x for x in sim_up.output.splitlines() if x.startswith("export MODEL_URI="))
    model = (
        "apiVersion: tritonshare.io/v1alpha1\nkind: TritonModel\n"
        "metadata: {name: add-one, namespace: upgrade}\n"
        "spec: {storageUri: $MODEL_URI, modelName: add_one, gpuMemory: 1Gi}\n"
    )
    setup = "\n".join(
        [
            "set -e",
            uri,
            "kubectl create namespace upgrade",
            f"kubectl apply -f - <<EOF\n{model}EOF",
            "kubectl wait tm -n upgrade add-one --for=condition=Ready --timeout=120s",
        ]
    )
    sim_up.run("bash", "-c", setup)
    # The TritonModel's Service has its endpoints, as kubectl lists them on a cluster.
    listed = sim_up.run(sim_up.kubectl, "get", "endpoints,endpointslices", "-n", "upgrade")
    assert "endpoints/add-one" in listed and "endpointslice.discovery.k8s.io/add-one-" in listed
    selector = "app.kubernetes.io/name=tritonshare-node"
    before = sim_up.get("pods", "-n", "tritonshare-system", "-l", selector)["items"]
    assert [p["spec"]["nodeName"] for p in before] == ["gpu-node-0"], before
    on_node = {
        (p["metadata"]["namespace"], p["metadata"]["name"]): p["metadata"]["uid"]
        for p in sim_up.get("pods", "-A", "--field-selector", "spec.nodeName=gpu-node-0")["items"]
        if p["metadata"]["namespace"] != "tritonshare-system" and _is_ready(p)
    }
    assert on_node, "no Ready model pod on the node: nothing to bring back"
    done = subprocess.run(
        ["bash", "-c", "set -e\n" + block],
        env=sim_up.env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert f'pod "{before[0]["metadata"]["name"]}" deleted' in output, output
    assert "condition met" in output and "gpu-node-0" in output, output
    after = sim_up.get("pods", "-n", "tritonshare-system", "-l", selector)["items"]
    assert [p["metadata"]["name"] for p in after] != [before[0]["metadata"]["name"]], after
    # The model pods are not recreated: the same pods, Ready once their proxies reinstalled.
    for (namespace, name), uid in on_node.items():
        run = ["pod", name, "-n", namespace]
        sim_up.run(sim_up.kubectl, "wait", *run, "--for=condition=Ready", "--timeout=100s")
        assert sim_up.get(*run)["metadata"]["uid"] == uid, name


def test_modelmeshs_example_onnx_mnist_is_served_once_kserves_crds_are_applied(
    sim_up: SimUp,
) -> None:
    """docs/modelmesh.md on sim-up, as a ModelMesh user moving over: the binders ran without
    KServe's CRDs (they find them later, no restart); `kubectl apply -k deploy/kserve-crds`,
    a namespace labelled `modelmesh-enabled`, a `storage-config` Secret for a real S3 API
    server, ModelMesh's `triton-2.x` ClusterServingRuntime and its example-onnx-mnist read
    `Ready` and `Loaded`, answering ONNX Runtime's numbers through `modelmesh-serving` (its
    ClusterIP): KServe v2 gRPC on 8033, REST on 8008."""
    name, namespace = "example-onnx-mnist", mm.NAMESPACE
    assert sim_up.get("crd")["items"] and not any(
        c["spec"]["group"] == mm.KSERVE for c in sim_up.get("crd")["items"]
    ), "sim-up serves KServe's kinds before they are applied"
    sim_up.run(sim_up.kubectl, "apply", "-k", str(ROOT / "deploy" / "kserve-crds"))
    labels = "modelmesh-enabled=true"
    sim_up.run(sim_up.kubectl, "create", "namespace", namespace)
    sim_up.run(sim_up.kubectl, "label", "namespace", namespace, labels)
    config = sim_up.env["KUBECONFIG"]
    api = kubernetes.config.new_client_from_config(config)  # type: ignore[no-untyped-call]
    core = cast(Any, kubernetes.client.CoreV1Api(api))
    custom = cast(Any, kubernetes.client.CustomObjectsApi(api))
    mnist = mm._mnist()

    def said() -> str:
        logs = sorted((sim_up.directory / "logs").glob("binder*.log"))
        tails = ["\n".join(p.read_text().splitlines()[-30:]) for p in logs]
        return mm._said(custom, name) + "\n".join(tails)

    try:
        with s3_server(mm.BUCKET) as s3:
            s3.put(mm.BUCKET, "onnx/mnist.onnx", mnist)
            mm.set_up_namespace(core, custom, s3, cluster_runtime=True)
            custom.create_namespaced_custom_object(
                mm.KSERVE, "v1beta1", namespace, mm.ISVCS, mm._isvc(name)
            )
            # The binders look for the kinds again every 30 s; then a first load on a busy node.
            status = wait_until(f"{name} Loaded", partial(mm._loaded, custom, name), 300, said)
            assert status["url"] == f"grpc://modelmesh-serving.{namespace}:8033", status
            ready = {c["type"]: c["status"] for c in status["conditions"]}
            assert ready["Ready"] == "True", status

            session = onnxruntime.InferenceSession(mnist, providers=["CPUExecutionProvider"])
            images = np.random.default_rng(3).random((2, 1, 28, 28), dtype=np.float32)
            expected = np.asarray(session.run([mm.OUTPUT], {mm.INPUT: images})[0])
            address = sim_up.get("service", "modelmesh-serving", "-n", namespace)["spec"]
            ip = address["clusterIP"]
            assert {p["port"] for p in address["ports"]} >= {8033, 8008}, address

            def over_grpc() -> list[NDArray[Any]] | None:
                try:
                    return [mm._infer(f"{ip}:8033", name, images)]
                except InferenceServerException:
                    return None  # the host has not read its routes yet

            [answer] = wait_until(f"{name} over gRPC", over_grpc, 60, said)
            np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-6)
            rest = httpclient.InferenceServerClient(f"{ip}:8008")
            try:
                tensor = httpclient.InferInput(mm.INPUT, list(images.shape), "FP32")
                tensor.set_data_from_numpy(images)
                over_rest = rest.infer(name, [tensor]).as_numpy(mm.OUTPUT)
            finally:
                rest.close()
            np.testing.assert_allclose(over_rest, expected, rtol=1e-5, atol=1e-6)
    finally:
        api.close()


def test_sim_down_stops_every_process_and_removes_its_files(sim_up: SimUp) -> None:
    daemon = int((sim_up.directory / "sim-up.pid").read_text())
    tree = [daemon, *(p.pid for p in psutil.Process(daemon).children(recursive=True))]
    assert len(tree) > 5  # Triton, agent, gateway, binders, webhook, pods
    stopped = _sim_up("stop", "--dir", str(sim_up.directory), env=sim_up.env)
    assert stopped.returncode == 0, stopped.stderr
    assert not sim_up.directory.exists()
    assert not [pid for pid in tree if _running(pid)]


def _running(pid: int) -> bool:
    """Not gone, nor an exited process its new parent has yet to reap."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
