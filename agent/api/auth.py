"""Who may call the agent: projected service-account tokens checked with TokenReview, and the
pods they speak for, whose placement must be proved.

Authentication: only tokens TokenReview accepts for the agent's audience (a review that names no
audience is refused), bound to a pod (the review names the pod and its uid). A review is reused
until the earlier of the cache period and the token's own `exp` (read from the token once the
review has vouched for it); a refused token is remembered briefly, so a flood of bad tokens costs
the API server one review per token and period, and at most MAX_REVIEWS_IN_FLIGHT reviews are
sent at once (the other callers wait, holding no message: `agent.api.callgate` authenticates first).

Authorization of a model call: the token's pod, read fresh, must still be the pod the token was
bound to (same uid), bound to THIS node, scheduled by tritonshare, not terminated, name the model
in its model-id annotation, and carry a placement proof that verifies for exactly that pod, node,
GPU and model (`agent.pods.provenpods`). A model host's token (the model-host label) may act on
model X only as the host's replica of X: the host's annotation names it and its proof verifies here,
as the binder signed it for the host's namespace and node. Ownership of the model id among proven
pods is decided by `agent.models.nodemodels`. Refusals say which check failed: UNAUTHENTICATED for a
missing or rejected token, PERMISSION_DENIED for a valid token that may not do this.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agent.errors import NotPlacedError, PermissionDeniedError, UnauthenticatedError
from agent.kube.client import JsonObject, TokenReviewResult
from agent.pods.modelpods import PodInfo, hosted_from_dict, is_host, pod_from_dict
from agent.pods.provenpods import PlacementVerifier, Proven
from common.contract import Keys
from common.hosted import (
    HostedReplica,
    Parked,
    decode_parked,
    host_label,
    hosted_models_annotation,
    parked_models_annotation,
)

POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
CACHE_LIMIT = 10_000
MAX_REVIEWS_IN_FLIGHT = 8


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
    """Checks callers against TokenReview, the pods of this node, and their placement proofs."""

    def __init__(
        self,
        kube: TokenReviewer,
        verifier: PlacementVerifier,
        *,
        node_name: str,
        scheduler_name: str,
        keys: Keys,
        audience: str,
        platform_accounts: Sequence[str],
        cache_seconds: float = 30.0,
        failure_cache_seconds: float = 5.0,
        clock: Callable[[], float] = time.time,
        watched_host: Callable[[str, str], JsonObject | None],
        max_hosted: Callable[[], int] = lambda: 0,
    ) -> None:
        """`max_hosted()`: the most replicas a host of this node may name (0: not known)."""
        self._kube = kube
        self._max_hosted = max_hosted
        self._watched_host = watched_host
        """A model host as the agent's pod watch shows it (`NodePods.watched_host`): a host
        lists its replicas every fraction of a second, which a fresh read each time would turn
        into API load per host; its other calls read it fresh."""
        self._verifier = verifier
        self.node_name = node_name
        self.scheduler_name = scheduler_name
        self.keys = keys
        self.audience = audience
        self.platform_accounts = frozenset(platform_accounts)
        self._cache_seconds = cache_seconds
        self._failure_seconds = failure_cache_seconds
        self._clock = clock
        """Wall-clock seconds (time.time): the token's `exp` is wall-clock too."""
        self._cache: dict[str, tuple[float, Caller]] = {}
        """Token digest -> (valid until, caller)."""
        self._refused: dict[str, tuple[float, str]] = {}
        """Token digest -> (remembered until, why it was refused)."""
        self.reviews = 0
        """TokenReviews sent, for tests and metrics."""
        self._reviewing = asyncio.Semaphore(MAX_REVIEWS_IN_FLIGHT)

    def known(self, metadata: Iterable[Any] | None) -> Caller | None:
        """The caller, when a review of its token is cached; None when it needs one. Raises
        UnauthenticatedError for a malformed header or a token refused moments ago."""
        token = bearer_token(metadata)
        digest = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        cached = self._cache.get(digest)
        if cached is not None:
            if now < cached[0]:
                return cached[1]
            del self._cache[digest]
        refused = self._refused.get(digest)
        if refused is not None:
            if now < refused[0]:
                raise UnauthenticatedError(refused[1])
            del self._refused[digest]
        return None

    async def authenticate(self, metadata: Iterable[Any] | None) -> Caller:
        known = self.known(metadata)
        if known is not None:
            return known
        token = bearer_token(metadata)
        digest = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        try:
            async with self._reviewing:
                caller, expires = await self._review(token, now)
        except UnauthenticatedError as e:
            _bounded(self._refused)[digest] = (now + self._failure_seconds, str(e))
            raise
        until = min(now + self._cache_seconds, expires)
        if until > now:
            _bounded(self._cache)[digest] = (until, caller)
        return caller

    async def _review(self, token: str, now: float) -> tuple[Caller, float]:
        """The caller and when its token expires, or UnauthenticatedError."""
        self.reviews += 1
        review = await self._kube.review_token(token, self.audience)
        if not review.authenticated:
            raise UnauthenticatedError(
                f"the token was rejected by TokenReview ({review.error or 'not authenticated'}); "
                f"send a current projected service-account token with audience {self.audience!r}"
            )
        if self.audience not in review.audiences:
            raise UnauthenticatedError(
                f"TokenReview did not confirm the audience {self.audience!r} for this token "
                f"(it confirmed {list(review.audiences)}); project the token with audience "
                f"{self.audience!r}"
            )
        caller = _caller_from(review)
        if not (caller.pod_name and caller.pod_uid):
            raise UnauthenticatedError(
                f"{caller.username or 'the caller'} presented a token not bound to a pod; use the "
                f"pod's projected service-account token (a serviceAccountToken volume)"
            )
        expires = token_expiry(token)
        if expires is None:
            raise UnauthenticatedError(
                "the token carries no readable expiry (exp); send a projected service-account "
                "token, which always has one"
            )
        if expires <= now:
            raise UnauthenticatedError("the token has expired; send the pod's current token")
        return caller, expires

    def is_platform(self, caller: Caller) -> bool:
        return caller.username in self.platform_accounts

    def require_platform(self, caller: Caller, what: str) -> None:
        if not self.is_platform(caller):
            raise PermissionDeniedError(
                f"{caller.username} may not {what}: only the platform's service accounts "
                f"({', '.join(sorted(self.platform_accounts)) or 'none configured'}) may"
            )

    async def authorize_model(
        self, caller: Caller, model_id: str, replica: int | None = None
    ) -> Proven:
        """The caller's pod (or, for a model host, its replica `replica` of `model_id`; None:
        its only one) with its proven placement, if it may act on `model_id` on this node; else
        PermissionDeniedError (a NotPlacedError when the proof is what fails)."""
        obj, pod = await self._own_pod(caller)
        if is_host(obj, self.keys):
            return self._replica(obj, pod.key, model_id, replica)
        if pod.model_id != model_id:
            raise PermissionDeniedError(
                f"pod {pod.key} is annotated {self.keys.model_id}={pod.model_id!r}; it may act "
                f"only on that model, not on {model_id!r}"
            )
        return self._verifier.prove(pod)

    async def host_of(self, caller: Caller) -> JsonObject:
        """The caller's pod, as the pod watch shows it (or read fresh when the watch shows no
        host of the token's uid), when it is a model host of this node (checked as
        `authorize_model` checks a pod); else PermissionDeniedError."""
        watched = self._watched_host(caller.namespace, caller.pod_name)
        if watched is not None and str((watched.get("metadata") or {}).get("uid")) != (
            caller.pod_uid
        ):
            watched = None
        obj, pod = await self._own_pod(caller, watched)
        if not is_host(obj, self.keys):
            raise PermissionDeniedError(
                f"pod {pod.key} is not a model host (no {host_label(self.keys)}=true label): "
                f"only a host lists its replicas; a model pod asks for its own model with "
                f"GetModel"
            )
        return obj

    async def _own_pod(
        self, caller: Caller, known: JsonObject | None = None
    ) -> tuple[JsonObject, PodInfo]:
        """The token's pod (`known`, else read fresh), when it is still that pod, bound to this
        node, scheduled by tritonshare and not terminated; else PermissionDeniedError."""
        obj = (
            known
            if known is not None
            else await self._kube.get_pod(caller.namespace, caller.pod_name)
        )
        if obj is None:
            raise PermissionDeniedError(f"pod {caller.pod_key} of the token no longer exists")
        pod = pod_from_dict(obj, self.keys)
        if pod.uid != caller.pod_uid:
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
        return obj, pod

    def _replica(self, obj: JsonObject, key: str, model_id: str, ordinal: int | None) -> Proven:
        """The model host's replica `ordinal` of `model_id` (None: its only one), proven; else
        PermissionDeniedError. Each replica's proof binds its ordinal, so a forged ordinal, or
        an entry copied under another, does not verify."""
        hosted, problem = hosted_from_dict(obj, self.keys, self._max_hosted())
        if problem:
            raise PermissionDeniedError(problem)
        mine = [r for e, r in hosted if e.model_id == model_id]
        named = "" if ordinal is None else f" {ordinal}"
        if ordinal is not None:
            mine = [r for e, r in hosted if e.model_id == model_id and e.replica == ordinal]
        if not mine:
            raise PermissionDeniedError(
                f"model host {key} serves no replica{named} of model {model_id!r} on this node "
                f"(its annotation {hosted_models_annotation(self.keys)} names none); it may act "
                f"only on the replicas the binder placed on it"
            )
        if len(mine) > 1:
            raise PermissionDeniedError(
                f"model host {key} names {len(mine)} replicas{named} of model {model_id!r}; "
                f"say which replica (its ordinal), and name each replica once"
            )
        return self._verifier.prove(mine[0])

    def hosted(self, obj: JsonObject) -> tuple[list[tuple[HostedReplica, Proven]], list[str]]:
        """A model host's replicas whose proofs verify here, each beside its entry, and why
        each other is refused ("model/replica: why"); the caller has checked the host
        (`host_of`)."""
        hosted, problem = hosted_from_dict(obj, self.keys, self._max_hosted())
        if problem:
            return [], [problem]
        proven, refused = [], []
        for entry, replica in hosted:
            try:
                proven.append((entry, self._verifier.prove(replica)))
            except NotPlacedError as e:
                refused.append(f"{replica.name}: {e}")
        return proven, refused

    def parked(self, obj: JsonObject) -> tuple[list[Parked], str]:
        """The models a model host's annotation parks on it (no proof: parking loads nothing,
        it only has the namespace's own host hold requests for its own models), and what is
        wrong with the annotation ("" when nothing is); the caller has checked the host."""
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        value = annotations.get(parked_models_annotation(self.keys), "")
        return decode_parked(str(value), max(1, self._max_hosted()))


def _bounded(cache: dict[str, Any]) -> dict[str, Any]:
    """The cache, emptied first when full: a flood of distinct tokens cannot grow it forever."""
    if len(cache) >= CACHE_LIMIT:
        cache.clear()
    return cache


def token_expiry(token: str) -> float | None:
    """The `exp` claim of a JWT, in Unix seconds; None when it cannot be read. Read only after
    TokenReview has accepted the token: the API server vouched for its claims."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload))
    except (binascii.Error, ValueError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    if isinstance(exp, bool) or not isinstance(exp, int | float):
        return None
    return float(exp)


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
