"""The one Event recorder: core/v1 Events about pods, Nodes and any other object, over the one
API session (common.kubeapi.session), for the agent and the binder alike.

common/events.py builds each Event and decides, by kube's one de-duplication rule, whether to
create it or raise the count of the one already there; this only sends what it says. A recorder
that retries (the binder's) rides out an unavailable API server as the session's writes do; one
that does not (the agent's) tries each write once and leaves the next repeat to record it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Unpack
from urllib.parse import quote

from common.events import EventAggregator, EventText, EventWrite, event, pod_ref
from common.kubeapi.errors import ConflictError, NotFoundError
from common.kubeapi.paths import namespace_path
from common.kubeapi.session import JSON, MERGE_PATCH, JsonObject, Session


class EventRecorder:
    """Records Events over one session, every one through its aggregator."""

    def __init__(self, session: Session, *, action: str, retry: bool = True) -> None:
        """`action`: the Events' `action` unless a call names another (the binder: Scheduling);
        `retry`: whether each write rides out an unavailable API server (`Session.write`)."""
        self._session = session
        self._action = action
        self._retry = retry
        self.events = EventAggregator()
        """Every Event recorded goes through it (one rule: common/events.py)."""

    def record_event(
        self,
        namespace: str,
        name: str,
        uid: str,
        *,
        reporting_instance: str,
        component: str = "tritonshare",
        action: str = "",
        **said: Unpack[EventText],
    ) -> None:
        """A core/v1 Event about a pod, as kube-scheduler and the kubelet record one."""
        self.record_object_event(
            pod_ref(namespace, name, uid),
            reporting_instance=reporting_instance,
            component=component,
            action=action,
            **said,
        )

    def record_object_event(
        self,
        involved: Mapping[str, str],
        *,
        reporting_instance: str,
        component: str = "tritonshare",
        action: str = "",
        **said: Unpack[EventText],
    ) -> None:
        """An Event about any object (`involved`: apiVersion, kind, name, and namespace and uid
        where it has them); created, or its count raised, as the aggregator says. NotFoundError
        when its namespace is gone; any other ApiError as the session raises it."""
        body = event(
            involved,
            component=component,
            instance=reporting_instance,
            action=action or self._action,
            **said,
        )
        key = "/".join(filter(None, (involved.get("namespace"), involved["name"])))
        what = f"recording a {said['reason']} event for {involved['kind']} {key}"
        write: EventWrite | None = self.events.write_for(body)
        while write is not None:
            try:
                self._send(what, write)
            except NotFoundError:
                # Expired or deleted: a repeat records it again; a new one is refused.
                if write.create:
                    self.events.lost(write)
                    raise
                write = self.events.answered(write, found=False)
                continue
            except Exception:
                self.events.failed(write)
                raise
            write = self.events.answered(write, found=True)

    def _send(self, what: str, write: EventWrite) -> None:
        events = f"{namespace_path(write.namespace)}/events"
        if write.create:
            # 409: a retry after a lost answer finds the Event it named already there.
            with contextlib.suppress(ConflictError):
                self._write(what, "POST", events, write.body, JSON)
            return
        path = f"{events}/{quote(write.name, safe='')}"
        self._write(what, "PATCH", path, write.body, MERGE_PATCH)

    def _write(self, what: str, method: str, path: str, body: JsonObject, kind: str) -> None:
        if self._retry:
            self._session.write(what, method, path, body, kind)
        else:
            self._session.request(method, path, body=body, content_type=kind)
