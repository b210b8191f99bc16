"""The agent's token rules against sim/'s real TokenReview: a cached review never outlives the
token's `exp`, a review must confirm the agent's audience, and only pod-bound tokens count."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.api.auth import Authorizer, token_expiry
from agent.errors import UnauthenticatedError
from agent.kube.client import JsonObject, KubeClient, TokenReviewResult
from agent.pods.provenpods import PlacementVerifier
from common.contract import Keys
from sim.apiserver import RunningApiServer
from tests.agent.conftest import NODE, bearer, make_pod
from tests.agent.hosts import unwatched
from tests.fixtures_sim import TEST_RING


class WallClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def authorizer(kube: object, clock: WallClock, cache_seconds: float = 3600.0) -> Authorizer:
    return Authorizer(
        kube,  # type: ignore[arg-type]
        PlacementVerifier(lambda: TEST_RING, NODE),
        node_name=NODE,
        scheduler_name="tritonshare",
        keys=Keys(),
        audience="tritonshare-agent",
        platform_accounts=(),
        cache_seconds=cache_seconds,
        clock=clock,
        watched_host=unwatched,
    )


async def test_a_cached_review_never_outlives_the_tokens_expiry(
    apiserver: RunningApiServer, kube_api: object, kubeconfig: Path
) -> None:
    make_pod(kube_api, "p", "m")  # type: ignore[arg-type]
    token = apiserver.mint_token("default", "p", expiration_seconds=600)
    expires = token_expiry(token)
    assert expires is not None
    kube = KubeClient(str(kubeconfig))
    try:
        clock = WallClock(expires - 300)
        auth = authorizer(kube, clock)
        caller = await auth.authenticate(bearer(token))
        assert caller.pod_name == "p" and caller.pod_uid
        clock.now = expires - 1
        assert await auth.authenticate(bearer(token)) == caller
        assert auth.reviews == 1, "within its life the review is cached"
        # The cache period (an hour) is longer than the token's life: the expiry wins.
        clock.now = expires + 1
        with pytest.raises(UnauthenticatedError, match="expired"):
            await auth.authenticate(bearer(token))
    finally:
        await kube.close()


class Reviewer:
    def __init__(self, result: TokenReviewResult) -> None:
        self.result = result

    async def review_token(self, token: str, audience: str) -> TokenReviewResult:
        return self.result

    async def get_pod(self, namespace: str, name: str) -> JsonObject | None:
        return None


JWT = "e30.eyJleHAiOiA0MTAyNDQ0ODAwfQ.c2ln"  # exp 2100-01-01


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (
            TokenReviewResult(
                True,
                "system:serviceaccount:default:default",
                (),
                {
                    "authentication.kubernetes.io/pod-name": ["p"],
                    "authentication.kubernetes.io/pod-uid": ["u"],
                },
            ),
            "did not confirm the audience",
        ),
        (
            TokenReviewResult(
                True, "system:serviceaccount:default:default", ("tritonshare-agent",), {}
            ),
            "not bound to a pod",
        ),
        (
            TokenReviewResult(
                True,
                "system:serviceaccount:default:default",
                ("tritonshare-agent",),
                {"authentication.kubernetes.io/pod-name": ["p"]},
            ),
            "not bound to a pod",
        ),
    ],
    ids=["no-audience-in-review", "no-pod", "pod-without-uid"],
)
async def test_reviews_that_do_not_bind_the_token_to_the_agent_and_a_pod_are_refused(
    result: TokenReviewResult, message: str
) -> None:
    auth = authorizer(Reviewer(result), WallClock(1e9))
    with pytest.raises(UnauthenticatedError, match=message):
        await auth.authenticate(bearer(JWT))
    # Refused again from the brief failure cache, without a second review.
    with pytest.raises(UnauthenticatedError, match=message):
        await auth.authenticate(bearer(JWT))
    assert auth.reviews == 1


@pytest.mark.parametrize("token", ["opaque", "a.b", "e30.bm90LWpzb24.c2ln", "e30.e30.c2ln"])
def test_a_token_without_a_readable_exp_has_no_expiry(token: str) -> None:
    assert token_expiry(token) is None
