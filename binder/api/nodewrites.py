"""The binder's Node writes over a common.kubeapi.session.Session: annotations (the node autoscaling
pass's scale-down guards) and merge patches of a Node or its status (`tritonshare
uninstall-cleanup`, the CLI's quarantine commands). The binder's scheduling never writes a Node.
"""

from __future__ import annotations

from collections.abc import Mapping

from common.kubeapi.paths import node_path
from common.kubeapi.session import MERGE_PATCH, READ_TIMEOUT_SECONDS, JsonObject, Session


class NodeWrites:
    """Node writes over one session."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def patch_node_annotations(self, name: str, annotations: Mapping[str, str | None]) -> None:
        """Set (None: remove) annotations of a Node, by a JSON merge patch; retried."""
        path = node_path(name)
        body = {"metadata": {"annotations": dict(annotations)}}
        self._session.write(f"annotating node {name}", "PATCH", path, body, MERGE_PATCH)

    def merge_patch_node(self, name: str, body: JsonObject, subresource: str = "") -> None:
        """A JSON merge patch (RFC 7386: `null` removes a key) of a Node or its `status`; one
        attempt."""
        path = node_path(name, subresource)
        self._session.request("PATCH", path, READ_TIMEOUT_SECONDS, body, MERGE_PATCH)
