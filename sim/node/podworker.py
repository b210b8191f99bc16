"""One pod's life on the simulated kubelet, from volume setup to deletion.

Owns the order a kubelet follows: volumes (emptyDir and hostPath as local directories, a ConfigMap's
or a Secret's keys as files, read in the pod's own namespace; projected service-account tokens
from the TokenRequest API, rotated at 80% of their life), init containers one by one (restarted
with back-off unless restartPolicy is Never), then the main containers (startup, liveness and
readiness httpGet probes; restarted as the policy says), and on deletion preStop hooks, SIGTERM,
the grace period, SIGKILL and the final delete with gracePeriodSeconds=0. It reports all of this
in the pod's status (`sim.node.podstatus`). It must not watch the API: `sim.node.kubelet` does and
hands it the pod.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Unreachable

from sim.node.addresses import PodAddresses
from sim.node.containers import ContainerRun, http_get, now_rfc3339
from sim.node.cpushares import CpuGroups, container_millicpu, pod_millicpu
from sim.node.events import EventRecorder
from sim.node.podnetwork import pod_network
from sim.node.podspec import Obj, PodSpecError, plan
from sim.node.podstatus import write_status

log = logging.getLogger(__name__)


CONFIG_MAP_SYNC_SECONDS = 2.0
"""How often a pod's ConfigMap volumes are projected again."""


def read_json(response: Any) -> Any:
    """The JSON body of a `_preload_content=False` response."""
    return json.loads(response.data)


def pod_key(pod: Obj) -> str:
    """namespace/name."""
    return f"{pod['metadata'].get('namespace', 'default')}/{pod['metadata']['name']}"


@dataclass(frozen=True)
class NodeRuntime:
    """What every pod worker of one simulated node shares."""

    core: client.CoreV1Api
    workdir: Path
    host_ip: str
    python: str
    addresses: PodAddresses
    """Where each pod's own IP comes from (`sim.node.addresses`)."""
    source_address_variables: tuple[str, ...]
    """Environment variables through which a pod's processes learn the address their connections
    leave from: the pod's IP (`sim.node.podnetwork`)."""
    base_env: Mapping[str, str]
    backoff_initial: float
    """Seconds before the first restart of a failed container; doubles per restart."""
    backoff_max: float
    """Seconds, the cap of the restart back-off."""
    abandon_grace: float
    """Seconds between SIGTERM and SIGKILL when the simulation itself stops."""
    masquerade: bool = False
    """Pods' connections leave from the node's address, as under a CNI that masquerades
    node-local traffic (`sim.node.podnetwork`)."""
    cpu: CpuGroups | None = None
    """Where each pod's processes get the CPU weight of its requests (`sim.node.cpushares`);
    None: every process shares the machine as one."""
    events: EventRecorder | None = None
    """Where the kubelet's Events on pods go (`sim.node.events`); None: nowhere."""
    kept_logs: Path | None = None
    """Where a stopped pod's container logs are moved (`<namespace>_<pod>_<uid>/`), to be read
    after the run; None: they go with the pod."""


class PodWorker(threading.Thread):
    """Runs one pod from start to deletion."""

    def __init__(self, node: NodeRuntime, pod: Obj) -> None:
        super().__init__(name=f"kubelet-pod-{pod_key(pod)}")
        self.node = node
        self.pod = pod
        self.key = pod_key(pod)
        meta, spec = pod["metadata"], pod["spec"]
        self.uid = str(meta.get("uid", ""))
        self.namespace = str(meta.get("namespace", "default"))
        self.pod_name = str(meta["name"])
        self.restart_policy = str(spec.get("restartPolicy", "Always"))
        self.dir = node.workdir / f"{self.namespace}_{self.pod_name}_{self.uid[:8]}"
        self.inits = [ContainerRun(c) for c in spec.get("initContainers", [])]
        self.mains = [ContainerRun(c) for c in spec.get("containers", [])]
        self.mounts: dict[str, Path] = {}
        self.token_refresh: list[tuple[float, Callable[[], None]]] = []
        self.phase = "Pending"
        self.initialized = False
        self.config_error = ""
        self.start_time = now_rfc3339()
        self._grace = float(spec.get("terminationGracePeriodSeconds", 30))
        # A pod on the host network has the node's address; every other pod an address of its own.
        ports = [
            int(p["containerPort"])
            for c in spec.get("containers", [])
            for p in c.get("ports", [])
            if p.get("protocol", "TCP") == "TCP" and isinstance(p.get("containerPort"), int)
        ]
        self.pod_ip = (
            node.host_ip if spec.get("hostNetwork") else node.addresses.take(self.uid, ports)
        )
        self._deleting = threading.Event()
        self._abandon = threading.Event()
        self._abandon_grace = node.abandon_grace
        self._published = ""
        self._unreachable_since: float | None = None
        """Since when the API server could not be reached for the pod's writes (None: it can)."""
        self._next_try = 0.0
        """While it cannot be reached, the status is tried again once a second, not each turn."""

    def request_deletion(self, grace_seconds: float) -> None:
        """The pod was deleted gracefully: stop it within `grace_seconds`, then remove it."""
        self._grace = min(self._grace, grace_seconds)
        self._deleting.set()

    def abandon(self, grace: float | None = None) -> None:
        """Stop at once without API calls: the pod is gone, or the simulation is ending. Its
        containers get SIGTERM and `grace` seconds (default: the node's abandon grace), then
        SIGKILL."""
        if grace is not None:
            self._abandon_grace = grace
        self._abandon.set()
        self._deleting.set()

    def run(self) -> None:
        try:
            self._prepare_volumes()
            self._publish()
            if self._run_inits():
                self._run_mains()
        except PodSpecError as e:
            self.config_error = str(e)
            log.error("Pod %s cannot run on the simulated kubelet: %s", self.key, e)
            with contextlib.suppress(ApiException):
                self._publish()
            self._deleting.wait()
        except Exception:
            log.exception("The simulated kubelet failed to run pod %s: parking it.", self.key)
            self._deleting.wait()
        finally:
            try:
                self._terminate()
            finally:
                if self.pod_ip != self.node.host_ip:
                    self.node.addresses.give_back(self.pod_ip)

    # Volumes.

    def _prepare_volumes(self) -> None:
        for volume in self.pod["spec"].get("volumes", []):
            name = volume["name"]
            local = self.dir / "volumes" / name
            local.mkdir(parents=True, exist_ok=True)
            self.mounts[name] = local
            if "emptyDir" in volume or "hostPath" in volume:
                continue
            if "configMap" in volume:
                source = volume["configMap"]
                self._project_keys("ConfigMap", source.get("name", ""), name, local, source)
                self._keep_config_map(source.get("name", ""), name, local, source)
                continue
            if "secret" in volume:
                source = volume["secret"]
                self._project_keys("Secret", source.get("secretName", ""), name, local, source)
                continue
            if "projected" not in volume:
                kinds = ", ".join(k for k in volume if k != "name")
                raise PodSpecError(
                    f"volume {name!r} is a {kinds} volume; use emptyDir, hostPath, configMap, "
                    "secret or projected"
                )
            for source in volume["projected"].get("sources", []):
                if "secret" in source:
                    secret = source["secret"]
                    self._project_keys("Secret", secret.get("name", ""), name, local, secret)
                    continue
                if "serviceAccountToken" not in source:
                    raise PodSpecError(
                        f"volume {name!r}: only serviceAccountToken and secret projections are "
                        "simulated"
                    )
                self._project_token(local / source["serviceAccountToken"]["path"], source)

    def _project_keys(self, kind: str, name: str, volume: str, local: Path, source: Obj) -> None:
        """The keys of the ConfigMap or Secret (`kind`) of the pod's namespace as files
        (`items` picks keys and paths); a ConfigMap's again as it changes (`_keep_config_map`),
        a Secret's once. An optional one that does not exist leaves the volume empty."""
        core = self.node.core
        secret = kind == "Secret"
        try:
            read = core.read_namespaced_secret if secret else core.read_namespaced_config_map
            found = read_json(read(name, self.namespace, _preload_content=False))
        except ApiException as e:
            if e.status == 404 and source.get("optional"):
                return
            raise PodSpecError(
                f"volume {volume!r}: {kind} {self.namespace}/{name} cannot be read "
                f"({e.status} {e.reason}); create it, then recreate the pod"
            ) from e
        if secret:
            # The API server folds stringData into data; this one stores what was written.
            files = {k: base64.b64decode(v) for k, v in (found.get("data") or {}).items()}
            files |= {k: str(v).encode() for k, v in (found.get("stringData") or {}).items()}
        else:
            files = {k: str(v).encode() for k, v in (found.get("data") or {}).items()}
            files |= {k: base64.b64decode(v) for k, v in (found.get("binaryData") or {}).items()}
        items = source.get("items") or [{"key": key, "path": key} for key in files]
        for item in items:
            if item["key"] not in files:
                if source.get("optional"):
                    continue
                raise PodSpecError(
                    f"volume {volume!r}: {kind} {self.namespace}/{name} has no key {item['key']!r}"
                )
            target = local / item["path"]
            if not target.resolve().is_relative_to(local.resolve()):
                raise PodSpecError(f"volume {volume!r}: path {item['path']!r} leaves the volume")
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists() and target.read_bytes() == files[item["key"]]:
                continue
            partial = target.with_name(target.name + ".new")  # replaced whole, as a kubelet does
            partial.write_bytes(files[item["key"]])
            partial.replace(target)

    def _keep_config_map(self, name: str, volume: str, local: Path, source: Obj) -> None:
        """Project the ConfigMap's keys again every CONFIG_MAP_SYNC_SECONDS, as a kubelet
        refreshes a ConfigMap volume (within about a minute there)."""

        def refresh() -> None:
            try:
                self._project_keys("ConfigMap", name, volume, local, source)
            except Exception as e:  # a deleted ConfigMap keeps its last files, as on a kubelet
                log.debug("Pod %s: refreshing ConfigMap %s failed: %s", self.key, name, e)
            self.token_refresh.append((time.monotonic() + CONFIG_MAP_SYNC_SECONDS, refresh))

        self.token_refresh.append((time.monotonic() + CONFIG_MAP_SYNC_SECONDS, refresh))

    def _project_token(self, target: Path, source: Obj) -> None:
        token = source["serviceAccountToken"]
        expiry = int(token.get("expirationSeconds", 3600))
        spec: dict[str, Any] = {
            "expirationSeconds": expiry,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": self.pod_name},
        }
        spec["boundObjectRef"]["uid"] = self.uid
        if token.get("audience"):
            spec["audiences"] = [token["audience"]]
        account = self.pod["spec"].get("serviceAccountName") or "default"
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}

        def fetch() -> None:
            answer = read_json(
                self.node.core.create_namespaced_service_account_token(
                    account, self.namespace, cast(Any, body), _preload_content=False
                )
            )
            partial = target.with_name(target.name + ".new")
            partial.write_text(answer["status"]["token"])
            partial.replace(target)
            # The kubelet rotates a projected token at 80% of its life.
            self.token_refresh.append((time.monotonic() + 0.8 * expiry, fetch))

        fetch()

    def _refresh_tokens(self) -> None:
        now = time.monotonic()
        due = [fetch for at, fetch in self.token_refresh if now >= at]
        if not due:
            return
        self.token_refresh = [(at, fetch) for at, fetch in self.token_refresh if now < at]
        for fetch in due:
            try:
                fetch()
            except Exception as e:
                log.warning("Pod %s: rotating a projected token failed: %s", self.key, e)

    # Containers.

    def _launch(self, container: ContainerRun) -> None:
        pod = {
            **self.pod,
            "status": {
                **self.pod.get("status", {}),
                "hostIP": self.node.host_ip,
                "podIP": self.pod_ip,
            },
        }
        launch = plan(
            pod,
            container.spec,
            mounts=self.mounts,
            termination_log=self.dir / "termination" / container.name,
            base_env=self.node.base_env,
            python=self.node.python,
            network=pod_network(
                self.pod_ip,
                self.node.host_ip,
                self.node.source_address_variables,
                masquerade=self.node.masquerade,
            ),
            scratch=self.dir / "scratch" / container.name,
        )
        container.start(launch, self.dir / "logs" / f"{container.name}.log", self.dir)
        if self.node.cpu is not None and container.process is not None:
            self._weigh(self.node.cpu, container)
        log.info("Pod %s: started container %s.", self.key, container.name)

    def _weigh(self, cpu: CpuGroups, container: ContainerRun) -> None:
        """The container's process into its group inside the pod's, weighted by their requests and
        held to its CPU limit if it has one."""
        assert container.process is not None
        try:
            cpu.place(self._cpu_group, pod_millicpu(self.pod))
            cpu.place(
                f"{self._cpu_group}/{container.name}",
                container_millicpu(container.spec),
                [container.process.pid],
                limit=container_millicpu(container.spec, "limits"),
            )
        except (OSError, ValueError) as e:
            log.warning(
                "Pod %s: container %s runs without its CPU weight (%s).",
                self.key,
                container.name,
                e,
            )

    @property
    def _cpu_group(self) -> str:
        return f"pod-{self.uid}"

    def _exited(self, container: ContainerRun, code: int) -> None:
        container.exited(code)
        level = logging.INFO if code == 0 else logging.WARNING
        log.log(level, "Pod %s: container %s exited with code %d.", self.key, container.name, code)

    def _delay(self, container: ContainerRun) -> float:
        return float(min(self.node.backoff_max, self.node.backoff_initial * 2**container.restarts))

    def _back_off(self, container: ContainerRun) -> None:
        """Wait before restarting the failed container, and say so as the kubelet does."""
        container.back_off(self._delay(container))
        if self.node.events is not None:
            message = (
                f"Back-off restarting failed container {container.name} in pod"
                f" {self.pod_name}_{self.namespace}({self.uid})"
            )
            self.node.events.record(
                self.pod, "BackOff", message, event_type="Warning", container=container.name
            )

    def _run_inits(self) -> bool:
        """Run the init containers in order; False if the pod is deleted or fails first."""
        for container in self.inits:
            while True:
                self._launch(container)
                self._publish()
                assert container.process is not None
                while (code := container.process.poll()) is None:
                    self._refresh_tokens()
                    if self._deleting.wait(0.05):
                        return False
                self._exited(container, code)
                if code == 0:
                    break
                if self.restart_policy == "Never":
                    self.phase = "Failed"
                    self._publish()
                    self._deleting.wait()
                    return False
                self._back_off(container)
                container.restarts += 1
                self._publish()
                if self._deleting.wait(max(0.0, container.next_start - time.monotonic())):
                    return False
        self.initialized = True
        return True

    def _run_mains(self) -> None:
        for container in self.mains:
            self._launch(container)
        self.phase = "Running"
        self._publish()
        while not self._deleting.wait(0.05):
            self._refresh_tokens()
            for container in self.mains:
                self._tend(container)
            if all(c.process is None and not c.next_start for c in self.mains):
                codes = [c.state["terminated"]["exitCode"] for c in self.mains]
                self.phase = "Failed" if any(codes) else "Succeeded"
                self._publish()
                self._deleting.wait()
                return
            self._publish()

    def _tend(self, container: ContainerRun) -> None:
        """Probe a running container, or notice its exit and restart it as the policy says."""
        if container.process is None:
            if container.next_start and time.monotonic() >= container.next_start:
                container.next_start = 0.0
                container.restarts += 1
                self._launch(container)
            return
        code = container.process.poll()
        if code is None:
            failed = container.probe(self.pod_ip)
            if not failed:
                return
            log.warning(
                "Pod %s: container %s failed its %s probe: restarting it.",
                self.key,
                container.name,
                failed,
            )
            code = self._kill(container, min(self._grace, 10.0))
        self._exited(container, code)
        if self.restart_policy == "Always" or (self.restart_policy == "OnFailure" and code):
            self._back_off(container)

    @staticmethod
    def _kill(container: ContainerRun, grace: float) -> int:
        """SIGTERM, up to `grace` seconds, then SIGKILL; the exit code."""
        assert container.process is not None
        container.signal(signal.SIGTERM)
        try:
            return container.process.wait(grace)
        except subprocess.TimeoutExpired:
            container.signal(signal.SIGKILL)
            return container.process.wait(10)

    # Termination.

    def _terminate(self) -> None:
        deadline = time.monotonic() + self._grace
        if self._abandon.is_set():
            deadline = time.monotonic() + self._abandon_grace
        else:
            hooks = [
                threading.Thread(
                    target=self._pre_stop, args=(c, deadline), name=f"prestop-{c.name}"
                )
                for c in self.mains
                if c.running() and "preStop" in c.spec.get("lifecycle", {})
            ]
            for hook in hooks:
                hook.start()
            for hook in hooks:
                hook.join(max(0.0, deadline - time.monotonic()) + 1)
        running = [c for c in self.inits + self.mains if c.running()]
        # Abandoned with no grace (the simulation ending: a node switched off): SIGKILL at once.
        graceful = not (self._abandon.is_set() and self._abandon_grace <= 0)
        for container in running:
            container.signal(signal.SIGTERM if graceful else signal.SIGKILL)
        for container in running:
            code = self._await_exit(container, deadline, graceful)
            # Whatever the container left behind dies with it, as in its cgroup.
            container.signal(signal.SIGKILL)
            self._exited(container, code)
        # As the kubelet's status manager, the last status and the removal are retried while
        # the API server cannot be reached (an outage), until the node is abandoned.
        while not self._abandon.is_set():
            try:
                with contextlib.suppress(ApiException):
                    self._publish()
                self._remove_from_api()
                break
            except Unreachable as e:
                self._unreachable(e)
                self._abandon.wait(1.0)
        self._keep_logs()
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.node.cpu is not None:
            self.node.cpu.forget(self._cpu_group)

    def _keep_logs(self) -> None:
        """Move the pod's container logs to the node's `kept_logs`, if it keeps them."""
        logs = self.dir / "logs"
        if self.node.kept_logs is None or not logs.is_dir():
            return
        self.node.kept_logs.mkdir(parents=True, exist_ok=True)
        try:
            shutil.move(logs, self.node.kept_logs / self.dir.name)
        except OSError as e:
            log.warning("Pod %s: its logs could not be kept: %s", self.key, e)

    def _await_exit(self, container: ContainerRun, deadline: float, graceful: bool) -> int:
        """The container's exit code, once it has exited; SIGKILL once `deadline` has passed."""
        assert container.process is not None
        try:
            return container.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            if graceful:
                log.warning(
                    "Pod %s: container %s outlived its grace period: killing it.",
                    self.key,
                    container.name,
                )
            container.signal(signal.SIGKILL)
            return container.process.wait(10)

    def _pre_stop(self, container: ContainerRun, deadline: float) -> None:
        hook = container.spec["lifecycle"]["preStop"]
        left = max(0.1, deadline - time.monotonic())
        if "sleep" in hook:
            # Cut short when the simulation ends (abandon): the node is switched off.
            self._abandon.wait(min(float(hook["sleep"]["seconds"]), left))
        elif "httpGet" in hook:
            http_get(hook["httpGet"], container.ports, self.pod_ip, left)
        elif "exec" in hook and container.launch is not None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(
                    list(hook["exec"]["command"]),
                    env=dict(container.launch.env),
                    cwd=self.dir,
                    timeout=left,
                    check=False,
                    capture_output=True,
                )

    def _remove_from_api(self) -> None:
        # Not `_delete`: threading.Thread calls its own `_delete` as every thread ends, which
        # would remove from the API every pod whose worker stops (one marked Failed included).
        try:
            self.node.core.delete_namespaced_pod(
                self.pod_name,
                self.namespace,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=self.uid)
                ),
                _preload_content=False,
            )
            log.info("Pod %s has stopped: removed it from the API.", self.key)
        except ApiException as e:
            if e.status not in (404, 409):
                log.warning("Pod %s has stopped but could not be removed: %s", self.key, e.reason)

    # Status.

    def _status(self) -> dict[str, Any]:
        mains = [c.status() for c in self.mains]
        if self.config_error:
            for status in mains:
                status["state"] = {
                    "waiting": {
                        "reason": "CreateContainerConfigError",
                        "message": self.config_error,
                    }
                }
        ready = self.phase == "Running" and all(c.ready for c in self.mains)
        flags = {"Initialized": self.initialized, "ContainersReady": ready, "Ready": ready}
        return {
            "phase": self.phase,
            "hostIP": self.node.host_ip,
            "podIP": self.pod_ip,
            "podIPs": [{"ip": self.pod_ip}],
            "startTime": self.start_time,
            "conditions": [
                {"type": kind, "status": "True" if value else "False"}
                for kind, value in flags.items()
            ],
            "initContainerStatuses": [c.status() for c in self.inits],
            "containerStatuses": mains,
        }

    def _unreachable(self, error: Exception) -> None:
        self._next_try = time.monotonic() + 1.0
        if self._unreachable_since is None:
            self._unreachable_since = time.monotonic()
            log.warning(
                "Pod %s: the API server cannot be reached (%s); its status is written once it can.",
                self.key,
                error,
            )

    def _publish(self) -> None:
        """Write the status if it changed since the last write."""
        status = self._status()
        fingerprint = json.dumps(status, sort_keys=True)
        if fingerprint == self._published:
            return
        if self._unreachable_since is not None and time.monotonic() < self._next_try:
            return
        try:
            written = write_status(self.node.core, self.namespace, self.pod_name, self.uid, status)
        except Unreachable as e:
            self._unreachable(e)  # written at the next call, once the API server is back
            return
        if self._unreachable_since is not None:
            log.info(
                "Pod %s: the API server is reachable again after %.0f s; its status is written.",
                self.key,
                time.monotonic() - self._unreachable_since,
            )
            self._unreachable_since = None
        if written is None:
            log.warning(
                "Pod %s: its status was not written; retrying on the next change.", self.key
            )
            return
        self.pod = written
        self._published = fingerprint
