"""Service-account tokens: TokenRequest mints them bound to a pod, TokenReview checks them.

As the real API does for projected tokens: a token carries audiences, an expiry and a bound pod
(name and uid); a review authenticates it only if this server minted it, it has not expired, its
audiences intersect the review's (an empty review audience list means the API server's own
audience), and the bound pod still exists with the same uid. The user is
`system:serviceaccount:<ns>:<sa>` with the pod's name and uid in `extra`.

The same check authenticates a bearer token on an API request (`authenticate`, for the API
server's own audience): its `UserInfo` is what admission sees. A request with no credentials is
the cluster admin (`CLUSTER_ADMIN`), as the sim's kubeconfigs without a token have always meant.

Tokens look like JWTs (so code that decodes claims works) but the signature part is 32 random
bytes and a token is valid only if it is in this authority's table, so a forged or edited token
never authenticates. ServiceAccounts are implicit: any name in an existing namespace. This module
reads the store (pods, nodes, namespaces) and never writes it; no I/O.
"""

from __future__ import annotations

import base64
import json
import secrets
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sim.apiserver.clock import Clock, rfc3339
from sim.apiserver.errors import bad_request, conflict, invalid, not_found
from sim.apiserver.resources import NAMESPACES, NODES, PODS
from sim.apiserver.store import Store

JsonObject = dict[str, Any]

API_AUDIENCE = "https://kubernetes.default.svc.cluster.local"
ISSUER = "https://kubernetes.default.svc.cluster.local"
MIN_EXPIRATION_SECONDS = 600
DEFAULT_EXPIRATION_SECONDS = 3600


@dataclass(frozen=True)
class UserInfo:
    """Who made a request, as authentication hands it to admission (authentication/v1
    UserInfo): `request.userInfo` in a policy's CEL, `userInfo` in an AdmissionReview."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def to_json(self) -> JsonObject:
        body: JsonObject = {"username": self.username}
        if self.uid:
            body["uid"] = self.uid
        if self.groups:
            body["groups"] = list(self.groups)
        if self.extra:
            body["extra"] = {key: list(values) for key, values in self.extra.items()}
        return body


CLUSTER_ADMIN = UserInfo("kubernetes-admin", groups=("system:masters", "system:authenticated"))
"""A request without credentials: what kubeadm's admin.conf authenticates as. The simulated API
server authorises every request, so the sim's credential-free kubeconfigs act as the admin."""


@dataclass(frozen=True)
class Minted:
    namespace: str
    service_account: str
    service_account_uid: str
    audiences: tuple[str, ...]
    expires: float
    pod_name: str
    pod_uid: str
    node_name: str
    node_uid: str
    credential_id: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenAuthority:
    """Mints and reviews bound service-account tokens for one API server."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._tokens: dict[str, Minted] = {}
        self._sa_uids: dict[tuple[str, str], str] = {}

    def _service_account_uid(self, namespace: str, name: str) -> str:
        return self._sa_uids.setdefault((namespace, name), str(uuid.uuid4()))

    def token_request(self, namespace: str, service_account: str, body: Any) -> JsonObject:
        """Answer `POST .../serviceaccounts/{sa}/token` with the TokenRequest and its token."""
        if not isinstance(body, dict):
            raise bad_request("the request body must be a TokenRequest object")
        if self._store.get(NAMESPACES, "", namespace) is None:
            raise not_found(NAMESPACES.group_resource, namespace)
        spec = body.get("spec") or {}
        if not isinstance(spec, dict) or not isinstance(spec.get("audiences") or [], list):
            raise bad_request(
                'TokenRequest in version "v1" cannot be handled as a TokenRequest: spec must be an'
                " object and spec.audiences a list of strings"
            )
        audiences = [str(a) for a in (spec.get("audiences") or [])] or [API_AUDIENCE]
        seconds = spec.get("expirationSeconds")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int)):
            raise bad_request(
                f"TokenRequest spec.expirationSeconds must be an integer number of seconds, got"
                f" {seconds!r}"
            )
        seconds = DEFAULT_EXPIRATION_SECONDS if seconds is None else seconds
        if seconds < MIN_EXPIRATION_SECONDS:
            raise invalid(
                "TokenRequest",
                "authentication.k8s.io",
                service_account,
                [
                    (
                        "spec.expirationSeconds",
                        f"Invalid value: {seconds}: may not specify a duration less than 10"
                        " minutes",
                    )
                ],
            )
        ref = spec.get("boundObjectRef") or {}
        if not isinstance(ref, dict):
            raise bad_request("TokenRequest spec.boundObjectRef must be an object")
        pod_name = pod_uid = node_name = node_uid = ""
        if ref:
            if ref.get("kind") != "Pod":
                raise bad_request(
                    f"cannot bind token to object of type {ref.get('kind')!r}: the simulated API"
                    " server binds tokens to Pods only"
                )
            pod = self._store.get(PODS, namespace, str(ref.get("name", "")))
            if pod is None:
                raise not_found(PODS.group_resource, str(ref.get("name", "")))
            pod_meta = pod.obj["metadata"]
            if ref.get("uid") and ref["uid"] != pod_meta["uid"]:
                raise conflict(
                    "Pod",
                    pod.name,
                    f"the UID in the bound object reference ({ref['uid']}) does not match the UID"
                    " in record. The object might have been deleted and then recreated",
                )
            pod_sa = pod.obj.get("spec", {}).get("serviceAccountName", "default")
            if pod_sa != service_account:
                raise bad_request(
                    f'cannot bind token for serviceaccount "{service_account}" to pod running'
                    f' with different serviceaccount name ("{pod_sa}")'
                )
            pod_name, pod_uid = pod.name, str(pod_meta["uid"])
            node_name = str(pod.obj.get("spec", {}).get("nodeName") or "")
            node = self._store.get(NODES, "", node_name) if node_name else None
            node_uid = str(node.obj["metadata"]["uid"]) if node is not None else ""
        now = self._clock.now()
        minted = Minted(
            namespace=namespace,
            service_account=service_account,
            service_account_uid=self._service_account_uid(namespace, service_account),
            audiences=tuple(audiences),
            expires=now + seconds,
            pod_name=pod_name,
            pod_uid=pod_uid,
            node_name=node_name,
            node_uid=node_uid,
            credential_id=str(uuid.uuid4()),
        )
        token = self._encode(minted, now)
        self._tokens[token] = minted
        return {
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {
                "name": service_account,
                "namespace": namespace,
                "creationTimestamp": None,
            },
            "spec": {
                "audiences": audiences,
                "expirationSeconds": seconds,
                "boundObjectRef": ref or None,
            },
            "status": {"token": token, "expirationTimestamp": rfc3339(minted.expires)},
        }

    def _encode(self, minted: Minted, now: float) -> str:
        claims: JsonObject = {
            "aud": list(minted.audiences),
            "exp": int(minted.expires),
            "iat": int(now),
            "iss": ISSUER,
            "jti": minted.credential_id,
            "nbf": int(now),
            "sub": f"system:serviceaccount:{minted.namespace}:{minted.service_account}",
            "kubernetes.io": {
                "namespace": minted.namespace,
                "serviceaccount": {
                    "name": minted.service_account,
                    "uid": minted.service_account_uid,
                },
            },
        }
        if minted.pod_name:
            claims["kubernetes.io"]["pod"] = {"name": minted.pod_name, "uid": minted.pod_uid}
        if minted.node_name:
            claims["kubernetes.io"]["node"] = {"name": minted.node_name, "uid": minted.node_uid}
        header = _b64(json.dumps({"alg": "RS256", "kid": "sim"}).encode())
        payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
        return f"{header}.{payload}.{_b64(secrets.token_bytes(32))}"

    def token_review(self, body: Any) -> JsonObject:
        """Answer `POST /apis/authentication.k8s.io/v1/tokenreviews`."""
        if not isinstance(body, dict):
            raise bad_request("the request body must be a TokenReview object")
        spec = body.get("spec") or {}
        if not isinstance(spec, dict):
            raise bad_request("TokenReview spec must be an object with a token")
        token = str(spec.get("token") or "")
        wanted = [str(a) for a in (spec.get("audiences") or [])]
        status = self._review(token, wanted)
        return {
            "kind": "TokenReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": None},
            "spec": {"token": token, **({"audiences": wanted} if wanted else {})},
            "status": status,
        }

    def authenticate(self, token: str) -> UserInfo | None:
        """The user a bearer token on an API request stands for, or None (401) unless this
        server minted it for its own audience, it has not expired and its bound pod is there."""
        status = self._review(token, [API_AUDIENCE])
        if not status.get("authenticated"):
            return None
        user = status["user"]
        return UserInfo(
            username=user["username"],
            uid=user["uid"],
            groups=tuple(user["groups"]),
            extra={key: tuple(values) for key, values in user["extra"].items()},
        )

    def _review(self, token: str, wanted: list[str]) -> JsonObject:
        failure = {"user": {}, "error": "[invalid bearer token, token lookup failed]"}
        minted = self._tokens.get(token)
        if minted is None:
            return failure
        if minted.expires <= self._clock.now():
            return {
                "user": {},
                "error": "[invalid bearer token, service account token has expired]",
            }
        audiences = wanted or [API_AUDIENCE]
        shared = [a for a in audiences if a in minted.audiences]
        if not shared:
            return {
                "user": {},
                "error": "[invalid bearer token, token audiences"
                f" {json.dumps(list(minted.audiences))} is invalid for the target audiences"
                f" {json.dumps(audiences)}]",
            }
        extra: dict[str, list[str]] = {
            "authentication.kubernetes.io/credential-id": [f"JTI={minted.credential_id}"]
        }
        if minted.pod_name:
            pod = self._store.get(PODS, minted.namespace, minted.pod_name)
            if pod is None or pod.obj["metadata"]["uid"] != minted.pod_uid:
                return {
                    "user": {},
                    "error": f'[invalid bearer token, pod "{minted.pod_name}" not found or'
                    " replaced: the token's bound pod is gone]",
                }
            extra["authentication.kubernetes.io/pod-name"] = [minted.pod_name]
            extra["authentication.kubernetes.io/pod-uid"] = [minted.pod_uid]
        if minted.node_name:
            extra["authentication.kubernetes.io/node-name"] = [minted.node_name]
            extra["authentication.kubernetes.io/node-uid"] = [minted.node_uid]
        return {
            "authenticated": True,
            "user": {
                "username": f"system:serviceaccount:{minted.namespace}:{minted.service_account}",
                "uid": minted.service_account_uid,
                "groups": [
                    "system:serviceaccounts",
                    f"system:serviceaccounts:{minted.namespace}",
                    "system:authenticated",
                ],
                "extra": extra,
            },
            "audiences": shared,
        }
