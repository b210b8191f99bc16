"""What each verb does to stored objects: the registry strategies of the real API server.

create (defaults, generateName, uid, creationTimestamp, validation, 409 AlreadyExists), update
(resourceVersion precondition, 409 Conflict, status subresource split, pod spec immutability and
ephemeral containers added only through their subresource,
create-on-update for leases and events), patch (the three kinds, then the update rules) and delete
(pod graceful deletion, finalizers, preconditions, namespace cascade). Binding lives in `binding`.
Each write a client makes passes its `Admit` (validating admission) once the object is valid and
before it is stored. Raises `ApiError`; does no I/O.
"""

from __future__ import annotations

import json
import secrets
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from sim.apiserver import (
    customresources,
    fieldvalidation,
    priority,
    services,
    validation,
    workloads,
)
from sim.apiserver import patch as patches
from sim.apiserver.clock import Clock, rfc3339
from sim.apiserver.errors import (
    STALE_OBJECT,
    ApiError,
    already_exists,
    bad_request,
    conflict,
    internal,
    invalid,
    not_found,
    unprocessable,
    unsupported_media_type,
)
from sim.apiserver.resources import (
    CUSTOM_RESOURCE_DEFINITIONS,
    DEPLOYMENTS,
    LEASES,
    NAMESPACES,
    NODES,
    POD_DISRUPTION_BUDGETS,
    PODS,
    PRIORITY_CLASSES,
    REPLICA_SETS,
    RESOURCE_QUOTAS,
    SERVICES,
    VALIDATING_ADMISSION_POLICIES,
    Catalog,
    Resource,
)
from sim.apiserver.store import Store, Stored

JsonObject = dict[str, Any]

_NAME_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
DEFAULT_GRACE_SECONDS = 30
DEFAULT_TOLERATION_SECONDS = (300, 300)
"""kube-apiserver's --default-not-ready-toleration-seconds and
--default-unreachable-toleration-seconds."""
PROTECTED_NAMESPACES = frozenset({"default", "kube-system", "kube-public"})


class Admit(Protocol):
    """Validating admission of one write (`object` None for a delete, `old` None for a create);
    raises ApiError to refuse it."""

    def __call__(
        self,
        operation: str,
        resource: Resource,
        subresource: str,
        namespace: str,
        name: str,
        obj: JsonObject | None,
        old: JsonObject | None,
    ) -> None: ...


def admit_all(
    operation: str,
    resource: Resource,
    subresource: str,
    namespace: str,
    name: str,
    obj: JsonObject | None,
    old: JsonObject | None,
) -> None:
    """No validating admission: the server's own writes."""


@dataclass(frozen=True)
class DeleteOptions:
    grace_period_seconds: int | None = None
    uid: str | None = None
    resource_version: str | None = None


@dataclass(frozen=True)
class DeleteResult:
    stored: Stored
    removed: bool
    """False when the object stays (graceful pod deletion, finalizers)."""


def _default_tolerations(spec: JsonObject, seconds: tuple[int, int]) -> None:
    """The DefaultTolerationSeconds admission plugin: a pod tolerating no NoExecute taint of
    `node.kubernetes.io/not-ready` (or `unreachable`) gets one for `seconds`."""
    tolerations = spec.get("tolerations")
    if tolerations is None:
        tolerations = []
    if not isinstance(tolerations, list):
        return  # validation refuses it
    for key, after in zip(
        ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"), seconds, strict=True
    ):
        if not any(
            isinstance(t, dict)
            and t.get("key") == key
            and t.get("effect") in (None, "", "NoExecute")
            for t in tolerations
        ):
            tolerations.append(
                {
                    "key": key,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": after,
                }
            )
    spec["tolerations"] = tolerations


def _kind_group(resource: Resource) -> tuple[str, str]:
    return resource.kind, resource.group


def _meta(obj: JsonObject) -> JsonObject:
    meta = obj.get("metadata")
    if meta is None:
        meta = obj["metadata"] = {}
    if not isinstance(meta, dict):
        raise bad_request("metadata must be an object")
    return meta


class Registry:
    """The verbs over a `Store`, with upstream's rules per kind."""

    def __init__(self, store: Store, clock: Clock, catalog: Catalog | None = None) -> None:
        self.store = store
        self.clock = clock
        self.catalog = catalog or Catalog()
        self._terminating: dict[tuple[str, str], tuple[str, float]] = {}
        """Pods deleted gracefully: (namespace, name) -> (uid, when their grace period ends)."""
        self.default_toleration_seconds = DEFAULT_TOLERATION_SECONDS
        """The DefaultTolerationSeconds admission plugin's tolerationSeconds of the not-ready and
        unreachable NoExecute taints, added to a pod that tolerates neither already."""

    # helpers

    def _check_body(self, resource: Resource, body: Any) -> JsonObject:
        if not isinstance(body, dict):
            raise bad_request(f"the request body must be a JSON object ({resource.kind})")
        kind = body.get("kind")
        if kind not in (None, "", resource.kind):
            raise bad_request(
                f"the kind of the body ({kind}) does not match the resource ({resource.kind})"
            )
        api_version = body.get("apiVersion")
        if api_version not in (None, "", resource.api_version):
            raise bad_request(
                f"the apiVersion of the body ({api_version}) does not match the resource"
                f" ({resource.api_version})"
            )
        body["kind"] = resource.kind
        body["apiVersion"] = resource.api_version
        fieldvalidation.prune_metadata(body)
        # A custom object's fields are its schema's to check (`_validate`).
        problem = None if resource.custom else validation.decoding_error(resource, body)
        if problem is not None:
            raise bad_request(problem)
        _meta(body)
        for part in ("spec", "status"):
            if part in body and body[part] is None:
                del body[part]
        return body

    def _check_namespace(self, resource: Resource, namespace: str, obj: JsonObject) -> None:
        meta = _meta(obj)
        if not resource.namespaced:
            meta.pop("namespace", None)
            return
        given = meta.get("namespace")
        if given and given != namespace:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the"
                " request"
            )
        meta["namespace"] = namespace
        if self.store.get(NAMESPACES, "", namespace) is None:
            raise not_found(NAMESPACES.group_resource, namespace)

    def _validate(self, resource: Resource, obj: JsonObject, causes: list[tuple[str, str]]) -> None:
        causes = causes + validation.kind_causes(resource, obj)
        if resource.custom is not None:
            causes += customresources.object_causes(resource, obj)
        elif resource is CUSTOM_RESOURCE_DEFINITIONS:
            causes += customresources.crd_causes(obj)
        if causes:
            kind, group = _kind_group(resource)
            name = str(obj["metadata"].get("name", ""))
            # Upstream names a kind of a group by its group too (built-in kinds kept as they are).
            qualified = bool(resource.custom) or resource is CUSTOM_RESOURCE_DEFINITIONS
            raise invalid(kind, group, name, causes, qualified=qualified)

    def get(self, resource: Resource, namespace: str, name: str) -> Stored:
        stored = self.store.get(resource, namespace, name)
        if stored is None:
            raise not_found(resource.group_resource, name)
        return stored

    # create

    def create(
        self, resource: Resource, namespace: str, body: Any, admit: Admit = admit_all
    ) -> Stored:
        """Create without admission webhooks (the server's own objects, and create on update)."""
        obj, causes = self.prepare_create(resource, namespace, body)
        return self.commit_create(resource, obj, causes, admit)

    def prepare_create(
        self, resource: Resource, namespace: str, body: Any
    ) -> tuple[JsonObject, list[tuple[str, str]]]:
        """The object to create, decoded and defaulted, and the name problems found so far:
        what mutating admission sees. `commit_create` validates and stores it."""
        obj = self._check_body(resource, body)
        self._check_namespace(resource, namespace, obj)
        meta = obj["metadata"]
        if meta.get("resourceVersion"):
            raise internal("resourceVersion should not be set on objects to be created")
        causes: list[tuple[str, str]] = []
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if prefix:
                meta["name"] = prefix[:58] + "".join(
                    secrets.choice(_NAME_SUFFIX_ALPHABET) for _ in range(5)
                )
            else:
                causes.append(("metadata.name", "Required value: name or generateName is required"))
        name = str(meta.get("name", ""))
        if name:
            causes += validation.name_causes(resource, name)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = rfc3339(self.clock.now())
        for key in ("deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
            meta.pop(key, None)
        if resource is PODS:
            if isinstance(obj.get("spec"), dict) and obj["spec"].get("ephemeralContainers"):
                causes.append(("spec.ephemeralContainers", "Forbidden: cannot be set on create"))
            priority.admit_pod(self.store, obj)  # the Priority plugin runs before webhooks
        self._defaults(resource, obj)
        if resource is DEPLOYMENTS or resource is REPLICA_SETS:
            workloads.prepare_create(resource, obj)
        elif resource.custom is not None:
            meta["generation"] = 1
            if resource.status_subresource:
                obj.pop("status", None)  # as upstream: the status is written through /status
        elif resource is CUSTOM_RESOURCE_DEFINITIONS:
            meta["generation"] = 1
            obj["status"] = customresources.crd_status(obj, rfc3339(self.clock.now()))
        elif resource is RESOURCE_QUOTAS:
            obj.pop("status", None)  # as upstream: the quota controller writes it
        return obj, causes

    def commit_create(
        self,
        resource: Resource,
        obj: JsonObject,
        causes: list[tuple[str, str]],
        admit: Admit = admit_all,
        dry_run: bool = False,
    ) -> Stored:
        """Default again (a webhook may have added fields), validate, admit, store; a dry run
        (`?dryRun=All`) does all but store, and answers with the object it would have stored."""
        self._defaults(resource, obj)
        meta = obj["metadata"]
        name = str(meta.get("name", ""))
        self._validate(resource, obj, causes)
        if resource is PRIORITY_CLASSES:
            priority.validate_class(self.store, obj, None)
        admit("CREATE", resource, "", str(meta.get("namespace", "")), name, obj, None)
        if self.store.get(resource, meta.get("namespace", ""), name) is not None:
            raise already_exists(resource.group_resource, name)
        if dry_run:
            return Stored(obj, 0)
        return self.store.insert(resource, obj)

    def _defaults(self, resource: Resource, obj: JsonObject) -> None:
        if resource.custom is not None:
            customresources.prepare(resource, obj)
        elif resource is CUSTOM_RESOURCE_DEFINITIONS:
            customresources.crd_defaults(obj)
        elif resource is PODS:
            spec = obj.setdefault("spec", {})
            if isinstance(spec, dict):
                spec.setdefault("schedulerName", "default-scheduler")
                spec.setdefault("restartPolicy", "Always")
                spec.setdefault("dnsPolicy", "ClusterFirst")
                spec.setdefault("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS)
                spec.setdefault("serviceAccountName", "default")
                spec.setdefault("serviceAccount", spec["serviceAccountName"])
                spec.setdefault("securityContext", {})
                spec.setdefault("priority", 0)
                spec.setdefault("enableServiceLinks", True)
                spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
                _default_tolerations(spec, self.default_toleration_seconds)
            obj["status"] = {"phase": "Pending", "qosClass": _qos_class(obj)}
        elif resource is NODES:
            obj.setdefault("spec", {})
            obj.setdefault("status", {})
        elif resource is LEASES:
            obj.setdefault("spec", {})
        elif resource is VALIDATING_ADMISSION_POLICIES:
            spec = obj.get("spec")
            if isinstance(spec, dict):
                spec.setdefault("failurePolicy", "Fail")
        elif resource is POD_DISRUPTION_BUDGETS:
            # As upstream's strategy: a new budget starts at generation 1 with an empty status,
            # which the disruption controller then fills in.
            obj.setdefault("spec", {})
            obj["metadata"]["generation"] = 1
            obj["status"] = {
                "disruptionsAllowed": 0,
                "currentHealthy": 0,
                "desiredHealthy": 0,
                "expectedPods": 0,
            }
        elif resource is DEPLOYMENTS or resource is REPLICA_SETS:
            workloads.apply_defaults(resource, obj)
        elif resource is SERVICES:
            services.apply_defaults(self.store, obj)
        elif resource is NAMESPACES:
            obj["spec"] = {"finalizers": ["kubernetes"]}
            obj["status"] = {"phase": "Active"}
            labels = obj["metadata"].setdefault("labels", {})
            if isinstance(labels, dict):
                labels["kubernetes.io/metadata.name"] = obj["metadata"].get("name", "")

    # update and patch

    def update(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        body: Any,
        subresource: str = "",
        admit: Admit = admit_all,
    ) -> tuple[Stored, bool]:
        """PUT; returns the stored object and whether it was created."""
        obj = self._check_body(resource, body)
        meta = obj["metadata"]
        if meta.get("name") and meta["name"] != name:
            raise bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL"
                f" ({name})"
            )
        meta["name"] = name
        self._check_namespace(resource, namespace, obj)
        current = self.store.get(resource, namespace, name)
        if current is None:
            if resource.allow_create_on_update and not subresource:
                meta.pop("resourceVersion", None)
                return self.create(resource, namespace, obj, admit), True
            raise not_found(resource.group_resource, name)
        given_rv = meta.get("resourceVersion")
        if not given_rv and not resource.allow_unconditional_update:
            kind, group = _kind_group(resource)
            raise invalid(
                kind,
                group,
                name,
                [
                    (
                        "metadata.resourceVersion",
                        "Invalid value: 0x0: must be specified for an update",
                    )
                ],
            )
        return self._commit_update(resource, current, obj, subresource, admit), False

    def patch(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        content_type: str,
        raw: bytes,
        subresource: str = "",
        admit: Admit = admit_all,
        fields: fieldvalidation.FieldValidation | None = None,
    ) -> Stored:
        """PATCH; `fields` checks the patched object's fields (the request's fieldValidation)."""
        current = self.get(resource, namespace, name)
        media = content_type.split(";")[0].strip().lower()
        if resource.custom is not None and media == patches.STRATEGIC_MERGE_PATCH:
            # As upstream: a custom object has no patch strategy to merge by.
            raise unsupported_media_type(
                content_type, [patches.JSON_PATCH, patches.MERGE_PATCH, patches.APPLY_PATCH]
            )
        result = apply_patch(current.copy(), content_type, raw)
        if fields is not None:
            fields.check_patched(resource, content_type, raw, result)
        obj = self._check_body(resource, result)
        meta = obj["metadata"]
        if meta.get("name") != name or (resource.namespaced and meta.get("namespace") != namespace):
            raise bad_request("a patch may not change metadata.name or metadata.namespace")
        return self._commit_update(resource, current, obj, subresource, admit)

    def scale(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        scale: Any,
        admit: Admit = admit_all,
    ) -> Stored:
        """Write a Scale's `spec.replicas` into a Deployment, a ReplicaSet or a custom object
        (the scale subresource); its `metadata.resourceVersion`, if given, is a precondition."""
        current = self.get(resource, namespace, name)
        try:
            replicas = workloads.scale_replicas(scale)
        except ValueError as e:
            raise bad_request(
                f'Scale in version "v1" cannot be handled as a Scale: json: {e}'
            ) from e
        given_rv = (scale.get("metadata") or {}).get("resourceVersion")
        if given_rv and str(given_rv) != str(current.rv):
            raise conflict(resource.group_resource, current.name, STALE_OBJECT)
        obj = current.copy()
        if resource.custom is not None:
            customresources.set_replicas(resource, obj, replicas)
        else:
            obj["spec"]["replicas"] = replicas
        return self._commit_update(resource, current, obj, "scale", admit)

    def scale_view(self, resource: Resource, stored: Stored) -> JsonObject:
        """The autoscaling/v1 Scale of a stored object that has the scale subresource."""
        if resource.custom is not None:
            return customresources.scale_of(resource, stored.obj)
        return workloads.scale_of(stored.obj)

    def _commit_update(
        self,
        resource: Resource,
        current: Stored,
        obj: JsonObject,
        subresource: str,
        admit: Admit,
    ) -> Stored:
        meta = obj["metadata"]
        old = current.obj
        old_meta = old["metadata"]
        given_rv = meta.get("resourceVersion")
        if given_rv and str(given_rv) != str(current.rv):
            raise conflict(resource.group_resource, current.name, STALE_OBJECT)
        causes: list[tuple[str, str]] = []
        if meta.get("uid") and meta["uid"] != old_meta.get("uid"):
            causes.append(("metadata.uid", f'Invalid value: "{meta["uid"]}": field is immutable'))
        meta["uid"] = old_meta.get("uid")
        meta["creationTimestamp"] = old_meta.get("creationTimestamp")
        for key in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        if subresource == "status":
            for key, value in old.items():
                if key not in ("metadata", "status", "kind", "apiVersion"):
                    obj[key] = value
            if resource.custom is not None:
                # As upstream's custom resource status strategy: only the status changes.
                meta = obj["metadata"] = json.loads(json.dumps(old_meta))
            if resource is PODS:
                if "ownerReferences" in old_meta:
                    meta["ownerReferences"] = old_meta["ownerReferences"]
                else:
                    meta.pop("ownerReferences", None)
        elif subresource == "ephemeralcontainers":
            # As upstream: the subresource changes spec.ephemeralContainers and nothing else.
            ephemeral = (obj.get("spec") or {}).get("ephemeralContainers") or []
            for key, value in old.items():
                obj[key] = json.loads(json.dumps(value))
            meta = obj["metadata"]
            obj["spec"]["ephemeralContainers"] = ephemeral
            causes += validation.ephemeral_update_causes(old, obj)
        elif resource.status_subresource:
            if "status" in old:
                obj["status"] = old["status"]
            else:
                obj.pop("status", None)
            if resource is PODS:
                causes += validation.pod_update_causes(old, obj)
        if resource is NAMESPACES and subresource != "status":
            obj["spec"] = old.get("spec", {})
        if resource is POD_DISRUPTION_BUDGETS:
            # The generation counts spec changes; the controller's observedGeneration trails it.
            generation = int(old_meta.get("generation") or 1)
            if subresource != "status" and obj.get("spec") != old.get("spec"):
                generation += 1
            meta["generation"] = generation
        if resource is DEPLOYMENTS or resource is REPLICA_SETS:
            workloads.apply_defaults(resource, obj)
            meta["generation"] = workloads.next_generation(old, obj, subresource)
            causes += workloads.update_causes(old, obj)
        if resource.custom is not None:
            if subresource != "status":
                customresources.prepare(resource, obj)
            meta["generation"] = customresources.next_generation(resource, old, obj)
        if resource is CUSTOM_RESOURCE_DEFINITIONS:
            customresources.crd_defaults(obj)
            meta["generation"] = customresources.next_generation(resource, old, obj)
            causes += _immutable_crd_causes(old, obj)
        self._validate(resource, obj, causes)
        if resource is PRIORITY_CLASSES:
            priority.validate_class(self.store, obj, old)
        admit("UPDATE", resource, subresource, current.namespace, current.name, obj, old)
        if _finalized(obj):
            return self.store.remove(resource, current.namespace, current.name)
        meta["resourceVersion"] = old_meta.get("resourceVersion")
        if obj == old:
            # As upstream: a write that changes nothing keeps the resourceVersion, sends no event.
            return current
        return self.store.replace(resource, obj)

    # delete

    def delete(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        options: DeleteOptions,
        admit: Admit = admit_all,
    ) -> DeleteResult:
        current = self.get(resource, namespace, name)
        meta = current.obj["metadata"]
        if resource is NAMESPACES and name in PROTECTED_NAMESPACES:
            raise ApiError(
                403,
                "Forbidden",
                f'namespaces "{name}" is forbidden: this namespace may not be deleted',
                {"name": name, "kind": "namespaces"},
            )
        check_preconditions(resource, current, options)
        admit("DELETE", resource, "", namespace, name, None, current.obj)
        grace = self._grace_period(resource, current, options)
        finalizers = meta.get("finalizers") or []
        pending = meta.get("deletionGracePeriodSeconds")
        if grace == 0 and not finalizers:
            if resource is NAMESPACES:
                self._empty_namespace(name)
            return DeleteResult(self.store.remove(resource, namespace, name), True)
        if meta.get("deletionTimestamp") and (pending is None or grace >= pending):
            return DeleteResult(current, False)
        obj = current.copy()
        obj["metadata"]["deletionTimestamp"] = rfc3339(self.clock.now() + grace)
        obj["metadata"]["deletionGracePeriodSeconds"] = grace
        if resource is PODS:
            uid = str(meta.get("uid", ""))
            self._terminating[(namespace, name)] = (uid, self.clock.now() + grace)
        return DeleteResult(self.store.replace(resource, obj), False)

    def finish_overdue_deletions(self) -> int:
        """Remove the gracefully deleted pods whose grace period is over and whose node no
        kubelet reports for (a Node object without a Ready condition, or none at all): the
        kubelet finishes the others, and here no one else would. On a real node the kubelet
        stops the containers and removes the pod within the grace period; for a node that is
        gone, the pod garbage collector does. Returns how many were removed."""
        now = self.clock.now()
        removed = 0
        for key, (uid, deadline) in list(self._terminating.items()):
            if deadline > now:
                continue
            del self._terminating[key]
            stored = self.store.get(PODS, *key)
            if stored is None or stored.obj["metadata"].get("uid") != uid:
                continue
            meta = stored.obj["metadata"]
            if meta.get("finalizers") or not meta.get("deletionTimestamp"):
                continue
            if self._kubelet_reports(str(stored.obj.get("spec", {}).get("nodeName") or "")):
                continue
            self.store.remove(PODS, *key)
            removed += 1
        return removed

    def _kubelet_reports(self, node: str) -> bool:
        """Whether a kubelet reports for `node`: the Node exists with a Ready condition."""
        stored = self.store.get(NODES, "", node)
        if stored is None:
            return False
        conditions = stored.obj.get("status", {}).get("conditions") or []
        return any(isinstance(c, dict) and c.get("type") == "Ready" for c in conditions)

    def _grace_period(self, resource: Resource, current: Stored, options: DeleteOptions) -> int:
        if resource is not PODS:
            return 0
        spec = current.obj.get("spec", {})
        grace = options.grace_period_seconds
        if grace is None:
            grace = int(spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS))
        if grace < 0:
            grace = 1
        phase = current.obj.get("status", {}).get("phase")
        if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
            return 0
        return grace

    def _empty_namespace(self, namespace: str) -> None:
        """The namespace controller's job, done at once: every object in it goes first."""
        for resource in list(self.catalog.stored()):
            if not resource.namespaced:
                continue
            for stored in list(self.store.objects(resource, namespace)):
                self.store.remove(resource, namespace, stored.name)

    # binding


def apply_patch(target: JsonObject, content_type: str, raw: bytes) -> JsonObject:
    """The document `raw` (a JSON, merge or strategic merge patch, by `content_type`) applied to
    `target`; 415 for another media type, 400 or 422 for a patch that does not apply."""
    media = content_type.split(";")[0].strip().lower()
    if media not in (patches.JSON_PATCH, patches.MERGE_PATCH, patches.STRATEGIC_MERGE_PATCH):
        if media == patches.APPLY_PATCH:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                "server-side apply (application/apply-patch+yaml) is not implemented by the"
                " simulated API server; use a strategic merge, merge or JSON patch",
            )
        raise unsupported_media_type(content_type, patches.ACCEPTED)
    try:
        document = json.loads(raw)
    except ValueError as e:
        raise bad_request(f"error decoding patch: {e}") from e
    if media == patches.JSON_PATCH:
        result = patches.json_patch(target, document)
    elif media == patches.MERGE_PATCH:
        result = patches.json_merge_patch(target, document)
    else:
        result = patches.strategic_merge_patch(target, document)
    if not isinstance(result, dict):
        raise unprocessable("the patched document is not a JSON object")
    return result


def check_preconditions(resource: Resource, current: Stored, options: DeleteOptions) -> None:
    """409 Conflict, in upstream's words, when the delete's uid or resourceVersion is not the
    object's."""
    uid = current.obj["metadata"].get("uid")
    if options.uid is not None and options.uid != uid:
        raise conflict(
            resource.group_resource,
            current.name,
            f"Precondition failed: UID in precondition: {options.uid}, UID in object meta: {uid}",
        )
    if options.resource_version is not None and options.resource_version != str(current.rv):
        raise conflict(
            resource.group_resource,
            current.name,
            f"Precondition failed: ResourceVersion in precondition:"
            f" {options.resource_version}, ResourceVersion in object meta: {current.rv}",
        )


def _immutable_crd_causes(old: JsonObject, new: JsonObject) -> list[tuple[str, str]]:
    """The parts of a CRD that cannot change once it is served (the simulator's subset)."""
    causes = []
    for field in ("group", "scope"):
        before, after = (old.get("spec") or {}).get(field), (new.get("spec") or {}).get(field)
        if before != after:
            causes.append((f"spec.{field}", f'Invalid value: "{after}": field is immutable'))
    return causes


def _finalized(obj: JsonObject) -> bool:
    """An object marked for deletion whose last finalizer is gone (and grace has run out)."""
    meta = obj["metadata"]
    return (
        bool(meta.get("deletionTimestamp"))
        and not meta.get("finalizers")
        and not meta.get("deletionGracePeriodSeconds")
    )


def _qos_class(pod: JsonObject) -> str:
    spec = pod.get("spec") or {}
    containers = [c for c in (spec.get("containers") or []) if isinstance(c, dict)]
    requests_any = False
    guaranteed = bool(containers)
    for container in containers:
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        requests = resources.get("requests") or {}
        if limits or requests:
            requests_any = True
        for name in ("cpu", "memory"):
            if name not in limits or requests.get(name, limits[name]) != limits[name]:
                guaranteed = False
    if guaranteed:
        return "Guaranteed"
    return "Burstable" if requests_any else "BestEffort"
