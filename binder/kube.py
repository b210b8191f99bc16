"""The binder's only door to the Kubernetes API (the only binder module importing `kubernetes`).

Blocking calls, meant to run on worker threads: list and watch raw API dicts (camelCase, no model
deserialisation), patch a pod's annotations, post a Binding, record an Event, set the PodScheduled
condition, and read/write the leader Lease. Every answer is read whole and its connection handed
back to the pool, so calls reuse a few keep-alive connections instead of opening one each.

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

import json
import logging
import math
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlsplit

import kubernetes.client
import kubernetes.config
import urllib3
from kubernetes.client.exceptions import ApiException

from binder.errors import (
    ApiError,
    ConfigError,
    ConflictError,
    GoneError,
    NotFoundError,
    UnavailableError,
    api_error,
)
from binder.wire import Answer, Connections
from common.events import pod_event

log = logging.getLogger(__name__)

JsonObject = dict[str, Any]
VERSION = "0.1.0"
USER_AGENT = f"tritonshare-binder/{VERSION}"
WATCH_TIMEOUT_SECONDS = 300
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
    """A watched collection."""

    name: str
    list_call: Callable[..., Any]
    namespace: str | None = None


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _retry_after(headers: Any) -> float | None:
    try:
        value = headers.get("Retry-After") if headers else None
    except AttributeError:
        return None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the server's own clock, not worth trusting; back off instead


def _status_error(status: int, reason: str, body: str, headers: Any) -> ApiError:
    """The ApiError for an answer that is not a success, from its Status body."""
    message = body or reason
    try:
        status_body = json.loads(body) if body else {}
        reason = str(status_body.get("reason") or reason)
        message = str(status_body.get("message") or message)
    except (ValueError, AttributeError):
        pass
    return api_error(status, reason, message, _retry_after(headers))


def _error(e: ApiException) -> ApiError:
    return _status_error(int(e.status or 0), str(e.reason or ""), str(e.body or ""), e.headers)


def _unreachable(e: Exception) -> UnavailableError:
    """No answer: refused, reset, timed out, or a broken stream."""
    return UnavailableError(0, type(e).__name__, f"the API server could not be reached: {e}")


_TRANSPORT_ERRORS = (urllib3.exceptions.HTTPError, OSError)
_PATCH = "application/strategic-merge-patch+json"
"""What the generated client sends for a dict patch body; kept, so nothing changes server-side."""


def _wire(configuration: Any, keep: int) -> tuple[Connections, str, str] | None:
    """Connections for the writes, with the server's path prefix and Host header, from the
    client's own configuration (same server, CA, client certificate, SNI); None when a proxy is
    configured, which only the official client's urllib3 path knows how to cross."""
    if configuration.proxy:
        return None
    url = urlsplit(configuration.host)
    if url.scheme not in ("http", "https") or not url.hostname:
        return None
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
    return connections, url.path.rstrip("/"), url.netloc


def _pod_path(namespace: str, name: str, subresource: str = "") -> str:
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"
    return f"{path}/{subresource}" if subresource else path


def kubeconfig_namespace(kubeconfig: str, context: str | None = None) -> str | None:
    """The namespace the kubeconfig's `context` (default: its current context) names, as kubectl
    reads it; None when it names none. Raises ConfigError for an unreadable kubeconfig or an
    unknown context."""
    try:
        loader: Any = kubernetes.config
        contexts, current = loader.list_kube_config_contexts(config_file=kubeconfig)
    except (kubernetes.config.ConfigException, OSError, ValueError) as e:
        raise ConfigError(f"cannot read kubeconfig {kubeconfig}: {e}") from e
    if context:
        chosen = next((c for c in contexts if c.get("name") == context), None)
        if chosen is None:
            names = ", ".join(sorted(str(c.get("name")) for c in contexts)) or "none"
            raise ConfigError(
                f"context {context!r} is not in kubeconfig {kubeconfig} (it has: {names})"
            )
    else:
        chosen = current
    namespace = (chosen or {}).get("context", {}).get("namespace")
    return str(namespace) if namespace else None


class Kube:
    """One ApiClient per process, shared by every thread (urllib3's pool is thread-safe)."""

    def __init__(
        self,
        kubeconfig: str | None,
        *,
        context: str | None = None,
        user_agent: str = USER_AGENT,
        pool_size: int = 32,
        retry: RetryPolicy | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        # The client's own annotations do not describe raw (`_preload_content=False`) calls.
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
            raise ConfigError(
                f"cannot configure the Kubernetes client from {where}: {e}; pass --kubeconfig "
                f"(or KUBECONFIG) outside a cluster"
            ) from e
        configuration.connection_pool_maxsize = pool_size
        # Connection failures are retried by `_write` and the informers, with backoff and a
        # sentence in the log; urllib3's own three immediate retries would only add noise. One
        # immediate retry of a read stays, for a pooled connection the server closed while idle.
        configuration.retries = urllib3.Retry(total=1, connect=0, read=1, redirect=0, status=0)
        self.client: Any = kubernetes.client.ApiClient(configuration)
        self.client.user_agent = user_agent
        self._configuration: Any = configuration
        try:
            self._wire = _wire(configuration, pool_size)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"cannot set up TLS to the API server: {e}") from e
        self.core: Any = kubernetes.client.CoreV1Api(self.client)
        self.coordination: Any = kubernetes.client.CoordinationV1Api(self.client)
        self.retry = retry or RetryPolicy()
        self.retry_while: Callable[[], bool] = lambda: True
        """Writes are retried only while this holds (set to "this replica leads")."""
        self._monotonic = monotonic
        self._watches: set[urllib3.HTTPResponse] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._closing = threading.Event()
        self._unsure: set[tuple[str, str]] = set()
        """Pods whose Binding may have landed although its answer was lost."""
        self._auth: list[str] = []
        self._auth_until = -math.inf

    def close(self) -> None:
        self._closing.set()
        self.close_watches()
        if self._wire is not None:
            self._wire[0].close()
        self.client.close()

    # ---- one request ---------------------------------------------------------------------------

    def _send(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> bytes:
        """One request; its answer read whole and its connection handed back to the pool (an
        unread answer keeps its connection busy, so the next call would open a new one)."""
        kwargs.setdefault("_request_timeout", (CONNECT_TIMEOUT_SECONDS, READ_TIMEOUT_SECONDS))
        try:
            response = call(*args, _preload_content=False, **kwargs)
        except ApiException as e:
            raise _error(e) from e
        except _TRANSPORT_ERRORS as e:
            raise _unreachable(e) from e
        try:
            data: bytes = response.data
        except _TRANSPORT_ERRORS as e:
            raise _unreachable(e) from e
        finally:
            response.release_conn()
        return data

    def _request(
        self,
        method: str,
        path: str,
        timeout: float,
        body: JsonObject | None = None,
        content_type: str = "application/json",
    ) -> bytes:
        """One request for a body built here, through the official client's own request layer
        (same configuration, credentials, TLS and connection pool), without the generated
        methods' per-call argument validation: a third of a write's CPU, spent checking dicts
        this module wrote. Answer read whole, connection handed back to the pool.

        Without a proxy the request goes through binder.wire instead, on connections of its own
        to the same server with the same TLS settings and credentials: a seventh of the CPU."""
        if self._wire is not None:
            return self._send_wire(method, path, timeout, body, content_type)
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        request = self.client.param_serialize(
            method=method,
            resource_path=path,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self.client.call_api(
                *request, _request_timeout=(CONNECT_TIMEOUT_SECONDS, timeout)
            )
        except ApiException as e:
            raise _error(e) from e
        except _TRANSPORT_ERRORS as e:
            raise _unreachable(e) from e
        try:
            data: bytes = response.read()
        except _TRANSPORT_ERRORS as e:
            raise _unreachable(e) from e
        finally:
            response.response.release_conn()
        if not 200 <= response.status <= 299:
            text = data.decode("utf-8", "replace")
            raise _status_error(response.status, str(response.reason or ""), text, response.headers)
        return data

    def _send_wire(
        self,
        method: str,
        path: str,
        timeout: float,
        body: JsonObject | None,
        content_type: str,
    ) -> bytes:
        assert self._wire is not None
        connections, prefix, host = self._wire
        payload = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        lines = [
            f"{method} {prefix}{path} HTTP/1.1",
            f"Host: {host}",
            f"User-Agent: {self.client.user_agent}",
            "Accept: application/json",
        ]
        if body is not None:
            lines.append(f"Content-Type: {content_type}")
            lines.append(f"Content-Length: {len(payload)}")
        lines.extend(self._auth_headers())
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        try:
            answer: Answer = connections.request(head, payload, timeout)
        except OSError as e:
            raise _unreachable(e) from e
        if not 200 <= answer.status <= 299:
            retry_after = answer.headers.get("retry-after")
            raise _status_error(
                answer.status,
                answer.reason,
                answer.body.decode("utf-8", "replace"),
                {"Retry-After": retry_after} if retry_after is not None else {},
            )
        return answer.body

    def _auth_headers(self) -> list[str]:
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
                    headers.append(f"{auth['key']}: {auth['value']}")
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
        return Kind("nodes", self.core.list_node)

    def pods(self) -> Kind:
        return Kind("pods", self.core.list_pod_for_all_namespaces)

    def leases(self, namespace: str) -> Kind:
        return Kind("leases", self.coordination.list_namespaced_lease, namespace)

    def _call(self, kind: Kind, **kwargs: Any) -> Any:
        if kind.namespace is not None:
            return kind.list_call(kind.namespace, _preload_content=False, **kwargs)
        return kind.list_call(_preload_content=False, **kwargs)

    def list_all(self, kind: Kind, page: int = 500) -> tuple[list[JsonObject], str]:
        """Every object of the kind (paginated) and the list's resourceVersion. One attempt:
        raises UnavailableError when the server cannot answer."""
        items: list[JsonObject] = []
        token = None
        args = (kind.namespace,) if kind.namespace is not None else ()
        while True:
            kwargs: dict[str, Any] = {"limit": page, "_request_timeout": (10, 60)}
            if token:
                kwargs["_continue"] = token
            body = json.loads(self._send(kind.list_call, *args, **kwargs))
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
        try:
            response = self._call(
                kind,
                watch=True,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=WATCH_TIMEOUT_SECONDS,
                _request_timeout=(10, WATCH_TIMEOUT_SECONDS + 30),
            )
        except ApiException as e:
            raise _error(e) from e
        except _TRANSPORT_ERRORS as e:
            raise _unreachable(e) from e
        with self._lock:
            if self._closed:
                response.release_conn()
                return
            self._watches.add(response)
        try:
            on_open()
            for line in response:
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
        except (*_TRANSPORT_ERRORS, ValueError) as e:
            if not self._closed:
                raise UnavailableError(0, "WatchBroken", f"the {kind.name} watch broke: {e}") from e
        finally:
            with self._lock:
                self._watches.discard(response)
            response.release_conn()

    def close_watches(self) -> None:
        """End every open watch now (from any thread), and refuse new ones."""
        with self._lock:
            self._closed = True
            responses = list(self._watches)
        for response in responses:
            try:
                response.shutdown()
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

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        """POST pods/{name}/binding, as kube-scheduler does. Raw answers: the client's V1Binding
        model fails to read the Status the server answers with (kubernetes-client/python #547,
        #825).

        After an attempt whose answer was lost (no answer, or a 5xx from a server that may have
        committed it), the pod is read before the next attempt: already on `node` is success,
        on another node a ConflictError. If the budget runs out still unsure, the pod is
        remembered so its next annotation patch checks first."""
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
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
        self, namespace: str, name: str, message: str, reason: str = "Unschedulable"
    ) -> None:
        """PodScheduled=False with `reason` (Unschedulable, or SchedulerError when a plugin
        failed the attempt), as kube-scheduler writes it."""
        body = {
            "status": {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": reason,
                        "message": message,
                        "lastProbeTime": None,
                        "lastTransitionTime": now_rfc3339(),
                    }
                ]
            }
        }
        self._write(
            f"setting PodScheduled=False on pod {namespace}/{name}",
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

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete the pod with this uid (a pod recreated under the name meanwhile is kept)."""
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid}}
        self._write(
            f"deleting pod {namespace}/{name}",
            lambda timeout: self._request("DELETE", _pod_path(namespace, name), timeout, body),
        )

    def record_event(
        self,
        namespace: str,
        name: str,
        uid: str,
        *,
        reason: str,
        message: str,
        reporting_instance: str,
        event_type: str = "Warning",
        component: str = "tritonshare",
    ) -> None:
        """A core/v1 Event about a pod, as kube-scheduler records one."""
        body = pod_event(
            namespace,
            name,
            uid,
            reason=reason,
            message=message,
            component=component,
            instance=reporting_instance,
            action="Scheduling",
            event_type=event_type,
        )
        self._write(
            f"recording a {reason} event for pod {namespace}/{name}",
            lambda timeout: self._request(
                "POST", f"/api/v1/namespaces/{quote(namespace, safe='')}/events", timeout, body
            ),
        )

    # ---- leases (one attempt each: the elector retries every retry period) ----------------------

    def get_lease(
        self, namespace: str, name: str, timeout: float = READ_TIMEOUT_SECONDS
    ) -> JsonObject | None:
        try:
            data = self._send(
                self.coordination.read_namespaced_lease,
                name,
                namespace,
                _request_timeout=(min(CONNECT_TIMEOUT_SECONDS, timeout), timeout),
            )
        except NotFoundError:
            return None
        result: JsonObject = json.loads(data)
        return result

    def create_lease(
        self, namespace: str, body: JsonObject, timeout: float = READ_TIMEOUT_SECONDS
    ) -> JsonObject:
        data = self._send(
            self.coordination.create_namespaced_lease,
            namespace,
            body,
            _request_timeout=(min(CONNECT_TIMEOUT_SECONDS, timeout), timeout),
        )
        result: JsonObject = json.loads(data)
        return result

    def replace_lease(
        self, namespace: str, name: str, body: JsonObject, timeout: float = READ_TIMEOUT_SECONDS
    ) -> JsonObject:
        """PUT with the body's resourceVersion: a 409 means someone else wrote it first."""
        data = self._send(
            self.coordination.replace_namespaced_lease,
            name,
            namespace,
            body,
            _request_timeout=(min(CONNECT_TIMEOUT_SECONDS, timeout), timeout),
        )
        result: JsonObject = json.loads(data)
        return result

    def read_pod(self, namespace: str, name: str) -> JsonObject:
        result: JsonObject = json.loads(self._send(self.core.read_namespaced_pod, name, namespace))
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
