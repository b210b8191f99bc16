"""What each model host's loader last reported it fails to load (ListHosted), by replica.

A host's loader fetches and installs its replicas itself, so a 404 at the store, a missing
credential or files the agent refuses are known to it first. Each ListHosted carries the
replicas it fails to load now, each named as the loader names it in every call (the model id
its clients send, spec.modelName, and the ordinal); `report` replaces what that host said before
(a replica no longer listed has no failure), keeping only the host's own proven, non-draining
replicas (a host cannot report about another host, namespace or model), with a known reason and
a bounded message (`common.hosted.load_failure`), and says whether anything changed.
`agent.status.conditions` reads `of(replica)` for a replica its host has not made READY yet. Pure
bookkeeping in memory: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agent.pods.modelpods import PodInfo
from agent.pods.provenpods import Proven
from common.hosted import HostedReplica, load_failure

REMEMBERED_HOSTS = 1_000
"""Hosts whose reports are kept (more than a node has pods: a replaced host's report stays until
then); past it all are forgotten, and each live host reports again at its next poll. Each is at
most one ListHosted's (the gate reads 64 KiB of it)."""


@dataclass(frozen=True)
class LoadFailure:
    """A replica its host's loader cannot load: the reason (`LOAD_FAILURE_REASONS`) and why."""

    reason: str
    message: str


class LoadFailures:
    """The last report of each model host, by host uid then replica uid."""

    def __init__(self) -> None:
        self._by_host: dict[str, dict[str, LoadFailure]] = {}

    def report(
        self,
        host_uid: str,
        hosted: Iterable[tuple[HostedReplica, Proven]],
        failures: Iterable[tuple[str, int, str, str]],
    ) -> bool:
        """Replace host `host_uid`'s report with `failures` ((model id, ordinal, reason,
        message)), kept for the host's proven replicas `hosted` (each beside its entry in the
        host's annotation) that are not draining; True when the report differs from the last."""
        replicas = {
            (entry.model_id, entry.replica): proven.pod.uid
            for entry, proven in hosted
            if not proven.pod.draining
        }
        kept: dict[str, LoadFailure] = {}
        for model_id, ordinal, reason, message in failures:
            uid = replicas.get((model_id, ordinal))
            if uid is not None:
                kept[uid] = LoadFailure(*load_failure(reason, message))
        if kept == self._by_host.get(host_uid, {}):
            return False
        if not kept:
            del self._by_host[host_uid]
            return True
        if host_uid not in self._by_host and len(self._by_host) >= REMEMBERED_HOSTS:
            self._by_host.clear()
        self._by_host[host_uid] = kept
        return True

    def of(self, replica: PodInfo) -> LoadFailure | None:
        """What `replica`'s host last reported about it; None for a model pod or no failure."""
        if not replica.host:
            return None
        return self._by_host.get(replica.host_uid, {}).get(replica.uid)
