"""The node's quarantines on its Node: the `quarantined` annotation's format (what
`tritonshare quarantine list` and `status` read), and `NodeQuarantine`, which keeps the annotation
in step with the ledger (`agent.quarantine.crashledger.CrashLedger`), takes the quarantines back
from the Node after a node pod replacement, lifts those an operator names in `quarantine-clear`, and
carries out the ledger's expiry.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from agent.errors import AgentError
from agent.quarantine.crashledger import NAMESPACE, CrashLedger, CrashRecord, NamespaceRecord
from agent.quarantine.suspects import CallerRecord
from common.contract import Keys

log = logging.getLogger(__name__)


class NodeAnnotations(Protocol):
    """The Node as `NodeQuarantine` reads and writes it (`agent.kube.client.KubeClient`)."""

    async def get_node(self, name: str) -> dict[str, Any] | None: ...

    async def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None]
    ) -> None: ...


REQUESTS = "requests"
"""The `cause` of a quarantined pod's entry in the annotation (a model's files have none)."""


def from_annotation(value: str) -> tuple[list[CrashRecord], list[CallerRecord]]:
    """The quarantines a `quarantined` Node annotation lists, of models' files and of pods'
    requests (unreadable entries are skipped)."""
    try:
        shown = json.loads(value) if value else []
    except ValueError:
        return [], []
    records, callers = [], []
    for item in shown if isinstance(shown, list) else []:
        with contextlib.suppress(KeyError, TypeError, ValueError, AttributeError):
            namespace, _, model_id = str(item["model"]).partition("/")
            pod = str(item["pod"])
            if pod.partition("/")[0] != namespace or not model_id:
                continue
            crashes = int(item["crashes"])
            if item.get("cause") == NAMESPACE:
                continue  # `namespaces_from_annotation`
            if item.get("cause") == REQUESTS:
                callers.append(CallerRecord(pod, model_id, str(item["uid"]), crashes, True))
            else:
                records.append(CrashRecord(str(item["digest"]), model_id, pod, crashes, True))
    return records, callers


def namespaces_from_annotation(value: str) -> list[NamespaceRecord]:
    """The namespace quarantines a `quarantined` Node annotation lists."""
    try:
        shown = json.loads(value) if value else []
    except ValueError:
        return []
    found = []
    for item in shown if isinstance(shown, list) else []:
        with contextlib.suppress(KeyError, TypeError, ValueError, AttributeError):
            if item.get("cause") == NAMESPACE and str(item["model"]).endswith("/*"):
                namespace = str(item["model"])[:-2]
                found.append(
                    NamespaceRecord(namespace, str(item["pod"]), int(item["crashes"]), True)
                )
    return found


def entry_key(item: Mapping[str, object]) -> str:
    """What names one entry of the annotation across rewrites: its files' digest, or its pod."""
    if item.get("cause") == NAMESPACE:
        return f"namespace:{item.get('model', '')}"
    return str(item.get("digest") or "") or f"pod:{item.get('pod', '')}"


def shown_since(value: str) -> dict[str, str]:
    """When each entry of a `quarantined` annotation was first shown (`entry_key` -> RFC 3339)."""
    try:
        shown = json.loads(value) if value else []
    except ValueError:
        return {}
    return {
        entry_key(item): str(item["since"])
        for item in (shown if isinstance(shown, list) else [])
        if isinstance(item, dict) and item.get("since")
    }


def annotation(
    records: Iterable[CrashRecord],
    callers: Iterable[CallerRecord] = (),
    namespaces: Iterable[NamespaceRecord] = (),
    *,
    since: Mapping[str, str] | None = None,
    now: str = "",
    wanting: Callable[[str], list[str]] | None = None,
) -> str:
    """The `quarantined` Node annotation for `records`, `callers` and `namespaces` ("" when none
    is quarantined). With `now`, each entry says `since` when (kept from `since`, else `now`);
    with `wanting`, a files entry lists the node's pods that still want those files
    (`wanted_by`), which `tritonshare quarantine clear` refuses to clear under."""
    shown: list[dict[str, object]] = [
        {
            "model": f"{r.namespace}/{r.model_id}",
            "pod": r.pod,
            "digest": r.digest,
            "crashes": r.crashes,
        }
        for r in records
        if r.quarantined
    ]
    shown += [
        {
            "model": f"{c.namespace}/{c.model_id}",
            "pod": c.pod,
            "uid": c.uid,
            "digest": "",
            "crashes": c.crashes,
            "cause": REQUESTS,
        }
        for c in callers
        if c.quarantined
    ]
    shown += [
        {
            "model": f"{n.namespace}/*",
            "pod": n.pod,
            "digest": "",
            "crashes": n.crashes,
            "cause": NAMESPACE,
        }
        for n in namespaces
        if n.quarantined
    ]
    for item in shown:
        if now:
            item["since"] = (since or {}).get(entry_key(item), now)
        pods = wanting(str(item["digest"])) if wanting is not None and item["digest"] else []
        if pods:
            item["wanted_by"] = sorted(pods)
    return json.dumps(shown, sort_keys=True, separators=(",", ":")) if shown else ""


class NodeQuarantine:
    """Keeps the Node's `quarantined` annotation in step with the ledger and carries out the
    operator's `quarantine-clear` annotation. Reads the Node once per `period` seconds, and only
    while something is quarantined or shown as such: a node without quarantines costs no read."""

    def __init__(
        self,
        ledger: CrashLedger,
        kube: NodeAnnotations,
        node_name: str,
        keys: Keys,
        on_cleared: Callable[[list[CrashRecord]], None],
        *,
        period: float,
        on_callers_cleared: Callable[[list[CallerRecord]], None],
        wanting: Callable[[str], list[str]],
        wall: Callable[[], float] = time.time,
    ) -> None:
        """`wanting(digest)`: the pods of the node that still want those files (shown)."""
        self._ledger = ledger
        self._wanting = wanting
        self._wall = wall
        self._kube = kube
        self._node = node_name
        self._keys = keys
        self._on_cleared = on_cleared
        self._on_callers_cleared = on_callers_cleared
        self.period = period
        self._shown: str | None = None
        """The annotation as last read or written (None: not read since start)."""

    async def sync(self) -> None:
        """Read the Node once; lift what the operator asked to clear, show what remains."""
        node = await self._kube.get_node(self._node)
        if node is None:
            return
        current = dict((node.get("metadata") or {}).get("annotations") or {})
        if self._shown is None:
            # A new node pod starts with an empty state directory: the Node kept its quarantines.
            shown_before = str(current.get(self._keys.quarantined) or "")
            for record in self._ledger.restore(*from_annotation(shown_before)):
                log.warning(
                    "%s stays quarantined on this node, as its Node says.", _described(record)
                )
            for held in self._ledger.restore_namespaces(namespaces_from_annotation(shown_before)):
                log.warning(
                    "Namespace %s's new loads stay quarantined on this node, as its Node says.",
                    held.namespace,
                )
        patch: dict[str, str | None] = {}
        expired = self._ledger.expire()
        for lapsed in expired:
            log.warning(
                "The quarantine of %s lapses after --crash-quarantine-expiry-seconds: it may be "
                "loaded on this node again, and one more crash quarantines it again.",
                _described(lapsed),
            )
        if expired:
            self._on_cleared(expired)
        asked = str(current.get(self._keys.quarantine_clear) or "")
        if asked:
            cleared = self._ledger.clear(asked.split(","))
            callers = self._ledger.clear_callers(asked.split(","))
            namespaces = self._ledger.clear_namespaces(asked.split(","))
            for held in namespaces:
                log.warning(
                    "The quarantine of namespace %s's new loads is cleared as the operator "
                    "asked: its models may be loaded on this node again.",
                    held.namespace,
                )
            lifted: list[CrashRecord | CallerRecord] = [*cleared, *callers]
            for gone in lifted:
                log.warning(
                    "The quarantine of %s is cleared as the operator asked: %s.",
                    _described(gone),
                    "its requests are served again"
                    if isinstance(gone, CallerRecord)
                    else "it may be loaded on this node again",
                )
            if not cleared and not callers and not namespaces:
                log.warning(
                    "The node's %s annotation (%r) names no quarantined model: nothing cleared.",
                    self._keys.quarantine_clear,
                    asked,
                )
            if cleared:
                self._on_cleared(cleared)
            if callers:
                self._on_callers_cleared(callers)
            patch[self._keys.quarantine_clear] = None
        shown = str(current.get(self._keys.quarantined) or "")
        wanted = annotation(
            self._ledger.records(),
            self._ledger.callers(),
            self._ledger.namespaces(),
            since=shown_since(shown),
            now=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._wall())),
            wanting=self._wanting,
        )
        if wanted != shown:
            patch[self._keys.quarantined] = wanted or None
        if patch:
            await self._kube.patch_node_annotations(self._node, patch)
        self._shown = wanted

    async def run(self, stop: asyncio.Event) -> None:
        """Sync once at start, then each period while anything is quarantined or shown."""
        while not stop.is_set():
            if (
                self._shown is None
                or self._shown
                or annotation(
                    self._ledger.records(), self._ledger.callers(), self._ledger.namespaces()
                )
            ):
                try:
                    await self.sync()
                except AgentError as e:
                    log.warning(
                        "Reading the node's quarantine annotations has failed (%s): trying "
                        "again in %g s.",
                        e,
                        self.period,
                    )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.period)


def _described(record: CrashRecord | CallerRecord) -> str:
    if isinstance(record, CallerRecord):
        return f"Pod {record.pod} (its requests to model {record.model_id})"
    return f"Model {record.namespace}/{record.model_id} (files {record.digest[:12]})"
