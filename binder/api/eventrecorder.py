"""The binder's one Event recorder: core/v1 Events about pods and any other object, as
kube-scheduler records them, over a binder.api.session.Session.

common/events.py builds each Event and decides, by kube's one de-duplication rule, whether to
create it or raise the count of the one already there; this only sends what it says.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Unpack
from urllib.parse import quote

from binder.api.session import MERGE_PATCH, Session
from binder.errors import ConflictError, NotFoundError
from common.events import EventAggregator, EventText, EventWrite, event, pod_ref


class EventRecorder:
    """Records Events over one session, every one through its aggregator."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self.events = EventAggregator()
        """Every Event the binder records goes through it (one rule: common/events.py)."""

    def record_event(
        self,
        namespace: str,
        name: str,
        uid: str,
        *,
        reporting_instance: str,
        component: str = "tritonshare",
        **said: Unpack[EventText],
    ) -> None:
        """A core/v1 Event about a pod, as kube-scheduler records one."""
        self.record_object_event(
            pod_ref(namespace, name, uid),
            reporting_instance=reporting_instance,
            component=component,
            **said,
        )

    def record_object_event(
        self,
        involved: Mapping[str, str],
        *,
        reporting_instance: str,
        component: str = "tritonshare",
        **said: Unpack[EventText],
    ) -> None:
        """An Event about any object (`involved`: apiVersion, kind, namespace, name, uid), as
        kube-scheduler records one; created, or its count raised, as the aggregator says
        (common/events.py)."""
        body = event(
            involved,
            component=component,
            instance=reporting_instance,
            action="Scheduling",
            **said,
        )
        what = (
            f"recording a {said['reason']} event for {involved['kind']} "
            f"{involved['namespace']}/{involved['name']}"
        )
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
        events = f"/api/v1/namespaces/{quote(write.namespace, safe='')}/events"
        if write.create:
            # 409: a retry after a lost answer finds the Event it named already there.
            with contextlib.suppress(ConflictError):
                self._session.write(what, "POST", events, write.body)
            return
        path = f"{events}/{quote(write.name, safe='')}"
        self._session.write(what, "PATCH", path, write.body, MERGE_PATCH)
