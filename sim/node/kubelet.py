"""The simulated kubelet: runs the pods bound to one node as local processes, through the API.

`Kubelet` lists and watches the pods with `spec.nodeName=<node>` through the official client and
gives each pod a `sim.node.podworker.PodWorker`, which runs it as a kubelet would (volumes,
projected tokens, init containers, main containers, readiness probes, status, graceful deletion).

`HollowKubelet` stands in for the kubelets of simulated nodes that run nothing (as kwok does): it
marks their pods Running and Ready and removes them once they are deleted.

It must not know the product: everything comes from the pod spec.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sim.node.addresses import PodAddresses
from sim.node.admission import NodeAdmission, rejected_status
from sim.node.containers import ContainerRun, now_rfc3339
from sim.node.cpushares import CpuGroups
from sim.node.events import EventRecorder
from sim.node.heartbeat import NodeHeartbeat
from sim.node.logserver import LogServer
from sim.node.podspec import Obj
from sim.node.podworker import NodeRuntime, PodWorker, pod_key, read_json
from sim.watching import watch_events

log = logging.getLogger(__name__)

USER_AGENT = "tritonshare-sim-kubelet"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
"""A mirror pod's mark: the API's copy of a pod something else runs (`sim.node.mirrorpods`), as
the kubelet's mirror pods of static pods; a kubelet never runs one."""


def is_mirror(pod: Obj) -> bool:
    return MIRROR_ANNOTATION in (pod["metadata"].get("annotations") or {})


class _PodWatcher:
    """List, then watch, the pods a kubelet cares about; relist on errors and 410 Gone."""

    def __init__(self, api_client: client.ApiClient, field_selector: str, name: str) -> None:
        self.core = client.CoreV1Api(api_client)
        self._field_selector = field_selector
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name)

    def start(self) -> None:
        self._thread.start()

    def stop_watching(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def sync(self, pods: list[Obj]) -> None:
        """Called with every pod after each (re)list."""
        raise NotImplementedError

    def admitted(self, admission: NodeAdmission, node: str, pod: Obj) -> bool:
        """Judge a pod first seen on `node` as the kubelet's admission does (the Node read
        again for its allocatable); a refused pod is marked Failed with the kubelet's reason
        and a Warning Event, and is never run."""
        try:
            admission.set_node(read_json(self.core.read_node(node, _preload_content=False)))
        except ApiException as e:
            log.warning("Node %s could not be read for admission: %s.", node, e.reason)
        refusal = admission.admit(pod)
        if refusal is None:
            return True
        meta = pod["metadata"]
        log.warning(
            "The kubelet of node %s refuses pod %s: %s", node, pod_key(pod), refusal.message
        )
        stamp = now_rfc3339()
        try:
            body = {**pod, "status": rejected_status(pod, refusal, stamp)}
            core = cast(Any, self.core)
            core.replace_namespaced_pod_status(
                meta["name"], meta["namespace"], body, _preload_content=False
            )
        except ApiException as e:
            if e.status not in (404, 409):
                log.warning("The kubelet could not mark pod %s refused: %s", pod_key(pod), e.reason)
            return False
        EventRecorder(self.core, node).record(
            pod, refusal.reason, refusal.message, event_type="Warning"
        )
        return False

    def handle(self, event_type: str, pod: Obj) -> None:
        """Called for each watch event."""
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                listed = read_json(
                    self.core.list_pod_for_all_namespaces(
                        field_selector=self._field_selector, _preload_content=False
                    )
                )
                self.sync([p for p in listed.get("items", []) if not is_mirror(p)])
                self._watch(listed["metadata"]["resourceVersion"])
            except Exception as e:
                if self._stop.is_set():
                    return
                log.warning(
                    "The pod watch (%s) failed: %s; listing again.", self._field_selector, e
                )
                self._stop.wait(0.5)

    def _watch(self, resource_version: str) -> None:
        for event_type, raw in watch_events(
            self.core.list_pod_for_all_namespaces,
            self._stop,
            resource_version,
            field_selector=self._field_selector,
        ):
            if not is_mirror(raw):
                self.handle(event_type, raw)


class Kubelet(_PodWatcher):
    """Runs the pods bound to `node_name` as processes under `workdir`. Use as a context manager,
    or call start() and stop().

    `source_address_variables` name the environment variables set to each pod's IP, the stand-in
    for a pod's own network namespace (`sim.node.podnetwork`): the caller knows which ones its
    programs read; the kubelet does not. With `cpu`, each pod's processes run in a CPU cgroup
    weighted by the pod's CPU requests, as a real kubelet runs them (`sim.node.cpushares`).
    Kubelets of several nodes share one `addresses`, so that their pods' IPs differ, as the
    cluster's network hands them out. With `masquerade`, the variables name the node's address:
    the pods' connections leave from it, as under a CNI that masquerades node-local traffic.
    With `kept_logs`, a stopped pod's container logs are moved there instead of removed.
    With `heartbeat_seconds`, it renews its node's Lease and Ready condition that often
    (`sim.node.heartbeat`; `clock` stamps them), until it stops."""

    def __init__(
        self,
        api_client: client.ApiClient,
        node_name: str,
        workdir: Path,
        *,
        host_ip: str = "127.0.0.1",
        python: str = sys.executable,
        base_env: Mapping[str, str] | None = None,
        source_address_variables: Sequence[str] = (),
        backoff_initial: float = 0.5,
        backoff_max: float = 5.0,
        abandon_grace: float = 10.0,
        cpu: CpuGroups | None = None,
        addresses: PodAddresses | None = None,
        masquerade: bool = False,
        kept_logs: Path | None = None,
        heartbeat_seconds: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        api_client.user_agent = USER_AGENT
        super().__init__(api_client, f"spec.nodeName={node_name}", f"kubelet-{node_name}")
        self.heartbeat = (
            None
            if heartbeat_seconds is None
            else NodeHeartbeat(
                api_client, [node_name], renew_seconds=heartbeat_seconds, clock=clock
            )
        )
        self.node_name = node_name
        self.workdir = workdir
        self.runtime = NodeRuntime(
            core=self.core,
            workdir=workdir,
            host_ip=host_ip,
            python=python,
            addresses=PodAddresses() if addresses is None else addresses,
            source_address_variables=tuple(source_address_variables),
            base_env=dict(os.environ if base_env is None else base_env),
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
            abandon_grace=abandon_grace,
            cpu=cpu,
            masquerade=masquerade,
            events=EventRecorder(self.core, node_name),
            kept_logs=kept_logs,
        )
        self._workers: dict[str, PodWorker] = {}
        self._lock = threading.Lock()
        self.admission = NodeAdmission()
        self.logs: LogServer | None = None

    def sync(self, pods: list[Obj]) -> None:
        seen = set()
        for pod in pods:
            seen.add(pod["metadata"].get("uid", ""))
            self.handle("MODIFIED", pod)
        with self._lock:
            gone = [w for uid, w in self._workers.items() if uid not in seen]
        for worker in gone:
            worker.abandon()

    def handle(self, event_type: str, pod: Obj) -> None:
        uid = str(pod["metadata"].get("uid", ""))
        with self._lock:
            worker = self._workers.get(uid)
            deleting = pod["metadata"].get("deletionTimestamp") is not None
            terminal = pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
            if event_type == "DELETED" or terminal:
                self.admission.forget(uid)
            if event_type == "DELETED":
                if worker is not None:
                    worker.abandon()
                return
            external = worker is not None and worker.phase not in ("Succeeded", "Failed")
            if worker is not None and terminal and external and not deleting:
                # Marked terminal by someone else (an eviction): stop its containers and leave
                # the status as written, as a real kubelet does.
                worker.abandon()
                return
            if worker is None:
                if pod.get("status", {}).get("phase") in ("Succeeded", "Failed") or deleting:
                    if deleting:
                        self._force_delete(pod)
                    return
                if not self.admitted(self.admission, self.node_name, pod):
                    return
                worker = PodWorker(self.runtime, pod)
                self._workers[uid] = worker
                worker.start()
            if deleting:
                grace = pod["metadata"].get("deletionGracePeriodSeconds")
                worker.request_deletion(float(30 if grace is None else grace))

    def _force_delete(self, pod: Obj) -> None:
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(
                pod["metadata"]["name"],
                pod["metadata"].get("namespace", "default"),
                body=client.V1DeleteOptions(grace_period_seconds=0),
                _preload_content=False,
            )

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log.info(
            "The simulated kubelet of node %s is running pods in %s.", self.node_name, self.workdir
        )
        self._serve_logs()
        super().start()
        if self.heartbeat is not None:
            self.heartbeat.start()

    def _serve_logs(self) -> None:
        """Serve the pods' logs on the node's address, and publish the port on the Node as a
        kubelet does (status.daemonEndpoints), where the API server finds it for `pods/log`."""
        self.logs = LogServer(self.runtime.host_ip, self.containers)
        self.logs.start()
        status = {"status": {"daemonEndpoints": {"kubeletEndpoint": {"Port": self.logs.port}}}}
        try:
            self.core.patch_node_status(self.node_name, status, _preload_content=False)
        except ApiException as e:
            log.warning(
                "Node %s: its kubelet's log port could not be published (%s): kubectl logs"
                " will not reach its pods.",
                self.node_name,
                e.reason,
            )

    def containers(self, namespace: str, pod: str) -> list[ContainerRun] | None:
        """The init and main containers of the pod this kubelet runs (the latest of that name),
        or None."""
        with self._lock:
            workers = [
                w for w in self._workers.values() if (w.namespace, w.pod_name) == (namespace, pod)
            ]
        if not workers:
            return None
        worker = workers[-1]
        return [*worker.inits, *worker.mains]

    def stop(self, grace: float = 0.0) -> None:
        """Stop watching and stop every pod's processes (no API calls: the cluster may be gone).

        The simulation is ending, as if the node were switched off: by default containers get no
        grace (a proxy's drain and unload would only delay the end of every test and demo run;
        nothing outlives the simulation for them to hand over to). Graceful termination is what
        deleting a pod through the API shows."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
        self.stop_watching()
        if self.logs is not None:
            self.logs.stop()
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            worker.abandon(grace)
        for worker in workers:
            worker.join(grace + 15)

    def lose(self) -> None:
        """The node is lost with its kubelet: every pod's processes SIGKILLed at once, no more
        heartbeats or API calls (the pods stay bound to the node in the API)."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
        self._stop.set()  # no new pod started meanwhile
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            worker.abandon(0.0)
        self.stop(0.0)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every pod worker has finished (its pod deleted); True if they all did."""
        deadline = time.monotonic() + timeout
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        return not any(w.is_alive() for w in workers)

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """The log of a container of a running pod (empty if unknown)."""
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            if (worker.namespace, worker.pod_name) == (namespace, pod):
                for c in worker.inits + worker.mains:
                    if c.name == container and c.log_path and c.log_path.exists():
                        return c.log_path.read_text(errors="replace")
        return ""

    def __enter__(self) -> Kubelet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class HollowKubelet(_PodWatcher):
    """Marks the pods of simulated nodes Running and Ready, and removes them once deleted."""

    def __init__(
        self,
        api_client: client.ApiClient,
        node_names: Iterable[str],
        *,
        heartbeat_seconds: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        api_client.user_agent = USER_AGENT
        super().__init__(api_client, "", "hollow-kubelet")
        self.node_names = frozenset(node_names)
        self.heartbeat = (
            None
            if heartbeat_seconds is None
            else NodeHeartbeat(
                api_client, sorted(self.node_names), renew_seconds=heartbeat_seconds, clock=clock
            )
        )
        self.admission = {name: NodeAdmission() for name in self.node_names}

    def sync(self, pods: list[Obj]) -> None:
        for pod in pods:
            self.handle("MODIFIED", pod)

    def handle(self, event_type: str, pod: Obj) -> None:
        node = pod["spec"].get("nodeName")
        if node not in self.node_names:
            return
        admission = self.admission[node]
        uid = str(pod["metadata"].get("uid", ""))
        phase = pod.get("status", {}).get("phase")
        if event_type == "DELETED" or phase in ("Succeeded", "Failed"):
            admission.forget(uid)
            return
        meta = pod["metadata"]
        first_seen = meta.get("deletionTimestamp") is None and uid not in admission.admitted
        if first_seen and not self.admitted(admission, node, pod):
            return
        try:
            if meta.get("deletionTimestamp") is not None:
                self.core.delete_namespaced_pod(
                    meta["name"],
                    meta["namespace"],
                    body=client.V1DeleteOptions(grace_period_seconds=0),
                    _preload_content=False,
                )
            elif pod.get("status", {}).get("phase") != "Running":
                self._mark_running(pod)
        except ApiException as e:
            if e.status not in (404, 409):
                log.warning(
                    "The hollow kubelet could not update pod %s: %s", pod_key(pod), e.reason
                )

    def _mark_running(self, pod: Obj) -> None:
        stamp = now_rfc3339()
        kept = [
            c
            for c in pod.get("status", {}).get("conditions", [])
            if c["type"] not in ("Initialized", "Ready", "ContainersReady")
        ]
        containers = [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "started": True,
                "state": {"running": {"startedAt": stamp}},
            }
            for c in pod["spec"].get("containers", [])
        ]
        body = dict(pod)
        body["status"] = {
            **pod.get("status", {}),
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "startTime": stamp,
            "conditions": kept
            + [
                {"type": t, "status": "True", "lastTransitionTime": stamp}
                for t in ("Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": containers,
        }
        self.core.replace_namespaced_pod_status(
            pod["metadata"]["name"],
            pod["metadata"]["namespace"],
            cast(Any, body),
            _preload_content=False,
        )

    def start(self) -> None:
        super().start()
        if self.heartbeat is not None:
            self.heartbeat.start()

    def stop(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
        self.stop_watching()

    def __enter__(self) -> HollowKubelet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
