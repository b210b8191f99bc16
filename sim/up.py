"""`make sim-up` and `make sim-down`: the simulated cluster left running in the background, to use
with plain `kubectl` and `tritonshare` as a real cluster is used.

`python -m sim.up start` starts `python -m sim.up run` as a daemon (its own session, its output in
`DIR/logs/sim-up.log`) and returns once the cluster is ready, its last line
`export KUBECONFIG=DIR/kubeconfig`; `python -m sim.up stop` ends it with SIGTERM and removes DIR.
`run` is `SimCluster` (one GPU node with two T4s, served by the real Triton on the CPU; two
binders; the webhook and its model store, holding the example's add_one and `sim.onnxmodels`'
convolutional network; deploy/base's host ports, so deploy/example runs as shipped) plus what a
cluster has around it: kube-proxy for ClusterIP Services (`sim.service.ServiceProxy`) and, where
the `prometheus` binary is installed, a Prometheus scraping the model pods' proxies of every
namespace and the simulated HPA and KEDA controller (`sim.controllers.hpa`) acting on it; the
binders run the built-in autoscaler. It must not create workloads: the user does, with kubectl.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import kubernetes.client

from sim.cluster import (
    NODE_AGENT_PORT,
    NODE_GATEWAY_GRPC_PORT,
    NODE_GATEWAY_HTTP_PORT,
    NODE_GATEWAY_METRICS_PORT,
    NodeSpec,
    SimCluster,
)
from sim.controllers.hpa import Autoscalers, Prometheus
from sim.onnxmodels import CONV_NAME, write_conv_model
from sim.processes import ClusterError
from sim.service import ServiceProxy
from sim.watching import watch_events

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = ROOT / ".sim"
EXAMPLE_MODEL = ROOT / "deploy" / "example" / "model"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
NODES = (
    NodeSpec(
        "gpu-node-0",
        "2xT4",
        {"topology.kubernetes.io/zone": "zone-a"},
        (GPU_TAINT,),
        real=True,
    ),
)
READY_FILE = "ready.json"
PID_FILE = "sim-up.pid"
START_SECONDS = 300.0
PROXY_METRICS_PORT = 9002


class SimUpError(RuntimeError):
    """The cluster could not be started or stopped; the message says what to do."""


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class ScrapeTargets:
    """Prometheus's file of scrape targets: every pod with an address and a proxy (a container
    port named `metrics`), in every namespace, as the chart's PodMonitor selects them; kept
    current from a pod watch."""

    def __init__(self, api: kubernetes.client.ApiClient, path: Path) -> None:
        self.core = cast(Any, kubernetes.client.CoreV1Api(api))
        self.path = path
        self._targets: dict[str, tuple[str, str, str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scrape-targets")
        self._write()

    def _write(self) -> None:
        groups = [
            {
                "targets": [f"{address}:{PROXY_METRICS_PORT}"],
                "labels": {"namespace": namespace, "pod": name},
            }
            for (namespace, name, address) in sorted(self._targets.values())
        ]
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(groups))
        partial.replace(self.path)

    def _seen(self, event_type: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        address = (pod.get("status") or {}).get("podIP") or ""
        scraped = any(
            port.get("name") == "metrics"
            for container in pod.get("spec", {}).get("containers", [])
            for port in container.get("ports") or []
        )
        if event_type == "DELETED" or meta.get("deletionTimestamp") or not address or not scraped:
            changed = self._targets.pop(key, None) is not None
        else:
            target = (meta["namespace"], meta["name"], address)
            changed = self._targets.get(key) != target
            self._targets[key] = target
        if changed:
            self._write()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                listed = json.loads(
                    self.core.list_pod_for_all_namespaces(_preload_content=False).data
                )
                self._targets.clear()
                for pod in listed.get("items", []):
                    self._seen("ADDED", pod)
                self._write()
                version = listed["metadata"]["resourceVersion"]
                for event_type, pod in watch_events(
                    self.core.list_pod_for_all_namespaces, self._stop, version
                ):
                    self._seen(event_type, pod)
            except Exception:
                if self._stop.is_set():
                    return
                self._stop.wait(0.5)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(15)


@contextlib.contextmanager
def _prometheus(cluster: SimCluster, workdir: Path) -> Iterator[str | None]:
    """A real Prometheus scraping the model pods' proxies every 5 s, where it is installed, and
    the simulated KEDA and HPA controller reading it (`sim.controllers.hpa`, the production 15 s
    sync period); its address (None when it is not)."""
    binary = shutil.which("prometheus")
    if binary is None:
        yield None
        return
    # Imported here: the demo's module pulls its scenario in, which only this part needs.
    from sim.demo.autoscale import prometheus

    assert cluster.apiserver is not None
    api = cluster.apiserver.api_client()
    targets = ScrapeTargets(api, workdir / "prometheus-targets.json")
    targets.start()
    autoscalers_api = cluster.apiserver.api_client()
    try:
        with (
            prometheus(binary, workdir, targets.path, "5s") as listen,
            Autoscalers(autoscalers_api, Prometheus(listen), cluster.apiserver.clock.now),
        ):
            yield listen
    finally:
        targets.stop()
        api.close()  # type: ignore[no-untyped-call]
        autoscalers_api.close()  # type: ignore[no-untyped-call]


def run(workdir: Path, masquerade: bool = False) -> int:
    """The daemon: start everything, write the ready file, serve until SIGTERM, stop."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    cluster = SimCluster(
        workdir,
        NODES,
        tenant_code_namespaces=(),
        webhook=True,
        node_ports=True,
        masquerade=masquerade,
        mirror_pods=True,
        say=_say,
    )
    services: ServiceProxy | None = None
    try:
        cluster.start()
        assert cluster.apiserver is not None and cluster.model_store is not None
        services = ServiceProxy(cluster.apiserver.api_client())
        services.start()
        _say("kube-proxy routes each ClusterIP Service's address (127.2.x.x) to its ready pods.")
        uri = cluster.model_store.publish("add_one", EXAMPLE_MODEL)
        conv = write_conv_model(workdir / "models" / CONV_NAME)
        conv_uri = cluster.model_store.publish(CONV_NAME, conv)
        with _prometheus(cluster, workdir) as prometheus:
            ready = {
                "kubeconfig": str(cluster.kubeconfig),
                "apiserver": cluster.apiserver.url,
                "model_uri": uri,
                "conv_model_uri": conv_uri,
                "prometheus": f"http://{prometheus}" if prometheus else "",
                "missing": cluster.missing,
            }
            partial = workdir / (READY_FILE + ".partial")
            partial.write_text(json.dumps(ready))
            partial.replace(workdir / READY_FILE)
            stop.wait()
            _say("Stopping the simulated cluster.")
    except (ClusterError, OSError) as e:
        _say(f"The simulated cluster did not start: {e}")
        return 1
    finally:
        if services is not None:
            services.stop()
        cluster.stop()
    return 0


def start(workdir: Path, masquerade: bool = False, timeout: float = START_SECONDS) -> int:
    """Start the daemon and wait until it is ready; print how to reach it."""
    pid_file = workdir / PID_FILE
    if pid_file.exists() and _alive(int(pid_file.read_text())):
        raise SimUpError(
            f"a simulated cluster already runs from {workdir} (pid {pid_file.read_text()}); "
            "stop it first with `make sim-down`"
        )
    node_ports = (NODE_AGENT_PORT, NODE_GATEWAY_HTTP_PORT, NODE_GATEWAY_GRPC_PORT)
    for port in (*node_ports, NODE_GATEWAY_METRICS_PORT):
        with socket.socket() as probe:
            # As the servers bind: a port left in TIME_WAIT by a cluster just stopped is free.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError as e:
                raise SimUpError(
                    f"port {port} on 127.0.0.1, one of the node's host ports, is taken ({e}): "
                    "another `make sim-up` (`make sim-down` in its tree) or another program"
                ) from e
    shutil.rmtree(workdir, ignore_errors=True)
    (workdir / "logs").mkdir(parents=True)
    log_path = workdir / "logs" / "sim-up.log"
    _say(f"Starting the simulated cluster in {workdir} (about a minute; log: {log_path}).")
    with log_path.open("wb") as log:
        daemon = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sim.up",
                "run",
                "--dir",
                str(workdir),
                *(["--masquerade"] if masquerade else []),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
    pid_file.write_text(str(daemon.pid))
    ready_file = workdir / READY_FILE
    deadline = time.monotonic() + timeout
    while not ready_file.exists():
        if daemon.poll() is not None or time.monotonic() > deadline:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
            stop(workdir)
            raise SimUpError(f"the simulated cluster did not start; the end of its log:\n{tail}")
        time.sleep(0.2)
    ready = json.loads(ready_file.read_text())
    _say(
        "Ready: API server "
        f"{ready['apiserver']}; node gpu-node-0 (2 x T4, tainted nvidia.com/gpu) with a real "
        "Triton on the CPU; 2 binders; the webhook; a model store."
    )
    _say(
        "The binders' built-in autoscaler scales TritonModels with spec.autoscaling and "
        "Deployments with autoscaling.knative.dev/target."
    )
    if ready["prometheus"]:
        _say(f"Prometheus scrapes the model pods' proxies: {ready['prometheus']}")
        _say("The simulated HPA and KEDA controller scale on it every 15 s.")
    for part in ready["missing"]:
        _say(f"Not running: {part}")
    _say("The example model's files for the short form (tritonshare.io/model-uri):")
    _say(f"export MODEL_URI={ready['model_uri']}")
    _say("A convolutional network (ONNX, 3x32x32 IMAGE in, 100 SCORES out), for the same:")
    _say(f"export CONV_MODEL_URI={ready['conv_model_uri']}")
    _say("Stop it with `make sim-down`. Then, for kubectl and tritonshare:")
    _say(f"export KUBECONFIG={ready['kubeconfig']}")
    return 0


def _alive(pid: int) -> bool:
    """Whether `pid` is a running `python -m sim.up run` (a stale pid file may name another
    process by now, which must not be signalled)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return b"sim.up" in cmdline and b"run" in cmdline and state != "Z"


def stop(workdir: Path, grace: float = 60.0) -> int:
    """End the daemon (SIGTERM, then SIGKILL of its session after `grace` s); remove workdir."""
    pid_file = workdir / PID_FILE
    if pid_file.exists():
        pid = int(pid_file.read_text())
        if _alive(pid):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while _alive(pid) and time.monotonic() < deadline:
                with contextlib.suppress(ChildProcessError):
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        break
                time.sleep(0.2)
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
    existed = workdir.exists()
    shutil.rmtree(workdir, ignore_errors=True)
    _say(f"The simulated cluster is stopped; {workdir} removed." if existed else "Nothing to stop.")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.up", description=__doc__)
    parser.add_argument("command", choices=("start", "stop", "run"))
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path(os.environ.get("SIM_DIR") or DEFAULT_DIR),
        help="the cluster's files: kubeconfig, logs, pid (default: .sim, or $SIM_DIR)",
    )
    parser.add_argument(
        "--masquerade",
        action="store_true",
        help="the pods' connections to their node's agent and gateway leave from the node's "
        "address, as under a CNI that masquerades node-local traffic (portmap's SNAT)",
    )
    args = parser.parse_args(argv)
    workdir = args.dir.resolve()
    try:
        if args.command == "start":
            return start(workdir, args.masquerade)
        if args.command == "stop":
            return stop(workdir)
        return run(workdir, args.masquerade)
    except SimUpError as e:
        sys.stderr.write(f"sim-up: {e}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
