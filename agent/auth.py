"""Who may call the agent: projected service-account tokens checked with TokenReview.

A model call is accepted only from a pod bound to THIS node, scheduled by tritonshare, not
terminated, whose model-id annotation is the model it names, and whose uid is the one the token
was bound to (so a token of a deleted pod cannot speak for a new pod of the same name). Listing
calls are for the platform's own service accounts. Refusals say which check failed:
UNAUTHENTICATED for a missing or rejected token, PERMISSION_DENIED for a valid token that may not
do this. TokenReview answers are reused briefly; the pod is read fresh on every call.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agent.errors import PermissionDeniedError, UnauthenticatedError
from agent.kube import JsonObject, TokenReviewResult
from agent.pods import PodInfo, pod_from_dict
from common.contract import Keys

POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


class TokenReviewer(Protocol):
    async def review_token(self, token: str, audience: str) -> TokenReviewResult: ...

    async def get_pod(self, namespace: str, name: str) -> JsonObject | None: ...


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: its username and, for a pod's token, the pod."""

    username: str
    namespace: str = ""
    pod_name: str = ""
    pod_uid: str = ""

    @property
    def pod_key(self) -> str:
        return f"{self.namespace}/{self.pod_name}" if self.pod_name else ""


def bearer_token(metadata: Iterable[Any] | None) -> str:
    """The token of an `authorization: Bearer ...` entry, or UnauthenticatedError."""
    for key, value in metadata or ():
        if key.lower() == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            scheme, _, token = text.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            raise UnauthenticatedError(
                "the authorization metadata is not 'Bearer <token>'; send the pod's projected "
                "service-account token"
            )
    raise UnauthenticatedError(
        "no authorization metadata; send 'authorization: Bearer <token>' with the pod's "
        "projected service-account token (audience tritonshare-agent)"
    )


class Authorizer:
    """Checks callers against TokenReview and the pods of this node."""

    def __init__(
        self,
        kube: TokenReviewer,
        *,
        node_name: str,
        scheduler_name: str,
        keys: Keys,
        audience: str,
        platform_accounts: Sequence[str],
        cache_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._kube = kube
        self.node_name = node_name
        self.scheduler_name = scheduler_name
        self.keys = keys
        self.audience = audience
        self.platform_accounts = frozenset(platform_accounts)
        self._cache_seconds = cache_seconds
        self._clock = clock
        self._cache: dict[str, tuple[float, Caller]] = {}

    async def authenticate(self, metadata: Iterable[Any] | None) -> Caller:
        token = bearer_token(metadata)
        digest = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        cached = self._cache.get(digest)
        if cached is not None and now - cached[0] < self._cache_seconds:
            return cached[1]
        review = await self._kube.review_token(token, self.audience)
        if not review.authenticated:
            raise UnauthenticatedError(
                f"the token was rejected by TokenReview ({review.error or 'not authenticated'}); "
                f"send a current projected service-account token with audience {self.audience!r}"
            )
        if review.audiences and self.audience not in review.audiences:
            raise UnauthenticatedError(
                f"the token is for audiences {list(review.audiences)}, not {self.audience!r}; "
                f"project the token with audience {self.audience!r}"
            )
        caller = _caller_from(review)
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[digest] = (now, caller)
        return caller

    def is_platform(self, caller: Caller) -> bool:
        return caller.username in self.platform_accounts

    def require_platform(self, caller: Caller, what: str) -> None:
        if not self.is_platform(caller):
            raise PermissionDeniedError(
                f"{caller.username} may not {what}: only the platform's service accounts "
                f"({', '.join(sorted(self.platform_accounts)) or 'none configured'}) may"
            )

    async def authorize_model(self, caller: Caller, model_id: str) -> PodInfo:
        """The caller's pod, if it may act on `model_id` on this node; else PermissionDenied."""
        if not caller.pod_name:
            raise PermissionDeniedError(
                f"{caller.username} presented a token not bound to a pod; use the model pod's "
                f"projected service-account token"
            )
        obj = await self._kube.get_pod(caller.namespace, caller.pod_name)
        if obj is None:
            raise PermissionDeniedError(f"pod {caller.pod_key} of the token no longer exists")
        pod = pod_from_dict(obj, self.keys)
        if caller.pod_uid and pod.uid != caller.pod_uid:
            raise PermissionDeniedError(
                f"the token was issued to an earlier pod named {caller.pod_key} (uid "
                f"{caller.pod_uid}), not the current one (uid {pod.uid})"
            )
        if pod.node_name != self.node_name:
            raise PermissionDeniedError(
                f"pod {pod.key} is bound to node {pod.node_name or '(none)'}, not to "
                f"{self.node_name}; call the agent of its own node"
            )
        if pod.scheduler_name != self.scheduler_name:
            raise PermissionDeniedError(
                f"pod {pod.key} is scheduled by {pod.scheduler_name!r}, not "
                f"{self.scheduler_name!r}; only tritonshare pods may use the agent"
            )
        if pod.terminated:
            raise PermissionDeniedError(f"pod {pod.key} has terminated ({pod.phase})")
        if pod.model_id != model_id:
            raise PermissionDeniedError(
                f"pod {pod.key} is annotated {self.keys.model_id}={pod.model_id!r}; it may act "
                f"only on that model, not on {model_id!r}"
            )
        return pod


def _caller_from(review: TokenReviewResult) -> Caller:
    username = review.username
    namespace = ""
    if username.startswith(SERVICE_ACCOUNT_PREFIX):
        namespace = username.removeprefix(SERVICE_ACCOUNT_PREFIX).partition(":")[0]
    extra: Mapping[str, list[str]] = review.extra
    pod_names = extra.get(POD_NAME_EXTRA) or []
    pod_uids = extra.get(POD_UID_EXTRA) or []
    return Caller(
        username=username,
        namespace=namespace,
        pod_name=pod_names[0] if pod_names else "",
        pod_uid=pod_uids[0] if pod_uids else "",
    )
