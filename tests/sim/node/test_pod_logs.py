"""`kubectl logs` on the simulated cluster: the API server serves `pods/<name>/log` from the log
the kubelet of the pod's node wrote (its log port published on the Node), with `container`,
`previous`, `tailLines` and `follow`, and upstream's errors. Through the official client's
`read_namespaced_pod_log` and the real `kubectl logs`."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest

from sim.apiserver import RunningApiServer
from sim.node.kubelet import Kubelet
from tests.conftest import require_executable
from tests.fixtures_sim import status_of
from tests.sim.node.test_kubelet import NS, core, create, pod_manifest, read, wait_for

NODE = "node-logs"
CRASHER = "import sys; print('run', sys.argv[1], flush=True); print('tail line'); sys.exit(3)"
TICKER = (
    "import time\nfor i in range(5):\n    print('tick', i, flush=True)\n    time.sleep(0.2)\n"
    "time.sleep(30)"
)


@pytest.fixture
def node(apiserver: RunningApiServer, tmp_path: Path) -> Iterator[Kubelet]:
    api = apiserver.api_client()
    core(api).create_node(
        {
            "metadata": {"name": NODE},
            "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]},
        }
    )
    kubelet = Kubelet(api, NODE, tmp_path / "kubelet", backoff_initial=0.1, abandon_grace=5)
    kubelet.start()
    try:
        yield kubelet
    finally:
        kubelet.stop()
        api.close()  # type: ignore[no-untyped-call]


def _container(name: str, code: str, *args: str) -> dict[str, Any]:
    return {"name": name, "image": "x", "command": [sys.executable, "-c", code], "args": list(args)}


def _restarts(api: kubernetes.client.ApiClient, pod: str, container: str, at_least: int) -> bool:
    found = read(api, pod) or {}
    statuses = (found.get("status") or {}).get("containerStatuses") or []
    return any(s["name"] == container and s["restartCount"] >= at_least for s in statuses)


def test_logs_of_the_current_and_previous_run(
    kube_api: kubernetes.client.ApiClient, node: Kubelet
) -> None:
    spec = {"containers": [_container("app", CRASHER, "x")], "restartPolicy": "Always"}
    create(kube_api, pod_manifest("crash", {**spec, "nodeName": NODE}))
    wait_for("two restarts", lambda: _restarts(kube_api, "crash", "app", 2))
    v1 = core(kube_api)
    # One container: the name may be left out. Each run's own output, not every run's.
    assert v1.read_namespaced_pod_log("crash", NS) in ("", "run x\ntail line\n")
    previous = v1.read_namespaced_pod_log("crash", NS, container="app", previous=True)
    assert previous == "run x\ntail line\n"
    assert v1.read_namespaced_pod_log("crash", NS, previous=True, tail_lines=1) == "tail line\n"


def test_follow_streams_what_the_container_writes(
    kube_api: kubernetes.client.ApiClient, node: Kubelet
) -> None:
    spec = {
        "containers": [
            _container("ticker", TICKER),
            _container("idle", "import time; time.sleep(30)"),
        ]
    }
    create(kube_api, pod_manifest("ticks", {**spec, "nodeName": NODE}))
    v1 = core(kube_api)
    wait_for("the ticker to start", lambda: "tick 0" in _log(v1, "ticks", "ticker"))
    stream = v1.read_namespaced_pod_log(
        "ticks", NS, container="ticker", follow=True, _preload_content=False
    )
    lines: list[str] = []
    for raw in stream.stream(64):
        lines += [line for line in raw.decode().splitlines() if line]
        if "tick 4" in lines:
            break
    stream.release_conn()
    assert lines == [f"tick {i}" for i in range(5)]


def _log(v1: Any, pod: str, container: str) -> str:
    try:
        return str(v1.read_namespaced_pod_log(pod, NS, container=container))
    except kubernetes.client.ApiException:
        return ""


def test_upstreams_errors(kube_api: kubernetes.client.ApiClient, node: Kubelet) -> None:
    v1 = core(kube_api)
    spec = {
        "initContainers": [_container("wait", "import time; time.sleep(30)")],
        "containers": [_container("a", "pass"), _container("b", "pass")],
    }
    create(kube_api, pod_manifest("two", {**spec, "nodeName": NODE}))
    create(kube_api, pod_manifest("nowhere", {**spec, "nodeName": ""}))
    cases = [
        (
            {"name": "two"},
            "a container name must be specified for pod two, choose one of: [a b] or one of the"
            " init containers: [wait]",
        ),
        ({"name": "two", "container": "c"}, "container c is not valid for pod two"),
        ({"name": "nowhere", "container": "a"}, "pod nowhere does not have a host assigned"),
    ]
    wait_for("the init container to run", lambda: _init_running(kube_api, "two"))
    cases.append(
        (
            {"name": "two", "container": "a"},
            'container "a" in pod "two" is waiting to start: PodInitializing',
        )
    )
    for arguments, message in cases:
        with pytest.raises(kubernetes.client.ApiException) as refused:
            v1.read_namespaced_pod_log(namespace=NS, **arguments)
        assert refused.value.status == 400, arguments
        assert status_of(refused.value)["message"] == message


def test_kubectl_logs(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    node: Kubelet,
    tmp_path: Path,
) -> None:
    kubectl = require_executable("kubectl")
    config = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    spec = {
        "initContainers": [_container("loader", CRASHER, "init")],
        "containers": [_container("proxy", "pass")],
    }
    create(kube_api, pod_manifest("model", {**spec, "nodeName": NODE}))
    wait_for("the loader to restart", lambda: _init_restarts(kube_api, "model") >= 1)

    def kubectl_logs(*args: str) -> str:
        done = subprocess.run(
            [kubectl, "--kubeconfig", str(config), "-n", NS, "logs", "model", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert kubectl_logs("-c", "loader", "--previous") == "run init\ntail line\n"
    assert kubectl_logs("-c", "loader", "--previous", "--tail=1") == "tail line\n"


def _init_restarts(api: kubernetes.client.ApiClient, pod: str) -> int:
    found = read(api, pod) or {}
    statuses = (found.get("status") or {}).get("initContainerStatuses") or []
    return max((int(s["restartCount"]) for s in statuses), default=0)


def _init_running(api: kubernetes.client.ApiClient, pod: str) -> bool:
    found = read(api, pod) or {}
    statuses = (found.get("status") or {}).get("initContainerStatuses") or []
    return any("running" in (s.get("state") or {}) for s in statuses)


def test_a_kubelet_that_keeps_logs_moves_a_deleted_pods_logs_aside(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient, tmp_path: Path
) -> None:
    """A benchmark's post-mortem: with `kept_logs`, a pod's container logs outlive the pod."""
    api = apiserver.api_client()
    core(api).create_node(
        {
            "metadata": {"name": NODE},
            "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]},
        }
    )
    kept = tmp_path / "kept"
    kubelet = Kubelet(api, NODE, tmp_path / "kubelet", abandon_grace=5, kept_logs=kept)
    kubelet.start()
    try:
        spec = {"containers": [_container("ticker", TICKER)]}
        create(kube_api, pod_manifest("ticks", {**spec, "nodeName": NODE}))
        v1 = core(kube_api)
        wait_for("the ticker to tick", lambda: "tick 2" in _log(v1, "ticks", "ticker"))
        v1.delete_namespaced_pod("ticks", NS, grace_period_seconds=1)
        wait_for("the pod gone", lambda: read(kube_api, "ticks") is None)
    finally:
        kubelet.stop()
        api.close()  # type: ignore[no-untyped-call]
    (pod_dir,) = [d for d in kept.iterdir() if d.name.startswith(f"{NS}_ticks_")]
    assert "tick 2" in (pod_dir / "ticker.log").read_text()
    assert not list((tmp_path / "kubelet").glob(f"{NS}_ticks_*"))
