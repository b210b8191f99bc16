"""What the binder writes to pods, over a common.kubeapi.session.Session: the placement annotations
and the Binding, an eviction, the PodScheduled condition and the nomination, a failed or deleted
pod, and the few pod reads its passes and the CLI need.

A Binding whose answer was lost (no answer, or a 5xx from a server that may have committed it) is
checked against the pod before it is sent again, and, if the retry budget runs out still unsure,
before the pod's next annotation patch: a new placement never rewrites the GPU of a running pod.
Owns no scheduling logic.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from common.conditions import Condition, condition_patch
from common.kubeapi.errors import ConflictError, NotFoundError, UnavailableError
from common.kubeapi.paths import namespace_path, pod_path
from common.kubeapi.session import (
    MERGE_PATCH,
    READ_TIMEOUT_SECONDS,
    STRATEGIC_MERGE_PATCH,
    JsonObject,
    Session,
)


class PodWrites:
    """Pod calls over one session; remembers the pods whose Binding may have landed unseen."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._lock = threading.Lock()
        self._unsure: set[tuple[str, str]] = set()
        """Pods whose Binding may have landed although its answer was lost."""

    def patch_pod_annotations(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """One merge patch of the pod's annotations (the binder's placement: GPU and proof).

        If an earlier Binding of this pod may have landed unseen, the pod is read first: a bound
        pod is a ConflictError, so a new placement never rewrites the GPU of a running one."""
        body = {"metadata": {"annotations": annotations}}
        key = (namespace, name)

        def attempt(timeout: float) -> bytes:
            if key in self._unsure:
                where = self._bound_node(namespace, name, timeout)
                if where:
                    raise ConflictError(
                        409, "AlreadyBound", f"pod {namespace}/{name} is on {where}"
                    )
                with self._lock:
                    self._unsure.discard(key)
            return self._session.request(
                "PATCH", pod_path(namespace, name), timeout, body, STRATEGIC_MERGE_PATCH
            )

        self._session.retrying(f"patching the annotations of pod {namespace}/{name}", attempt)

    def _bound_node(self, namespace: str, name: str, timeout: float) -> str:
        """The node the pod is bound to now ("" for none); one attempt."""
        data = self._session.request("GET", pod_path(namespace, name), timeout)
        return str((json.loads(data).get("spec") or {}).get("nodeName") or "")

    def bind(
        self,
        namespace: str,
        name: str,
        uid: str,
        node: str,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """POST pods/{name}/binding, as kube-scheduler does, with `annotations`, which the API
        server sets on the pod as it binds it (kube-apiserver's BindingREST): one write, and a
        pod bound already is refused (409) whole, its annotations untouched. Raw answers: the
        client's V1Binding model fails to read the Status the server answers with
        (kubernetes-client/python #547, #825).

        After an attempt whose answer was lost (no answer, or a 5xx from a server that may have
        committed it), the pod is read before the next attempt: already on `node` is success,
        on another node a ConflictError. If the budget runs out still unsure, the pod is
        remembered so its next annotation patch (a nomination's) checks first."""
        metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid}
        if annotations:
            metadata["annotations"] = dict(annotations)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        unsure = False

        def attempt(timeout: float) -> bytes:
            nonlocal unsure
            if unsure:
                where = self._bound_node(namespace, name, timeout)
                if where == node:
                    return b""
                if where:
                    raise ConflictError(
                        409, "AlreadyBound", f"pod {namespace}/{name} is on {where}"
                    )
                unsure = False
            try:
                return self._session.request(
                    "POST", pod_path(namespace, name, "binding"), timeout, body
                )
            except UnavailableError as e:
                unsure = e.status != 429  # a 429 is refused before anything is done
                raise

        try:
            self._session.retrying(f"binding pod {namespace}/{name} to {node}", attempt)
        except UnavailableError:
            if unsure:
                with self._lock:
                    self._unsure.add((namespace, name))
            raise
        except NotFoundError:
            with self._lock:
                self._unsure.discard((namespace, name))
            raise

    def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        """POST the pod's eviction subresource (policy/v1), once, for that uid only: the API
        server applies the pod's PodDisruptionBudget and answers 429 when it forbids the
        eviction (an UnavailableError with status 429), which the caller takes as a verdict,
        not as a reason to retry."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}},
        }
        self._session.request(
            "POST", pod_path(namespace, name, "eviction"), READ_TIMEOUT_SECONDS, body
        )

    def set_unschedulable(
        self,
        namespace: str,
        name: str,
        message: str,
        reason: str = "Unschedulable",
        *,
        was: str | None = None,
    ) -> None:
        """PodScheduled=False with `reason` (Unschedulable, or SchedulerError when a plugin
        failed the attempt), as kube-scheduler writes it; `was`: its status as this replica last
        wrote it (None: not known), which keeps its lastTransitionTime while it stays False."""
        condition = condition_patch(Condition("PodScheduled", "False", reason, message), was)
        body = {"status": {"conditions": [{**condition, "lastProbeTime": None}]}}
        self._patch_status(namespace, name, "setting PodScheduled=False on", body)

    def set_nominated_node(self, namespace: str, name: str, node: str) -> None:
        """status.nominatedNodeName: where a preemption made room for the pod."""
        body = {"status": {"nominatedNodeName": node}}
        self._patch_status(namespace, name, f"nominating node {node} for", body)

    def set_pod_condition(self, namespace: str, name: str, condition: JsonObject) -> None:
        """One condition on the pod's status, merged by type (the others untouched)."""
        body = {"status": {"conditions": [condition]}}
        self._patch_status(namespace, name, f"setting {condition.get('type')} on", body)

    def fail_pod(
        self, namespace: str, name: str, reason: str, message: str, condition: JsonObject
    ) -> None:
        """Mark the pod Failed with a reason and one condition (merged by type), as the pod
        garbage collector marks a pod whose node is gone; its kubelet then stops it."""
        body = {
            "status": {
                "phase": "Failed",
                "reason": reason,
                "message": message[:1024],
                "conditions": [condition],
            }
        }
        self._patch_status(namespace, name, "failing", body)

    def _patch_status(self, namespace: str, name: str, doing: str, body: JsonObject) -> None:
        """A strategic merge patch of the pod's status; `doing` names it in the logs."""
        path = pod_path(namespace, name, "status")
        what = f"{doing} pod {namespace}/{name}"
        self._session.write(what, "PATCH", path, body, STRATEGIC_MERGE_PATCH)

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete the pod with this uid (a pod recreated under the name meanwhile is kept)."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}}
        self._session.write(
            f"deleting pod {namespace}/{name}", "DELETE", pod_path(namespace, name), body
        )

    def create_pod(self, namespace: str, body: JsonObject) -> None:
        path = f"{namespace_path(namespace)}/pods"
        self._session.write(
            f"creating pod {namespace}/{body['metadata']['name']}", "POST", path, body
        )

    def merge_patch_pod(self, namespace: str, name: str, body: JsonObject) -> None:
        """A JSON merge patch of a pod (`null` removes a key)."""
        self._session.write(
            f"patching pod {namespace}/{name}",
            "PATCH",
            pod_path(namespace, name),
            body,
            MERGE_PATCH,
        )

    def pods_on_node(self, node: str) -> list[JsonObject]:
        """Every pod bound to `node` (one attempt)."""
        path = f"/api/v1/pods?fieldSelector={quote('spec.nodeName=' + node, safe='=')}"
        items: list[JsonObject] = (
            json.loads(self._session.request("GET", path, READ_TIMEOUT_SECONDS)).get("items") or []
        )
        return items

    def read_pod(self, namespace: str, name: str) -> JsonObject:
        return self._session.read(pod_path(namespace, name))

    def dry_run_create_pod(self, namespace: str, body: JsonObject) -> JsonObject:
        """Create the pod with `dryRun=All`: the API server defaults, validates and admits it
        (webhooks, Pod Security, ValidatingAdmissionPolicies, quotas) and stores nothing. The pod
        it would have stored, or the ApiError that refuses it; one attempt."""
        path = f"{namespace_path(namespace)}/pods?dryRun=All"
        result: JsonObject = json.loads(
            self._session.request("POST", path, READ_TIMEOUT_SECONDS, body)
        )
        return result
