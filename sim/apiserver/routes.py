"""The HTTP face of the API server: aiohttp routes, request parsing, responses, audit.

Every request is authenticated (a bearer token this server minted, or none: the cluster admin;
any other token gets 401), and every `/api/...` and `/apis/...` request is parsed into a
`RequestInfo`, dispatched to the
registry (`rest`), the token authority (`auth`) or a watch stream (`watch`), and answered with the
object, a `...List`, or a `Status`; every request is recorded in the audit log. Discovery
(`/api`, `/apis`, `/api/v1`, ...), `/version` and the health endpoints are served too. This module
holds no object state of its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from sim.apiserver import (
    binding,
    customresources,
    discovery,
    eviction,
    fieldvalidation,
    listing,
    openapi,
    podlogs,
    quota,
    tables,
)
from sim.apiserver import watch as watches
from sim.apiserver.admission import podsecurity, webhooks
from sim.apiserver.admission.policies import Policies
from sim.apiserver.admission.policies import Request as AdmissionRequest
from sim.apiserver.audit import WRITE_VERBS, AuditLog, AuditRecord
from sim.apiserver.auth import CLUSTER_ADMIN, TokenAuthority, UserInfo
from sim.apiserver.clock import Clock
from sim.apiserver.disruption import DisruptionController
from sim.apiserver.errors import (
    ApiError,
    bad_request,
    internal,
    method_not_allowed,
    too_large_resource_version,
)
from sim.apiserver.faults import Fault, Faults
from sim.apiserver.requestinfo import RequestInfo, parse_bool, parse_request
from sim.apiserver.resources import (
    BINDINGS,
    NAMESPACES,
    PODS,
    SERVICE_ACCOUNTS,
    TOKEN_REVIEWS,
    Catalog,
    Resource,
)
from sim.apiserver.rest import Admit, DeleteOptions, Registry, apply_patch
from sim.apiserver.selectors import parse_field_selector, parse_label_selector
from sim.apiserver.settings import ApiServerSettings
from sim.apiserver.store import Store, Stored

log = logging.getLogger(__name__)

INFO_KEY = web.RequestKey("info", RequestInfo)
ARRIVED_KEY = web.RequestKey("arrived", float)
RECORDED_KEY = web.RequestKey("recorded", bool)
USER_KEY = web.RequestKey("user", UserInfo)
WARNINGS_KEY = web.RequestKey("warnings", list[str])
ANNOTATIONS_KEY = web.RequestKey("annotations", dict[str, str])

JsonObject = dict[str, Any]


@dataclass
class ApiServerCore:
    """Everything one API server instance owns, shared by its handlers."""

    settings: ApiServerSettings
    clock: Clock = field(default_factory=Clock)
    store: Store = field(init=False)
    catalog: Catalog = field(init=False)
    registry: Registry = field(init=False)
    authority: TokenAuthority = field(init=False)
    audit: AuditLog = field(init=False)
    faults: Faults = field(default_factory=Faults)
    delay_seconds: float = 0.0
    """Seconds every resource request waits before it is served, as a slow (not absent) API
    server answers late: 0 (off) unless a test sets it (`RunningApiServer.slow`)."""
    policies: Policies = field(init=False)
    disruption: DisruptionController = field(init=False)
    quotas: quota.QuotaController = field(init=False)

    def __post_init__(self) -> None:
        self.store = Store(self.settings.history_size)
        self.catalog = Catalog()
        self.store.observe(customresources.Definitions(self.catalog, self.store))
        self.registry = Registry(self.store, self.clock, self.catalog)
        self.registry.default_toleration_seconds = (
            self.settings.default_not_ready_toleration_seconds,
            self.settings.default_unreachable_toleration_seconds,
        )
        self.disruption = DisruptionController(self.store, self.clock)
        self.quotas = quota.QuotaController(self.store)
        self.authority = TokenAuthority(self.store, self.clock)
        self.policies = Policies(self.store)
        self.audit = AuditLog(self.settings.audit_size)


def _json(obj: object, status: int = 200) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(obj, separators=(",", ":")).encode(),
        content_type="application/json",
    )


def _fault(fault: Fault) -> web.Response:
    """The Status answer of an armed fault, with its Retry-After."""
    error = ApiError(fault.status, fault.reason, fault.message, {})
    response = _json(error.status(), fault.status)
    if fault.retry_after is not None:
        response.headers["Retry-After"] = str(fault.retry_after)
    return response


def _header_text(text: str) -> str:
    """A warning as a quoted header value: one line, quotes and backslashes escaped."""
    text = " ".join(text.split())
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _peer(request: web.Request) -> str:
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    if not peer:
        return ""
    return f"{peer[0]}:{peer[1]}"


def _object(stored: Stored, status: int = 200) -> web.Response:
    return web.Response(status=status, body=stored.full(), content_type="application/json")


def _success(resource: Resource, stored: Stored) -> web.Response:
    details: JsonObject = {"name": stored.name}
    if resource.group:
        details["group"] = resource.group
    details["kind"] = resource.plural
    details["uid"] = stored.obj["metadata"].get("uid")
    return _json(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": details,
        }
    )


async def _body(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        raise bad_request("the request body is empty; send the object as JSON")
    try:
        return json.loads(raw)
    except ValueError as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from e


async def _checked_body(
    request: web.Request, resource: Resource, fields: fieldvalidation.FieldValidation
) -> Any:
    """The body of a create or update, its fields checked as the request's fieldValidation
    asks."""
    raw = await request.read()
    if not raw:
        raise bad_request("the request body is empty; send the object as JSON")
    try:
        body, duplicates = fieldvalidation.loads(raw)
    except ValueError as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from e
    fields.check_object(resource, body, duplicates)
    return body


def _int_param(request: web.Request, name: str) -> int | None:
    value = request.query.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError as e:
        raise bad_request(f"invalid value for {name}: {value!r} is not an integer") from e


class Handlers:
    """The request handlers of one `ApiServerCore`."""

    def __init__(self, core: ApiServerCore) -> None:
        self.core = core
        self._kubelets: aiohttp.ClientSession | None = None
        """The one client to the kubelets (`pods/log`), made on first use, closed with the app."""

    async def close(self, _: web.Application) -> None:
        if self._kubelets is not None:
            await self._kubelets.close()

    @web.middleware
    async def audit_middleware(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        arrived = self.core.clock.now()
        request[ARRIVED_KEY] = arrived
        try:
            info = parse_request(
                request.method,
                request.path,
                request.query.get("watch"),
                self.core.catalog.by_group_version,
            )
        except ApiError as e:
            return _json(e.status(), e.code)
        request[INFO_KEY] = info
        request[WARNINGS_KEY] = []
        request[ANNOTATIONS_KEY] = {}
        code = 500
        try:
            request[USER_KEY] = self._authenticate(request)
            fault = None
            if info.is_resource_request:
                fault = self.core.faults.take(
                    request.headers.get("User-Agent", ""), info.verb, info.resource_name
                )
            if info.is_resource_request and self.core.delay_seconds > 0:
                await asyncio.sleep(self.core.delay_seconds)
            if fault is not None and fault.delay_seconds:
                await asyncio.sleep(fault.delay_seconds)
            if fault is None or fault.committed:
                response = await handler(request)
            if fault is not None:
                response = _fault(fault)
            code = response.status
            for warning in request[WARNINGS_KEY]:
                response.headers.add("Warning", f'299 - "{_header_text(warning)}"')
            return response
        except ApiError as e:
            code = e.code
            answer = _json(e.status(), e.code)
            retry_after = (e.details or {}).get("retryAfterSeconds")
            if retry_after:
                # As upstream's response writer: a suggested retry delay is a header too.
                answer.headers["Retry-After"] = str(retry_after)
            return answer
        except web.HTTPException as e:
            code = e.status
            raise
        except Exception as e:
            # A bug in the simulator: answer as the real server does (500 Status) and say where.
            log.exception(
                "The simulated API server failed on %s %s: answering 500.",
                request.method,
                request.path,
            )
            error = internal(f"{type(e).__name__}: {e}")
            code = error.code
            return _json(error.status(), error.code)
        finally:
            if info.is_resource_request and not request.get(RECORDED_KEY, False):
                self._record(request, info, arrived, code)

    def _authenticate(self, request: web.Request) -> UserInfo:
        """The caller: the service account of a token this server minted for its own audience,
        the cluster admin without credentials; 401 for any other credentials, as upstream."""
        authorization = request.headers.get("Authorization", "")
        if not authorization:
            return CLUSTER_ADMIN
        scheme, _, token = authorization.partition(" ")
        user = None
        if scheme.lower() == "bearer":
            user = self.core.authority.authenticate(token.strip())
        if user is None:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return user

    def _admit(self, request: web.Request) -> Admit:
        """Validating admission for this request's writes, as its caller; warnings go to the
        response's Warning headers."""
        user, warnings = request[USER_KEY], request[WARNINGS_KEY]
        annotations = request[ANNOTATIONS_KEY]

        def admit(
            operation: str,
            resource: Resource,
            subresource: str,
            namespace: str,
            name: str,
            obj: JsonObject | None,
            old: JsonObject | None,
        ) -> None:
            # The PodSecurity plugin runs before ValidatingAdmissionPolicy, as in kube-apiserver.
            security = podsecurity.admit(
                self.core.store, operation, resource, subresource, namespace, name, obj, old
            )
            warnings.extend(security.warnings)
            annotations.update(security.annotations)
            attributes = AdmissionRequest(
                operation, resource, subresource, namespace, name, obj, old, user
            )
            warnings.extend(self.core.policies.validate(attributes))
            if resource is PODS and operation == "CREATE" and not subresource and obj is not None:
                quota.admit_pod(self.core.store, namespace, obj)  # the last admission plugin

        return admit

    @staticmethod
    def _fields(request: web.Request) -> fieldvalidation.FieldValidation:
        """Field validation for this request's write, as its `fieldValidation` parameter asks;
        warnings go to the response's Warning headers."""
        directive = fieldvalidation.parse_directive(request.query.get("fieldValidation"))
        return fieldvalidation.FieldValidation(directive, request[WARNINGS_KEY])

    def _record(self, request: web.Request, info: RequestInfo, arrived: float, code: int) -> None:
        user = request.get(USER_KEY)
        # Requests without credentials are recorded with no user, as before admission knew them.
        self.core.audit.append(
            AuditRecord(
                time=arrived,
                user_agent=request.headers.get("User-Agent", ""),
                user=user.username if user is not None and user is not CLUSTER_ADMIN else "",
                verb=info.verb,
                api_group=info.api_group,
                resource=info.resource_name,
                subresource=info.subresource,
                namespace=info.namespace,
                name=info.name,
                code=code,
                peer=_peer(request),
                annotations=tuple(sorted(request.get(ANNOTATIONS_KEY, {}).items())),
            )
        )
        violations = request.get(ANNOTATIONS_KEY, {}).get(podsecurity.AUDIT_VIOLATIONS)
        if violations:
            log.info(
                "Audit: %s %s %s/%s: %s=%s.",
                info.verb,
                info.resource_name,
                info.namespace,
                info.name,
                podsecurity.AUDIT_VIOLATIONS,
                violations,
            )

    # dispatch

    async def api(self, request: web.Request) -> web.StreamResponse:
        info = request[INFO_KEY]
        if not info.is_resource_request:
            return self._discovery(info)
        resource = info.resource
        if resource is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        verb = info.verb
        if resource is TOKEN_REVIEWS:
            if verb != "create":
                raise method_not_allowed(verb, "tokenreviews")
            return _json(self.core.authority.token_review(await _body(request)), 201)
        if resource is SERVICE_ACCOUNTS and info.subresource == "token":
            if verb == "create" and info.name:
                answer = self.core.authority.token_request(
                    info.namespace, info.name, await _body(request)
                )
                return _json(answer, 201)
            raise method_not_allowed(verb, "serviceaccounts/token")
        if resource is BINDINGS:
            if verb != "create":
                raise method_not_allowed(verb, "bindings")
            body = await _body(request)
            meta = body.get("metadata") if isinstance(body, dict) else None
            name = meta.get("name") if isinstance(meta, dict) else None
            # The binding checks the body itself; a name that is not a string gets its 400.
            name = name if isinstance(name, str) else ""
            if isinstance(body, dict):
                self._admit(request)("CREATE", BINDINGS, "", info.namespace, name, body, None)
            return self._bind(info.namespace, name, body)
        dry_run = verb == "create" and "dryRun" in request.query
        if dry_run and request.query.getall("dryRun") != ["All"]:
            values = ", ".join(f'"{v}"' for v in request.query.getall("dryRun"))
            raise bad_request(f'dryRun: Unsupported value: {values}: supported values: "All"')
        if "dryRun" in request.query and verb in WRITE_VERBS and not dry_run:
            raise bad_request(
                "dryRun is not implemented by the simulated API server: the request was not"
                " applied; send it without dryRun"
            )
        if info.subresource:
            return await self._subresource(request, info, resource)
        namespace = info.namespace if resource.namespaced else ""
        if verb == "get":
            stored = self.core.registry.get(resource, namespace, info.name)
            if self._table_version(request):
                metadata = {"resourceVersion": str(stored.rv)}
                return self._table(request, resource, [stored.obj], metadata)
            return _object(stored)
        if verb == "list":
            return self._list(request, resource, info)
        if verb == "watch":
            return await self._watch(request, resource, info)
        if verb == "create":
            registry = self.core.registry
            body = await _checked_body(request, resource, self._fields(request))
            obj, causes = registry.prepare_create(resource, namespace, body)
            # Mutating admission: webhooks see the defaulted object, before validation.
            obj = await webhooks.mutate(
                registry.store, resource, "CREATE", namespace, obj, request[USER_KEY], dry_run
            )
            admit = self._admit(request)
            return _object(registry.commit_create(resource, obj, causes, admit, dry_run), 201)
        if verb == "update":
            body = await _checked_body(request, resource, self._fields(request))
            stored, created = self.core.registry.update(
                resource, namespace, info.name, body, admit=self._admit(request)
            )
            return _object(stored, 201 if created else 200)
        if verb == "patch":
            stored = self.core.registry.patch(
                resource,
                namespace,
                info.name,
                request.headers.get("Content-Type", ""),
                await request.read(),
                admit=self._admit(request),
                fields=self._fields(request),
            )
            return _object(stored)
        if verb == "delete":
            result = self.core.registry.delete(
                resource,
                namespace,
                info.name,
                await self._delete_options(request),
                self._admit(request),
            )
            if resource is PODS or resource is NAMESPACES or resource.custom or not result.removed:
                # Custom objects, as pods, answer with the deleted object itself.
                return _object(result.stored)
            return _success(resource, result.stored)
        if verb == "deletecollection":
            return await self._delete_collection(request, resource, info)
        raise method_not_allowed(verb, resource.group_resource)

    async def _delete_collection(
        self, request: web.Request, resource: Resource, info: RequestInfo
    ) -> web.Response:
        """Delete every selected object, each as a single delete would (graceful for pods)."""
        if resource is NAMESPACES:
            raise method_not_allowed("deletecollection", "namespaces")
        labels, fields = self._selectors(request, resource)
        options = await self._delete_options(request)
        namespace = info.namespace if resource.namespaced and info.namespace else None
        chosen = [
            s
            for s in self.core.store.objects(resource, namespace)
            if labels.matches(s.obj) and fields.matches(s.obj)
        ]
        admit = self._admit(request)
        items = [
            self.core.registry.delete(resource, s.namespace, s.name, options, admit).stored.body()
            for s in chosen
        ]
        head = json.dumps(
            {
                "kind": resource.list_kind,
                "apiVersion": resource.api_version,
                "metadata": {"resourceVersion": str(self.core.store.rv)},
            },
            separators=(",", ":"),
        ).encode()
        body = head[:-1] + b',"items":[' + b",".join(items) + b"]}"
        return web.Response(body=body, content_type="application/json")

    async def _subresource(
        self, request: web.Request, info: RequestInfo, resource: Resource
    ) -> web.StreamResponse:
        sub = info.subresource
        if sub not in resource.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        namespace = info.namespace if resource.namespaced else ""
        if sub == "binding":
            if info.verb != "create":
                raise method_not_allowed(info.verb, "pods/binding")
            body = await _body(request)
            if isinstance(body, dict):
                self._admit(request)("CREATE", resource, sub, namespace, info.name, body, None)
            return self._bind(namespace, info.name, body)
        if sub == "eviction":
            if info.verb != "create":
                raise method_not_allowed(info.verb, "pods/eviction")
            body = await _body(request)
            options = eviction.check_body(namespace, info.name, body)
            self._admit(request)("CREATE", resource, sub, namespace, info.name, body, None)
            return self._evict(namespace, info.name, options)
        if sub == "scale":
            return await self._scale(request, info, resource, namespace)
        if sub == "log":
            if info.verb != "get":
                raise method_not_allowed(info.verb, "pods/log")
            if self._kubelets is None:
                self._kubelets = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(connect=10))
            return await podlogs.serve(
                request, self.core.store, self._kubelets, namespace, info.name
            )
        if info.verb == "get":
            return _object(self.core.registry.get(resource, namespace, info.name))
        if info.verb == "update":
            stored, _ = self.core.registry.update(
                resource,
                namespace,
                info.name,
                await _checked_body(request, resource, self._fields(request)),
                subresource=sub,
                admit=self._admit(request),
            )
            return _object(stored)
        if info.verb == "patch":
            stored = self.core.registry.patch(
                resource,
                namespace,
                info.name,
                request.headers.get("Content-Type", ""),
                await request.read(),
                subresource=sub,
                admit=self._admit(request),
                fields=self._fields(request),
            )
            return _object(stored)
        raise method_not_allowed(info.verb, f"{resource.group_resource}/{sub}")

    async def _scale(
        self, request: web.Request, info: RequestInfo, resource: Resource, namespace: str
    ) -> web.Response:
        """The autoscaling/v1 Scale of a Deployment, ReplicaSet or custom object: read, or
        write its replicas."""
        registry = self.core.registry
        if info.verb == "get":
            return _json(
                registry.scale_view(resource, registry.get(resource, namespace, info.name))
            )
        if info.verb == "update":
            scale = await _body(request)
        elif info.verb == "patch":
            # The body is read before the object, with no wait between reading the object and
            # writing it: a patch that names no resourceVersion applies to the latest object, as
            # kube-apiserver retries its own conflicts, rather than to one a controller has
            # changed meanwhile (a 409 the client never caused).
            raw = await request.read()
            current = registry.get(resource, namespace, info.name)
            scale = apply_patch(
                registry.scale_view(resource, current),
                request.headers.get("Content-Type", ""),
                raw,
            )
        else:
            raise method_not_allowed(info.verb, f"{resource.group_resource}/scale")
        stored = registry.scale(resource, namespace, info.name, scale, self._admit(request))
        return _json(registry.scale_view(resource, stored))

    def _bind(self, namespace: str, name: str, body: Any) -> web.Response:
        binding.bind(self.core.store, self.core.clock, namespace, name, body)
        return _json(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "code": 201,
            },
            201,
        )

    def _evict(self, namespace: str, name: str, options: DeleteOptions) -> web.Response:
        refused = eviction.evict(self.core.registry, self.core.clock, namespace, name, options)
        status: JsonObject = {"kind": "Status", "apiVersion": "v1", "metadata": {}}
        if refused is not None:
            # Upstream answers this one with a Failure Status of its own, without a reason.
            return _json(status | {"status": "Failure", "message": refused, "code": 500}, 500)
        return _json(status | {"status": "Success", "code": 201}, 201)

    async def _delete_options(self, request: web.Request) -> DeleteOptions:
        grace = _int_param(request, "gracePeriodSeconds")
        uid = rv = None
        raw = await request.read()
        if raw:
            try:
                body = json.loads(raw)
            except ValueError as e:
                raise bad_request(f"the DeleteOptions body is not valid JSON: {e}") from e
            if not isinstance(body, dict):
                raise bad_request("the DeleteOptions body must be a JSON object")
            given = body.get("gracePeriodSeconds")
            if given is not None:
                if isinstance(given, bool) or not isinstance(given, int):
                    raise bad_request(
                        f"DeleteOptions gracePeriodSeconds must be an integer, got {given!r}"
                    )
                grace = given
            preconditions = body.get("preconditions") or {}
            if not isinstance(preconditions, dict):
                raise bad_request("DeleteOptions preconditions must be an object")
            uid = preconditions.get("uid")
            rv = preconditions.get("resourceVersion")
            if not isinstance(uid, str | None) or not isinstance(rv, str | None):
                raise bad_request("DeleteOptions preconditions uid and resourceVersion are strings")
        return DeleteOptions(grace_period_seconds=grace, uid=uid, resource_version=rv)

    # list and watch

    def _selectors(self, request: web.Request, resource: Resource) -> tuple[Any, Any]:
        labels = parse_label_selector(request.query.get("labelSelector", ""))
        fields = parse_field_selector(request.query.get("fieldSelector", ""), resource.field_labels)
        return labels, fields

    def _list(self, request: web.Request, resource: Resource, info: RequestInfo) -> web.Response:
        labels, fields = self._selectors(request, resource)
        namespace = info.namespace if resource.namespaced and info.namespace else None
        body = listing.list_body(
            self.core.store, resource, namespace, labels, fields, request.query
        )
        if self._table_version(request):
            listed = json.loads(body)
            return self._table(request, resource, listed["items"], listed["metadata"])
        return web.Response(body=body, content_type="application/json")

    @staticmethod
    def _table_version(request: web.Request) -> str | None:
        return tables.wanted_version(request.headers.get("Accept", ""))

    def _table(
        self,
        request: web.Request,
        resource: Resource,
        objects: list[JsonObject],
        metadata: JsonObject,
    ) -> web.Response:
        """The Table form kubectl asks for (`as=Table` in Accept)."""
        return _json(self._table_body(request, resource, objects, metadata))

    def _table_body(
        self,
        request: web.Request,
        resource: Resource,
        objects: list[JsonObject],
        metadata: JsonObject,
    ) -> JsonObject:
        version = self._table_version(request)
        assert version is not None
        return tables.table(
            resource,
            objects,
            version=version,
            now=self.core.clock.now(),
            metadata=metadata,
            include_object=request.query.get("includeObject", ""),
        )

    async def _watch(
        self, request: web.Request, resource: Resource, info: RequestInfo
    ) -> web.StreamResponse:
        store = self.core.store
        labels, fields = self._selectors(request, resource)
        if info.name:
            fields = parse_field_selector(f"metadata.name={info.name}", resource.field_labels)
        rv_text = request.query.get("resourceVersion", "")
        start: int | None = None
        if rv_text not in ("", "0"):
            start = listing.parse_rv(rv_text)
            if start > store.rv:
                raise too_large_resource_version(start, store.rv)
        timeout = _int_param(request, "timeoutSeconds")
        query = request.query
        spec = watches.WatchRequest(
            resource=resource,
            namespace=info.namespace if resource.namespaced and info.namespace else None,
            labels=labels,
            fields=fields,
            start_rv=start,
            timeout_seconds=float(timeout)
            if timeout
            else self.core.settings.default_watch_timeout_seconds,
            bookmarks=parse_bool("allowWatchBookmarks", query.get("allowWatchBookmarks")),
            send_initial_events=parse_bool("sendInitialEvents", query.get("sendInitialEvents")),
        )
        if self._table_version(request):

            def as_table(obj: JsonObject) -> JsonObject:
                return self._table_body(request, resource, [obj], {})

            spec = dataclasses.replace(spec, as_table=as_table)
        if spec.send_initial_events:
            # A streaming list starts from the current state whatever version was asked for.
            spec = dataclasses.replace(spec, start_rv=None)
        # A watch is audited when it starts (it may stay open for the whole test).
        self._record(request, info, request[ARRIVED_KEY], 200)
        request[RECORDED_KEY] = True
        return await watches.stream(
            request, store, spec, self.core.settings.bookmark_interval_seconds
        )

    # discovery and health

    def _discovery(self, info: RequestInfo) -> web.Response:
        document = discovery.resource_list(self.core.catalog, info.api_group, info.api_version)
        if not info.api_version or document is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        return _json(document)

    async def root_api(self, request: web.Request) -> web.Response:
        return _json(discovery.api_versions())

    async def root_apis(self, request: web.Request) -> web.Response:
        return _json(discovery.api_groups(self.core.catalog))

    async def version(self, request: web.Request) -> web.Response:
        return _json(discovery.SERVER_VERSION)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def openapi_v2(self, request: web.Request) -> web.Response:
        """An OpenAPI document without definitions (protobuf's empty message, or `{}` in JSON):
        the server publishes no schemas, so `kubectl apply` validates nothing client-side, as for
        a kind a real server publishes no schema of, instead of failing to download one."""
        if "protobuf" in request.headers.get("Accept", ""):
            return web.Response(
                body=b"", content_type="application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
            )
        return _json({"swagger": "2.0", "info": {"title": "sim", "version": "v1"}, "paths": {}})

    async def openapi_v3(self, request: web.Request) -> web.Response:
        """`/openapi/v3`: the group/versions with a document (those serving custom
        resources)."""
        return _json(openapi.discovery_document(self.core.catalog))

    async def openapi_v3_group_version(self, request: web.Request) -> web.Response:
        """`/openapi/v3/apis/<group>/<version>`: the custom resources' schemas and paths."""
        document = openapi.group_version_document(
            self.core.catalog, request.match_info["group"], request.match_info["version"]
        )
        if document is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        return _json(document)


def build_app(core: ApiServerCore) -> web.Application:
    handlers = Handlers(core)
    app = web.Application(middlewares=[handlers.audit_middleware], client_max_size=64 * 1024**2)
    app.on_cleanup.append(handlers.close)
    app.router.add_get("/api", handlers.root_api)
    app.router.add_get("/apis", handlers.root_apis)
    app.router.add_get("/version", handlers.version)
    app.router.add_get("/openapi/v2", handlers.openapi_v2)
    app.router.add_get("/openapi/v3", handlers.openapi_v3)
    app.router.add_get("/openapi/v3/apis/{group}/{version}", handlers.openapi_v3_group_version)
    for path in ("/healthz", "/livez", "/readyz"):
        app.router.add_get(path, handlers.health)
    app.router.add_route("*", "/api/{tail:.*}", handlers.api)
    app.router.add_route("*", "/apis/{tail:.*}", handlers.api)
    return app
