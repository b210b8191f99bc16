"""Mutating admission webhooks, as kube-apiserver calls them on create.

For an object being created (after defaulting, before validation), every webhook of every stored
`MutatingWebhookConfiguration` (admissionregistration.k8s.io/v1; configurations in name order,
webhooks in order) whose `rules`, `namespaceSelector` and `objectSelector` match is called with
an `AdmissionReview` v1 (with the caller's `userInfo`) over HTTPS, trusting only its
`clientConfig.caBundle`. A JSONPatch answer is applied; a refusal fails the request with the
webhook's status and upstream's wording (`admission webhook "x" denied the request: ...`); a
webhook that cannot be reached or answers nonsense fails the request with 500 under
`failurePolicy: Fail` (the default) and is skipped under `Ignore`.

Not simulated: webhooks on UPDATE, DELETE and CONNECT (only CREATE is sent), `clientConfig.service`
(there is no cluster DNS: use `url`), `matchPolicy` equivalents, `matchConditions`,
`reinvocationPolicy`, and validating webhooks.
"""

from __future__ import annotations

import base64
import binascii
import json
import ssl
import uuid
from typing import Any

import aiohttp

from sim.apiserver.admission.matching import (
    labels_of,
    namespace_selector_applies,
    rule_matches,
    selector_matches,
)
from sim.apiserver.auth import UserInfo
from sim.apiserver.errors import ApiError
from sim.apiserver.patch import json_patch
from sim.apiserver.resources import MUTATING_WEBHOOK_CONFIGURATIONS, NAMESPACES, Resource
from sim.apiserver.store import Store

JsonObject = dict[str, Any]
DEFAULT_TIMEOUT_SECONDS = 10


class WebhookCallError(Exception):
    """The webhook could not be called, or its answer is not a usable AdmissionReview."""


def webhooks_for(
    store: Store, resource: Resource, operation: str, namespace: str, obj: JsonObject
) -> list[JsonObject]:
    """The webhooks to call for this request, in the order the API server calls them."""
    configurations = sorted(
        (s.obj for s in store.objects(MUTATING_WEBHOOK_CONFIGURATIONS, "")),
        key=lambda o: str(o["metadata"]["name"]),
    )
    namespace_labels: JsonObject = {}
    if resource is NAMESPACES:
        namespace_labels = labels_of(obj)
    elif resource.namespaced:
        stored = store.get(NAMESPACES, "", namespace)
        namespace_labels = labels_of(stored.obj if stored else None)
    chosen = []
    for configuration in configurations:
        for webhook in configuration.get("webhooks") or []:
            if not any(rule_matches(r, resource, operation) for r in webhook.get("rules") or []):
                continue
            if namespace_selector_applies(resource) and not selector_matches(
                webhook.get("namespaceSelector"), namespace_labels
            ):
                continue
            if not selector_matches(webhook.get("objectSelector"), labels_of(obj)):
                continue
            chosen.append(webhook)
    return chosen


def _review(
    resource: Resource,
    operation: str,
    namespace: str,
    obj: JsonObject,
    user: UserInfo,
    dry_run: bool = False,
) -> JsonObject:
    group_version_kind = {
        "group": resource.group,
        "version": resource.version,
        "kind": resource.kind,
    }
    group_version_resource = {
        "group": resource.group,
        "version": resource.version,
        "resource": resource.plural,
    }
    request: JsonObject = {
        "uid": str(uuid.uuid4()),
        "kind": group_version_kind,
        "resource": group_version_resource,
        "requestKind": group_version_kind,
        "requestResource": group_version_resource,
        "name": obj.get("metadata", {}).get("name", ""),
        "operation": operation,
        "userInfo": user.to_json(),
        "object": obj,
        "oldObject": None,
        "dryRun": dry_run,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
    }
    if resource.namespaced:
        request["namespace"] = namespace
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


async def call(webhook: JsonObject, review: JsonObject) -> JsonObject:
    """POST the review to the webhook over HTTPS; its `response`, or WebhookCallError."""
    config = webhook.get("clientConfig") or {}
    url = config.get("url")
    if not url:
        raise WebhookCallError(
            "the simulated API server has no cluster DNS to reach clientConfig.service; give "
            "the webhook a clientConfig.url"
        )
    if not str(url).startswith("https://"):
        raise WebhookCallError(f"webhook URL {url!r} is not https://; the API server needs TLS")
    context = ssl.create_default_context()
    if config.get("caBundle"):
        try:
            context = ssl.create_default_context(
                cadata=base64.b64decode(config["caBundle"]).decode()
            )
        except (binascii.Error, UnicodeDecodeError, ssl.SSLError) as e:
            raise WebhookCallError(f"clientConfig.caBundle is not a PEM bundle: {e}") from e
    timeout = aiohttp.ClientTimeout(total=webhook.get("timeoutSeconds", DEFAULT_TIMEOUT_SECONDS))
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(url, json=review, ssl=context) as answer,
        ):
            if answer.status != 200:
                raise WebhookCallError(f"the webhook answered HTTP {answer.status}")
            body = await answer.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, json.JSONDecodeError) as e:
        # The socket's own error reads as upstream's ("connection refused", "certificate verify
        # failed"); aiohttp's wrapper would add its SSL context's repr.
        cause = getattr(e, "os_error", None) or e
        raise WebhookCallError(f'failed to call webhook: Post "{url}": {cause}') from e
    response = body.get("response") if isinstance(body, dict) else None
    if not isinstance(response, dict) or response.get("uid") != review["request"]["uid"]:
        raise WebhookCallError("the webhook's answer is not an AdmissionReview for this request")
    return response


def _denied(name: str, response: JsonObject) -> ApiError:
    """Upstream's ToStatusErr: at least 400, the webhook's message after who denied it."""
    status = response.get("status") or {}
    code = status["code"] if isinstance(status.get("code"), int) else 400
    denied_by = f'admission webhook "{name}" denied the request'
    if status.get("message"):
        message = f"{denied_by}: {status['message']}"
    elif status.get("reason"):
        message = f"{denied_by}: {status['reason']}"
    else:
        message = f"{denied_by} without explanation"
    return ApiError(max(int(code), 400), str(status.get("reason") or ""), message)


async def mutate(
    store: Store,
    resource: Resource,
    operation: str,
    namespace: str,
    obj: JsonObject,
    user: UserInfo,
    dry_run: bool = False,
) -> JsonObject:
    """`obj` after every matching mutating webhook, or the ApiError that fails the request. A
    dry run calls only webhooks whose sideEffects are None or NoneOnDryRun, and fails with
    upstream's 400 on any other, as kube-apiserver does."""
    for webhook in webhooks_for(store, resource, operation, namespace, obj):
        name = str(webhook.get("name", ""))
        if dry_run and webhook.get("sideEffects") not in ("None", "NoneOnDryRun"):
            raise ApiError(
                400, "BadRequest", f'admission webhook "{name}" does not support dry run'
            )
        try:
            review = _review(resource, operation, namespace, obj, user, dry_run)
            response = await call(webhook, review)
            if not response.get("allowed"):
                raise _denied(name, response)
            if response.get("patch"):
                if response.get("patchType") != "JSONPatch":
                    raise WebhookCallError(f"patchType {response.get('patchType')!r} is unknown")
                try:
                    operations = json.loads(base64.b64decode(response["patch"]))
                    obj = json_patch(obj, operations)
                except (binascii.Error, json.JSONDecodeError, ApiError) as e:
                    raise WebhookCallError(f"the webhook's patch does not apply: {e}") from e
        except WebhookCallError as e:
            if webhook.get("failurePolicy", "Fail") == "Ignore":
                continue
            raise ApiError(
                500,
                "InternalError",
                f'Internal error occurred: failed calling webhook "{name}": {e}',
            ) from e
    return obj
