"""The binder's only door to the Kubernetes API (the only binder module importing `kubernetes`).

Blocking calls, meant to run on worker threads: list and watch raw API dicts (camelCase, no model
deserialisation), patch a pod's annotations, post a Binding, record an Event, set the PodScheduled
condition, and read/write the leader Lease. Every request goes through `Kube._request` (a watch
through `Kube._stream`) over the one transport of binder.api.transport chosen at start-up; the
`kubernetes` package only reads the kubeconfig or the service account and refreshes the token.
Every answer is read whole and its connection handed back to the pool, so calls reuse a few
keep-alive connections instead of opening one each.

Failures become binder.errors.ApiError subclasses carrying the status; an unreachable server
(refused, reset, timed out) and 429/5xx answers are UnavailableError. Writes ride those out with
bounded exponential backoff (honouring Retry-After) for at most the RetryPolicy's budget and only
while `retry_while()` holds (the replica leads): a write that outlives its leadership could
double-book a GPU the next leader has given away. A Binding whose answer was lost is checked
against the pod before it is sent again. Lists, watches and lease calls are tried once: their
callers (the informers, the elector) own the retry. Watches can be cut from another thread
(`close_watches`), so shutdown never waits for a read timeout. No scheduling logic lives here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import ssl
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Unpack
from urllib.parse import quote, urlencode, urlsplit

import kubernetes.client
import kubernetes.client.rest
import kubernetes.config

from binder.api.transport import Answer, Connections, Direct, Proxied, Stream, Transport
from binder.errors import (
    ApiError,
    ConflictError,
    GoneError,
    NotFoundError,
    SettingsError,
    UnavailableError,
    api_error,
)
from common.conditions import Condition, condition_patch
from common.events import EventAggregator, EventText, EventWrite, event, pod_ref
from common.version import VERSION

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]
USER_AGENT = f"tritonshare-binder/{VERSION}"
AUTOSCALER = "tritonshare-autoscaler"
"""The field manager of the built-in autoscaler's writes to `scale`."""
WATCH_TIMEOUT_SECONDS = 300
LIST_TIMEOUT_SECONDS = 60.0
CONNECT_TIMEOUT_SECONDS = 10.0
READ_TIMEOUT_SECONDS = 30.0
"""No call may hang a worker thread forever."""
AUTH_REFRESH_SECONDS = 1.0
"""How long the writes reuse the credential headers before reading them again."""


@dataclass(frozen=True)
class RetryPolicy:
    """How a write rides out an unavailable API server."""

    initial_seconds: float = 0.2
    """First wait after a failed attempt; doubles per attempt. Default 0.2 s."""
    max_seconds: float = 5.0
    """Longest wait between two attempts (a longer Retry-After is honoured). Default 5 s."""
    budget_seconds: float = 10.0
    """Give a write up once this long has passed since its first attempt. Default 10 s."""


@dataclass(frozen=True)
class Kind:
    """A watched collection: its name and the API path that lists it."""

    name: str
    path: str


_LEASES = "/apis/coordination.k8s.io/v1"
_TRITONMODELS = "/apis/tritonshare.io/v1alpha1/tritonmodels"


def _models_path(namespace: str) -> str:
    return f"/apis/tritonshare.io/v1alpha1/namespaces/{quote(namespace, safe='')}/tritonmodels"


def micro_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _retry_after(headers: dict[str, str]) -> float | None:
    value = headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the server's own clock, not worth trusting; back off instead


def _status_error(answer: Answer) -> ApiError:
    """The ApiError for an answer that is not a success, from its Status body."""
    body = answer.body.decode("utf-8", "replace")
    reason, message = answer.reason, body or answer.reason
    try:
        status_body = json.loads(body) if body else {}
        reason = str(status_body.get("reason") or reason)
        message = str(status_body.get("message") or message)
    except (ValueError, AttributeError):
        pass
    return api_error(answer.status, reason, message, _retry_after(answer.headers))


def _unreachable(e: Exception) -> UnavailableError:
    """No answer: refused, reset, timed out, or a broken stream."""
    return UnavailableError(0, type(e).__name__, f"the API server could not be reached: {e}")


_JSON = "application/json"
_PATCH = "application/strategic-merge-patch+json"
"""What the generated client sends for a dict patch body; kept, so nothing changes server-side."""
_MERGE_PATCH = "application/merge-patch+json"


def _transport(configuration: Any, keep: int, user_agent: str) -> Transport:
    """The one transport for every request, from the client configuration the kubeconfig (or the
    service account) filled in: the same server, CA, client certificate, SNI and proxy settings.
    Our own connections (binder.api.transport.Direct), unless a proxy applies to the server: then
    the urllib3 proxy manager the official client would use."""
    url = urlsplit(configuration.host)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise SettingsError(f"the API server's URL {configuration.host!r} is not http(s)://host")
    if configuration.proxy and not kubernetes.client.rest.should_bypass_proxies(
        configuration.host, configuration.no_proxy or ""
    ):
        pool = kubernetes.client.rest.RESTClientObject(configuration).pool_manager
        log.info(
            "Talking to the API server at %s through the proxy %s.",
            configuration.host,
            configuration.proxy,
        )
        return Proxied(pool, configuration.host, user_agent)
    tls = None
    if url.scheme == "https":
        if configuration.verify_ssl:
            tls = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
            if configuration.assert_hostname is False:
                tls.check_hostname = False
        else:
            tls = ssl.create_default_context()
            tls.check_hostname = False
            tls.verify_mode = ssl.CERT_NONE
        if configuration.cert_file:
            tls.load_cert_chain(configuration.cert_file, configuration.key_file or None)
    port = url.port or (443 if url.scheme == "https" else 80)
    connections = Connections(
        url.hostname,
        port,
        tls=tls,
        server_hostname=configuration.tls_server_name or url.hostname,
        connect_timeout=CONNECT_TIMEOUT_SECONDS,
        keep=keep,
    )
    return Direct(connections, url.path.rstrip("/"), url.netloc, user_agent)


def _pod_path(namespace: str, name: str, subresource: str = "") -> str:
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"
    return f"{path}/{subresource}" if subresource else path


def kubeconfig_namespace(kubeconfig: str, context: str | None = None) -> str | None:
    """The namespace the kubeconfig's `context` (default: its current context) names, as kubectl
    reads it; None when it names none. Raises SettingsError for an unreadable kubeconfig or an
    unknown context."""
    try:
        loader: Any = kubernetes.config
        contexts, current = loader.list_kube_config_contexts(config_file=kubeconfig)
    except (kubernetes.config.ConfigException, OSError, ValueError) as e:
        raise SettingsError(f"cannot read kubeconfig {kubeconfig}: {e}") from e
    if context:
        chosen = next((c for c in contexts if c.get("name") == context), None)
        if chosen is None:
            names = ", ".join(sorted(str(c.get("name")) for c in contexts)) or "none"
            raise SettingsError(
                f"context {context!r} is not in kubeconfig {kubeconfig} (it has: {names})"
            )
    else:
        chosen = current
    namespace = (chosen or {}).get("context", {}).get("namespace")
    return str(namespace) if namespace else None


class Kube:
    """One transport per process, shared by every thread; every request goes through `_request`
    (or `_stream`, for a watch), which adds the credentials and maps failures to ApiErrors."""

    def __init__(
        self,
        kubeconfig: str | None,
        *,
        context: str | None = None,
        user_agent: str = USER_AGENT,
        pool_size: int = 32,
        retry: RetryPolicy | None = None,
        retry_while: Callable[[], bool] = lambda: True,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """Writes are retried under `retry` only while `retry_while()` holds (the binder gives
        "this replica leads")."""
        loader: Any = kubernetes.config
        configuration = kubernetes.client.Configuration()
        try:
            if kubeconfig:
                # A KUBECONFIG-style list of files (a:b) is merged as kubectl merges it.
                loader.load_kube_config(
                    config_file=kubeconfig, context=context, client_configuration=configuration
                )
            else:
                loader.load_incluster_config(client_configuration=configuration)
        except (kubernetes.config.ConfigException, OSError, ValueError) as e:
            where = f"kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster service account"
            if context:
                where += f", context {context}"
            raise SettingsError(
                f"cannot configure the Kubernetes client from {where}: {e}; pass --kubeconfig "
                f"(or KUBECONFIG) outside a cluster"
            ) from e
        configuration.connection_pool_maxsize = pool_size
        self._configuration: Any = configuration
        try:
            self._transport = _transport(configuration, pool_size, user_agent)
        except (OSError, ssl.SSLError) as e:
            raise SettingsError(f"cannot set up TLS to the API server: {e}") from e
        self.retry = retry or RetryPolicy()
        self.retry_while = retry_while
        self._monotonic = monotonic
        self._watches: set[Stream] = set()
        self.events = EventAggregator()
        """Every Event the binder records goes through it (one rule: common/events.py)."""
        self._lock = threading.Lock()
        self._closed = False
        self._closing = threading.Event()
        self._unsure: set[tuple[str, str]] = set()
        """Pods whose Binding may have landed although its answer was lost."""
        self._auth: list[tuple[str, str]] = []
        self._auth_until = -math.inf

    @property
    def server(self) -> str:
        """The API server's URL, as the kubeconfig or the service account gave it."""
        return str(self._configuration.host)

    def close(self) -> None:
        self._closing.set()
        self.close_watches()
        self._transport.close()

    # ---- one request ---------------------------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        timeout: float = READ_TIMEOUT_SECONDS,
        body: JsonObject | None = None,
        content_type: str = _JSON,
        *,
        connect_timeout: float = CONNECT_TIMEOUT_SECONDS,
    ) -> bytes:
        """One request (`path` with its query), its answer read whole; the body of a 2xx answer,
        else the ApiError the answer's Status names. UnavailableError when no answer came."""
        headers = [("Accept", _JSON), *self._auth_headers()]
        payload = b""
        if body is not None:
            payload = json.dumps(body, separators=(",", ":")).encode()
            headers.append(("Content-Type", content_type))
        try:
            answer = self._transport.request(
                method, path, headers, payload, timeout, min(connect_timeout, timeout)
            )
        except OSError as e:
            raise _unreachable(e) from e
        if not 200 <= answer.status <= 299:
            raise _status_error(answer)
        return answer.body

    def _stream(self, path: str, timeout: float) -> Stream:
        """A GET whose answer is read as it comes (a watch); ApiError as `_request`."""
        headers = [("Accept", _JSON), *self._auth_headers()]
        try:
            stream = self._transport.stream("GET", path, headers, timeout, CONNECT_TIMEOUT_SECONDS)
        except OSError as e:
            raise _unreachable(e) from e
        if not 200 <= stream.status <= 299:
            try:
                body = stream.read()
            except OSError as e:
                raise _unreachable(e) from e
            finally:
                stream.close()
            raise _status_error(Answer(stream.status, stream.reason, stream.headers, body))
        return stream

    def _auth_headers(self) -> list[tuple[str, str]]:
        """The credential headers, read through the client's refresh hook at most once per
        AUTH_REFRESH_SECONDS. The hook re-reads an expired in-cluster token (the client itself
        does so once a minute), and re-applies the whole kubeconfig or in-cluster settings to the
        configuration each time, whose `host` setter scans the environment for proxies: 0.08 ms
        a write, more than the write itself."""
        now = self._monotonic()
        if now >= self._auth_until:
            headers = []
            for auth in self._configuration.auth_settings().values():
                if auth.get("in") == "header" and auth.get("value"):
                    headers.append((str(auth["key"]), str(auth["value"])))
            self._auth = headers
            self._auth_until = now + AUTH_REFRESH_SECONDS
        return self._auth

    def _write(self, what: str, attempt: Callable[[float], bytes]) -> bytes:
        """Run `attempt(read_timeout)` until the server gives a verdict, backing off while it is
        unavailable, within the retry budget and while `retry_while()` holds."""
        policy = self.retry
        started = self._monotonic()
        deadline = started + policy.budget_seconds
        delay = policy.initial_seconds
        tries = 1
        while True:
            left = deadline - self._monotonic()
            try:
                return attempt(max(1.0, min(READ_TIMEOUT_SECONDS, left)))
            except UnavailableError as e:
                wait = max(delay, e.retry_after or 0.0)
                if self._closing.is_set() or not self.retry_while():
                    raise
                if self._monotonic() + wait > deadline:
                    log.warning(
                        "Giving up %s after %d attempts in %.1f s: the API server is unavailable "
                        "(%s).",
                        what,
                        tries,
                        self._monotonic() - started,
                        e,
                    )
                    raise
                log.info(
                    "%s has failed (%s): attempt %d, trying again in %.1f s.",
                    what[:1].upper() + what[1:],
                    e,
                    tries,
                    wait,
                )
                self._closing.wait(wait)
                delay = min(delay * 2, policy.max_seconds)
                tries += 1

    # ---- list and watch ------------------------------------------------------------------------

    def nodes(self) -> Kind:
        return Kind("nodes", "/api/v1/nodes")

    def pods(self) -> Kind:
        return Kind("pods", "/api/v1/pods")

    def namespaces(self) -> Kind:
        return Kind("namespaces", "/api/v1/namespaces")

    def budgets(self) -> Kind:
        return Kind("poddisruptionbudgets", "/apis/policy/v1/poddisruptionbudgets")

    def quotas(self) -> Kind:
        return Kind("resourcequotas", "/api/v1/resourcequotas")

    def priority_classes(self) -> Kind:
        return Kind("priorityclasses", "/apis/scheduling.k8s.io/v1/priorityclasses")

    def leases(self, namespace: str) -> Kind:
        return Kind("leases", f"{_LEASES}/namespaces/{quote(namespace, safe='')}/leases")

    def list_all(self, kind: Kind, page: int = 500) -> tuple[list[JsonObject], str]:
        """Every object of the kind (paginated) and the list's resourceVersion. One attempt:
        raises UnavailableError when the server cannot answer."""
        items: list[JsonObject] = []
        token = None
        while True:
            query: dict[str, str | int] = {"limit": page}
            if token:
                query["continue"] = token
            data = self._request("GET", f"{kind.path}?{urlencode(query)}", LIST_TIMEOUT_SECONDS)
            body = json.loads(data)
            items.extend(body.get("items") or [])
            meta = body.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                return items, str(meta.get("resourceVersion", ""))

    def watch(
        self,
        kind: Kind,
        resource_version: str,
        on_open: Callable[[], None] = lambda: None,
    ) -> Iterator[tuple[str, JsonObject]]:
        """Watch events (type, object) from `resource_version`, bookmarks included; ends when the
        server closes the stream. `on_open` is called once the server has accepted the watch.
        Raises GoneError when the version is too old, UnavailableError when the server cannot be
        reached or the stream breaks."""
        query = urlencode(
            {
                "watch": "true",
                "resourceVersion": resource_version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": WATCH_TIMEOUT_SECONDS,
            }
        )
        stream = self._stream(f"{kind.path}?{query}", WATCH_TIMEOUT_SECONDS + 30)
        with self._lock:
            if self._closed:
                stream.close()
                return
            self._watches.add(stream)
        try:
            on_open()
            for line in stream.lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                kind_type = str(event.get("type", ""))
                obj = event.get("object") or {}
                if kind_type == "ERROR":
                    raise api_error(
                        int(obj.get("code") or 500),
                        str(obj.get("reason", "")),
                        str(obj.get("message", "")),
                    )
                yield kind_type, obj
        except (OSError, ValueError) as e:
            if not self._closed:
                raise UnavailableError(0, "WatchBroken", f"the {kind.name} watch broke: {e}") from e
        finally:
            with self._lock:
                self._watches.discard(stream)
            stream.close()

    def close_watches(self) -> None:
        """End every open watch now (from any thread), and refuse new ones."""
        with self._lock:
            self._closed = True
            streams = list(self._watches)
        for stream in streams:
            try:
                stream.shutdown()
            except Exception:  # noqa: S112 - best effort during shutdown
                continue

    # ---- writes for scheduling -----------------------------------------------------------------

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
            return self._request("PATCH", _pod_path(namespace, name), timeout, body, _PATCH)

        self._write(f"patching the annotations of pod {namespace}/{name}", attempt)

    def _bound_node(self, namespace: str, name: str, timeout: float) -> str:
        """The node the pod is bound to now ("" for none); one attempt."""
        data = self._request("GET", _pod_path(namespace, name), timeout)
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
                return self._request("POST", _pod_path(namespace, name, "binding"), timeout, body)
            except UnavailableError as e:
                unsure = e.status != 429  # a 429 is refused before anything is done
                raise

        try:
            self._write(f"binding pod {namespace}/{name} to {node}", attempt)
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
        self._request("POST", _pod_path(namespace, name, "eviction"), READ_TIMEOUT_SECONDS, body)

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
        self._write(
            f"setting PodScheduled=False on pod {namespace}/{name}",
            lambda timeout: self._request(
                "PATCH", _pod_path(namespace, name, "status"), timeout, body, _PATCH
            ),
        )

    def set_nominated_node(self, namespace: str, name: str, node: str) -> None:
        """status.nominatedNodeName: where a preemption made room for the pod."""
        body = {"status": {"nominatedNodeName": node}}
        self._write(
            f"nominating node {node} for pod {namespace}/{name}",
            lambda timeout: self._request(
                "PATCH", _pod_path(namespace, name, "status"), timeout, body, _PATCH
            ),
        )

    def pods_on_node(self, node: str) -> list[JsonObject]:
        """Every pod bound to `node` (one attempt)."""
        path = f"/api/v1/pods?fieldSelector={quote('spec.nodeName=' + node, safe='=')}"
        items: list[JsonObject] = (
            json.loads(self._request("GET", path, READ_TIMEOUT_SECONDS)).get("items") or []
        )
        return items

    def set_pod_condition(self, namespace: str, name: str, condition: JsonObject) -> None:
        """One condition on the pod's status, merged by type (the others untouched)."""
        body = {"status": {"conditions": [condition]}}
        self._write(
            f"setting {condition.get('type')} on pod {namespace}/{name}",
            lambda timeout: self._request(
                "PATCH", _pod_path(namespace, name, "status"), timeout, body, _PATCH
            ),
        )

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
        self._write(
            f"failing pod {namespace}/{name}",
            lambda timeout: self._request(
                "PATCH", _pod_path(namespace, name, "status"), timeout, body, _PATCH
            ),
        )

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete the pod with this uid (a pod recreated under the name meanwhile is kept)."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}}
        self._write(
            f"deleting pod {namespace}/{name}",
            lambda timeout: self._request("DELETE", _pod_path(namespace, name), timeout, body),
        )

    def put_budget(self, body: JsonObject) -> None:
        """Create the PodDisruptionBudget, or set the spec of the one of its name."""
        meta = body["metadata"]
        namespace, name = quote(meta["namespace"], safe=""), quote(meta["name"], safe="")
        path = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"
        what = f"PodDisruptionBudget {meta['namespace']}/{meta['name']}"
        try:
            self._write(
                f"creating {what}", lambda timeout: self._request("POST", path, timeout, body)
            )
        except ConflictError:
            patch = {"spec": body["spec"]}
            self._write(
                f"updating {what}",
                lambda timeout: self._request(
                    "PATCH", f"{path}/{name}", timeout, patch, _MERGE_PATCH
                ),
            )

    def delete_budget(self, namespace: str, name: str) -> None:
        """Delete the PodDisruptionBudget (gone already: nothing to do)."""
        path = (
            f"/apis/policy/v1/namespaces/{quote(namespace, safe='')}/poddisruptionbudgets/"
            f"{quote(name, safe='')}"
        )
        with contextlib.suppress(NotFoundError):
            self._write(
                f"deleting PodDisruptionBudget {namespace}/{name}",
                lambda timeout: self._request("DELETE", path, timeout),
            )

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

    # ---- TritonModels, their hosts and Services ------------------------------------------------

    def tritonmodels(self) -> Kind:
        return Kind("tritonmodels", _TRITONMODELS)

    def patch_model_status(self, namespace: str, name: str, uid: str, status: JsonObject) -> None:
        """A merge patch of a TritonModel's `status` subresource, only while it is the object
        with this uid (a model recreated under the name meanwhile is left alone: 409)."""
        body = {"metadata": {"uid": uid}, "status": status}
        path = f"{_models_path(namespace)}/{quote(name, safe='')}/status"
        self._write(
            f"writing the status of TritonModel {namespace}/{name}",
            lambda timeout: self._request("PATCH", path, timeout, body, _MERGE_PATCH),
        )

    def horizontal_pod_autoscalers(self) -> Kind:
        return Kind("horizontalpodautoscalers", "/apis/autoscaling/v2/horizontalpodautoscalers")

    def deployments(self) -> Kind:
        return Kind("deployments", "/apis/apps/v1/deployments")

    def scale(self, api: str, plural: str, namespace: str, name: str, replicas: int) -> None:
        """Set the replicas of an object (`api`: "/apis/GROUP/VERSION") through its `scale`
        subresource, as an HPA does, under the autoscaler's own field manager."""
        path = (
            f"{api}/namespaces/{quote(namespace, safe='')}/{plural}/{quote(name, safe='')}"
            f"/scale?fieldManager={AUTOSCALER}"
        )
        body = {"spec": {"replicas": replicas}}
        self._write(
            f"scaling {plural} {namespace}/{name} to {replicas}",
            lambda timeout: self._request("PATCH", path, timeout, body, _MERGE_PATCH),
        )

    def create_pod(self, namespace: str, body: JsonObject) -> None:
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods"
        self._write(
            f"creating pod {namespace}/{body['metadata']['name']}",
            lambda timeout: self._request("POST", path, timeout, body),
        )

    def merge_patch_pod(self, namespace: str, name: str, body: JsonObject) -> None:
        """A JSON merge patch of a pod (`null` removes a key)."""
        self._write(
            f"patching pod {namespace}/{name}",
            lambda timeout: self._request(
                "PATCH", _pod_path(namespace, name), timeout, body, _MERGE_PATCH
            ),
        )

    def create_service(self, namespace: str, body: JsonObject) -> None:
        """Create the Service (ConflictError when one of that name is there)."""
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/services"
        self._write(
            f"creating Service {namespace}/{body['metadata']['name']}",
            lambda timeout: self._request("POST", path, timeout, body),
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
                self._send_event(what, write)
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

    def _send_event(self, what: str, write: EventWrite) -> None:
        events = f"/api/v1/namespaces/{quote(write.namespace, safe='')}/events"
        if write.create:
            # 409: a retry after a lost answer finds the Event it named already there.
            with contextlib.suppress(ConflictError):
                self._write(
                    what, lambda timeout: self._request("POST", events, timeout, write.body)
                )
            return
        path = f"{events}/{quote(write.name, safe='')}"
        self._write(
            what, lambda timeout: self._request("PATCH", path, timeout, write.body, _MERGE_PATCH)
        )

    # ---- leases (one attempt each: the elector retries every retry period) ----------------------

    def _lease_path(self, namespace: str, name: str = "") -> str:
        path = f"{_LEASES}/namespaces/{quote(namespace, safe='')}/leases"
        return f"{path}/{quote(name, safe='')}" if name else path

    def get_lease(
        self, namespace: str, name: str, timeout: float = READ_TIMEOUT_SECONDS
    ) -> JsonObject | None:
        try:
            data = self._request("GET", self._lease_path(namespace, name), timeout)
        except NotFoundError:
            return None
        result: JsonObject = json.loads(data)
        return result

    def create_lease(
        self, namespace: str, body: JsonObject, timeout: float = READ_TIMEOUT_SECONDS
    ) -> JsonObject:
        result: JsonObject = json.loads(
            self._request("POST", self._lease_path(namespace), timeout, body)
        )
        return result

    def replace_lease(
        self, namespace: str, name: str, body: JsonObject, timeout: float = READ_TIMEOUT_SECONDS
    ) -> JsonObject:
        """PUT with the body's resourceVersion: a 409 means someone else wrote it first."""
        result: JsonObject = json.loads(
            self._request("PUT", self._lease_path(namespace, name), timeout, body)
        )
        return result

    def delete_lease(self, namespace: str, name: str) -> bool:
        """Delete a Lease; False when it was already gone."""
        try:
            self._request("DELETE", self._lease_path(namespace, name))
        except NotFoundError:
            return False
        return True

    # ---- nodes (`tritonshare uninstall-cleanup`; the binder itself never writes a Node) ---------

    def patch_node_annotations(self, name: str, annotations: Mapping[str, str | None]) -> None:
        """Set (None: remove) annotations of a Node, by a JSON merge patch."""
        path = f"/api/v1/nodes/{quote(name, safe='')}"
        body = {"metadata": {"annotations": dict(annotations)}}
        self._write(
            f"annotating node {name}",
            lambda timeout: self._request("PATCH", path, timeout, body, _MERGE_PATCH),
        )

    def merge_patch_node(self, name: str, body: JsonObject, subresource: str = "") -> None:
        """A JSON merge patch (RFC 7386: `null` removes a key) of a Node or its `status`."""
        path = f"/api/v1/nodes/{quote(name, safe='')}" + (f"/{subresource}" if subresource else "")
        self._request("PATCH", path, READ_TIMEOUT_SECONDS, body, _MERGE_PATCH)

    # ---- reads and dry runs for `tritonshare preflight` ------------------------------------------

    def read(self, path: str) -> JsonObject:
        """GET one object or document at `path` (`/version`, an object's path); one attempt."""
        result: JsonObject = json.loads(self._request("GET", path))
        return result

    def dry_run_create_pod(self, namespace: str, body: JsonObject) -> JsonObject:
        """Create the pod with `dryRun=All`: the API server defaults, validates and admits it
        (webhooks, Pod Security, ValidatingAdmissionPolicies, quotas) and stores nothing. The pod
        it would have stored, or the ApiError that refuses it; one attempt."""
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods?dryRun=All"
        result: JsonObject = json.loads(self._request("POST", path, READ_TIMEOUT_SECONDS, body))
        return result

    def read_pod(self, namespace: str, name: str) -> JsonObject:
        result: JsonObject = json.loads(self._request("GET", _pod_path(namespace, name)))
        return result


__all__ = [
    "USER_AGENT",
    "ApiError",
    "GoneError",
    "JsonObject",
    "Kind",
    "Kube",
    "RetryPolicy",
    "UnavailableError",
    "micro_time",
]
