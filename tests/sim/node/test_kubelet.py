"""The simulated kubelet runs a node's pods as processes, through the official client against sim/.

Pods here use tiny `python -c` programs, so the tests exercise the kubelet's own behaviour: init
order, Downward API, projected tokens, volumes, readiness, termination messages, restarts and
graceful deletion, as a client reads them back from the API.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from sim.apiserver import RunningApiServer
from sim.node.kubelet import HollowKubelet, Kubelet
from sim.triton import free_port

NODE = "node-local"
NS = "default"


def core(api: kubernetes.client.ApiClient) -> Any:
    """CoreV1Api, untyped: these tests pass raw dicts and read raw responses."""
    return cast(Any, kubernetes.client.CoreV1Api(api))


def read(api: kubernetes.client.ApiClient, name: str) -> dict[str, Any] | None:
    try:
        response = core(api).read_namespaced_pod(name, NS, _preload_content=False)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    pod: dict[str, Any] = json.loads(response.data)
    return pod


def wait_for(
    what: str, check: Callable[[], Any], timeout: float = 60.0, interval: float = 0.05
) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def condition(pod: dict[str, Any] | None, kind: str) -> str | None:
    if pod is None:
        return None
    for c in pod.get("status", {}).get("conditions", []):
        if c["type"] == kind:
            return str(c["status"])
    return None


def create(api: kubernetes.client.ApiClient, pod: dict[str, Any]) -> None:
    core(api).create_namespaced_pod(NS, pod, _preload_content=False)


def pod_manifest(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"example.com/model": "add_one"}},
        "spec": {"nodeName": NODE, **spec},
    }


@pytest.fixture
def kubelet(apiserver: RunningApiServer, tmp_path: Path) -> Iterator[Kubelet]:
    api = apiserver.api_client()
    node = Kubelet(api, NODE, tmp_path / "kubelet", backoff_initial=0.1, abandon_grace=5)
    node.start()
    try:
        yield node
    finally:
        node.stop()
        api.close()  # type: ignore[no-untyped-call]


# The init container records what it was given; the main container serves it over HTTP.
INIT = """
import json, os, pathlib, sys
out = pathlib.Path(sys.argv[1])
token = pathlib.Path(sys.argv[2]).read_text()
env = {k: os.environ[k] for k in ("POD_NAME", "POD_UID", "HOST_IP", "MODEL", "GREETING")}
(out / "index.json").write_text(json.dumps({"env": env, "token": token, "argv": sys.argv[1:]}))
"""


def test_a_pod_runs_init_then_main_containers_and_becomes_ready(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient, kubelet: Kubelet
) -> None:
    port = free_port()
    create(
        kube_api,
        pod_manifest(
            "web",
            {
                "initContainers": [
                    {
                        "name": "prepare",
                        "image": "tritonshare",
                        "command": ["python", "-c", INIT],
                        "args": ["/srv/data", "/var/run/secrets/tokens/token"],
                        "env": [
                            {
                                "name": "POD_NAME",
                                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                            },
                            {
                                "name": "POD_UID",
                                "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}},
                            },
                            {
                                "name": "HOST_IP",
                                "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}},
                            },
                            {
                                "name": "MODEL",
                                "valueFrom": {
                                    "fieldRef": {
                                        "fieldPath": "metadata.annotations['example.com/model']"
                                    }
                                },
                            },
                            {"name": "GREETING", "value": "hello $(MODEL) on $(HOST_IP)"},
                        ],
                        "volumeMounts": [
                            {"name": "data", "mountPath": "/srv/data"},
                            {"name": "token", "mountPath": "/var/run/secrets/tokens"},
                        ],
                    }
                ],
                "containers": [
                    {
                        "name": "server",
                        "image": "tritonshare",
                        "command": ["python", "-m", "http.server"],
                        "args": [str(port), "--bind", "$(POD_IP)", "--directory", "/srv/data"],
                        "env": [
                            {
                                "name": "POD_IP",
                                "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                            }
                        ],
                        "ports": [{"name": "http", "containerPort": port}],
                        "readinessProbe": {
                            "httpGet": {"path": "/index.json", "port": "http"},
                            "periodSeconds": 1,
                        },
                        "volumeMounts": [{"name": "data", "mountPath": "/srv/data"}],
                    }
                ],
                "volumes": [
                    {"name": "data", "emptyDir": {}},
                    {
                        "name": "token",
                        "projected": {
                            "sources": [
                                {
                                    "serviceAccountToken": {
                                        "audience": "tritonshare-agent",
                                        "expirationSeconds": 3600,
                                        "path": "token",
                                    }
                                }
                            ]
                        },
                    },
                ],
            },
        ),
    )
    pod = wait_for(
        "the pod to be Ready",
        lambda: condition(read(kube_api, "web"), "Ready") == "True" and read(kube_api, "web"),
    )
    assert pod["status"]["phase"] == "Running"
    assert condition(pod, "Initialized") == "True"
    [init] = pod["status"]["initContainerStatuses"]
    assert init["state"]["terminated"]["reason"] == "Completed"
    assert init["state"]["terminated"]["exitCode"] == 0
    [main] = pod["status"]["containerStatuses"]
    assert main["ready"] is True and "running" in main["state"]

    # The pod has an address of its own, not the node's; the server listens on it and the
    # kubelet's readiness probe reached it there.
    pod_ip = pod["status"]["podIP"]
    assert pod_ip != pod["status"]["hostIP"] == "127.0.0.1"
    assert pod_ip.startswith("127.") and pod["status"]["podIPs"] == [{"ip": pod_ip}]
    with urllib.request.urlopen(f"http://{pod_ip}:{port}/index.json", timeout=10) as response:
        seen = json.loads(response.read())
    uid = pod["metadata"]["uid"]
    assert seen["env"] == {
        "POD_NAME": "web",
        "POD_UID": uid,
        "HOST_IP": "127.0.0.1",
        "MODEL": "add_one",
        "GREETING": "hello add_one on 127.0.0.1",
    }
    # Mount paths in args are rewritten to the local directories that stand in for the volumes.
    assert not seen["argv"][0].startswith("/srv/")
    # The projected token is a real one: TokenReview binds it to this pod, with the audience.
    review = cast(Any, kubernetes.client.AuthenticationV1Api(kube_api)).create_token_review(
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": seen["token"], "audiences": ["tritonshare-agent"]},
        },
        _preload_content=False,
    )
    status = json.loads(review.data)["status"]
    assert status["authenticated"] is True
    assert status["user"]["extra"]["authentication.kubernetes.io/pod-uid"] == [uid]


def test_a_failing_init_container_reports_its_termination_message(
    kube_api: kubernetes.client.ApiClient, kubelet: Kubelet
) -> None:
    failing = (
        "import pathlib, sys; pathlib.Path(sys.argv[1]).write_text('config.pbtxt is missing');"
        " sys.exit(3)"
    )
    create(
        kube_api,
        pod_manifest(
            "broken",
            {
                "restartPolicy": "Never",
                "initContainers": [
                    {
                        "name": "loader",
                        "image": "tritonshare",
                        "command": ["python", "-c", failing],
                        "args": ["/dev/termination-log"],
                    }
                ],
                "containers": [{"name": "never", "image": "tritonshare", "command": ["false"]}],
            },
        ),
    )
    pod = wait_for(
        "the pod to fail",
        lambda: (p := read(kube_api, "broken")) and p["status"].get("phase") == "Failed" and p,
    )
    terminated = pod["status"]["initContainerStatuses"][0]["state"]["terminated"]
    assert terminated == terminated | {
        "exitCode": 3,
        "reason": "Error",
        "message": "config.pbtxt is missing",
    }
    assert condition(pod, "Initialized") == "False"
    assert "running" not in pod["status"]["containerStatuses"][0]["state"]


def test_the_loader_as_the_webhook_writes_it_reports_into_the_pods_own_directory(
    kube_api: kubernetes.client.ApiClient, kubelet: Kubelet, tmp_path: Path
) -> None:
    """The webhook's loader names no --termination-log: it writes its default,
    /dev/termination-log, where the kubelet mounts the container's termination file. The
    simulated kubelet must land that write in the pod's own directory (and so report it), never
    on the host's /dev."""
    create(
        kube_api,
        pod_manifest(
            "unreachable",
            {
                "restartPolicy": "Never",
                "initContainers": [
                    {
                        "name": "loader",
                        "image": "tritonshare",
                        "command": ["python", "-m", "loader"],
                        "args": [
                            "--model-dir=/mnt/models",
                            "--model-id=add_one",
                            f"--agent-address=127.0.0.1:{free_port()}",
                            "--token-file=/var/run/secrets/tritonshare/token",
                            "--timeout=5",
                        ],
                        "volumeMounts": [
                            {"name": "model", "mountPath": "/mnt/models"},
                            {"name": "token", "mountPath": "/var/run/secrets/tritonshare"},
                        ],
                    }
                ],
                "containers": [{"name": "never", "image": "tritonshare", "command": ["false"]}],
                "volumes": [{"name": "model", "emptyDir": {}}, {"name": "token", "emptyDir": {}}],
            },
        ),
    )
    pod = wait_for(
        "the pod to fail",
        lambda: (p := read(kube_api, "unreachable")) and p["status"].get("phase") == "Failed" and p,
    )
    terminated = pod["status"]["initContainerStatuses"][0]["state"]["terminated"]
    # terminationMessagePolicy File (the default): the message is the file's, nothing else.
    assert "has no config.pbtxt" in terminated["message"], terminated
    written = [p for p in (tmp_path / "kubelet").rglob("termination/loader") if p.read_text()]
    assert len(written) == 1 and written[0].read_text().strip() == terminated["message"].strip()


def test_a_crashing_container_is_restarted_with_back_off(
    kube_api: kubernetes.client.ApiClient, kubelet: Kubelet
) -> None:
    create(
        kube_api,
        pod_manifest(
            "crashy",
            {
                "containers": [
                    {
                        "name": "main",
                        "image": "tritonshare",
                        "command": ["python", "-c", "raise SystemExit(1)"],
                    }
                ]
            },
        ),
    )

    waiting_reasons: set[str] = set()

    def restarted_twice() -> dict[str, Any] | None:
        pod = read(kube_api, "crashy")
        statuses = (pod or {}).get("status", {}).get("containerStatuses") or [{}]
        waiting_reasons.add(statuses[0].get("state", {}).get("waiting", {}).get("reason", ""))
        return pod if statuses[0].get("restartCount", 0) >= 2 else None

    pod = wait_for("two restarts", restarted_twice, interval=0.02)
    status = pod["status"]["containerStatuses"][0]
    assert status["lastState"]["terminated"]["exitCode"] == 1
    assert "CrashLoopBackOff" in waiting_reasons


def test_deleting_a_pod_runs_pre_stop_then_sigterm_then_removes_it(
    kube_api: kubernetes.client.ApiClient, kubelet: Kubelet, tmp_path: Path
) -> None:
    marker = tmp_path / "order.txt"
    program = (
        "import pathlib, signal, sys, time\n"
        "log = pathlib.Path(sys.argv[1])\n"
        "def stop(*_):\n"
        "    log.write_text(log.read_text() + 'sigterm at %.2f\\n' % time.time()); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "log.write_text('started\\n')\n"
        "while True: time.sleep(0.05)\n"
    )
    create(
        kube_api,
        pod_manifest(
            "graceful",
            {
                "terminationGracePeriodSeconds": 20,
                "containers": [
                    {
                        "name": "main",
                        "image": "tritonshare",
                        "command": [sys.executable, "-c", program, str(marker)],
                        "lifecycle": {"preStop": {"sleep": {"seconds": 1}}},
                    }
                ],
            },
        ),
    )
    wait_for("the container to start", lambda: marker.exists() and "started" in marker.read_text())
    deleted_at = time.time()
    core(kube_api).delete_namespaced_pod("graceful", NS, _preload_content=False)
    wait_for("the pod to be removed", lambda: read(kube_api, "graceful") is None)
    lines = marker.read_text().splitlines()
    assert lines[0] == "started"
    sigterm_at = float(lines[1].split()[-1])
    assert sigterm_at - deleted_at >= 0.9, "SIGTERM came before the preStop sleep ended"


def test_a_container_that_ignores_sigterm_is_killed_after_the_grace_period(
    kube_api: kubernetes.client.ApiClient, kubelet: Kubelet
) -> None:
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    create(
        kube_api,
        pod_manifest(
            "stubborn",
            {
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {"name": "main", "image": "tritonshare", "command": ["python", "-c", stubborn]}
                ],
            },
        ),
    )
    wait_for(
        "the pod to run",
        lambda: (p := read(kube_api, "stubborn")) and p["status"].get("phase") == "Running",
    )
    started = time.monotonic()
    core(kube_api).delete_namespaced_pod("stubborn", NS, _preload_content=False)
    wait_for("the pod to be removed", lambda: read(kube_api, "stubborn") is None)
    assert time.monotonic() - started < 15


def test_the_hollow_kubelet_marks_pods_of_its_nodes_ready_and_removes_deleted_ones(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient
) -> None:
    api = apiserver.api_client()
    hollow = HollowKubelet(api, ["gpu-a"])
    hollow.start()
    try:
        for name, node in (("mine", "gpu-a"), ("other", "gpu-b")):
            pod = pod_manifest(name, {"containers": [{"name": "c", "image": "x:1"}]})
            pod["spec"]["nodeName"] = node
            create(kube_api, pod)
        wait_for(
            "the hollow pod to be Ready",
            lambda: condition(read(kube_api, "mine"), "Ready") == "True",
        )
        other = read(kube_api, "other")
        assert other is not None and other.get("status", {}).get("phase") != "Running"
        core(kube_api).delete_namespaced_pod("mine", NS, _preload_content=False)
        wait_for("the hollow pod to be removed", lambda: read(kube_api, "mine") is None)
    finally:
        hollow.stop()
        api.close()  # type: ignore[no-untyped-call]


def test_a_container_failing_its_liveness_probe_is_restarted(
    kube_api: kubernetes.client.ApiClient, kubelet: Kubelet
) -> None:
    dead_port = free_port()  # nothing listens there: every liveness probe fails
    create(
        kube_api,
        pod_manifest(
            "unhealthy",
            {
                "containers": [
                    {
                        "name": "main",
                        "image": "tritonshare",
                        "command": ["python", "-c", "import time; time.sleep(600)"],
                        "livenessProbe": {
                            "httpGet": {"path": "/healthz", "port": dead_port},
                            "periodSeconds": 1,
                            "failureThreshold": 2,
                        },
                    }
                ]
            },
        ),
    )

    def restarted() -> dict[str, Any] | None:
        pod = read(kube_api, "unhealthy")
        statuses = (pod or {}).get("status", {}).get("containerStatuses") or [{}]
        return pod if statuses[0].get("restartCount", 0) >= 1 else None

    pod = wait_for("a restart after failed liveness probes", restarted)
    last = pod["status"]["containerStatuses"][0]["lastState"]["terminated"]
    assert last["exitCode"] == -15, "the kubelet stops the container with SIGTERM"


def test_readiness_waits_for_the_startup_probe(
    kube_api: kubernetes.client.ApiClient, kubelet: Kubelet, tmp_path: Path
) -> None:
    port = free_port()
    site = tmp_path / "site"
    site.mkdir()
    (site / "ready").write_text("ok")
    create(
        kube_api,
        pod_manifest(
            "slow-start",
            {
                "containers": [
                    {
                        "name": "main",
                        "image": "tritonshare",
                        "command": ["python", "-m", "http.server", str(port)],
                        "args": ["--bind", "$(POD_IP)", "--directory", str(site)],
                        "env": [
                            {
                                "name": "POD_IP",
                                "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                            }
                        ],
                        "startupProbe": {
                            "httpGet": {"path": "/started", "port": port},
                            "periodSeconds": 1,
                            "failureThreshold": 30,
                        },
                        "readinessProbe": {
                            "httpGet": {"path": "/ready", "port": port},
                            "periodSeconds": 1,
                        },
                    }
                ]
            },
        ),
    )
    wait_for(
        "the container to run",
        lambda: (p := read(kube_api, "slow-start")) and p["status"].get("phase") == "Running",
    )
    # Readiness would pass within a second if it ran before the startup probe passed.
    window = time.monotonic() + 2.5
    while time.monotonic() < window:
        pod = read(kube_api, "slow-start")
        assert condition(pod, "Ready") != "True", "readiness ran before the startup probe passed"
        assert pod is not None and pod["status"]["containerStatuses"][0]["started"] is False
        time.sleep(0.1)
    (site / "started").write_text("ok")
    wait_for(
        "Ready after the startup probe passes",
        lambda: condition(read(kube_api, "slow-start"), "Ready") == "True",
    )


# Listens where its args say, and tells the "gateway" (a socket of the test) its address,
# connecting from the address in EXAMPLE_SOURCE when the kubelet sets it.
SERVE_AND_CALL = """
import http.server, os, socket, sys
host, port, gateway = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
source = (os.environ["EXAMPLE_SOURCE"], 0) if "EXAMPLE_SOURCE" in os.environ else None
with socket.create_connection(("127.0.0.1", gateway), 10, source) as s:
    s.sendall(host.encode())
http.server.HTTPServer((host, port), http.server.SimpleHTTPRequestHandler).serve_forever()
"""


def test_pods_listen_on_the_any_address_as_in_a_network_namespace_of_their_own(
    apiserver: RunningApiServer, kube_api: kubernetes.client.ApiClient, tmp_path: Path
) -> None:
    api = apiserver.api_client()
    node = Kubelet(
        api,
        NODE,
        tmp_path / "kubelet",
        source_address_variables=("EXAMPLE_SOURCE",),
        abandon_grace=5,
    )
    port = free_port()
    with contextlib.closing(api), socket.socket() as gateway, node:
        gateway.bind(("127.0.0.1", 0))
        gateway.listen()
        gateway.settimeout(60)
        for name in ("one", "two"):
            create(
                kube_api,
                pod_manifest(
                    name,
                    {
                        "containers": [
                            {
                                "name": "server",
                                "image": "tritonshare",
                                "command": ["python", "-c", SERVE_AND_CALL],
                                # Both on the same port, as two pods of a Deployment are.
                                "args": ["0.0.0.0", str(port), str(gateway.getsockname()[1])],
                                "ports": [{"name": "http", "containerPort": port}],
                                "readinessProbe": {
                                    "httpGet": {"path": "/", "port": "http"},
                                    "periodSeconds": 1,
                                },
                            }
                        ]
                    },
                ),
            )
        calls = {}
        for _ in range(2):
            accepted, (peer, _) = gateway.accept()
            with accepted:
                calls[peer] = accepted.recv(100).decode()

        def ready(name: str) -> dict[str, Any] | None:
            pod = read(kube_api, name)
            return pod if condition(pod, "Ready") == "True" else None

        pods = [wait_for(f"pod {name} Ready", partial(ready, name)) for name in ("one", "two")]
        addresses = {p["status"]["podIP"] for p in pods}
        assert len(addresses) == 2 and "127.0.0.1" not in addresses
        # Each listened on its own IP (0.0.0.0 in its spec) and called from it.
        assert calls == {a: a for a in addresses}
        for address in addresses:
            with urllib.request.urlopen(f"http://{address}:{port}/", timeout=10) as answer:
                assert answer.status == 200
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5)


def test_a_secret_volume_holds_the_keys_of_the_pods_own_namespaces_secret(
    kube_api: kubernetes.client.ApiClient, kubelet: Kubelet
) -> None:
    """As a kubelet mounts a Secret: its keys as files (`data` base64, `stringData` as
    written), read in the pod's namespace only; an optional one that is not there leaves the
    volume empty, a required one keeps the pod from running."""
    api = core(kube_api)
    api.create_namespace({"metadata": {"name": "team-a"}})
    secret = {
        "metadata": {"name": "creds"},
        "data": {"token": "czNjcjN0"},
        "stringData": {"a": "b"},
    }
    api.create_namespaced_secret(NS, secret)
    api.create_namespaced_secret("team-a", {"metadata": {"name": "theirs"}, "data": {"k": "dg=="}})
    items = [{"key": "token", "path": "creds/token"}, {"key": "none", "path": "creds/none"}]
    volumes = [
        {"name": "mine", "secret": {"secretName": "creds", "optional": True}},
        {"name": "theirs", "secret": {"secretName": "theirs", "optional": True}},
        {
            "name": "projected",
            "projected": {
                "sources": [
                    {"secret": {"name": "creds", "optional": True, "items": items}},
                    {"secret": {"name": "theirs", "optional": True}},
                ]
            },
        },
    ]
    container = {"name": "c", "image": "tritonshare", "command": ["python", "-c", "pass"]}
    spec = {"restartPolicy": "Never", "volumes": volumes, "containers": [container]}
    create(kube_api, pod_manifest("reader", spec))
    wait_for(
        "the pod to finish",
        lambda: (read(kube_api, "reader") or {}).get("status", {}).get("phase") == "Succeeded",
    )
    [pod_dir] = kubelet.workdir.glob(f"{NS}_reader_*")
    mine, theirs = pod_dir / "volumes" / "mine", pod_dir / "volumes" / "theirs"
    assert {p.name: p.read_bytes() for p in mine.iterdir()} == {"token": b"s3cr3t", "a": b"b"}
    assert not any(theirs.iterdir()), "another namespace's Secret is never read"
    projected = pod_dir / "volumes" / "projected"
    assert [p.relative_to(projected).as_posix() for p in projected.rglob("*")] == [
        "creds",
        "creds/token",
    ]

    volumes[1]["secret"] = {"secretName": "theirs"}
    create(kube_api, pod_manifest("required", spec))
    wait_for(
        "the pod's error",
        lambda: (
            "Secret default/theirs cannot be read (404" in json.dumps(read(kube_api, "required"))
        ),
    )


def test_a_pod_that_stops_while_the_api_server_is_down_is_removed_once_it_is_back(
    apiserver: RunningApiServer,
    kube_api: kubernetes.client.ApiClient,
    kubelet: Kubelet,
    tmp_path: Path,
) -> None:
    """As the kubelet's status manager, the simulated kubelet retries a stopped pod's last
    status and its removal while the API server cannot be reached; once, the pod's worker died
    on the first refused connection and the pod stayed Terminating in the API for good."""
    marker = tmp_path / "order.txt"
    program = (
        "import pathlib, signal, sys, time\n"
        "log = pathlib.Path(sys.argv[1])\n"
        "def stop(*_):\n"
        "    log.write_text('sigterm\\n'); time.sleep(1.0); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "log.write_text('started\\n')\n"
        "while True: time.sleep(0.05)\n"
    )
    command = [sys.executable, "-c", program, str(marker)]
    create(
        kube_api,
        pod_manifest(
            "outlasting",
            {"containers": [{"name": "main", "image": "tritonshare", "command": command}]},
        ),
    )
    wait_for("the container to start", lambda: marker.exists() and "started" in marker.read_text())
    core(kube_api).delete_namespaced_pod("outlasting", NS, _preload_content=False)
    wait_for("SIGTERM", lambda: "sigterm" in marker.read_text())
    apiserver.pause()
    try:
        time.sleep(3.0)  # the outage: the container exits 1 s into it, its removal refused
    finally:
        apiserver.resume()
    wait_for("the pod to be removed", lambda: read(kube_api, "outlasting") is None, timeout=20)
