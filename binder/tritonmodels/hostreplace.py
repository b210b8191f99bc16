"""When a namespace's model host no longer matches what the binder would create, and when it may
be replaced.

A pod's spec cannot change, so a host made from another template (another --host-image, ports or
pod settings: another binder's), or without a storage Secret its replicas need, is deleted and
created anew (`binder.tritonmodels.hostwriter`). Replacements go one host of a namespace at a
time, so its models stay served by their replicas on other nodes: the next waits until no host
of the namespace is being deleted and every other one serves its replicas, or
--host-drain-seconds after the last replacement at most. This module decides; the host writer
deletes.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Container, Mapping

from binder.cluster.modelviews import ModelInfo
from binder.cluster.objects import PodInfo
from binder.tritonmodels.hostpod import host_image, mounted_secrets
from binder.tritonmodels.rolling import Loaded
from common.contract import Keys
from common.hosted import host_template_annotation
from common.kubeapi.session import JsonObject

log = logging.getLogger(__name__)

Replicas = list[tuple[ModelInfo, int, PodInfo]]
"""The replicas of a namespace charged on one node: (model, ordinal, replica)."""
Where = tuple[str, str]
"""A host of a namespace: its node and its storage Secret ("": none)."""


class HostReplacements:
    """Which hosts are outdated, and whether a namespace's may be replaced now; `draining`
    (replica uids) and `served` are the model writer's, read as they change."""

    def __init__(
        self,
        keys: Keys,
        *,
        drain_seconds: float,
        clock: Callable[[], float],
        draining: Container[str],
        served: Callable[[ModelInfo, PodInfo], Loaded],
    ) -> None:
        self._keys = keys
        self._drain_seconds = drain_seconds
        self._clock = clock
        self._draining = draining
        self._served = served
        self._replaced_at: dict[str, float] = {}
        """Namespace -> when one of its outdated hosts was last replaced (`clock`)."""
        self._replacing: dict[str, str] = {}
        """Namespace -> the uid of the host it replaced last."""

    def outdated(self, there: JsonObject, body: JsonObject) -> str:
        """Why the host `there` no longer matches the host the binder would create now, `body`
        ("" when it does)."""
        key = host_template_annotation(self._keys)
        made = ((there.get("metadata") or {}).get("annotations") or {}).get(key)
        if made != body["metadata"]["annotations"][key]:
            old, new = host_image(there.get("spec") or {}), host_image(body["spec"])
            if old != new:
                return f"its image is {old}, and --host-image is {new}"
            return "it was made from another pod template (ports, arguments or settings)"
        missing = mounted_secrets(body["spec"]) - mounted_secrets(there.get("spec") or {})
        if missing:
            return f"it does not mount Secret {', '.join(sorted(missing))}"
        return ""

    def may_replace(
        self,
        namespace: str,
        where: Where,
        wanted: Mapping[Where, Replicas],
        there_now: Mapping[Where, JsonObject],
    ) -> bool:
        """Whether the namespace's host `where` may be replaced now."""
        deleted = self._replacing.get(namespace)
        for host in there_now.values():
            meta = host.get("metadata") or {}
            if meta.get("deletionTimestamp") or meta.get("uid") == deleted:
                return False  # one is going (or its deletion is not in the cache yet)
        if self._clock() >= self._replaced_at.get(namespace, -math.inf) + self._drain_seconds:
            return True
        for other, replicas in wanted.items():
            if other == where:
                continue
            if other not in there_now:
                return False
            for model, _, replica in replicas:
                if replica.uid not in self._draining and not self._served(model, replica).ready:
                    return False
        return True

    def replacing(self, namespace: str, node: str, there: JsonObject, why: str) -> None:
        """The outdated host `there` on `node` is being deleted now: the namespace's next
        replacement waits for it."""
        meta = there.get("metadata") or {}
        log.info(
            "Replacing the model host %s/%s on node %s (%s): its replicas there are served "
            "again once its successor has loaded them.",
            namespace,
            meta.get("name"),
            node,
            why,
        )
        self._replaced_at[namespace] = self._clock()
        self._replacing[namespace] = str(meta.get("uid"))
