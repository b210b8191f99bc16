"""The agent's adapter to the Kubernetes API, over the product's one door to it (common.kubeapi:
the kubeconfig or service account, one transport, one request with its credentials and errors).

It reads and patches the Node, renews the agent's Lease, reviews callers' tokens, reads pods, and
watches the pods bound to this node (fieldSelector spec.nodeName). Requests are blocking, so calls
run on this adapter's own small thread pool and the watch on one daemon thread that hands events
to the event loop, in turns by namespace (`agent.pods.podturns`). It returns plain JSON dicts and
turns a failed call into the agent's KubeError (a 404 read into None); deciding is left to the
callers. Each call is tried once: its caller owns the retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, TypeVar, Unpack
from urllib.parse import quote, urlencode

from agent import __version__
from agent.errors import KubeError
from agent.pods.podturns import PodTurns
from common.conditions import Condition, condition_patch
from common.events import EventText, node_ref, pod_ref
from common.kubeapi.errors import ApiError, KubeConfigError, NotFoundError
from common.kubeapi.eventrecorder import EventRecorder
from common.kubeapi.kubeconfig import client_configuration, transport_for
from common.kubeapi.paths import namespace_path, node_path, pod_path
from common.kubeapi.session import JSON, STRATEGIC_MERGE_PATCH, RetryPolicy, Session
from common.kubeapi.transport import Stream

log = logging.getLogger(__name__)

T = TypeVar("T")
JsonObject = dict[str, Any]
REQUEST_TIMEOUT = (5.0, 30.0)
"""Seconds to connect, and to wait for an answer, on every call but the watch."""
WORKERS = 4
"""Threads (and kept connections) for the calls; the watch has one more of each."""
LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
"""Where TokenReviews are created."""
EVENTS_PER_TURN = 32
"""Pod events applied in one turn of the loop before others' work runs."""


@dataclass(frozen=True)
class TokenReviewResult:
    """What TokenReview said about a token."""

    authenticated: bool
    username: str = ""
    audiences: tuple[str, ...] = ()
    extra: dict[str, list[str]] = field(default_factory=dict)
    error: str = ""


def _micro_time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class KubeClient:
    """One API client per process, configured from a kubeconfig file or in-cluster."""

    def __init__(
        self,
        kubeconfig: str | None,
        *,
        request_timeout: tuple[float, float] = REQUEST_TIMEOUT,
    ) -> None:
        self.request_timeout = request_timeout
        try:
            configuration = client_configuration(kubeconfig, None, WORKERS + 1)
            transport = transport_for(
                configuration,
                WORKERS + 1,
                f"tritonshare-agent/{__version__}",
                request_timeout[0],
            )
        except KubeConfigError as e:
            raise KubeError(str(e)) from e
        self.session = Session(configuration, transport, retry=RetryPolicy())
        self._executor = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="agent-kube")
        self._recorder = EventRecorder(self.session, action="Serving", retry=False)
        self.events = self._recorder.events
        """Every Event the agent records goes through it (one rule: common/events.py)."""

    async def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        self.session.close()

    async def _call(
        self,
        what: str,
        method: str,
        path: str,
        body: JsonObject | None = None,
        content_type: str = JSON,
    ) -> Any:
        """One request on the thread pool; its JSON body, None for 404, else KubeError."""
        connect, read = self.request_timeout

        def run() -> Any:
            # A hanging API server must not hold a worker (and the Lease renewal) forever.
            data = self.session.request(
                method, path, read, body, content_type, connect_timeout=connect
            )
            return json.loads(data) if data else None

        return await self._in_pool(what, run)

    async def _in_pool(self, what: str, run: Callable[[], T]) -> T | None:
        """`run()` on the thread pool: its result, None for 404, else KubeError."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, run)
        except NotFoundError:
            return None
        except ApiError as e:
            raise _kube_error(what, e) from e

    # Node.
    async def get_node(self, name: str) -> JsonObject | None:
        result: JsonObject | None = await self._call(f"read node {name}", "GET", node_path(name))
        return result

    async def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None]
    ) -> None:
        """Merge `annotations` into the Node's (None removes one)."""
        body = {"metadata": {"annotations": annotations}}
        await self._call(
            f"annotate node {name}", "PATCH", node_path(name), body, STRATEGIC_MERGE_PATCH
        )

    async def patch_node_capacity(self, name: str, resources: dict[str, str]) -> None:
        body = {"status": {"capacity": resources, "allocatable": resources}}
        await self._call(
            f"update node {name} capacity",
            "PATCH",
            node_path(name, "status"),
            body,
            STRATEGIC_MERGE_PATCH,
        )

    # Lease.
    async def renew_lease(
        self, namespace: str, name: str, holder: str, duration: int, now: datetime
    ) -> None:
        """One write: patch renewTime (and holder); create the Lease if it is missing."""
        spec = {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration,
            "renewTime": _micro_time(now),
        }
        leases = LEASES.format(namespace=quote(namespace, safe=""))
        patched = await self._call(
            f"renew lease {namespace}/{name}",
            "PATCH",
            f"{leases}/{quote(name, safe='')}",
            {"spec": spec},
            STRATEGIC_MERGE_PATCH,
        )
        if patched is not None:
            return
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {**spec, "acquireTime": _micro_time(now)},
        }
        await self._call(f"create lease {namespace}/{name}", "POST", leases, body)

    # Auth.
    async def review_token(self, token: str, audience: str) -> TokenReviewResult:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": [audience]},
        }
        review = await self._call("review a caller's token", "POST", REVIEWS, body)
        status = (review or {}).get("status") or {}
        user = status.get("user") or {}
        return TokenReviewResult(
            authenticated=bool(status.get("authenticated")),
            username=str(user.get("username", "")),
            audiences=tuple(status.get("audiences") or ()),
            extra={k: list(v) for k, v in (user.get("extra") or {}).items()},
            error=str(status.get("error", "")),
        )

    # Events.
    async def record_pod_event(
        self, namespace: str, name: str, uid: str, *, component: str, **said: Unpack[EventText]
    ) -> None:
        """An Event on a pod (Warning by default), as the kubelet records one (`kubectl
        describe pod`)."""
        await self.record_event(pod_ref(namespace, name, uid), component, "Serving", **said)

    async def record_node_event(
        self, name: str, *, component: str, **said: Unpack[EventText]
    ) -> None:
        """An Event on a Node, as the kubelet records one (`kubectl describe node`)."""
        await self.record_event(node_ref(name), component, "Checking", **said)

    async def record_event(
        self, involved: Mapping[str, str], component: str, action: str, **said: Unpack[EventText]
    ) -> None:
        """Record an Event about `involved` as the aggregator says: created, or its count
        raised (common.kubeapi.eventrecorder); an object already gone records nothing."""
        key = "/".join(filter(None, (involved.get("namespace"), involved["name"])))
        what = f"record an event on {involved['kind'].lower()} {key}"
        record = functools.partial(
            self._recorder.record_object_event,
            involved,
            reporting_instance=component,
            component=component,
            action=action,
            **said,
        )
        await self._in_pool(what, record)

    async def fail_pod(self, namespace: str, name: str, reason: str, message: str) -> None:
        """Mark a pod Failed with a reason, as the kubelet does for an evicted pod."""
        body = {"status": {"phase": "Failed", "reason": reason, "message": message[:1024]}}
        await self._call(
            f"mark pod {namespace}/{name} Failed",
            "PATCH",
            pod_path(namespace, name, "status"),
            body,
            STRATEGIC_MERGE_PATCH,
        )

    async def set_pod_condition(
        self, namespace: str, name: str, condition: Condition, *, was: str | None = None
    ) -> None:
        """Set one condition on a pod's status (a strategic-merge patch: merged by type, the
        pod's other conditions untouched), as the kubelet sets Ready. `was`: its status as last
        seen (None: not known); while the status stays, its lastTransitionTime is kept."""
        bounded = replace(condition, message=condition.message[:1024])
        body = {"status": {"conditions": [condition_patch(bounded, was)]}}
        await self._call(
            f"set {condition.type}={condition.status} on pod {namespace}/{name}",
            "PATCH",
            pod_path(namespace, name, "status"),
            body,
            STRATEGIC_MERGE_PATCH,
        )

    async def remove_pod_condition(self, namespace: str, name: str, condition_type: str) -> None:
        """Take one condition off a pod's status (a strategic-merge patch deleting it by type)."""
        body = {"status": {"conditions": [{"type": condition_type, "$patch": "delete"}]}}
        await self._call(
            f"remove {condition_type} from pod {namespace}/{name}",
            "PATCH",
            pod_path(namespace, name, "status"),
            body,
            STRATEGIC_MERGE_PATCH,
        )

    # Pods.
    async def get_pod(self, namespace: str, name: str) -> JsonObject | None:
        result: JsonObject | None = await self._call(
            f"read pod {namespace}/{name}", "GET", pod_path(namespace, name)
        )
        return result

    async def list_pods(self, namespace: str) -> list[JsonObject]:
        """Every pod of `namespace`."""
        result = await self._call(
            f"list the pods of namespace {namespace}", "GET", f"{namespace_path(namespace)}/pods"
        )
        items: list[JsonObject] = (result or {}).get("items") or []
        return items

    def watch_pods(
        self,
        node_name: str,
        on_list: Callable[[list[JsonObject]], None],
        on_event: Callable[[str, JsonObject], None],
        *,
        timeout_seconds: int = 300,
    ) -> PodWatch:
        """Start watching this node's pods; callbacks run on the event loop's thread."""
        watch = PodWatch(self, node_name, on_list, on_event, timeout_seconds)
        watch.start(asyncio.get_running_loop())
        return watch


class PodWatch:
    """List, then watch from that resourceVersion; relist on 410 Gone or a broken stream."""

    def __init__(
        self,
        kube: KubeClient,
        node_name: str,
        on_list: Callable[[list[JsonObject]], None],
        on_event: Callable[[str, JsonObject], None],
        timeout_seconds: int,
    ) -> None:
        self._kube = kube
        self._selector = f"spec.nodeName={node_name}"
        self._on_list = on_list
        self._on_event = on_event
        self._timeout = timeout_seconds
        self._stopped = threading.Event()
        self._response: Stream | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._turns = PodTurns()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        # A daemon thread: a blocked read must never keep the process alive at exit.
        self._thread = threading.Thread(target=self._run, name="agent-pod-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()

    def _deliver(self, wake: bool) -> None:
        assert self._loop is not None
        if wake:
            with contextlib.suppress(RuntimeError):  # the loop is closing
                self._loop.call_soon_threadsafe(self._take)

    def _take(self) -> None:
        """On the loop: apply a batch of events in turns by namespace (`agent.pods.podturns`), and
        leave the loop to others before the next batch."""
        listed, events, more = self._turns.take(EVENTS_PER_TURN)
        if more:  # first: a failing callback must not stop the events after it
            asyncio.get_running_loop().call_soon(self._take)
        calls: list[Callable[[], None]] = []
        if listed is not None:
            calls.append(functools.partial(self._on_list, listed))
        calls += [functools.partial(self._on_event, kind, obj) for kind, obj in events]
        for call in calls:
            try:
                call()
            except Exception:
                log.exception(
                    "Applying a pod event failed; the pod's next event or list applies it again."
                )

    def _run(self) -> None:
        session = self._kube.session
        connect, read = self._kube.request_timeout
        backoff = 0.5
        while not self._stopped.is_set():
            try:
                query = urlencode({"fieldSelector": self._selector})
                listed = session.request(
                    "GET", f"/api/v1/pods?{query}", read, connect_timeout=connect
                )
                body = json.loads(listed)
                self._deliver(self._turns.listed(body.get("items") or []))
                version = body["metadata"]["resourceVersion"]
                backoff = 0.5
                while not self._stopped.is_set():
                    version = self._watch_once(version)
                    if version is None:
                        break  # 410 Gone: relist
            except Exception as e:
                if self._stopped.is_set():
                    return
                log.warning(
                    "Watching this node's pods failed (%s): retrying in %.1f s.", e, backoff
                )
                self._stopped.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _watch_once(self, version: str) -> str | None:
        query = urlencode(
            {
                "fieldSelector": self._selector,
                "watch": "true",
                "resourceVersion": version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(self._timeout),
            }
        )
        response = self._kube.session.stream(f"/api/v1/pods?{query}", self._timeout + 30)
        self._response = response
        try:
            for line in response.lines():
                if self._stopped.is_set():
                    return version
                if not line:
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        return None
                    raise KubeError(f"the pod watch reported {obj.get('message', obj)}")
                version = (obj.get("metadata") or {}).get("resourceVersion", version)
                if kind != "BOOKMARK":
                    self._deliver(self._turns.put(str(kind), obj))
        finally:
            self._response = None
            response.close()
        return version


def _kube_error(what: str, e: ApiError) -> KubeError:
    """The agent's KubeError for a failed call, in its words."""
    if e.status == 0:
        return KubeError(f"the Kubernetes API is unreachable while trying to {what}: {e.message}")
    return KubeError(
        f"the Kubernetes API refused to {what} ({e.status} {e.reason}: {e.message[:300]})"
    )
