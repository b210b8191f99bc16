"""Mirror pods: the API's copies of the pods the simulated cluster runs as processes of its own
(each real node's node pod: Triton, the agent, the gateway; the binders; the webhook), so
`kubectl get pods -A` lists them with their real status, as a kubelet publishes a mirror pod for
each static pod it runs.

Every `period` seconds `MirrorPods` makes the API match `wanted()`: a pod per `Mirror` in its
namespace, marked with the kubelet's mirror annotation (`sim.node.kubelet` never runs one) and
labelled with its DaemonSet's or Deployment's labels, whose status says what `state(mirror)`
reads of its processes: each container running or not and its restarts, the pod Running and
Ready while all run. A mirror pod deleted (`kubectl delete pod`) is replaced as its controller
would: a node pod by `replace(mirror)` (a DaemonSet update: new processes, empty volumes) under a
new name, shown ContainerCreating until it returns; a binder's or the webhook's is made again (its
process runs on). One thread; it knows no product part: the cluster hands it the mirrors.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sim.apiserver.clock import rfc3339
from sim.node.kubelet import MIRROR_ANNOTATION

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]
MIRROR_OF = "sim.tritonshare.io/mirror-of"
"""The label naming what a mirror pod stands for (its `Mirror.key`)."""


@dataclass(frozen=True)
class Mirror:
    """One pod the cluster runs itself."""

    key: str
    """What it stands for, unique: `node/<node>`, `binder/<identity>`, `webhook`."""
    prefix: str
    """Its name's start: a random suffix follows, as a controller's pods have."""
    template: Mapping[str, Any]
    """The pod template it was made from (labels, containers, service account)."""
    node: str = ""
    owner: Mapping[str, Any] | None = None
    """Its controller's ownerReference (the node DaemonSet), or None."""
    replaceable: bool = field(default=False)
    """Deleting it replaces its processes (a node pod); else it is only made again."""


ContainerStates = Mapping[str, tuple[bool, int]]
"""Container name -> (running, restarts since the pod started)."""


class MirrorPods:
    """Start with start(), stop with stop()."""

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        wanted: Callable[[], list[Mirror]],
        state: Callable[[Mirror], ContainerStates],
        replace: Callable[[Mirror], None],
        *,
        clock: Callable[[], float],
        period: float = 1.0,
    ) -> None:
        self.core = cast(Any, client.CoreV1Api(api_client))
        self.namespace = namespace
        self._wanted = wanted
        self._state = state
        self._replace = replace
        self._clock = clock
        self._period = period
        self._replacing: set[str] = set()
        self._started_at: dict[str, str] = {}
        """Pod name -> when it started (RFC 3339)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mirror-pods")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as e:  # the next period tries again
                if self._stop.is_set():
                    return
                log.warning("Publishing the mirror pods failed: %s; trying again.", e)
            self._stop.wait(self._period)

    def sync(self) -> None:
        """One pass: each wanted mirror's pod made, replaced or brought up to date."""
        listed = json.loads(
            self.core.list_namespaced_pod(
                self.namespace, label_selector=MIRROR_OF, _preload_content=False
            ).data
        )
        held: dict[str, JsonObject] = {}
        deleted: list[tuple[JsonObject, str]] = []
        for pod in listed.get("items", []):
            key = _key_of(pod)
            if pod["metadata"].get("deletionTimestamp"):
                deleted.append((pod, key))
            else:
                held[key] = pod
        wanted = {m.key: m for m in self._wanted()}
        for pod, key in deleted:
            mirror = wanted.get(key)
            if mirror is not None and mirror.replaceable and key not in self._replacing:
                self._replacing.add(key)
                threading.Thread(
                    target=self._replace_in_background, args=(mirror,), name=f"replace-{key}"
                ).start()
            self._delete(pod["metadata"]["name"])
        for key, pod in held.items():
            if key not in wanted:
                self._delete(pod["metadata"]["name"])
        for key, mirror in wanted.items():
            pod = held.get(key) or self._create(mirror)
            status = self._status(mirror, pod)
            if _shown(pod.get("status") or {}) != _shown(status):
                self.core.patch_namespaced_pod_status(
                    pod["metadata"]["name"],
                    self.namespace,
                    {"status": status},
                    _preload_content=False,
                )

    def _replace_in_background(self, mirror: Mirror) -> None:
        try:
            self._replace(mirror)
        except Exception:
            log.exception("Replacing the processes of %s has failed.", mirror.key)
        finally:
            self._replacing.discard(mirror.key)

    def _create(self, mirror: Mirror) -> JsonObject:
        template = mirror.template
        spec = dict(template.get("spec") or {})
        if mirror.node:
            spec["nodeName"] = mirror.node
        metadata: JsonObject = {
            "name": f"{mirror.prefix}-{secrets.token_hex(3)[:5]}",
            "namespace": self.namespace,
            "labels": {
                **(template.get("metadata") or {}).get("labels", {}),
                MIRROR_OF: _label(mirror.key),
            },
            "annotations": {MIRROR_ANNOTATION: mirror.key},
        }
        if mirror.owner is not None:
            metadata["ownerReferences"] = [dict(mirror.owner)]
        created: JsonObject = json.loads(
            self.core.create_namespaced_pod(
                self.namespace,
                {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec},
                _preload_content=False,
            ).data
        )
        self._started_at[created["metadata"]["name"]] = rfc3339(self._clock())
        return created

    def _delete(self, name: str) -> None:
        self._started_at.pop(name, None)
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(
                name, self.namespace, grace_period_seconds=0, _preload_content=False
            )

    def _status(self, mirror: Mirror, pod: JsonObject) -> JsonObject:
        name = pod["metadata"]["name"]
        started = self._started_at.setdefault(name, rfc3339(self._clock()))
        replacing = mirror.key in self._replacing
        states = {} if replacing else dict(self._state(mirror))
        containers = []
        for container in (pod.get("spec") or {}).get("containers") or []:
            running, restarts = states.get(container["name"], (False, 0))
            containers.append(
                {
                    "name": container["name"],
                    "image": container.get("image", ""),
                    "imageID": "",
                    "ready": running,
                    "started": running,
                    "restartCount": restarts,
                    "state": {"running": {"startedAt": started}}
                    if running
                    else {"waiting": {"reason": "ContainerCreating" if replacing else "Error"}},
                }
            )
        ready = "True" if containers and all(c["ready"] for c in containers) else "False"
        return {
            "phase": "Pending" if replacing else "Running",
            "startTime": started,
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": ready},
                {"type": "Ready", "status": ready},
            ],
            "containerStatuses": containers,
        }


def _label(key: str) -> str:
    """A mirror's key as a label value (no `/`)."""
    return key.replace("/", ".")


def _key_of(pod: JsonObject) -> str:
    return str((pod["metadata"].get("annotations") or {}).get(MIRROR_ANNOTATION, ""))


def _shown(status: JsonObject) -> tuple[Any, ...]:
    """What a status change is judged by (the server adds transition times)."""
    conditions = tuple((c.get("type"), c.get("status")) for c in status.get("conditions") or ())
    containers = tuple(
        (c.get("name"), c.get("ready"), c.get("restartCount"), json.dumps(c.get("state")))
        for c in status.get("containerStatuses") or ()
    )
    return status.get("phase"), conditions, containers
