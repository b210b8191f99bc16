"""The simulated kubelet's Events, as a real kubelet records them: on the pod (the container's
field path when one is concerned), from component `kubelet` on its host; a repeat of the same
(pod, container, reason) raises the first Event's count, as the kubelet's event aggregation does.
Must not decide anything: the pod worker and the kubelet say what happened.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sim.node.containers import now_rfc3339
from sim.node.podspec import Obj

log = logging.getLogger(__name__)

REMEMBERED = 10_000
"""Events whose repeats are counted; past that, a repeat starts a new Event."""


def field_path(pod: Obj, container: str) -> str:
    """`spec.initContainers{name}` or `spec.containers{name}`, as upstream's references."""
    inits = [c.get("name") for c in (pod.get("spec") or {}).get("initContainers") or []]
    return f"spec.{'initContainers' if container in inits else 'containers'}{{{container}}}"


class EventRecorder:
    """Writes one node's kubelet Events; counts repeats."""

    def __init__(self, core: client.CoreV1Api, host: str) -> None:
        self._core = cast(Any, core)
        self._host = host
        self._written: dict[tuple[str, str, str, str], tuple[str, int]] = {}
        self._lock = threading.Lock()

    def record(
        self, pod: Obj, reason: str, message: str, *, event_type: str, container: str = ""
    ) -> None:
        meta = pod["metadata"]
        namespace, uid = str(meta.get("namespace", "default")), str(meta.get("uid", ""))
        key = (uid, container, reason, message)
        stamp = now_rfc3339()
        with self._lock:
            seen = self._written.get(key)
        try:
            if seen is not None:
                name, count = seen[0], seen[1] + 1
                patch = {"count": count, "lastTimestamp": stamp}
                self._core.patch_namespaced_event(name, namespace, patch, _preload_content=False)
            else:
                involved = {"kind": "Pod", "namespace": namespace, "name": meta["name"], "uid": uid}
                if container:
                    involved["fieldPath"] = field_path(pod, container)
                body = {
                    "metadata": {"generateName": f"{meta['name']}."},
                    "involvedObject": involved,
                    "reason": reason,
                    "message": message,
                    "type": event_type,
                    "source": {"component": "kubelet", "host": self._host},
                    "firstTimestamp": stamp,
                    "lastTimestamp": stamp,
                    "count": 1,
                }
                response = self._core.create_namespaced_event(
                    namespace, body, _preload_content=False
                )
                name, count = str(json.loads(response.data)["metadata"]["name"]), 1
        except ApiException as e:
            log.warning(
                "The kubelet could not record %s on pod %s: %s.", reason, meta["name"], e.reason
            )
            return
        with self._lock:
            if len(self._written) >= REMEMBERED:
                self._written.clear()
            self._written[key] = (name, count)
