"""The simulated kube-scheduler (schedulerName `default-scheduler`), enough for pods the product
hands to it (the binder's placeholders): each pass, every pending pod of that scheduler is bound
to the first node by name that `sim.controllers.nodefit` accepts beside the pods already there,
or gets kube-scheduler's `PodScheduled=False` `Unschedulable` with its FitError message and a
`FailedScheduling` Event (once per message). No scores, no preemption.
Acts only through the API (the official client), as `tritonshare-sim-scheduler`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Self

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sim.apiserver.clock import rfc3339
from sim.controllers.nodefit import fit_error, running_on, unfit

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]
USER_AGENT = "tritonshare-sim-scheduler"
SCHEDULER_NAME = "default-scheduler"


def list_json(call: Callable[..., Any]) -> list[JsonObject]:
    """The items of a list call of the official client, as plain JSON."""
    items: list[JsonObject] = json.loads(call(_preload_content=False).data).get("items") or []
    return items


class Loop:
    """A pass every `period` seconds on a thread of its own (`start`, `stop`, a context
    manager); `sync_once` runs one pass."""

    name = "sim-loop"

    def __init__(self, period: float) -> None:
        self.period = period
        self.syncs = 0
        """Completed passes, for tests that wait for the next one."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync_once()
            except Exception:  # the loop outlives one bad pass, as upstream's workers do
                log.exception("The %s pass has failed; trying again", self.name)
            self.syncs += 1
            self._stop.wait(self.period)

    def sync_once(self) -> None:
        raise NotImplementedError


class DefaultScheduler(Loop):
    """Binds pending default-scheduler pods (see the module)."""

    name = "sim-default-scheduler"

    def __init__(self, api: client.ApiClient, period: float = 0.2) -> None:
        super().__init__(period)
        api.user_agent = USER_AGENT
        self.core: Any = client.CoreV1Api(api)
        self._reported: dict[str, str] = {}

    def sync_once(self) -> None:
        nodes = sorted(list_json(self.core.list_node), key=lambda n: n["metadata"]["name"])
        pods = list_json(self.core.list_pod_for_all_namespaces)
        for pod in pods:
            spec, meta = pod.get("spec") or {}, pod["metadata"]
            if (
                spec.get("schedulerName", SCHEDULER_NAME) != SCHEDULER_NAME
                or spec.get("nodeName")
                or meta.get("deletionTimestamp")
            ):
                continue
            reasons: dict[str, int] = {}
            for node in nodes:
                why = unfit(pod, node, running_on(pods, node["metadata"]["name"]))
                if why is None:
                    self._bind(pod, node["metadata"]["name"])
                    pod.setdefault("spec", {})["nodeName"] = node["metadata"]["name"]
                    break
                reasons[why] = reasons.get(why, 0) + 1
            else:
                self._unschedulable(pod, fit_error(len(nodes), reasons))

    def _bind(self, pod: JsonObject, node: str) -> None:
        meta = pod["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            self.core.create_namespaced_binding(meta["namespace"], body, _preload_content=False)
        except ApiException as e:
            log.warning(
                "Could not bind pod %s/%s to %s: %s",
                meta["namespace"],
                meta["name"],
                node,
                e.reason,
            )
            return
        self._reported.pop(meta["uid"], None)
        self._event(
            pod,
            "Scheduled",
            f"Successfully assigned {meta['namespace']}/{meta['name']} to {node}",
            "Normal",
        )

    def _unschedulable(self, pod: JsonObject, message: str) -> None:
        meta = pod["metadata"]
        if self._reported.get(meta["uid"]) == message:
            return
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastProbeTime": None,
            "lastTransitionTime": rfc3339(time.time()),
        }
        try:
            self.core.patch_namespaced_pod_status(
                meta["name"], meta["namespace"], {"status": {"conditions": [condition]}}
            )
        except ApiException as e:
            log.warning(
                "Could not mark pod %s/%s unschedulable: %s",
                meta["namespace"],
                meta["name"],
                e.reason,
            )
            return
        self._reported[meta["uid"]] = message
        self._event(pod, "FailedScheduling", message, "Warning")

    def _event(self, pod: JsonObject, reason: str, message: str, kind: str) -> None:
        event_object(self.core, pod, reason, message, kind, "default-scheduler")


def event_object(
    core: Any, obj: JsonObject, reason: str, message: str, kind: str, component: str
) -> None:
    """Record a core/v1 Event about `obj` (best effort, as upstream's recorders are)."""
    meta = obj["metadata"]
    now = rfc3339(time.time())
    namespace = meta.get("namespace") or "default"
    body = {
        "metadata": {"generateName": f"{meta['name']}.", "namespace": namespace},
        "involvedObject": {
            "kind": obj.get("kind") or "Pod",
            "name": meta["name"],
            "namespace": meta.get("namespace", ""),
            "uid": meta.get("uid", ""),
        },
        "reason": reason,
        "message": message,
        "type": kind,
        "source": {"component": component},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        core.create_namespaced_event(namespace, body, _preload_content=False)
    except ApiException as e:
        log.warning("Could not record Event %s on %s: %s", reason, meta["name"], e.reason)
