"""The pod binding subresource: how a scheduler assigns a pod to a node, once.

`POST pods/{name}/binding` (or the legacy `bindings` collection) sets `spec.nodeName`, copies the
Binding's annotations onto the pod and sets `PodScheduled=True`, as kube-apiserver's BindingREST
does; a pod already on a node, being deleted, gated (`spec.schedulingGates`), or with another
uid or resourceVersion than the Binding names gets 409 Conflict. The answer
(a Status) is the caller's job. No I/O.
"""

from __future__ import annotations

from typing import Any

from sim.apiserver.clock import Clock, rfc3339
from sim.apiserver.errors import bad_request, conflict, invalid, not_found
from sim.apiserver.resources import PODS
from sim.apiserver.store import Store, Stored


def _get_pod(store: Store, namespace: str, name: str) -> Stored:
    pod = store.get(PODS, namespace, name)
    if pod is None:
        raise not_found(PODS.group_resource, name)
    return pod


def bind(store: Store, clock: Clock, namespace: str, name: str, body: Any) -> Stored:
    """pods/binding: assign the pod to target.name, once."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a Binding object")
    meta = body.get("metadata") or {}
    target = body.get("target") or {}
    if not isinstance(meta, dict) or not isinstance(target, dict):
        raise bad_request(
            'Binding in version "v1" cannot be handled as a Binding: metadata and target must be'
            " objects"
        )
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, dict) or not all(
        isinstance(v, str) for v in annotations.values()
    ):
        raise bad_request("Binding metadata.annotations must be an object of strings")
    if not isinstance(target.get("name") or "", str) or not isinstance(meta.get("name") or "", str):
        raise bad_request("Binding metadata.name and target.name must be strings")
    bound_name = meta.get("name") or name
    if bound_name != name:
        raise bad_request("name in URL does not match name in Binding object")
    if meta.get("namespace") and meta["namespace"] != namespace:
        raise bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    causes = []
    if not target.get("name"):
        causes.append(("target.name", "Required value"))
    if target.get("kind") not in (None, "", "Node"):
        causes.append(
            ("target.kind", f'Unsupported value: "{target["kind"]}": supported values: "Node"')
        )
    if causes:
        raise invalid("Binding", "", name, causes)
    current = _get_pod(store, namespace, name)
    pod_meta = current.obj["metadata"]
    binding_resource = "pods/binding"
    if meta.get("uid") and meta["uid"] != pod_meta.get("uid"):
        raise conflict(
            binding_resource,
            name,
            f"Precondition failed: UID in precondition: {meta['uid']}, UID in object meta:"
            f" {pod_meta.get('uid')}",
        )
    if meta.get("resourceVersion") and str(meta["resourceVersion"]) != str(current.rv):
        raise conflict(
            binding_resource,
            name,
            "Precondition failed: ResourceVersion in precondition:"
            f" {meta['resourceVersion']}, ResourceVersion in object meta: {current.rv}",
        )
    if pod_meta.get("deletionTimestamp"):
        raise conflict(
            binding_resource, name, f"pod {name} is being deleted, cannot be assigned to a host"
        )
    node = current.obj.get("spec", {}).get("nodeName")
    if node:
        raise conflict(binding_resource, name, f'pod {name} is already assigned to node "{node}"')
    if current.obj.get("spec", {}).get("schedulingGates"):
        raise conflict(binding_resource, name, f"pod {name} has non-empty .spec.schedulingGates")
    obj = current.copy()
    obj["spec"]["nodeName"] = target["name"]
    if annotations:
        obj["metadata"].setdefault("annotations", {}).update(annotations)
    status = obj.setdefault("status", {})
    conditions = status.setdefault("conditions", [])
    now = rfc3339(clock.now())
    for condition in conditions:
        if condition.get("type") == "PodScheduled":
            if condition.get("status") != "True":
                condition["lastTransitionTime"] = now
            condition["status"] = "True"
            condition.pop("reason", None)
            condition.pop("message", None)
            break
    else:
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "True",
                "lastProbeTime": None,
                "lastTransitionTime": now,
            }
        )
    return store.replace(PODS, obj)
