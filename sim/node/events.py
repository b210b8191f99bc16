"""The simulated kubelet's Events, as a real kubelet records them: on the pod (the container's
field path when one is concerned), from component `kubelet` on its host; a repeat of the same
(pod, container, reason, message) raises the first Event's count, as the kubelet's event
aggregation does (common/events.py's rule, which the binder and the agent follow too).
Must not decide anything: the pod worker and the kubelet say what happened.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from common.events import EventAggregator
from sim.node.containers import now_rfc3339
from sim.node.podspec import Obj

log = logging.getLogger(__name__)


def field_path(pod: Obj, container: str) -> str:
    """`spec.initContainers{name}` or `spec.containers{name}`, as upstream's references."""
    inits = [c.get("name") for c in (pod.get("spec") or {}).get("initContainers") or []]
    return f"spec.{'initContainers' if container in inits else 'containers'}{{{container}}}"


class EventRecorder:
    """Writes one node's kubelet Events; a repeat raises the first one's count (the one rule
    of common/events.py)."""

    def __init__(self, core: client.CoreV1Api, host: str) -> None:
        self._core = cast(Any, core)
        self._host = host
        self._events = EventAggregator()

    def record(
        self, pod: Obj, reason: str, message: str, *, event_type: str, container: str = ""
    ) -> None:
        meta = pod["metadata"]
        namespace, uid = str(meta.get("namespace", "default")), str(meta.get("uid", ""))
        stamp = now_rfc3339()
        involved = {"kind": "Pod", "namespace": namespace, "name": meta["name"], "uid": uid}
        if container:
            involved["fieldPath"] = field_path(pod, container)
        write = self._events.write_for(
            {
                "metadata": {"namespace": namespace},
                "involvedObject": involved,
                "reason": reason,
                "message": message,
                "type": event_type,
                "source": {"component": "kubelet", "host": self._host},
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "count": 1,
            }
        )
        try:
            if write.create:
                self._core.create_namespaced_event(namespace, write.body, _preload_content=False)
            else:
                self._core.patch_namespaced_event(
                    write.name, namespace, write.body, _preload_content=False
                )
        except ApiException as e:
            self._events.failed(write)
            log.warning(
                "The kubelet could not record %s on pod %s: %s.", reason, meta["name"], e.reason
            )
